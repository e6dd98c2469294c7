"""`isiwatch demo --quick` end to end, `isiwatch report`, and the report page in headless Chromium."""

import html
import json
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_truncate_explain import DEMO
from test_watch import tiny_vit

import isiwatch
import isiwatch.cli.demo as demo_module
from isiwatch import Watch
from isiwatch._utils.files import write_json
from isiwatch.cli.commands import main
from isiwatch.cli.demo_models import QUICK
from isiwatch.cli.offline import analysis_record
from isiwatch.cli.report import read_run, write_report
from isiwatch.cli.truncate import truncate as truncate_command
from isiwatch.io.data import embedded_digits
from isiwatch.measure.depth import recommend_depth
from isiwatch.measure.tables import recommendation_text
from isiwatch.measure.vocabulary import PHASES, plateau_name
from isiwatch.truncation.explain import story_lines
from isiwatch.truncation.truncate_report import verdict_line

SERVE_S = 3
SERVED = {}  # what demo_run's scraper saw
TRAINED_FUSED = []  # the fused_attn flag of every attention module when the demo started training


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """The quick demo, with ``--serve``: a thread scrapes its Prometheus endpoint twice a second meanwhile."""
    out = tmp_path_factory.mktemp("demo")
    port, scrapes, done = free_port(), [], threading.Event()

    def scrape():
        while not done.wait(0.5):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                    scrapes.append((time.monotonic(), response.read().decode()))
            except OSError:
                pass

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    real_train = demo_module.train_classifier

    def train(model, *args, **kwargs):  # what attention path the demo's training takes
        TRAINED_FUSED.extend(m.fused_attn for m in model.modules() if hasattr(m, "fused_attn"))
        return real_train(model, *args, **kwargs)

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(demo_module, "train_classifier", train)
            result = CliRunner().invoke(main, ["demo", "--quick", "--out", str(out), "--prometheus-port", str(port),
                                               "--serve", str(SERVE_S)])
    finally:
        ended = time.monotonic()
        done.set()
        scraper.join()
    assert result.exit_code == 0, result.output
    SERVED.update(scrapes=scrapes, ended=ended, port=port)
    return out, result.output


def test_demo_serve_keeps_the_exporter_up_after_the_demo_then_closes_it(demo_run):
    out, output = demo_run
    scrapes, ended, port = SERVED["scrapes"], SERVED["ended"], SERVED["port"]
    assert f"serving the run's last Prometheus metrics at http://127.0.0.1:{port}/metrics for {SERVE_S} s" in output
    last_time, last_text = scrapes[-1]
    assert ended - last_time < SERVE_S + 0.6  # still answering in the serve window, after analysis and truncation
    assert f'isiwatch_training_step{{run="demo"}} {QUICK.epochs * 32}.0' in last_text  # the final sample
    assert 'isiwatch_alert_active{kind="plateau_onset",run="demo"}' in last_text
    with pytest.raises(OSError):  # closed when the serve time is over
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_bad_serve_values_are_refused_before_anything_is_written(tmp_path):
    for value in ("-1", "nan", "soon"):
        result = CliRunner().invoke(main, ["demo", "--quick", "--serve", value, "--out", str(tmp_path / "d")])
        assert result.exit_code == 1 and result.output.splitlines()[-1].startswith("Error: Invalid value for '--serve'")
        assert not (tmp_path / "d").exists()


def test_quick_demo_writes_the_run_directory(demo_run):
    out, output = demo_run
    for name in ("metrics.jsonl", "alerts.jsonl", "analysis.json", "curves.png", "model.pt", "truncated.pt",
                 "truncate_report.json", "report/report.html", "report/heatmaps.png", "report/plateau.png"):
        assert (out / name).is_file(), name
    events = EventAccumulator(str(out))
    events.Reload()
    assert "isiwatch/isi/layer_00" in events.Tags()["scalars"]
    analysis = json.loads((out / "analysis.json").read_text())
    assert len(analysis["layers"]) == QUICK.depth and analysis["model"]["sha256"]
    samples = (out / "metrics.jsonl").read_text().splitlines()
    steps = QUICK.epochs * 32  # 4,000 digits in batches of 128
    assert [json.loads(s)["step"] for s in samples] == list(range(QUICK.every_n_steps, steps + 1, QUICK.every_n_steps))
    assert all(1 <= json.loads(s)["recommendation"]["depth"] <= QUICK.depth for s in samples)
    assert "recommended depth at the last sample" in (out / "report" / "report.html").read_text()
    assert "phases (token_similarity)" in output and "accuracy validation n=500 " in output
    report = json.loads((out / "truncate_report.json").read_text())
    search = report["search"]
    # a real cut, certified within the bound the demo states, trained far enough for the cut to mean something
    assert report["cost"]["truncated"]["blocks"] < QUICK.depth and search["winner"] is not None
    assert f"--max-drop {QUICK.max_drop:g} --confidence 0.95" in output
    assert f"cut to {len(report['kept_blocks'])} of {QUICK.depth} blocks" in output
    lines = output.splitlines()
    assert lines[lines.index(verdict_line(report)) + 1:][:len(story_lines(report))] == story_lines(report)
    assert f"recommended: {analysis['recommendation']['depth']} of {QUICK.depth} blocks (" in output
    assert ": a signal from one analysis pass of the trained (uncut) model, no healing; truncate checks" in output
    assert "(the held-out digits halved, as truncate scores them below)" in output
    # one uncut accuracy per split: the demo's figures are the ones truncate's tables show
    assert f"uncut accuracy validation n=500 {search['uncut_validation_accuracy']:.3f}" in output
    assert f"accuracy validation n=500 {search['uncut_validation_accuracy']:.3f}, test n=500 " in output
    certifiable = output.index(f"auto: {search['validation_images']} validation images; a cut that changes no "
                               "prediction needs ")
    assert certifiable < output.index("uncut accuracy validation n=")  # said before the search, as truncate says it
    assert search["winner"]["validation_drop"]["upper_bound_points"] <= QUICK.max_drop  # the model written
    assert analysis["model"]["held_out_accuracy"] >= 0.85
    # the phase-change lines follow metrics.jsonl sample by sample; the final line is analysis.json's phases
    # a flat stretch has one name, the vocabulary's, in every line: "slow start" from block 0, else "plateau"
    spans = [(r["step"], f"{plateau_name(span)} {span[0]}–{span[1]}" if r["phases"] and (span := r["phases"]["plateau"])
              else "no flat stretch") for r in map(json.loads, samples)]
    changes = [(step, span) for i, (step, span) in enumerate(spans) if i == 0 or span != spans[i - 1][1]]
    printed = [(int(step), span) for step, span in re.findall(
        r"step (\d+): ((?:plateau|slow start) \d+–\d+|no flat stretch) \(token_similarity\)", output)]
    assert printed == changes
    for name in {span.rsplit(" ", 1)[0] for _, span in changes} - {"no flat"}:  # each defined once, when first shown
        assert output.count(f"({name}: {PHASES[name]}") == 1, name
    ph = analysis["phases"]
    named = {"cliff": "cliff", "climb": "climb", "plateau": "plateau" if ph["cliff"] else "slow start"}
    final = ", ".join(f"{named[name]} {ph[name][0]}–{ph[name][1]}" for name in ("cliff", "plateau", "climb")
                      if ph[name]) if ph["plateau"] else "no flat stretch (no plateau, no slow start)"
    assert f"phases (token_similarity): {final}\n" in output
    alerts = [json.loads(line) for line in (out / "alerts.jsonl").read_text().splitlines()]
    assert alerts and all(f"[{a['severity']}] step {a['step']}: {a['kind']}: {a['message']}" in output for a in alerts)


def test_the_demo_ends_with_the_next_commands_that_fit_its_run(demo_run):
    """Where the report is, TensorBoard on the run, and (the trained model having a flat stretch or a recommended
    depth below its own) the truncate command on the demo's checkpoint, which the CLI's parser accepts."""
    out, output = demo_run
    lines = output.splitlines()
    start = lines.index("next:")
    assert lines[start + 1:start + 3] == [f"  open the report: {out / 'report' / 'report.html'}",
                                          f"  browse the run's curves: tensorboard --logdir {out}"]
    analysis = json.loads((out / "analysis.json").read_text())
    fewer = analysis["phases"]["plateau"] is not None or analysis["recommendation"]["depth"] < QUICK.depth
    assert fewer  # the quick demo's model (seed 0) shows it: the line below is tested
    words = shlex.split(lines[start + 3].split(": ", 1)[1])
    assert words == ["isiwatch", "truncate", str(out / "model.pt"), "--data", "mnist", "--analysis",
                     str(out / "analysis.json"), "--max-drop", "1", "--out", str(out / "truncated-max-drop-1.pt")]
    assert truncate_command.make_context("truncate", words[2:]).params["analysis"] == out / "analysis.json"
    assert lines[start + 4].startswith("serving the run's last Prometheus metrics")  # the demo's next steps end


def test_report_command_and_bad_run_dir(demo_run, tmp_path):
    out, _ = demo_run
    result = CliRunner().invoke(main, ["report", str(out), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert f"next:\n  open the report: {tmp_path / 'r' / 'report.html'}\n" in result.output
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
    with Watch(model, px, py, every_n_steps=1, log_dir=run, run_folder=".") as watch:
        watch.step(1)
        watch.step(2)
    at_last = watch.history[-1].recommendation.to_dict()
    result = isiwatch.analyze(model, px, py)
    write_json(run / "analysis.json", analysis_record(result))
    trained = recommend_depth(result).to_dict()
    page = write_report(run, tmp_path / "new")[-1].read_text()
    assert (f"<td>recommended depth of the trained model (the analysis images: one pass, no healing)</td>"
            f"<td>{recommendation_text(trained)}</td>") in page
    last = html.escape("recommended depth at the last sample (the Watch's probe images)")
    assert f"<td>{last}</td><td>{recommendation_text(at_last)}</td>" in page
    assert f"{trained['depth']} of 4 blocks (signal {trained['signal']}; " in page

    # files written before the recommendation existed: no recommendation rows, the rest of the report intact
    write_json(run / "analysis.json", result.to_dict())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "recommendation"})
                                               + "\n" for r in rows))
    assert read_run(run).recommendation is None
    page = write_report(run, tmp_path / "old")[-1].read_text()
    assert "recommended depth" not in page and "<td>plateau_onset alerts</td>" in page and page.count("<img ") == 3


def test_out_of_range_prometheus_port_is_refused_before_anything_is_written(tmp_path):
    result = CliRunner().invoke(main, ["demo", "--quick", "--prometheus-port", "99999", "--out", str(tmp_path / "d")])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "'--prometheus-port': 99999 is not in the range 0<=x<=65535" in result.output
    assert list(tmp_path.iterdir()) == []


def three_samples(run: Path, **options) -> Path:
    """A Watch's log of three samples of a tiny ViT on 64 held-out digits, written into the folder ``run``."""
    x, y = embedded_digits()
    with Watch(tiny_vit(), x[4000:4064], y[4000:4064], every_n_steps=1, log_dir=run, run_folder=".",
               **options) as watch:
        for step in (1, 2, 3):
            watch.step(step)
    return run


@pytest.fixture(scope="module")
def watched_run(tmp_path_factory):
    return three_samples(tmp_path_factory.mktemp("watched") / "run")


@pytest.fixture
def run_copy(watched_run, tmp_path):
    return Path(shutil.copytree(watched_run, tmp_path / "run"))


def report(run, out):
    return CliRunner().invoke(main, ["report", str(run), "--out", str(out)])


def test_report_names_slow_start_and_plateau_episodes_with_their_cleared_records(run_copy, tmp_path):
    """Each episode's opening and its *_cleared record, where alerts.jsonl has them: a slow start that became the
    paper's plateau at step 2 and a plateau still open at the end."""
    records = [{"kind": kind, "step": step, "time": 0.0, "run": "r", "severity": "info", "message": kind, "data": {}}
               for kind, step in (("slow_start", 1), ("slow_start_cleared", 2), ("plateau_onset", 2))]
    (run_copy / "alerts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert report(run_copy, tmp_path / "r").exit_code == 0
    page = (tmp_path / "r" / "report.html").read_text()
    assert "<td>slow_start alerts</td><td>step 1 – cleared at step 2</td>" in page
    assert "<td>plateau_onset alerts</td><td>step 2 (open)</td>" in page


def test_report_skips_a_cut_off_last_line_with_a_warning(run_copy, tmp_path):
    metrics = run_copy / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join(lines) + "\n" + lines[-1][:57])  # what a run killed mid-write leaves
    result = report(run_copy, tmp_path / "r")
    assert result.exit_code == 0, result.output
    assert result.stderr == f"warning: {metrics}:4: skipped the cut-off last line (the run stopped while writing it)\n"
    assert "<td>samples</td><td>3</td>" in (tmp_path / "r" / "report.html").read_text()
    alerts = run_copy / "alerts.jsonl"
    alerts.write_text(alerts.read_text() + '{"step": 3, "kind": "pla')
    assert report(run_copy, tmp_path / "r2").exit_code == 0 and (tmp_path / "r2" / "report.html").is_file()


@pytest.mark.parametrize("name, edit, message", [
    ("metrics.jsonl", lambda lines: [lines[0], lines[1][:40], lines[2]], "metrics.jsonl:2: not a JSON line"),
    ("metrics.jsonl", lambda lines: [lines[0], lines[1].replace('"duration_s": ', '"duration_s": "x", "_": '),
                                     lines[2]], "metrics.jsonl:2: 'duration_s' is missing or not a number"),
    ("metrics.jsonl", lambda lines: [lines[0], lines[1], lines[2].replace('"isi": [', '"isi": ["a", ')],
     "metrics.jsonl:3: 'layers.isi' is not a list of numbers"),
    ("alerts.jsonl", lambda lines: ['{"step": 1, "kind": "x"}', '{"step": 2}'],
     "alerts.jsonl:1: 'severity' is missing or not a string"),
    ("truncate_report.json", lambda lines: ['{"strategy": "tail", "kept_blocks": [0, 1]}'],
     "truncate_report.json: not an isiwatch truncation report (missing 'healing_steps')"),
    ("truncate_report.json", lambda lines: ["[1, 2]"], "truncate_report.json: not an isiwatch truncation report"),
    ("analysis.json", lambda lines: ['{"layers": 3}'], "analysis.json: not an isiwatch analysis"),
])
def test_report_checks_every_input_before_writing_anything(run_copy, tmp_path, name, edit, message):
    path = run_copy / name
    lines = path.read_text().splitlines() if path.exists() else []
    path.write_text("\n".join(edit(lines)) + "\n")
    result = report(run_copy, tmp_path / "r")
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"Error: {run_copy / message}"), result.output
    assert not (tmp_path / "r").exists() and not (run_copy / "report").exists()


def test_a_report_that_fails_while_writing_leaves_the_old_one(run_copy, tmp_path, monkeypatch):
    import isiwatch.cli.report as report_module

    assert report(run_copy, tmp_path / "r").exit_code == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir()}

    def fail(*args, **kwargs):
        raise RuntimeError("killed while plotting")

    monkeypatch.setattr(report_module, "plot_plateau_timeline", fail)
    assert report(run_copy, tmp_path / "r").exit_code == 1
    assert {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir()} == before
    assert report(run_copy, tmp_path / "new").exit_code == 1 and sorted(p.name for p in tmp_path.iterdir()) == [
        "r", "run"]


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def test_report_renders_in_headless_chromium_with_plots_visible(demo_run, tmp_path):
    """The page explains itself: every column of the per-layer table is defined, the truncation candidates show
    the bound and their verdict, the slow start / plateau onset episodes are named, and every plot is shown large
    enough to read (heat-map panels at least 400 px wide)."""
    out, _ = demo_run
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is required (.ci/run installs it)"
    page = (out / "report" / "report.html").resolve()
    dom = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                          "--window-size=1200,2000", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    images = page.read_text().count("<img ")
    assert images == 3  # per-layer curves, heat-maps, plateau timeline
    assert f'data-images-loaded="{images}"' in dom.stdout  # every embedded plot decoded
    sizes = dict(item.split(":") for item in re.search(r'data-image-sizes="([^"]*)"', dom.stdout)[1].split(";"))
    shown = {alt: tuple(map(int, size.split("x"))) for alt, size in sizes.items()}
    assert all(width >= 800 and height >= 250 for width, height in shown.values()), shown
    assert shown["heat-maps"][0] / 2 >= 400 and shown["heat-maps"][1] >= 500, shown  # two panels a row
    body = re.sub(r"<[^>]+>", " ", dom.stdout.split("<body", 1)[1])
    header = re.search(r"<h2>Per-layer curves of the trained model</h2>.*?<thead><tr>(.*?)</tr>", dom.stdout, re.S)[1]
    columns = [html.unescape(c) for c in re.findall(r"<th>(.*?)</th>", header)]
    defined = [html.unescape(t) for t in re.findall(r"<dt>(.*?)</dt>", dom.stdout)]
    assert {"layer", "bi", "probe_pm", "tok_sim", "phase"} <= set(columns) and set(columns) <= set(defined)
    for text in ("pre_pe: the patch embeddings", f"slow start: {PHASES['slow start']}", "plateau_onset alerts",
                 "Candidates", "a cut qualifies when the upper 95 % confidence bound of its paired validation drop",
                 "the bound decides, not the observed drop", "verdict", "bi: ", "truncation (validated cut)"):
        assert text in html.unescape(body), text
    report = json.loads((out / "truncate_report.json").read_text())
    for line in story_lines(report):  # the terminal's story, on the page
        assert line in html.unescape(body), line
    candidates = re.search(r"<h3>Candidates</h3>.*?<thead><tr>(.*?)</tr>", dom.stdout, re.S)[1]
    assert {"images", "drop", "upper bound", "verdict"} <= set(re.findall(r"<th>(.*?)</th>", candidates))
    assert "<th>resumed</th>" not in dom.stdout  # none was resumed
    verdicts = re.findall(r"<td>(winner|within the bound|outside the bound: the sequence stops)</td>", dom.stdout)
    assert len(verdicts) == len(report["search"]["candidates"]) >= 1
    shot = tmp_path / "page.png"
    subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile2'}",
                    "--window-size=1200,2000", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    from PIL import Image

    image = Image.open(shot).convert("L")
    colours = image.getcolors(maxcolors=1 << 16) or []
    assert image.size == (1200, 2000) and len(colours) > 50  # plots, not a blank page


def test_bench_demo_records_phase_seconds_cut_and_bound_per_run(tmp_path):
    """benchmarks/bench_demo.py at --smoke size (a check that it runs, no figures): per seed × threads the wall
    time split into phases that add up to it, the cut's record and the held-out accuracy."""
    out = tmp_path / "demo.json"
    bench = Path(__file__).parents[1] / "benchmarks"
    done = subprocess.run([sys.executable, str(bench / "bench_demo.py"), "--smoke", "--seeds", "0", "--threads", "1",
                           "--modes", "quick", "--out", str(out)], cwd=bench, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    assert (run["mode"], run["seed"], run["threads"]) == ("quick", 0, 1)
    phases = run["phase_seconds"]
    assert list(phases) == ["startup", "data", "watch", "training", "evaluation", "analysis", "truncate", "report",
                            "other"]
    assert all(value > 0 for name, value in phases.items() if name != "other")
    assert sum(phases.values()) == pytest.approx(run["seconds"])
    assert phases["startup"] < run["seconds"] and 0 <= run["held_out_accuracy"] <= 1
    assert run["depth"] == 2 and run["max_drop"] == QUICK.max_drop and "upper_bound_points" in run
    assert data["summary"]["quick"]["slowest_run_phase_seconds"] == phases
    refused = subprocess.run([sys.executable, str(bench / "bench_demo.py"), "--smoke"], cwd=bench,
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "--smoke records no figures" in refused.stderr


def test_the_demo_trains_with_explicit_attention_and_analyses_with_the_models_own(demo_run):
    """Training takes timm's explicit softmax path (faster than the fused kernel for 17 tokens on CPU); evaluation
    and analysis after it take the fused path again, as `isiwatch analyze model.pt` does."""
    import torch

    assert len(TRAINED_FUSED) == QUICK.depth and not any(TRAINED_FUSED)  # the demo itself trained unfused

    from isiwatch.cli.demo import explicit_attention
    from isiwatch.truncation.healing import make_digits_vit

    model, _ = make_digits_vit(0, depth=2)
    attention = [m for m in model.modules() if hasattr(m, "fused_attn")]
    assert len(attention) == 2 and all(m.fused_attn for m in attention)
    x = embedded_digits()[0][:8]
    model.eval()
    with torch.no_grad():
        fused = model(x)
        with explicit_attention(model):
            assert not any(m.fused_attn for m in attention)
            explicit = model(x)
    assert all(m.fused_attn for m in attention)
    torch.testing.assert_close(explicit, fused, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError), explicit_attention(model):
        raise RuntimeError("training failed")
    assert all(m.fused_attn for m in attention)


# -- the plots: labelled axes and colour bars, alert labels inside the frame and apart ---------------------------
def drawn_figures(monkeypatch):
    """The figures the plot functions save, kept open instead of written."""
    from isiwatch.measure import plots

    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or Path(path))
    return figures


def test_every_curve_and_colour_bar_is_labelled(monkeypatch, tmp_path):
    """Each curve panel names its y axis (the metric's label and range) and each heat-map's colour bar names the
    metric it scales, in a panel drawn alone and in the exporter's one figure updated in place."""
    from isiwatch.measure.analysis import METRICS, Analysis
    from isiwatch.measure.plots import HeatmapPanel, heatmap_figure, plot_curves, value_label

    figures = drawn_figures(monkeypatch)
    layers = {m: [0.1 * b for b in range(4)] for m in METRICS}
    plot_curves(Analysis(layers, {}, {"depth": 4}), tmp_path / "curves.png")
    panels = [ax for ax in figures[0].axes if ax.lines]
    assert [ax.get_ylabel() for ax in panels] == [value_label(m) for m in METRICS]
    assert value_label("isi") == "isi in [0, 2]" and value_label("isi_recon") == "isi_recon"
    steps, grid = [10, 20], [[0.5, 0.25], [0.4, 0.2]]
    fig = heatmap_figure(steps, {"isi": grid, "probe_cls": grid})
    bars = [ax for ax in fig.axes if not ax.images]  # the colour bars' axes
    assert [bar.get_ylabel() for bar in bars] == [value_label("isi"), value_label("probe_cls")]
    assert [f.axes[1].get_ylabel() for _, f in HeatmapPanel().draw(steps, {"isi": grid, "tok": grid})] == [
        value_label("isi"), "tok"]


def test_alert_labels_stay_inside_the_frame_and_apart(monkeypatch, tmp_path):
    """Records of one step share one label; crowded steps, a record at the first and at the last step: every label
    inside the axes, none on another, the legend and axis labels inside the figure and off the plot."""
    from isiwatch.measure.plots import plot_plateau_timeline

    figures = drawn_figures(monkeypatch)
    steps = list(range(16, 321, 16))
    spans = [None] * 3 + [(0, 2)] * 5 + [(2, 4)] * 12
    alerts = [(16, "cls_marginalized"), (64, "slow_start"), (128, "slow_start_cleared"), (128, "plateau_onset"),
              (144, "isi_stall"), (146, "isi_stall_cleared"), (148, "non_finite"), (150, "non_finite_cleared"),
              (320, "cls_marginalized_cleared")]
    plot_plateau_timeline(steps, spans, 6, alerts, tmp_path / "plateau.png", "token_similarity")
    (fig,) = figures
    (ax,) = fig.axes
    renderer = fig.canvas.get_renderer()
    drawn = fig.get_tightbbox(renderer).transformed(fig.dpi_scale_trans)  # inches -> pixels
    assert fig.bbox.padded(1).contains(drawn.x0, drawn.y0) and fig.bbox.padded(1).contains(drawn.x1, drawn.y1)
    legend = fig.legends[0]
    assert not legend.get_window_extent(renderer).overlaps(ax.get_tightbbox(renderer))  # below the step axis
    frame = ax.get_window_extent(renderer)
    boxes = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts}
    assert "slow_start_cleared, plateau_onset" in boxes and "cls_marginalized" in boxes  # one label a step
    assert "cls_marginalized_cleared" in boxes  # the last step's, inside the frame too
    for text, box in boxes.items():
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, text
        assert not any(box.overlaps(other) for o, other in boxes.items() if o != text), text
    names = {t.get_text() for t in legend.get_texts()}
    assert {"plateau_onset", "isi_stall", "dotted: the episode cleared", "plateau (after a Cliff)"} <= names
    assert ax.get_ylabel() == "block" and ax.get_xlabel() == "training step"


# -- the truncation section: one story with the terminal ------------------------------------------------------
def truncation_report(**search):
    """The issue's demo report (test_truncate_explain.DEMO) with the cost and accuracy fields a report has."""
    cost = {"blocks": 12, "parameters": 100, "flops_per_image": 2e6, "latency_ms": 3.0}
    return {**DEMO, "latency_batch": 64, "cost": {"uncut": cost, "truncated": {**cost, "blocks": 9}},
            "accuracy": {"uncut": 0.89, "cut": 0.80, "healed": 0.88}, "agreement": {"cut": 0.85, "healed": 0.95},
            "search": {**DEMO["search"], "uncut_validation_accuracy": 0.89, "validation_images": 500,
                       "test": {"points": 0.4, "images": 500, "within_max_drop": True},
                       "rule": {"method": "Clopper-Pearson on each discordant count", "alpha": 0.05}, **search}}


def test_the_truncation_section_tells_the_terminals_story_with_a_full_candidates_table():
    """The depth story, the dropped blocks' reason and the sequence line as on the terminal; the candidates with
    their repair, what chose it, validation images, drop, upper bound and verdict; the caption says the bound, not
    the observed drop, decides; no resumed column unless one was resumed."""
    from isiwatch.truncation.explain import story_lines
    from isiwatch.truncation.report_html import truncation_section

    report = truncation_report()
    section = html.unescape(truncation_section(report))
    for line in story_lines(report):
        assert line in section, line
    header = re.search(r"<h3>Candidates</h3>.*?<thead><tr>(.*?)</tr>", section, re.S)[1]
    columns = re.findall(r"<th>(.*?)</th>", header)
    assert columns[:11] == ["repair", "heal-image bound", "strategy", "blocks", "kept", "heal steps",
                            "images", "val cut", "val repaired", "drop", "upper bound"]
    assert columns[-1] == "verdict" and "resumed" not in columns
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(<td>.*?)</tr>", section.split(
        "<h3>Candidates</h3>")[1])]
    winner = next(row for row in rows if row[-1] == "winner")
    assert winner[:11] == ["healed", "cut 8.10 / bridged 5.60", "bi", "9", "0–8", "64", "500",
                           "0.850", "0.870", "-0.20", "2.34"]
    assert rows[-1][0] == "healed" and rows[-1][-1] == "outside the bound: the sequence stops"
    assert "the bound decides, not the observed drop" in section and "upper 95 % confidence bound" in section
    assert "(healed)" in section.split("<table>")[0]  # the caption names the winner's repair
    resumed = truncation_report(candidates=[{**c, "resumed": i == 0} for i, c in enumerate(
        DEMO["search"]["candidates"])])
    assert "<th>resumed</th>" in truncation_section(resumed)
