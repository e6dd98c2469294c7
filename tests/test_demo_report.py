"""`isiwatch demo --quick` end to end, `isiwatch report`, and the report page in headless Chromium."""

import json
import shutil
import subprocess

import pytest
from click.testing import CliRunner
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_watch import tiny_vit

import isiwatch
from isiwatch import Watch
from isiwatch.cli import main
from isiwatch.data import embedded_digits
from isiwatch.depth import recommend_depth
from isiwatch.files import write_json
from isiwatch.offline import analysis_record
from isiwatch.report import read_run, write_report
from isiwatch.tables import recommendation_text


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    result = CliRunner().invoke(main, ["demo", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, result.output


def test_quick_demo_writes_the_run_directory(demo_run):
    out, output = demo_run
    for name in ("metrics.jsonl", "alerts.jsonl", "analysis.json", "curves.png", "model.pt", "truncated.pt",
                 "truncate_report.json", "report/report.html", "report/heatmaps.png", "report/plateau.png"):
        assert (out / name).is_file(), name
    events = EventAccumulator(str(out))
    events.Reload()
    assert "isiwatch/isi/layer_00" in events.Tags()["scalars"]
    analysis = json.loads((out / "analysis.json").read_text())
    assert len(analysis["layers"]) == 8 and analysis["model"]["sha256"]
    samples = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(s)["step"] for s in samples] == list(range(8, 65, 8))
    assert all(1 <= json.loads(s)["recommendation"]["depth"] <= 8 for s in samples)
    assert "recommended depth at the last sample" in (out / "report" / "report.html").read_text()
    assert "phases (token_similarity)" in output and "held-out accuracy" in output
    report = json.loads((out / "truncate_report.json").read_text())
    assert report["cost"]["truncated"]["blocks"] < 8
    assert (("plateau" in output) == (analysis["phases"]["plateau"] is not None)) or "no plateau" in output


def test_report_command_and_bad_run_dir(demo_run, tmp_path):
    out, _ = demo_run
    result = CliRunner().invoke(main, ["report", str(out), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert {p.name for p in (tmp_path / "r").iterdir()} == {"curves.png", "heatmaps.png", "plateau.png",
                                                              "report.html"}
    result = CliRunner().invoke(main, ["report", str(tmp_path / "nowhere")])
    assert result.exit_code == 1 and "no such run directory" in result.output
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(main, ["report", str(tmp_path / "empty")])
    assert result.exit_code == 1 and "no samples" in result.output


def test_report_shows_the_recommended_depth_and_reads_older_files(tmp_path):
    x, y = embedded_digits()
    px, py = x[4000:4064], y[4000:4064]
    model, run = tiny_vit(), tmp_path / "run"
    with Watch(model, px, py, every_n_steps=1, log_dir=run) as watch:
        watch.step(1)
        watch.step(2)
    at_last = watch.history[-1].recommendation.to_dict()
    result = isiwatch.analyze(model, px, py)
    write_json(run / "analysis.json", analysis_record(result))
    trained = recommend_depth(result).to_dict()
    page = write_report(run, tmp_path / "new")[-1].read_text()
    assert f"<td>recommended depth of the trained model</td><td>{recommendation_text(trained)}</td>" in page
    assert f"<td>recommended depth at the last sample</td><td>{recommendation_text(at_last)}</td>" in page
    assert f"{trained['depth']} of 4 blocks (signal {trained['signal']}; " in page

    # files written before the recommendation existed: no recommendation rows, the rest of the report intact
    write_json(run / "analysis.json", result.to_dict())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "recommendation"})
                                               + "\n" for r in rows))
    assert read_run(run).recommendation is None
    page = write_report(run, tmp_path / "old")[-1].read_text()
    assert "recommended depth" not in page and "<td>plateau onset</td>" in page and page.count("<img ") == 3


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def test_report_renders_in_headless_chromium_with_plots_visible(demo_run, tmp_path):
    out, _ = demo_run
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is required (.ci/run installs it)"
    page = (out / "report" / "report.html").resolve()
    dom = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                          "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    images = page.read_text().count("<img ")
    assert images == 3  # per-layer curves, heat-maps, plateau timeline
    assert f'data-images-loaded="{images}"' in dom.stdout  # every embedded plot decoded
    shot = tmp_path / "page.png"
    subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile2'}",
                    "--window-size=1200,2000", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    from PIL import Image

    image = Image.open(shot).convert("L")
    colours = image.getcolors(maxcolors=1 << 16) or []
    assert image.size == (1200, 2000) and len(colours) > 50  # plots, not a blank page
