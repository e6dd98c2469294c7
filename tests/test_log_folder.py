"""One writer per log folder: a second Watch on a folder in use is refused in one line naming the other run, a dead
process frees its folder for the resume, and a resume whose rewrite fails (a full disk) stays pending until the log
is true again."""

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from test_faults import fill, small_disk, tiny_vit  # noqa: F401  (small_disk: fixture)
from test_watch import digits  # noqa: F401  (fixture)

from isiwatch import Watch
from isiwatch.watch.log_folder import FolderInUse, holder


def steps_in(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_a_second_watch_on_a_folder_in_use_is_refused_naming_the_first(digits, tmp_path):  # noqa: F811
    _, _, px, py = digits
    model = tiny_vit()
    with Watch(model, px, py, every_n_steps=1, log_dir=tmp_path, run_name="first", heatmap_every=1000) as first:
        first.step(1, 1.0)
        before = (tmp_path / "metrics.jsonl").read_bytes()
        with pytest.raises(FolderInUse) as refused:
            Watch(model, px, py, every_n_steps=1, log_dir=tmp_path, run_name="second", heatmap_every=1000)
        message = str(refused.value)
        assert "\n" not in message and "run 'first'" in message and f"pid {os.getpid()}" in message
        assert holder(tmp_path) is not None and "run 'first'" in holder(tmp_path)
        first.step(2, 1.0)
        assert (tmp_path / "metrics.jsonl").read_bytes().startswith(before)  # the refused Watch touched nothing
    assert holder(tmp_path) is None
    with Watch(model, px, py, every_n_steps=1, log_dir=tmp_path, run_name="second", heatmap_every=1000) as second:
        second.step(3, 1.0)  # the folder is free once the first Watch closed
    assert [json.loads(line)["run"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        "first", "first", "second"]


def test_a_watch_nobody_references_does_not_hold_the_folder(digits, tmp_path):  # noqa: F811
    """A notebook cell run again binds a new Watch to the name of an unclosed one: once nothing references the old
    Watch it is no writer any more, so the new one takes the folder (a referenced one is still refused)."""
    _, _, px, py = digits
    model = tiny_vit()
    gc.disable()  # the old Watch stays uncollected until the lock asks for a collection
    try:
        Watch(model, px, py, every_n_steps=1, log_dir=tmp_path, run_name="old", heatmap_every=1000)
        watch = Watch(model, px, py, every_n_steps=1, log_dir=tmp_path, run_name="new", heatmap_every=1000)
    finally:
        gc.enable()
    assert "run 'new'" in holder(tmp_path)
    with pytest.raises(FolderInUse, match="run 'new'"):
        Watch(model, px, py, every_n_steps=1, log_dir=tmp_path, run_name="third", heatmap_every=1000)
    watch.close(final_sample=False)


def test_a_resumed_run_renames_the_holder(digits, tmp_path):  # noqa: F811
    _, _, px, py = digits
    model = tiny_vit()
    with Watch(model, px, py, every_n_steps=1, log_dir=tmp_path, run_name="saved") as watch:
        watch.step(1, 1.0)
        state = watch.state_dict()
    resumed = Watch(model, px, py, every_n_steps=1, log_dir=tmp_path)
    resumed.load_state_dict(state)
    assert "run 'saved'" in holder(tmp_path)
    resumed.close(final_sample=False)


HOLD = textwrap.dedent("""
    import sys, time
    from isiwatch.watch.log_folder import LogFolderLock
    lock = LogFolderLock(sys.argv[1], "elsewhere")
    print("held", flush=True)
    time.sleep(60)
""")


def test_another_process_holds_the_folder_until_it_dies(digits, tmp_path):  # noqa: F811
    _, _, px, py = digits
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUse, match=rf"run 'elsewhere' \(pid {proc.pid} on "):
            Watch(tiny_vit(), px, py, every_n_steps=1, log_dir=tmp_path)
    finally:
        proc.send_signal(signal.SIGKILL)  # a crash: the lock goes with the process
        proc.wait()
    with Watch(tiny_vit(), px, py, every_n_steps=1, log_dir=tmp_path, run_name="resumed") as watch:
        watch.step(1, 1.0)
    assert steps_in(tmp_path / "metrics.jsonl") == [1]


def test_a_resume_on_a_full_disk_drops_the_stale_records_once_there_is_room(digits, small_disk):  # noqa: F811  # noqa: F811
    """The crashed run logged steps 1-6 after its checkpoint at 3; the resume's rewrite fails on the full disk, so
    the exporter's episode stays open (no "works again") until writes after the disk has room rewrote the file (an
    episode clears after two successes in a row: steps 6 and 7): each step is then logged once, the resumed run's
    records from 4 on kept."""
    _, _, px, py = digits
    model = tiny_vit()
    log_dir = small_disk / "run"
    crashed = Watch(model, px, py, every_n_steps=1, log_dir=log_dir, run_name="r", heatmap_every=1000)
    for step in range(1, 7):
        crashed.step(step, 1.0)
        if step == 3:
            state = crashed.state_dict()
    crashed.close(final_sample=False)  # the process dies
    ballast = fill(small_disk)
    records = []
    resumed = Watch(model, px, py, every_n_steps=1, log_dir=log_dir, heatmap_every=1000,
                    alert_callback=records.append)
    resumed.load_state_dict(state)
    assert steps_in(log_dir / "metrics.jsonl")[-1] == 6  # the rewrite could not happen
    for step in range(4, 9):
        if step == 6:
            ballast.unlink()  # room again
        resumed.step(step, 1.0)
    resumed.close(final_sample=False)
    episode = [(r.kind, r.step) for r in records
               if r.kind.startswith("monitor_error") and r.data["source"] == "exporter JsonlExporter"]
    assert episode[0][0] == "monitor_error" and episode[-1] == ("monitor_error_cleared", 7)
    steps = steps_in(log_dir / "metrics.jsonl")
    assert steps == sorted(set(steps)) and steps[:3] == [1, 2, 3] and steps[-3:] == [6, 7, 8]
