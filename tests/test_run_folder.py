"""Issue 57.4: each run its own folder under log_dir, as Lightning's version_N: two runs one after the other never
mix their records, a resumed run writes on in its own folder, ``run_folder`` names the folder, and ``isiwatch
report LOG_DIR`` reports the latest run."""

import json
import re

import pytest
import torch
from click.testing import CliRunner
from run_dirs import run_dir
from test_faults import digits, tiny_vit  # noqa: F401  (fixtures)

from isiwatch import Watch
from isiwatch.cli.commands import main
from isiwatch.watch.log_folder import FolderInUse, holder


def records(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def watch(px, py, log_dir, **options):
    return Watch(tiny_vit(), px, py, every_n_steps=1, log_dir=log_dir, heatmap_every=1000, **options)


def two_runs(px, py, log_dir, steps):
    """The run folders of a run named "first" then one named "second" in ``log_dir``, each stepped ``steps``."""
    folders = []
    for name in ("first", "second"):
        with watch(px, py, log_dir, run_name=name) as w:
            for step in steps:
                w.step(step, 1.0)
            folders.append(w.run_dir)
    return folders


def test_two_runs_one_after_the_other_write_two_folders(digits, tmp_path):  # noqa: F811
    _, _, px, py = digits
    runs = two_runs(px, py, tmp_path, (1,))
    assert runs[0] != runs[1] and sorted(runs) == runs  # the names sort by start
    assert [p.parent for p in runs] == [tmp_path, tmp_path] and not (tmp_path / "metrics.jsonl").exists()
    assert re.fullmatch(r"\d{8}-\d{6}-first", runs[0].name)
    assert [[r["run"] for r in records(folder)] for folder in runs] == [["first"], ["second"]]


def test_a_resumed_run_writes_on_in_its_own_folder(digits, tmp_path):  # noqa: F811
    _, _, px, py = digits
    with watch(px, py, tmp_path) as crashed:
        for step in (1, 2, 3):
            crashed.step(step, 1.0)
        state = crashed.state_dict()
    resumed = watch(px, py, tmp_path)  # a new Watch makes a new folder; the resume goes back to the run's
    resumed.load_state_dict(state)
    resumed.step(4, 1.0)
    resumed.close(final_sample=False)
    assert resumed.run_dir == crashed.run_dir and run_dir(tmp_path) == crashed.run_dir  # no empty folder left
    assert [(r["run"], r["step"]) for r in records(crashed.run_dir)] == [(crashed.run, s) for s in (1, 2, 3, 4)]


def test_run_folder_names_the_folder(digits, tmp_path):  # noqa: F811
    _, _, px, py = digits
    for _ in range(2):  # a named folder is continued, as Lightning's version=
        with watch(px, py, tmp_path, run_folder="baseline", run_name="b") as w:
            w.step(1, 1.0)
    assert w.run_dir == tmp_path / "baseline" and len(records(tmp_path / "baseline")) == 2
    with watch(px, py, tmp_path, run_folder=".") as w:
        w.step(1, 1.0)
    assert w.run_dir == tmp_path and len(records(tmp_path)) == 1


@pytest.mark.parametrize(("options", "message"), [
    ({"run_folder": "../elsewhere"}, "option 'run_folder' must be a folder name under log_dir"),
    ({"run_folder": "/abs"}, "option 'run_folder' must be a folder name under log_dir"),
    ({"run_folder": "x", "log_dir": None}, "run_folder 'x' names a folder under log_dir, but log_dir is not set"),
])
def test_a_bad_run_folder_is_one_line(digits, tmp_path, options, message):  # noqa: F811
    _, _, px, py = digits
    with pytest.raises(ValueError) as refused:
        watch(px, py, **{"log_dir": tmp_path, **options})
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert list(tmp_path.iterdir()) == []


def test_a_resume_into_a_run_folder_in_use_is_refused_and_changes_nothing(digits, tmp_path):  # noqa: F811
    _, _, px, py = digits
    with watch(px, py, tmp_path, run_name="held") as running:
        running.step(1, 1.0)
        state = running.state_dict()
        other = watch(px, py, tmp_path, run_name="other")
        with pytest.raises(FolderInUse, match="run 'held'"):
            other.load_state_dict(state)
        assert other.run == "other" and other.run_dir != running.run_dir and "run 'other'" in holder(other.run_dir)
        other.close(final_sample=False)
    assert [r["run"] for r in records(running.run_dir)] == ["held"]


def test_a_state_saved_before_run_folders_resumes_in_log_dir_itself(digits, tmp_path):  # noqa: F811
    _, _, px, py = digits
    with watch(px, py, tmp_path, run_folder=".", run_name="old") as old:
        old.step(1, 1.0)
        state = old.state_dict()
    del state["run_folder"]  # what earlier versions saved: they wrote log_dir itself
    resumed = watch(px, py, tmp_path)
    resumed.load_state_dict(state)
    resumed.step(2, 1.0)
    resumed.close(final_sample=False)
    assert resumed.run_dir == tmp_path and [r["step"] for r in records(tmp_path)] == [1, 2]
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []


def test_report_of_a_log_dir_reports_its_latest_run_and_says_so(digits, tmp_path):  # noqa: F811
    _, _, px, py = digits
    folders = two_runs(px, py, tmp_path, (1, 2))
    result = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    first_line = result.output.splitlines()[0]
    assert first_line == (f"{tmp_path} holds 2 runs ({folders[0].name}, {folders[1].name}): reporting the latest, "
                          f"{folders[1]} (pass a run's folder for another)")
    assert (folders[1] / "report" / "report.html").is_file() and not (folders[0] / "report").exists()
    result = CliRunner().invoke(main, ["report", str(folders[0])])  # a run's folder: that run, nothing said
    assert result.exit_code == 0 and (folders[0] / "report" / "report.html").is_file()
    assert "holds" not in result.output


def test_a_state_saved_without_log_dir_keeps_the_new_folder(digits, tmp_path):  # noqa: F811
    """A state saved by a Watch without log_dir names no folder: the resumed Watch keeps the one it made."""
    _, _, px, py = digits
    plain = Watch(tiny_vit(), px, py, every_n_steps=1)
    plain.step(1, 1.0)
    state = plain.state_dict()
    assert state["run_folder"] is None
    resumed = watch(px, py, tmp_path)
    made = resumed.run_dir
    resumed.load_state_dict(state)
    resumed.step(2, torch.tensor(1.0))
    resumed.close(final_sample=False)
    assert resumed.run_dir == made and run_dir(tmp_path) == made
