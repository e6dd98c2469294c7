"""`isiwatch report` tells the truth about a folder: several runs, a step logged twice, another run's truncation and
a line that is not UTF-8 are each said in one line, never shown as one run without a word."""

import os
import subprocess
import sys

from test_faults import tiny_vit
from test_watch import digits  # noqa: F401  (fixture)

from isiwatch import Watch, analyze
from isiwatch.cli.run_records import _foreign_truncation, _older_than_the_log
from isiwatch.io.checkpoint import sha256_of


def report(run_dir, out):
    return subprocess.run([sys.executable, "-m", "isiwatch", "report", str(run_dir), "--out", str(out)],
                          capture_output=True, text=True)


def log(run_dir, px, py, run, steps):
    with Watch(tiny_vit(), px, py, every_n_steps=1, log_dir=run_dir, run_folder=".", run_name=run,
               heatmap_every=1000) as watch:
        for step in steps:
            watch.step(step, 1.0)


def test_two_runs_and_a_step_logged_twice_are_said(digits, tmp_path):  # noqa: F811
    _, _, px, py = digits
    run_dir = tmp_path / "run"
    log(run_dir, px, py, "first", (1, 2))
    log(run_dir, px, py, "second", (1, 2, 3))
    lines = (run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write(lines[-1])  # "second" logs step 3 twice
    done = report(run_dir, tmp_path / "report")
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2
    assert "holds 2 runs ('first', 'second')" in warnings[0] and "its own folder" in warnings[0]
    assert "run 'second' logged step 3 more than once" in warnings[1]
    page = (tmp_path / "report" / "report.html").read_text()
    assert page.count('<p class="warning">') == 2 and "holds 2 runs" in page


def test_one_run_has_no_warning(digits, tmp_path):  # noqa: F811
    _, _, px, py = digits
    log(tmp_path / "run", px, py, "only", (1, 2))
    done = report(tmp_path / "run", tmp_path / "report")
    assert done.returncode == 0 and "warning" not in done.stderr
    assert '<p class="warning">' not in (tmp_path / "report" / "report.html").read_text()


def test_a_complete_line_that_is_not_utf8_is_named_as_such(digits, tmp_path):  # noqa: F811
    _, _, px, py = digits
    log(tmp_path / "run", px, py, "r", (1, 2))
    with open(tmp_path / "run" / "metrics.jsonl", "ab") as fh:
        fh.write(b'{"step": 3, "run": "r\xff"}\n')  # whole (it ends in a line break), but not UTF-8
    done = report(tmp_path / "run", tmp_path / "report")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("metrics.jsonl:3: not UTF-8 (byte 22 of the line)")
    assert not (tmp_path / "report").exists()
    metrics = (tmp_path / "run" / "metrics.jsonl").read_bytes()
    (tmp_path / "run" / "metrics.jsonl").write_bytes(metrics[:metrics.rindex(b"\xff")] + b"\xc3")  # torn mid-character
    done = report(tmp_path / "run", tmp_path / "report")
    assert done.returncode == 0 and "metrics.jsonl:3: skipped the cut-off last line" in done.stderr


def test_a_truncation_of_another_model_is_said(digits, tmp_path):  # noqa: F811
    _, _, px, py = digits
    result = analyze(tiny_vit(), px, py)
    result.model_info["sha256"] = "a" * 64
    (tmp_path / "model.pt").write_bytes(b"this run's model")
    ours = {"source": {"checkpoint": "elsewhere/model.pt", "sha256": "a" * 64}}
    assert _foreign_truncation(tmp_path, result, ours) == []
    theirs = {"source": {"checkpoint": "elsewhere/model.pt", "sha256": "b" * 64}}
    [line] = _foreign_truncation(tmp_path, result, theirs)
    assert "cut another model than the checkpoint analysis.json analysed" in line
    now = {"source": {"checkpoint": str(tmp_path / "model.pt"), "sha256": "a" * 64}}  # model.pt changed since
    [line] = _foreign_truncation(tmp_path, None, now)
    assert f"than {tmp_path / 'model.pt'} as it is now" in line and sha256_of(tmp_path / "model.pt") != "a" * 64


def test_an_analysis_or_truncation_written_before_the_log_began_is_said(tmp_path):
    """A re-run that was interrupted leaves its new log beside the earlier run's truncation: written before the log's
    first sample, it cannot be this log's."""
    samples = [{"step": 1, "time": 1_000_000.0}, {"step": 2, "time": 1_000_060.0}]
    for name in ("analysis.json", "truncate_report.json"):
        (tmp_path / name).write_text("{}")
    os.utime(tmp_path / "truncate_report.json", (999_999.0, 999_999.0))  # before step 1
    os.utime(tmp_path / "analysis.json", (1_000_030.0, 1_000_030.0))  # after it
    [line] = _older_than_the_log(tmp_path, samples, ["analysis.json", "truncate_report.json"])
    assert line == (f"{tmp_path / 'truncate_report.json'} was written before the first sample in metrics.jsonl: it "
                    "belongs to an earlier run, not to this log")
    assert _older_than_the_log(tmp_path, samples, ["analysis.json"]) == []
