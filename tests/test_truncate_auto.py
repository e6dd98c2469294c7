"""`isiwatch truncate --strategy auto`: the search, a trained model with idle blocks, and bad input."""

import copy
import json

import pytest
import timm
import torch
from click.testing import CliRunner

import isiwatch.truncation.plan as truncate_module
from isiwatch.cli.commands import main
from isiwatch.io.checkpoint import load_checkpoint
from isiwatch.io.data import embedded_digits
from isiwatch.io.models import build_model
from isiwatch.truncation.healing import train_classifier
from isiwatch.truncation.strategies import STRATEGIES
from isiwatch.truncation.truncate import truncate

ARCH = "vit_tiny_patch16_224"
KWARGS = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=32, num_heads=2)


@pytest.fixture(scope="module")
def four_blocks():
    """A 4-block ViT trained on 2,000 of the embedded digits."""
    images, labels = embedded_digits()
    torch.manual_seed(0)
    model = timm.create_model(ARCH, pretrained=False, depth=4, **KWARGS)
    train_classifier(model, images[:2000], labels[:2000], epochs=3, lr=3e-3, batch_size=128)
    return model


def padded(model, idle_after, path, scale=0.0):
    """``model`` with an exact identity block (attention and MLP outputs zeroed: both residual branches add 0)
    after each of its blocks listed in ``idle_after`` (-1: before the first), saved to ``path``; with ``scale``,
    a nearly idle block instead: a copy of its second block with both branches' outputs scaled by it."""
    idle = copy.deepcopy(model.blocks[1])
    with torch.no_grad():
        for linear in (idle.attn.proj, idle.mlp.fc2):
            linear.weight.mul_(scale)
            linear.bias.mul_(scale)
    blocks = [copy.deepcopy(idle) for _ in range(idle_after.count(-1))]
    for i, block in enumerate(model.blocks):
        blocks += [block] + [copy.deepcopy(idle) for _ in range(idle_after.count(i))]
    out = copy.deepcopy(model)
    out.blocks = torch.nn.Sequential(*blocks)
    torch.save({"arch": ARCH, "model_kwargs": {**KWARGS, "depth": len(blocks)}, "state_dict": out.state_dict()}, path)
    return path


@pytest.fixture(scope="module")
def idle_ckpt(four_blocks, tmp_path_factory):
    """The trained 4-block ViT with three identity blocks spread between its blocks: 7 blocks, idle at 1, 4, 6."""
    return padded(four_blocks, [0, 2, 3], tmp_path_factory.mktemp("idle") / "idle.pt")


def test_auto_removes_spread_out_idle_blocks_within_max_drop(idle_ckpt, tmp_path):
    result = truncate(idle_ckpt, tmp_path / "cut.pt", epochs=1, max_drop=5.0, budget=4, images=500)
    report = result.report
    assert {1, 4, 6} <= set(report["recommendation"]["blocks_to_drop"])
    search = report["search"]
    winner = search["winner"]
    assert not {1, 4, 6} & set(winner["kept_blocks"]) and report["kept_blocks"] == winner["kept_blocks"]
    rule = search["rule"]
    assert (rule["confidence"], rule["alpha"]) == (0.95, pytest.approx(0.05)) and "parts" not in rule
    assert winner["validation_drop"]["upper_bound_points"] <= 5.0
    assert sum(c["winner"] for c in search["candidates"]) == 1
    assert all(c["qualifies"] == (c["validation_drop"]["upper_bound_points"] <= 5.0) for c in search["candidates"])
    # one fixed order from the fewest blocks dropped, up to its first failure (or the end of the order)
    walked = search["candidates"]
    assert [c["keep"] for c in walked] == list(range(6, 0, -1))[:len(walked)]
    assert all(c["qualifies"] for c in walked[:-1]) and (len(walked) == 6 or not walked[-1]["qualifies"])
    assert search["stopped_at"] == (None if walked[-1]["qualifies"] else walked[-1]["keep"])
    # the identity cuts change nothing on the healing images: tested as they are, with no discordant image
    for c in walked[:3]:
        assert c["repair"] == "none" and c["healing_steps"] == 0
        assert c["choice"]["discordant"] == {"cut": {"uncut_only": 0, "cut_only": 0}}
        assert c["validation_drop"]["uncut_only"] == c["validation_drop"]["cut_only"] == 0
    for c in walked:  # each repair is the least one the healing images said would qualify
        bounds = c["choice"]["predicted_bound_points"]
        unhealed = [name for name in bounds if name != "healed"]
        assert unhealed == ["cut", "bridged"][:len(unhealed)] and c["choice"]["calibration_images"] == 500
        passed = [name for name in unhealed if bounds[name] <= 5.0]
        if passed:
            assert c["repair"] == ("none" if passed[0] == "cut" else "bridge") and "healed" not in bounds
        elif c["repair"] == "heal":  # healed in full (an epoch of 4,000 digits), closer on the healing images
            assert c["healing_steps"] == 32 and bounds["healed"] < min(bounds[n] for n in unhealed)
        else:  # a heal that came no closer even on the images it trained on is not tested
            assert c["choice"]["heal_rejected"] == 32 and bounds["healed"] >= min(bounds[n] for n in unhealed)
        assert c["healing_steps"] == (32 if c["repair"] == "heal" else 0)
    assert sum(c["healing_steps"] > 0 for c in walked) <= 4 and search["test"]["images"] == 500
    assert winner["keep"] == min(c["keep"] for c in walked if c["qualifies"])
    assert report["healing_steps"] == winner["healing_steps"]  # the model tested is the model written
    # reported accuracy is on the test half, which took no part in the choice
    assert report["evaluated_on"] == "test" and report["held_out_images"] == search["test_images"] == 500
    assert report["strategy"] == f"auto: {winner['strategy']}"
    loaded = build_model(load_checkpoint(tmp_path / "cut.pt"))
    assert len(loaded.blocks) == winner["keep"] == report["cost"]["truncated"]["blocks"]
    # a repair never lowers what is certified: the cuts as they are alone certify no fewer blocks removed
    as_cut = truncate(idle_ckpt, None, epochs=0, bridge="none", max_drop=5.0, budget=4, images=500).report
    assert winner["keep"] <= len(as_cut["kept_blocks"])


def test_cli_auto_is_the_default_and_prints_every_candidate(idle_ckpt, tmp_path):
    out = tmp_path / "cut.pt"
    result = CliRunner().invoke(main, ["truncate", str(idle_ckpt), "--out", str(out), "--epochs", "0",
                                       "--budget", "2", "--images", "200", "--max-drop", "3", "--bridge", "none"])
    assert result.exit_code == 0, result.output
    assert "uncut accuracy validation n=" in result.output and "upper 95 % confidence bound" in result.output
    assert "(auto: bi)" in result.output and out.exists()
    assert "cut to 4 of 7 blocks (bi, as cut):" in result.output  # the 3 identity blocks
    assert "; cuts as they are (no repair)" in result.output  # --epochs 0 --bridge none: nothing to choose
    lines = result.output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["strategy", "blocks"])
    rows = [line.split()[0] for line in lines[header + 1:] if line.split()[0] != "model"][:4]
    assert rows and set(rows) <= set(STRATEGIES)  # every strategy shown is one the docs list
    # no terminal, so no bar: each stage that takes a while says so as it starts, each candidate as it is tested
    said = [i for i, line in enumerate(lines) if line.startswith(("analysing the uncut model on 200 healing images",
                                                                   "scoring the uncut model on the 500 validation",
                                                                   "  tested candidate 1: bi K=6 none bound "))]
    assert len(said) == 3 and said == sorted(said) and said[-1] < header


def test_a_validation_split_too_small_to_certify_stops_before_any_work_and_says_how_many_it_needs(
        idle_ckpt, tmp_path, monkeypatch):
    def never(*a, **k):
        raise AssertionError("analysis started on data that cannot certify a cut")
    monkeypatch.setattr(truncate_module, "analyze", never)
    result = CliRunner().invoke(main, ["truncate", str(idle_ckpt), "--out", str(tmp_path / "cut.pt"),
                                       "--max-drop", "0.5"])
    assert result.exit_code == 1
    assert result.output.strip().count("\n") == 0 and list(tmp_path.iterdir()) == []
    assert ("500 validation images cannot certify any cut within 0.5 points at 95 % confidence: even a cut that "
            "changes no prediction needs 736; give more validation images (--eval-data), a larger --max-drop or "
            "--confidence 0") in result.output


def test_confidence_zero_runs_where_the_bound_cannot_certify(busy_ckpt):
    result = truncate(busy_ckpt, None, heal_steps=2, max_drop=0.5, confidence=0, budget=1, images=200)
    assert result.report["search"]["rule"]["method"] == "point estimate"


def test_the_defaults_cut_the_identity_blocks_of_a_padded_model(four_blocks, tmp_path):
    """``isiwatch truncate CKPT --out OUT --data mnist`` and nothing else, on the trained 4-block ViT with an exact
    identity block after each of its blocks: it says what it can certify before healing, certifies the cuts of the
    identity blocks as they are (no discordant image) and cuts all 4 (healing on the 4,000 digits may then
    certify a deeper cut of this briefly trained ViT; benchmarks/bench_guarantee.py cuts exactly the identity
    blocks of better trained ones)."""
    ckpt = padded(four_blocks, [0, 1, 2, 3], tmp_path / "padded.pt")
    out = tmp_path / "cut.pt"
    result = CliRunner().invoke(main, ["truncate", str(ckpt), "--out", str(out), "--data", "mnist", "--report",
                                       str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    said = lines.index("auto: 500 validation images; a cut that changes no prediction needs 368 to be certified "
                       "within 1 point at 95 % confidence")
    assert said < next(i for i, line in enumerate(lines) if line.startswith("uncut accuracy validation n="))
    rows = [line.split() for line in lines if line.split()[:1] == ["bi"]]
    assert [(row[1], row[3]) for row in rows[:4]] == [(str(k), "none") for k in (7, 6, 5, 4)]
    candidates = json.loads((tmp_path / "r.json").read_text())["search"]["candidates"]
    for c in candidates[:4]:  # the identity cuts, tested as they are (no bridge fitted, no heal): no drop
        assert c["repair"] == "none" and c["choice"]["predicted_bound_points"]["cut"] < 1 and c["qualifies"]
        assert c["choice"]["discordant"] == {"cut": {"uncut_only": 0, "cut_only": 0}}
        assert c["validation_drop"]["points"] == 0.0
    kept = torch.load(out, weights_only=True)["isiwatch"]["kept_blocks"]
    assert len(kept) <= 4 and not {1, 3, 5, 7} & set(kept)


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
    assert [c["keep"] for c in search["candidates"]] == [3]  # the sequence stops at its first failure
    assert search["stopped_at"] == 3
    assert search["message"].startswith("no cut: no cut of the 4-block model was certified within 0.5 points "
                                        f"after {len(search['candidates'])} candidates; the closest, ")
    assert "\n" not in search["message"]


def test_an_interrupted_search_resumes_without_healing_its_finished_candidates(idle_ckpt, tmp_path, monkeypatch):
    # the identity cuts and K=3 as they are, then K=2 and K=1 healed (the point estimate: a heal qualifies)
    options = dict(heal_steps=4, max_drop=2.0, confidence=0.0, bridge="none", budget=4, images=200, seed=0)
    reference = truncate(idle_ckpt, None, journal=tmp_path / "reference.jsonl", **options).report
    healed = []
    real_heal = truncate_module.heal

    def heal_then_interrupt(*args, **kwargs):
        if len(healed) == 1:
            raise KeyboardInterrupt  # killed during the second heal
        healed.append(kwargs["max_steps"])
        return real_heal(*args, **kwargs)
    monkeypatch.setattr(truncate_module, "heal", heal_then_interrupt)
    journal = tmp_path / "search.jsonl"
    with pytest.raises(KeyboardInterrupt):
        truncate(idle_ckpt, None, journal=journal, **options)
    assert len(journal.read_text().splitlines()) == 1 + 1

    healed.clear()
    monkeypatch.setattr(truncate_module, "heal", lambda *a, **k: healed.append(k["max_steps"]) or real_heal(*a, **k))
    resumed = truncate(idle_ckpt, None, journal=journal, resume=True, **options).report
    heals = [c for c in reference["search"]["candidates"] if c["healing_steps"]]
    assert reference["search"]["winner"] is not None and len(heals) >= 2
    again = [4] if reference["search"]["winner"]["keep"] == heals[0]["keep"] else []  # a journalled winner
    assert healed == [4] * (len(heals) - 1) + again  # the unfinished heals
    assert resumed["search"]["resumed_candidates"] == 1
    for key in ("kept_blocks", "accuracy", "healing_steps"):
        assert resumed[key] == reference[key]

    def scored(report):
        return [{k: v for k, v in c.items() if k not in ("resumed", "latency_ms", "latency_quartiles_ms", "bridge")}
                | {"bridge": c["bridge"] and {k: v for k, v in c["bridge"].items() if k != "calibration_seconds"}}
                for c in report["search"]["candidates"]]
    assert scored(resumed) == scored(reference)


@pytest.mark.parametrize("args, message", [
    (["--max-drop", "-1"], "'--max-drop': -1.0 is not in the range 0<=x<100"),  # refused as click parses it
    (["--max-drop", "nan"], "'--max-drop': nan is not a finite number"),
    (["--budget", "0"], "'--budget': 0 is not in the range x>=1"),
    (["--strategy", "auto", "--keep", "3"], "cannot be combined with --strategy auto"),
    (["--confidence", "1"], "'--confidence': 1.0 is not in the range 0<=x<1"),
    (["--screen-steps", "8"], "No such option '--screen-steps'. Did you mean '--heal-steps'?"),  # removed
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


def test_a_search_refused_partway_removes_the_journal_it_started_and_keeps_one_it_resumed(idle_ckpt, tmp_path,
                                                                                          monkeypatch):
    """Issue 48.2: a refusal (a ValueError, here from the second healing) leaves no journal of its own; an
    interruption keeps it to resume from, and a resumed journal is never removed."""
    options = dict(heal_steps=4, max_drop=2.0, confidence=0.0, bridge="none", budget=4, images=200, seed=0)
    real_heal, healed = truncate_module.heal, []

    def heal_then(error, after=1):
        def heal(*args, **kwargs):
            if len(healed) == after:
                raise error
            healed.append(kwargs["max_steps"])
            return real_heal(*args, **kwargs)
        return heal
    journal = tmp_path / "search.jsonl"
    monkeypatch.setattr(truncate_module, "heal", heal_then(ValueError("refused")))
    with pytest.raises(ValueError, match="refused"):
        truncate(idle_ckpt, None, journal=journal, **options)
    assert not journal.exists()

    healed.clear()
    monkeypatch.setattr(truncate_module, "heal", heal_then(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        truncate(idle_ckpt, None, journal=journal, **options)
    started = journal.read_text()
    healed.clear()
    monkeypatch.setattr(truncate_module, "heal", heal_then(ValueError("refused"), after=0))
    with pytest.raises(ValueError, match="refused"):
        truncate(idle_ckpt, None, journal=journal, resume=True, **options)
    assert journal.read_text().startswith(started)  # resumed: kept, with what it finished
