"""Each step of ``truncate`` on its own: request checks, plan, execute, report, write."""

import argparse

import pytest
import timm
import torch

from isiwatch.truncation.truncate import TruncateRequest, execute, plan, report, write


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A random 6-block ViT on 28×28 digits, saved as timm's train.py does; one torch thread meanwhile (small
    forwards spin-wait with two on the shared 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    arch = "vit_tiny_patch16_224"
    vit = timm.create_model(arch, img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=32, depth=6,
                            num_heads=2)
    path = tmp_path_factory.mktemp("ckpt") / "vit.pth.tar"
    torch.save({"arch": arch, "args": argparse.Namespace(model=arch, model_kwargs={"num_heads": 2}),
                "state_dict": vit.state_dict()}, path)
    yield path
    torch.set_num_threads(threads)


@pytest.mark.parametrize("options, message", [
    ({"keep": 3, "strategy": "auto"}, "cannot be combined with strategy='auto'"),
    ({"strategy": "middle"}, "unknown strategy 'middle'"),
    ({"fmt": "zip"}, "unknown format 'zip'"),
    ({"budget": 0}, "budget must be at least 1"),
    ({"images": 3}, "images at least 4"),
    ({"report": "r.md"}, "report r.md: the extension .md names no report format; give a path ending in .json"),
])
def test_request_refuses_impossible_options_without_touching_files(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        TruncateRequest(tmp_path / "missing.pt", tmp_path / "out.pt", **options)
    assert list(tmp_path.iterdir()) == []


def test_request_resolves_the_strategy_and_refuses_overwriting_its_input(tmp_path):
    assert TruncateRequest(tmp_path / "a.pt", tmp_path / "b.pt").strategy == "auto"
    assert TruncateRequest(tmp_path / "a.pt", tmp_path / "b.pt", keep=2).strategy == "bi"
    with pytest.raises(ValueError, match="same file as the input"):
        TruncateRequest(tmp_path / "a.pt", tmp_path / "a.pt")


def test_plan_chooses_the_blocks_before_any_healing_and_execute_report_write_follow_it(ckpt, tmp_path):
    request = TruncateRequest(ckpt, tmp_path / "cut.pt", strategy="tail", keep=4, epochs=0, images=64,
                              report=tmp_path / "report.json")
    planned = plan(request)
    assert planned.kept == [0, 1, 2, 3] and planned.depth == 6
    assert planned.distances is None and planned.recommendation is None  # tail with --keep needs neither
    assert len(planned.split.train_y) == 4000 and len(planned.split.val_y) == 500
    assert list(tmp_path.iterdir()) == []  # planning writes nothing

    execution = execute(planned)
    assert execution.kept == [0, 1, 2, 3] and execution.healing_steps == 0 and execution.search is None
    assert len(execution.model.blocks) == 4 and len(planned.uncut.blocks) == 6  # the uncut model is untouched
    assert len(execution.eval_y) == 1000  # a fixed cut reports on validation and test together
    # no healing: the cut's block 3 is the source's block 3
    assert torch.equal(execution.model.blocks[3].mlp.fc2.weight, planned.uncut.blocks[3].mlp.fc2.weight)

    result = report(planned, execution)
    assert list(result["accuracy"]) == ["split", "images", "uncut", "cut"]  # unhealed: the cut is the written model
    assert result["cost"]["uncut"]["blocks"] == 6 and result["cost"]["truncated"]["blocks"] == 4
    assert result["kept_blocks"] == [0, 1, 2, 3] and result["dropped_blocks"] == [4, 5]
    assert result["train_last"] == 2 and result["evaluated_on"] == "validation+test"
    assert list(tmp_path.iterdir()) == []  # reporting writes nothing

    paths = write(planned, execution, result)
    assert paths == [tmp_path / "cut.pt", tmp_path / "report.json"]
    saved = torch.load(paths[0], weights_only=True)
    assert saved["model_kwargs"]["depth"] == 4 and saved["isiwatch"]["kept_blocks"] == [0, 1, 2, 3]


def test_plan_refuses_a_plateau_cut_without_a_plateau_before_healing(ckpt, tmp_path):
    request = TruncateRequest(ckpt, tmp_path / "cut.pt", strategy="plateau", images=64)
    with pytest.raises(ValueError, match="no plateau in the token_similarity curve"):
        plan(request)
    assert list(tmp_path.iterdir()) == []
