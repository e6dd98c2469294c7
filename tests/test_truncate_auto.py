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
from isiwatch.truncation.truncate import truncate

ARCH = "vit_tiny_patch16_224"
KWARGS = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=32, num_heads=2)


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
    result = truncate(idle_ckpt, tmp_path / "cut.pt", epochs=1, max_drop=5.0, budget=4, images=500)
    report = result.report
    assert {1, 4, 6} <= set(report["recommendation"]["blocks_to_drop"])
    search = report["search"]
    winner = search["winner"]
    assert not {1, 4, 6} & set(winner["kept_blocks"]) and report["kept_blocks"] == winner["kept_blocks"]
    assert search["rule"] == {**search["rule"], "confidence": 0.95, "tests": 5}  # 4 screens and the full heal
    assert winner["validation_drop"]["upper_bound_points"] <= 5.0
    assert 1 <= len(search["candidates"]) <= 4 and sum(c["winner"] for c in search["candidates"]) == 1
    assert all(c["qualifies"] == (c["validation_drop"]["upper_bound_points"] <= 5.0) for c in search["candidates"])
    # screened with a quarter of the full heal (one epoch of 4,000 digits: 32 steps); the winner healed fully
    assert {c["healing_steps"] for c in search["candidates"]} == {8} and report["healing_steps"] == 32
    assert search["full_heal"]["qualifies"] and search["test"]["images"] == 500
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
                                       "--budget", "2", "--images", "200", "--max-drop", "3"])
    assert result.exit_code == 0, result.output
    assert "uncut validation accuracy" in result.output and "upper 95 % confidence bound" in result.output
    assert "(auto: bi)" in result.output and out.exists() and "cut to 5 of 7 blocks (bi" in result.output
    assert "recommended" not in result.output  # every strategy shown is one the docs list


def test_a_validation_split_too_small_to_certify_says_so_and_how_many_images_it_needs(idle_ckpt, tmp_path):
    result = CliRunner().invoke(main, ["truncate", str(idle_ckpt), "--out", str(tmp_path / "cut.pt"),
                                       "--epochs", "0", "--budget", "16", "--images", "200"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    message = next(line for line in lines if line.startswith("no cut: 500 validation images cannot certify"))
    assert "over 16 bounds" in message and "it would take 643 validation images" in message
    # one row: nothing was cut, so no cut/healed rows identical to the uncut model
    assert not any(line.split()[:1] in (["cut"], ["healed"]) for line in lines)
    assert "uncut model kept (auto: nothing cut)" in result.output


@pytest.fixture(scope="module")
def busy_ckpt(idle_ckpt, tmp_path_factory):
    """The idle checkpoint without its idle blocks: the trained 4-block ViT, every block of which does work."""
    source = torch.load(idle_ckpt, weights_only=True)
    renumber = {"0": "0", "2": "1", "3": "2", "5": "3"}
    state = {}
    for key, value in source["state_dict"].items():
        parts = key.split(".")
        if parts[0] == "blocks":
            if parts[1] not in renumber:
                continue
            parts[1] = renumber[parts[1]]
        state[".".join(parts)] = value
    path = tmp_path_factory.mktemp("busy") / "busy.pt"
    torch.save({**source, "model_kwargs": {**source["model_kwargs"], "depth": 4}, "state_dict": state}, path)
    return path


def test_nothing_certified_names_the_closest_candidate_in_one_line(busy_ckpt, tmp_path):
    result = truncate(busy_ckpt, None, heal_steps=2, max_drop=0.5, confidence=0.5, budget=2, images=200)
    search = result.report["search"]
    assert search["winner"] is None and len(result.model.blocks) == 4
    assert search["message"].startswith("no cut: no cut of the 4-block model was certified within 0.5 points "
                                        "after 2 candidates; the closest, ")
    assert "\n" not in search["message"]


def test_an_interrupted_search_resumes_without_healing_its_finished_candidates(idle_ckpt, tmp_path, monkeypatch):
    options = dict(heal_steps=4, screen_steps=2, max_drop=4.0, budget=4, images=200, seed=0)
    reference = truncate(idle_ckpt, None, journal=tmp_path / "reference.jsonl", **options).report
    healed = []
    real_heal = truncate_module.heal

    def heal_then_interrupt(*args, **kwargs):
        if len(healed) == 2:
            raise KeyboardInterrupt  # killed during the third candidate
        healed.append(kwargs["max_steps"])
        return real_heal(*args, **kwargs)
    monkeypatch.setattr(truncate_module, "heal", heal_then_interrupt)
    journal = tmp_path / "search.jsonl"
    with pytest.raises(KeyboardInterrupt):
        truncate(idle_ckpt, None, journal=journal, **options)
    assert len(journal.read_text().splitlines()) == 1 + 2

    healed.clear()
    monkeypatch.setattr(truncate_module, "heal", lambda *a, **k: healed.append(k["max_steps"]) or real_heal(*a, **k))
    resumed = truncate(idle_ckpt, None, journal=journal, resume=True, **options).report
    screened = len(reference["search"]["candidates"])
    assert reference["search"]["winner"] is not None and screened > 2
    assert healed == [2] * (screened - 2) + [4]  # the unfinished screens, then the winner's full heal
    assert resumed["search"]["resumed_candidates"] == 2
    for key in ("kept_blocks", "accuracy", "healing_steps"):
        assert resumed[key] == reference[key]

    def scored(report):
        return [{k: v for k, v in c.items() if k not in ("resumed", "latency_ms")}
                for c in report["search"]["candidates"]]
    assert scored(resumed) == scored(reference)


@pytest.mark.parametrize("args, message", [
    (["--max-drop", "-1"], "'--max-drop': -1.0 is not in the range 0<=x<100"),  # refused as click parses it
    (["--max-drop", "nan"], "'--max-drop': nan is not a finite number"),
    (["--budget", "0"], "'--budget': 0 is not in the range x>=1"),
    (["--strategy", "auto", "--keep", "3"], "cannot be combined with --strategy auto"),
    (["--confidence", "1"], "'--confidence': 1.0 is not in the range 0<=x<1"),
    (["--screen-steps", "0"], "'--screen-steps': 0 is not in the range 1<=x<=10000000"),
    (["--heal-steps", "4", "--screen-steps", "8"], "--screen-steps (8) cannot exceed --heal-steps (4)"),
    (["--keep", "3", "--resume"], "--resume apply to --strategy auto only"),
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
