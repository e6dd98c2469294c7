"""`isiwatch truncate` when ``auto`` certifies nothing (it writes nothing and exits with its own status) and its
checks on the labels and images before any search (issues 40 and 41)."""


import json

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
KWARGS = {"img_size": 28, "patch_size": 7, "in_chans": 1, "num_classes": 10, "embed_dim": 32, "depth": 2,
          "num_heads": 2}
#: A short search: one healed candidate of one healing step, on the analysis of 64 digits.
QUICK = ["--budget", "1", "--heal-steps", "1", "--images", "64", "--device", "cpu"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-block ViT trained briefly on the 4,000 healing digits (about 0.59 on the other 1,000): well above
    chance, and every block does work."""
    images, labels = embedded_digits()
    torch.manual_seed(0)
    model = timm.create_model(ARCH, pretrained=False, **KWARGS)
    train_classifier(model, images[:4000], labels[:4000], epochs=6, lr=3e-3, batch_size=128)
    return save_checkpoint(tmp_path_factory.mktemp("trained") / "model.pt", ARCH, KWARGS, model.state_dict())


def test_no_certified_cut_writes_its_report_but_no_model_and_exits_with_its_own_status(trained, tmp_path,
                                                                                       monkeypatch):
    """Issue 48.5: the report asked for is the record of the decision, written on exit 3 too."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["truncate", str(trained), "--out", "cut.pt", "--report", "r.json",
                                       "--max-drop", "1", "--bridge", "none", "--epochs", "0", *QUICK])
    assert result.exit_code == NO_CERTIFIED_CUT != 1, result.output
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no cut.pt, no cut.pt.search.jsonl
    search = json.loads((tmp_path / "r.json").read_text())["search"]
    assert search["winner"] is None and search["candidates"] and search["message"].startswith("no cut: ")
    assert search["to_certify"]["max_drop"] > 1 and search["to_certify"]["keep"] == 1
    last = result.output.splitlines()[-1]
    assert last.startswith("no certified cut, no model written: the nearest candidate, ")
    assert "would be certified with --max-drop " in last
    assert "validate.py" not in result.output  # 'mnist' is no folder validate.py reads
    assert f"{NO_CERTIFIED_CUT} auto certified no cut" in CliRunner().invoke(main, ["truncate", "--help"]).output


def test_a_one_block_model_is_refused_before_any_data_analysis_or_file(tmp_path, monkeypatch):
    """Issue 48.2: a depth truncate cannot cut is refused in one line before the data is read, and leaves no
    journal."""
    import isiwatch.truncation.plan as truncate_module

    def never(*a, **k):
        raise AssertionError("the data was read for a model that cannot be cut")
    monkeypatch.setattr(truncate_module, "load_split", never)
    torch.manual_seed(0)
    one = timm.create_model(ARCH, pretrained=False, **{**KWARGS, "depth": 1})
    save_checkpoint(tmp_path / "one.pt", ARCH, {**KWARGS, "depth": 1}, one.state_dict())
    monkeypatch.chdir(tmp_path)
    for extra in ([], ["--strategy", "tail"], ["--strategy", "tail", "--keep", "1"]):
        result = CliRunner().invoke(main, ["truncate", "one.pt", "--out", "cut.pt", "--data", "mnist", *extra])
        assert result.exit_code == 1, result.output
        assert result.output == "Error: one.pt has 1 block: nothing can be cut from it (truncate needs at least 2)\n"
        assert [p.name for p in tmp_path.iterdir()] == ["one.pt"]


def test_a_train_last_no_cut_can_honour_is_refused_before_any_data(trained, tmp_path, monkeypatch):
    """Issue 48.2: --train-last above the blocks a cut keeps (this 2-block model's cuts keep 1) is refused in one
    line before the data is read, for a fixed --keep and for auto."""
    import isiwatch.truncation.plan as truncate_module

    def never(*a, **k):
        raise AssertionError("the data was read for a request that cannot be honoured")
    monkeypatch.setattr(truncate_module, "load_split", never)
    monkeypatch.chdir(tmp_path)
    for extra in (["--strategy", "tail", "--keep", "1"], []):
        result = CliRunner().invoke(main, ["truncate", str(trained), "--out", "cut.pt", "--train-last", "2", *extra])
        assert result.exit_code == 1, result.output
        assert result.output == "Error: --train-last must be at most 1, the blocks the cut keeps, got 2\n"
        assert list(tmp_path.iterdir()) == []


def test_the_api_says_no_cut_and_writes_no_file(trained, tmp_path):
    options = dict(budget=1, epochs=0, bridge="none", images=64)  # no repair to choose: the same cut at any max drop
    result = truncate(trained, tmp_path / "cut.pt", max_drop=1, **options)
    assert not result.cut and result.paths == [] and list(tmp_path.iterdir()) == []
    need = result.report["search"]["to_certify"]
    best = min(result.report["search"]["candidates"], key=lambda c: c["validation_drop"]["upper_bound_points"])
    assert need["keep"] == best["keep"] and need["max_drop"] >= best["validation_drop"]["upper_bound_points"]
    again = truncate(trained, None, max_drop=need["max_drop"], **options)
    assert again.cut  # the --max-drop it named certifies a cut


def test_no_max_drop_is_promised_where_it_would_change_the_repair():
    """The repair depends on the max drop (the least one the healing images say would qualify): a candidate healed
    at 1 point whose heal-image bound as cut is 4 points would be tested as cut at 6 points, a model the validation
    split never saw, so no --max-drop is named for it; more validation images that keep the repair are."""
    from isiwatch.truncation.confidence import SearchGuarantee
    from isiwatch.truncation.truncate import to_certify
    from isiwatch.truncation.truncate_report import no_cut_line

    discordant = {"cut": {"uncut_only": 30, "cut_only": 2}}  # of 1,000 healing images: about 4 points on 500
    healed = {"strategy": "bi", "keep": 3, "repair": "heal", "qualifies": False,
              "choice": {"calibration_images": 1000, "discordant": discordant},
              "validation_drop": {"points": 2.0, "upper_bound_points": 5.3, "images": 500, "uncut_only": 14,
                                  "cut_only": 4}}
    search = {"candidates": [healed], "heal_steps": 64, "winner": None, "validation_images": 500}
    need = to_certify(search, SearchGuarantee(1.0, 0.95))
    assert need["max_drop"] is None and need["upper_bound_points"] == 5.3
    line = no_cut_line({"search": {**search, "to_certify": need}})
    assert "had an upper bound of 5.30 points" in line and "no --max-drop is promised" in line
    kept_repair = {**search, "candidates": [{**healed, "choice": {"calibration_images": 1000, "discordant": {
        "cut": {"uncut_only": 300, "cut_only": 2}}}}]}  # as cut far beyond any max drop: healed at 5.3 points too
    need = to_certify(kept_repair, SearchGuarantee(1.0, 0.95))
    assert need["max_drop"] == 5.3 and "would be certified with --max-drop 5.30" in no_cut_line(
        {"search": {**kept_repair, "to_certify": need}})


def test_one_latency_per_model_the_same_in_every_table(trained):
    """Issue 40.3: each depth's latency is measured once (interleaved repeats, with their spread), the candidate
    rows and the summary show the same figure, and a wall-time speed-up is claimed only beyond the spread."""
    from isiwatch.truncation.truncate_report import candidates_table, report_rows, report_table

    result = truncate(trained, None, max_drop=60, budget=1, heal_steps=1, images=64)
    report, search = result.report, result.report["search"]
    assert result.cut
    truncated = report["cost"]["truncated"]
    for c in search["candidates"]:
        if c["keep"] == truncated["blocks"]:
            assert (c["latency_ms"], c["latency_quartiles_ms"]) == (truncated["latency_ms"],
                                                                    truncated["latency_quartiles_ms"])
    low, high = truncated["latency_quartiles_ms"]
    assert low <= truncated["latency_ms"] <= high
    cell = f"{truncated['latency_ms']:.2f} ({low:.2f}-{high:.2f})"
    assert cell in candidates_table(report) and cell in report_table(report)
    header, rows = report_rows(report)
    uncut_q, cut_q = report["cost"]["uncut"]["latency_quartiles_ms"], truncated["latency_quartiles_ms"]
    apart = uncut_q[1] < cut_q[0] or cut_q[1] < uncut_q[0]
    assert (rows[1][header.index("wall speed-up")] == "within noise") is not apart


#: Folder names of the digits 0-9 whose sorted order is the digits' reverse: timm numbers them 9, 8, ..., 0.
NAMES = [f"{chr(ord('j') - d)}_digit" for d in range(10)]


@pytest.fixture(scope="module")
def named_folder(tmp_path_factory):
    """300 of the embedded digits as PNGs in class folders named by ``NAMES``."""
    from PIL import Image

    from isiwatch.io.data import digit_pixels

    pixels, labels = digit_pixels()
    root = tmp_path_factory.mktemp("named")
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(1))[:300]
    for i in order.tolist():
        folder = root / NAMES[int(labels[i])]
        folder.mkdir(exist_ok=True)
        Image.fromarray(pixels[i].numpy()).save(folder / f"{i}.png")
    return root


#: What the folder tests share: digits normalised as the model trained, a bound 30 validation images can certify.
FOLDER = ["--mean", "0.1307", "--std", "0.3081", "--max-drop", "20", *QUICK]


def test_classes_numbered_unlike_the_model_stop_before_healing(trained, named_folder, tmp_path, monkeypatch):
    """Issue 41.8: folders sorted in another order than the model's labels leave the uncut model below chance;
    truncate refuses in one line before any analysis or healing and writes nothing."""
    import isiwatch.truncation.plan as truncate_module

    def never(*a, **k):
        raise AssertionError("the analysis started on labels that do not match")
    monkeypatch.setattr(truncate_module, "analyze", never)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["truncate", str(trained), "--out", "cut.pt", "--data", str(named_folder),
                                       *FOLDER])
    assert result.exit_code == 1, result.output
    assert result.output.count("\n") == 1 and list(tmp_path.iterdir()) == []
    assert "not above chance" in result.output and "sorted folder names" in result.output
    assert "--class-map FILE" in result.output


def test_a_class_map_given_or_recorded_numbers_the_folders(trained, named_folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "classes.json").write_text(json.dumps({name: d for d, name in enumerate(NAMES)}))
    result = CliRunner().invoke(main, ["truncate", str(trained), "--out", "cut.pt", "--data", str(named_folder),
                                       "--class-map", "classes.json", "--report", "r.json", *FOLDER])
    assert result.exit_code in (0, NO_CERTIFIED_CUT), result.output
    # the checkpoint records the map: a later run needs no --class-map (here: the source with the map recorded)
    from isiwatch.io.checkpoint import load_checkpoint

    source = load_checkpoint(trained)
    recorded = save_checkpoint(tmp_path / "recorded.pt", ARCH, KWARGS, source.state_dict,
                               {"class_map": {name: d for d, name in enumerate(NAMES)}})
    again = truncate(recorded, None, data=named_folder, mean=(0.1307,), std=(0.3081,), max_drop=20, budget=1,
                     heal_steps=1, images=64)
    assert again.report["labels"]["numbering"] == "class map"
    assert again.report["labels"]["classes"] == {name: d for d, name in enumerate(NAMES)}


def test_a_corrupt_evaluation_image_stops_before_the_search_and_leaves_no_journal(trained, named_folder, tmp_path,
                                                                                  monkeypatch):
    """Issue 41.9: every validation and test image is decoded before the analysis and the search."""
    import shutil

    import isiwatch.truncation.plan as truncate_module

    def never(*a, **k):
        raise AssertionError("the analysis started before every evaluation image was read")
    monkeypatch.setattr(truncate_module, "analyze", never)
    evaluation = tmp_path / "eval"
    shutil.copytree(named_folder, evaluation)
    (evaluation / NAMES[3] / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    (tmp_path / "classes.json").write_text(json.dumps(NAMES))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["truncate", str(trained), "--out", "cut.pt", "--data", str(named_folder),
                                       "--eval-data", str(evaluation), "--class-map", "classes.json", *FOLDER])
    assert result.exit_code == 1, result.output
    assert result.output.count("\n") == 1 and "broken.jpg" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["classes.json", "eval"]  # no cut.pt.search.jsonl


def test_truncate_auto_ends_with_the_story_of_its_cut(trained, tmp_path, monkeypatch):
    """After the verdict, `isiwatch truncate` tells the recommended depth, the phases and the cut in short lines,
    one fact each, as the demo and the HTML report do (issues 34 #5 and 40)."""
    from isiwatch.truncation.explain import story_lines
    from isiwatch.truncation.truncate_report import verdict_line

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["truncate", str(trained), "--out", "t.pt", "--report", "r.json",
                                       "--max-drop", "60", *QUICK])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    story = story_lines(report)
    assert story[0].startswith(f"recommended: {report['recommendation']['depth']} of 2 blocks")
    assert any(line.startswith("cut: 1 of 2 blocks") for line in story)
    lines = result.stdout.splitlines()
    assert lines[lines.index(verdict_line(report)) + 1:][:len(story)] == story
    accuracy = report["accuracy"]
    assert (accuracy["split"], accuracy["images"]) == ("test", 500)
    assert "accuracy test n=500" in result.stdout and "uncut accuracy validation n=500 " in result.stdout


def test_the_demo_finishes_and_says_no_certified_cut(tmp_path, monkeypatch):
    """The demo calls truncate; when nothing is certified (here: a 2-block model trained 32 steps, a 1-point bound,
    one candidate healed one step) it still finishes, says so, writes its own truncate_report.json for the HTML
    report, and no truncated.pt."""
    import isiwatch.cli.demo as demo_module
    import isiwatch.cli.demo_models as demo_models

    tiny = demo_models.DemoSettings(depth=2, epochs=1, lr=3e-3, every_n_steps=16, max_drop=1.0, cut_budget=1,
                                    heal_steps=1, distill=False)
    monkeypatch.setattr(demo_models, "QUICK", tiny)
    lines: list[str] = []
    summary = demo_module.run_demo(tmp_path / "run", quick=True, prometheus_port=None, echo=lines.append,
                                   progress=False)
    assert summary["truncation"]["search"]["winner"] is None
    assert any(line.startswith("no certified cut, no model written: ") for line in lines)
    run = tmp_path / "run"
    assert (run / "truncate_report.json").is_file() and not (run / "truncated.pt").exists()
    assert not list(run.glob("*.search.jsonl"))
    assert "no certified cut" in (run / "report" / "report.html").read_text()
