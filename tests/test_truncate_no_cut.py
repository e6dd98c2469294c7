"""`isiwatch truncate` when ``auto`` certifies nothing (it writes nothing and exits with its own status) and its
checks on the labels and images before any search (issues 40 and 41)."""


import pytest
import timm
import torch
from click.testing import CliRunner

from isiwatch.cli.commands import NO_CERTIFIED_CUT, main
from isiwatch.io.checkpoint import save_checkpoint
from isiwatch.io.data import embedded_digits
from isiwatch.truncation.healing import train_classifier
from isiwatch.truncation.truncate import truncate

ARCH = "vit_tiny_patch16_224"
KWARGS = {"img_size": 28, "patch_size": 7, "in_chans": 1, "num_classes": 10, "embed_dim": 16, "depth": 2,
          "num_heads": 2}
#: A short search: one healed candidate of one healing step, on the analysis of 64 digits.
QUICK = ["--budget", "1", "--heal-steps", "1", "--screen-steps", "1", "--images", "64", "--device", "cpu"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-block ViT trained briefly on 1,000 digits: well above chance, and every block does work."""
    images, labels = embedded_digits()
    torch.manual_seed(0)
    model = timm.create_model(ARCH, pretrained=False, **KWARGS)
    train_classifier(model, images[:1000], labels[:1000], epochs=2, lr=3e-3, batch_size=128)
    return save_checkpoint(tmp_path_factory.mktemp("trained") / "model.pt", ARCH, KWARGS, model.state_dict())


def test_no_certified_cut_writes_nothing_and_exits_with_its_own_status(trained, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["truncate", str(trained), "--out", "cut.pt", "--report", "r.json",
                                       "--max-drop", "1", *QUICK])
    assert result.exit_code == NO_CERTIFIED_CUT != 1, result.output
    assert list(tmp_path.iterdir()) == []  # no cut.pt, no report, no cut.pt.search.jsonl
    last = result.output.splitlines()[-1]
    assert last.startswith("no certified cut, nothing written: the nearest candidate, ")
    assert "would be certified with --max-drop " in last
    assert "validate.py" not in result.output  # 'mnist' is no folder validate.py reads
    assert f"{NO_CERTIFIED_CUT} auto certified no cut" in CliRunner().invoke(main, ["truncate", "--help"]).output


def test_the_api_says_no_cut_and_writes_no_file(trained, tmp_path):
    result = truncate(trained, tmp_path / "cut.pt", max_drop=1, budget=1, heal_steps=1, screen_steps=1, images=64)
    assert not result.cut and result.paths == [] and list(tmp_path.iterdir()) == []
    need = result.report["search"]["to_certify"]
    best = min(result.report["search"]["candidates"], key=lambda c: c["validation_drop"]["upper_bound_points"])
    assert need["keep"] == best["keep"] and need["max_drop"] >= best["validation_drop"]["upper_bound_points"]
    again = truncate(trained, None, max_drop=need["max_drop"], budget=1, heal_steps=1, screen_steps=1, images=64)
    assert again.cut  # the --max-drop it named certifies a cut
