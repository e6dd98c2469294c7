"""Each row of truncate's before/after table, and each accuracy in the written file, is the model the row names
(issue 48.1): the written file, evaluated outside the report's code, scores the last row, and the cut before any
repair scores the "cut" row; a row exists only for a model the run made."""

import json
import re

import pytest
import timm
import torch
from click.testing import CliRunner

from isiwatch.cli.commands import main
from isiwatch.io.checkpoint import load_checkpoint, save_checkpoint
from isiwatch.io.data import embedded_digits
from isiwatch.io.models import build_model
from isiwatch.truncation.healing import train_classifier
from isiwatch.truncation.surgery import cut_vit

ARCH = "vit_tiny_patch16_224"
KWARGS = {"img_size": 28, "patch_size": 7, "in_chans": 1, "num_classes": 10, "embed_dim": 32, "num_heads": 2,
          "depth": 4}
#: The embedded digits' test half as truncate splits 'mnist': 4,000 healing, then 500 validation, 500 test.
TEST = slice(4500, 5000)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 4-block ViT trained on the 4,000 healing digits (0.69 on the test half): each of its cuts loses
    accuracy, which the bridge and healing win back in part."""
    images, labels = embedded_digits()
    torch.manual_seed(0)
    model = timm.create_model(ARCH, pretrained=False, **KWARGS)
    train_classifier(model, images[:4000], labels[:4000], epochs=8, lr=3e-3, batch_size=128)
    return save_checkpoint(tmp_path_factory.mktemp("trained") / "model.pt", ARCH, KWARGS, model.state_dict())


def accuracy(model: torch.nn.Module) -> float:
    images, labels = embedded_digits()
    with torch.no_grad():
        predicted = model.eval()(images[TEST]).argmax(-1)
    return float((predicted == labels[TEST]).float().mean())


CASES = {  # the winner's repair: the options that give it on this model, and the rows its run made
    "none": (["--bridge", "none", "--epochs", "0", "--max-drop", "20"], ["uncut", "cut"]),
    "bridge": (["--epochs", "0", "--max-drop", "10"], ["uncut", "cut", "bridged cut"]),
    "heal": (["--bridge", "none", "--epochs", "1", "--max-drop", "10"], ["uncut", "cut", "healed"]),
}


@pytest.mark.parametrize("repair", list(CASES))
def test_each_row_is_the_model_it_names_and_the_last_is_the_written_file(trained, tmp_path, repair):
    options, rows = CASES[repair]
    out, report_path = tmp_path / "cut.pt", tmp_path / "report.json"
    result = CliRunner().invoke(main, ["truncate", str(trained), "--out", str(out), "--report", str(report_path),
                                       "--budget", "2", "--images", "200", "--device", "cpu", *options])
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    winner = report["search"]["winner"]
    assert winner["repair"] == repair and winner["keep"] == 3

    lines = result.output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["model", "blocks"])
    end = next(i for i, line in enumerate(lines) if line.startswith("kept blocks"))
    shown = [re.match(r"\s*([a-z ]+?)\s+\d", line).group(1) for line in lines[header + 1:end]]
    assert shown == rows  # one row per model made: no "healed" row for an unhealed cut

    written = accuracy(build_model(load_checkpoint(out)))
    stages = [k for k in report["accuracy"] if k not in ("split", "images")]
    assert report["accuracy"][stages[-1]] == pytest.approx(written, abs=1e-6)  # the last row is the file
    assert load_checkpoint(out).metadata["accuracy"] == report["accuracy"]  # the file says what the report says
    uncut = build_model(load_checkpoint(trained))
    assert report["accuracy"]["uncut"] == pytest.approx(accuracy(uncut), abs=1e-6)
    assert report["accuracy"]["cut"] == pytest.approx(accuracy(cut_vit(uncut, winner["kept_blocks"])), abs=1e-6)
    if "bridged" in report["accuracy"]:  # the bridge changed the cut: its row is not the plain cut's
        assert report["accuracy"]["bridged"] != report["accuracy"]["cut"]
