"""`isiwatch truncate --strategy auto`: the search, a trained model with idle blocks, and bad input."""

import copy
import json

import pytest
import timm
import torch
from click.testing import CliRunner

import isiwatch.truncation.truncate as truncate_module
from isiwatch.cli.commands import main
from isiwatch.io.checkpoint import load_checkpoint
from isiwatch.io.data import embedded_digits
from isiwatch.io.models import build_model
from isiwatch.truncation.healing import train_classifier
from isiwatch.truncation.strategies import CutSearch
from isiwatch.truncation.truncate import truncate

ARCH = "vit_tiny_patch16_224"
KWARGS = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=32, num_heads=2)


def search_with(accuracy_of_keep, depth=12, max_drop=1.0, budget=16, reference=0.9):
    """A CutSearch whose healed accuracy depends only on the number of kept blocks."""
    def heal_and_score(strategy, kept):
        return 0.0, accuracy_of_keep(len(kept)), 1, None

    def blocks_for(strategy, keep):
        order = {"bi": range(depth), "angular": range(depth - 1, -1, -1), "tail": range(depth)}.get(strategy)
        return None if order is None else sorted(list(order)[:keep])
    return CutSearch(depth, reference, max_drop, budget, blocks_for, heal_and_score)


def test_search_goes_below_a_qualifying_recommendation_to_the_cheapest_qualifying_depth():
    search = search_with(lambda k: 0.9 if k >= 5 else 0.5)
    winner = search.run(list(range(8)))
    assert winner.keep == 5 and winner.qualifies
    assert search.candidates[0].strategy == "recommended" and search.candidates[0].keep == 8
    # each infeasible K costs its distinct cuts (bi and tail coincide here), each feasible K one
    assert [c.keep for c in search.candidates] == [8, 4, 4, 6, 5]


def test_search_goes_above_a_failing_recommendation_and_respects_max_drop():
    search = search_with(lambda k: 0.895 if k >= 10 else 0.85, max_drop=1.0)
    assert search.run(list(range(6))).keep == 10
    assert all(c.qualifies == (c.healed >= 0.9 - 0.01) for c in search.candidates)
    strict = search_with(lambda k: 0.895 if k >= 10 else 0.85, max_drop=0.0)
    assert strict.run(list(range(6))) is None  # nothing reaches 0.9: the uncut model stays
    assert max(c.keep for c in strict.candidates) == 11


def test_budget_bounds_the_candidates_healed():
    search = search_with(lambda k: 0.9 if k >= 5 else 0.5, budget=2)
    winner = search.run(list(range(8)))
    assert len(search.candidates) == 2 and winner.keep == 8  # the recommendation, then K=4 fails its first try


@pytest.fixture(scope="module")
def idle_ckpt(tmp_path_factory):
    """A trained 4-block ViT with three identity blocks (attention and MLP outputs zeroed) spread between its
    blocks: 7 blocks, idle at 1, 4 and 6."""
    images, labels = embedded_digits()
    torch.manual_seed(0)
    model = timm.create_model(ARCH, pretrained=False, depth=4, **KWARGS)
    train_classifier(model, images[:2000], labels[:2000], epochs=3, lr=3e-3, batch_size=128)
    idle = copy.deepcopy(model.blocks[1])
    with torch.no_grad():
        for linear in (idle.attn.proj, idle.mlp.fc2):
            linear.weight.zero_()
            linear.bias.zero_()
    b = list(model.blocks)
    model.blocks = torch.nn.Sequential(b[0], copy.deepcopy(idle), b[1], b[2], copy.deepcopy(idle), b[3],
                                       copy.deepcopy(idle))
    path = tmp_path_factory.mktemp("idle") / "idle.pt"
    torch.save({"arch": ARCH, "model_kwargs": {**KWARGS, "depth": 7}, "state_dict": model.state_dict()}, path)
    return path


def test_auto_removes_spread_out_idle_blocks_within_max_drop(idle_ckpt, tmp_path):
    result = truncate(idle_ckpt, tmp_path / "cut.pt", epochs=1, max_drop=1.0, budget=4, images=500)
    report = result.report
    assert {1, 4, 6} <= set(report["recommendation"]["blocks_to_drop"])
    search = report["search"]
    winner = search["winner"]
    assert not {1, 4, 6} & set(winner["kept_blocks"]) and report["kept_blocks"] == winner["kept_blocks"]
    assert winner["validation_accuracy"]["healed"] >= search["uncut_validation_accuracy"] - 0.01
    assert 1 <= len(search["candidates"]) <= 4 and sum(c["winner"] for c in search["candidates"]) == 1
    assert all(c["qualifies"] == (c["validation_accuracy"]["healed"] >= search["uncut_validation_accuracy"] - 0.01)
               for c in search["candidates"])
    cheapest = min(c["keep"] for c in search["candidates"] if c["qualifies"])
    assert winner["keep"] == cheapest
    # reported accuracy is on the test half, which took no part in the choice
    assert report["evaluated_on"] == "test" and report["held_out_images"] == search["test_images"] == 500
    assert report["strategy"] == f"auto: {winner['strategy']}"
    loaded = build_model(load_checkpoint(tmp_path / "cut.pt"))
    assert len(loaded.blocks) == winner["keep"] == report["cost"]["truncated"]["blocks"]


def test_cli_auto_is_the_default_and_prints_every_candidate(idle_ckpt, tmp_path):
    out = tmp_path / "cut.pt"
    result = CliRunner().invoke(main, ["truncate", str(idle_ckpt), "--out", str(out), "--epochs", "0",
                                       "--budget", "2", "--images", "200"])
    assert result.exit_code == 0, result.output
    assert "uncut validation accuracy" in result.output and "recommended" in result.output
    assert "(auto: " in result.output and out.exists()


@pytest.mark.parametrize("args, message", [
    (["--max-drop", "-1"], "--max-drop must be at least 0 points, got -1.0"),
    (["--max-drop", "nan"], "--max-drop must be at least 0 points, got nan"),
    (["--budget", "0"], "--budget must be at least 1 candidate, got 0"),
    (["--strategy", "auto", "--keep", "3"], "cannot be combined with --strategy auto"),
])
def test_impossible_requests_fail_in_one_line_before_reading_the_checkpoint(idle_ckpt, tmp_path, monkeypatch, args,
                                                                          message):
    def never(*a, **k):
        raise AssertionError("work started before the request was checked")
    monkeypatch.setattr(truncate_module, "load_checkpoint", never)
    result = CliRunner().invoke(main, ["truncate", str(idle_ckpt), "--out", str(tmp_path / "o.pt"), *args])
    assert result.exit_code == 1 and message in result.output, result.output
    assert result.output.strip().count("\n") == 0 and list(tmp_path.iterdir()) == []


def test_missing_data_fails_before_any_analysis(idle_ckpt, tmp_path, monkeypatch):
    def never(*a, **k):
        raise AssertionError("analysis started before the data was checked")
    monkeypatch.setattr(truncate_module, "analyze", never)
    result = CliRunner().invoke(main, ["truncate", str(idle_ckpt), "--out", str(tmp_path / "o.pt"),
                                       "--data", str(tmp_path / "missing")])
    assert result.exit_code == 1 and "no such data folder" in result.output
    assert result.output.strip().count("\n") == 0 and list(tmp_path.iterdir()) == []


def test_fixed_strategy_without_keep_cuts_to_the_recommended_depth_instead_of_refusing(idle_ckpt, tmp_path):
    out = tmp_path / "cut.pt"
    result = CliRunner().invoke(main, ["truncate", str(idle_ckpt), "--out", str(out), "--strategy", "bi",
                                       "--epochs", "0", "--images", "200", "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    dropped = set(report["recommendation"]["blocks_to_drop"])
    assert {1, 4, 6} <= dropped and len(report["kept_blocks"]) == 7 - len(dropped)
    assert report["strategy"] == "bi" and report["search"] is None and "(bi)" in result.output


def test_a_config_default_for_max_drop_does_not_block_a_fixed_keep(idle_ckpt, tmp_path):
    config = tmp_path / "isiwatch.yaml"
    config.write_text("truncate:\n  max_drop: 2.0\n  budget: 3\n")
    out = tmp_path / "cut.pt"
    result = CliRunner().invoke(main, ["--config", str(config), "truncate", str(idle_ckpt), "--out", str(out),
                                       "--keep", "4", "--epochs", "0", "--images", "200"])
    assert result.exit_code == 0, result.output
    assert torch.load(out, weights_only=True)["model_kwargs"]["depth"] == 4
