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
import torch
from test_faults import fill, own_disk, remount, small_disk, tiny_vit  # noqa: F401  (fixtures)
from test_watch import digits  # noqa: F401  (fixture)

from isiwatch import Watch
from isiwatch.watch.log_folder import FolderInUse, LogFolderLock, holder


def steps_in(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_a_second_watch_on_a_folder_in_use_is_refused_naming_the_first(digits, tmp_path):  # noqa: F811
    _, _, px, py = digits
    model = tiny_vit()
    with Watch(model, px, py, every_n_steps=1, log_dir=tmp_path, run_folder=".", run_name="first",
               heatmap_every=1000) as first:
        first.step(1, 1.0)
        before = (tmp_path / "metrics.jsonl").read_bytes()
        with pytest.raises(FolderInUse) as refused:
            Watch(model, px, py, every_n_steps=1, log_dir=tmp_path, run_folder=".", run_name="second",
                  heatmap_every=1000)
        message = str(refused.value)
        assert "\n" not in message and "run 'first'" in message and f"pid {os.getpid()}" in message
        assert holder(tmp_path) is not None and "run 'first'" in holder(tmp_path)
        first.step(2, 1.0)
        assert (tmp_path / "metrics.jsonl").read_bytes().startswith(before)  # the refused Watch touched nothing
    assert holder(tmp_path) is None
    with Watch(model, px, py, every_n_steps=1, log_dir=tmp_path, run_folder=".", run_name="second",
               heatmap_every=1000) as second:
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
        Watch(model, px, py, every_n_steps=1, log_dir=tmp_path, run_folder=".", run_name="old", heatmap_every=1000)
        watch = Watch(model, px, py, every_n_steps=1, log_dir=tmp_path, run_folder=".", run_name="new",
                      heatmap_every=1000)
    finally:
        gc.enable()
    assert "run 'new'" in holder(tmp_path)
    with pytest.raises(FolderInUse, match="run 'new'"):
        Watch(model, px, py, every_n_steps=1, log_dir=tmp_path, run_folder=".", run_name="third", heatmap_every=1000)
    watch.close(final_sample=False)


def test_a_resumed_run_renames_the_holder(digits, tmp_path):  # noqa: F811
    _, _, px, py = digits
    model = tiny_vit()
    with Watch(model, px, py, every_n_steps=1, log_dir=tmp_path, run_name="saved") as watch:
        watch.step(1, 1.0)
        state = watch.state_dict()
    resumed = Watch(model, px, py, every_n_steps=1, log_dir=tmp_path)
    resumed.load_state_dict(state)
    assert resumed.run_dir == watch.run_dir and "run 'saved'" in holder(resumed.run_dir)
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
            Watch(tiny_vit(), px, py, every_n_steps=1, log_dir=tmp_path, run_folder=".")
    finally:
        proc.send_signal(signal.SIGKILL)  # a crash: the lock goes with the process
        proc.wait()
    with Watch(tiny_vit(), px, py, every_n_steps=1, log_dir=tmp_path, run_folder=".", run_name="resumed") as watch:
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
    log_dir = crashed.run_dir
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


def test_watches_built_on_an_unwritable_folder_lock_it_at_their_first_write(digits, own_disk):  # noqa: F811
    """Issue 48.3: two Watches built while the folder is read-only both start; once it is writable the first to
    write takes the lock, the other's writes are refused in one line naming it (its samples counted, not
    interleaved), and it writes once the first has closed."""
    _, _, px, py = digits
    folder = own_disk / "run"
    folder.mkdir()
    remount(own_disk, "ro")
    records = {"a": [], "b": []}
    try:
        watches = {name: Watch(tiny_vit(), px, py, every_n_steps=1, log_dir=folder, run_folder=".", run_name=name,
                               heatmap_every=1000, alert_callback=records[name].append) for name in records}
    finally:
        remount(own_disk, "rw")
    assert not (folder / ".isiwatch.lock").exists()  # nothing could be written, the lock included
    for step in (1, 2, 3, 4):
        for watch in watches.values():
            watch.step(step, 1.0)
    assert [json.loads(line)["run"] for line in (folder / "metrics.jsonl").read_text().splitlines()] == ["a"] * 4
    assert "run 'a'" in holder(folder)
    source = "exporter JsonlExporter (run folder in use)"  # its own line, though the exporter failed at step 0 already
    refused = [r for r in records["b"] if r.kind == "monitor_error" and r.data["source"] == source]
    assert len(refused) == 1 and refused[0].step == 1
    assert f"is in use by run 'a' (pid {os.getpid()} on " in refused[0].message and "\n" not in refused[0].message
    watches["a"].close(final_sample=False)
    for step in (5, 6, 7):
        watches["b"].step(step, 1.0)
    watches["b"].close(final_sample=False)
    assert steps_in(folder / "metrics.jsonl") == [1, 2, 3, 4, 5, 6, 7]
    cleared = [r for r in records["b"] if r.kind == "monitor_error_cleared" and r.data["source"] == source]
    failures = cleared[0].data["failures"]  # b's writes refused: its samples at steps 1-4 and its alert records
    assert len(cleared) == 1 and failures >= 4 and f"works again after {failures} failures" in cleared[0].message


def event_steps(folder, tag="isiwatch/loss"):
    """The steps of ``tag`` in every TensorBoard event file in ``folder``, read back file by file."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        events = EventAccumulator(str(path))
        events.Reload()
        steps += [e.step for e in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []
    return steps


@pytest.mark.parametrize("how", ["read-only mount", "chmod"])
def test_a_watch_refused_the_folder_writes_no_event_file_there(digits, tmp_path, request, how):  # noqa: F811
    """Issue 57.5: of two Watches built while the folder cannot be written, the one refused it once it can writes
    no TensorBoard event file there (before, its own file logged every step a second time); it writes once the
    holder has closed. Root writes a chmod-555 folder all the same: the read-only tmpfs covers root, chmod the
    others."""
    _, _, px, py = digits
    if how == "chmod":
        if os.geteuid() == 0:
            pytest.skip("root ignores a folder's permissions; the read-only mount variant covers root")
        folder = tmp_path / "run"
        folder.mkdir()
        folder.chmod(0o555)

        def writable():
            folder.chmod(0o755)
    else:
        disk = request.getfixturevalue("own_disk")
        folder = disk / "run"
        folder.mkdir()
        remount(disk, "ro")

        def writable():
            remount(disk, "rw")
    try:
        a, b = (Watch(tiny_vit(), px, py, every_n_steps=1, log_dir=folder, run_folder=".", run_name=name,
                      heatmap_every=1000) for name in "ab")
    finally:
        writable()
    for step in (1, 2, 3, 4):
        a.step(step, 1.0)
        b.step(step, 1.0)
    assert "run 'a'" in holder(folder)
    assert len(list(folder.glob("events.out.tfevents.*"))) == 1 and event_steps(folder) == [1, 2, 3, 4]
    assert {json.loads(line)["run"] for line in (folder / "metrics.jsonl").read_text().splitlines()} == {"a"}
    a.close(final_sample=False)
    b.step(5, 1.0)  # the folder is b's now
    b.close(final_sample=False)
    assert event_steps(folder) == [1, 2, 3, 4, 5] and steps_in(folder / "metrics.jsonl") == [1, 2, 3, 4, 5]


def test_a_watch_refused_a_folder_always_names_its_holder(tmp_path):
    """Issue 48.4: the holder's record is never seen half-written: of many simultaneous starts on one folder, each
    refused one names the run, pid and host of the one that got it."""
    import threading

    messages: list[str] = []

    def take(folder, name: str, start: threading.Barrier, locks: list) -> None:
        start.wait()
        try:
            locks.append(LogFolderLock(folder, name))
        except FolderInUse as exc:
            messages.append(str(exc))
    for round_ in range(60):
        start, locks = threading.Barrier(4), []
        threads = [threading.Thread(target=take, args=(tmp_path / str(round_), f"run{i}", start, locks))
                   for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(locks) == 1
        locks[0].release()
    assert len(messages) == 60 * 3
    unnamed = [m for m in messages if f"(pid {os.getpid()} on " not in m]
    assert not unnamed, f"{len(unnamed)} of {len(messages)} refusals do not name the holder: {unnamed[0]}"


def test_a_thread_refused_a_folder_names_a_holder_slow_to_write_its_record(tmp_path, monkeypatch):
    """A winner stalled between its lock and its record (a busy process: the GIL elsewhere, a long collection) for
    longer than a refused Watch waits is still named: in one process the lock and the record appear together."""
    import threading
    import time

    from isiwatch.watch import log_folder

    write = LogFolderLock.rename

    def stalled(self, run):
        time.sleep(log_folder.RECORD_WAIT_S + 0.3)
        write(self, run)
    monkeypatch.setattr(LogFolderLock, "rename", stalled)
    locks: list[LogFolderLock] = []
    winner = threading.Thread(target=lambda: locks.append(LogFolderLock(tmp_path, "slow")))
    winner.start()
    while not (tmp_path / log_folder.LOCK_NAME).exists():
        time.sleep(0.001)
    time.sleep(0.05)  # the winner holds the flock and sleeps before its record
    with pytest.raises(FolderInUse) as refused:
        LogFolderLock(tmp_path, "late")
    winner.join()
    assert f"run 'slow' (pid {os.getpid()} on " in str(refused.value)
    locks[0].release()


def test_a_closed_watch_leaves_no_lock_file_and_the_folder_free(tmp_path):
    from isiwatch.watch import log_folder

    x = torch.randn(16, 1, 28, 28)
    with Watch(tiny_vit(), x, torch.arange(16) % 10, every_n_steps=1, log_dir=str(tmp_path), run_folder=".",
               run_name="first"):
        assert "run 'first'" in holder(tmp_path)
    assert not (tmp_path / log_folder.LOCK_NAME).exists() and (tmp_path / "metrics.jsonl").exists()
    again = LogFolderLock(tmp_path, "second")  # the next run takes the folder with a new lock file
    assert "run 'second'" in holder(tmp_path)
    again.release()
    assert not (tmp_path / log_folder.LOCK_NAME).exists() and holder(tmp_path) is None


def test_a_lock_file_removed_as_another_watch_opens_it_is_not_locked_by_both(tmp_path, monkeypatch):
    """A release that removes the file between another Watch's open and its lock: that Watch must lock the file
    the path names now, not the removed one, or a third Watch could lock the new file beside it."""
    from isiwatch.watch import log_folder

    first = LogFolderLock(tmp_path, "first")
    real_lock = log_folder._lock
    released = []

    def lock_after_the_release(fd):
        if not released:
            released.append(True)
            first.release()  # the holder closes between this Watch's open and its flock
        real_lock(fd)

    monkeypatch.setattr(log_folder, "_lock", lock_after_the_release)
    second = LogFolderLock(tmp_path, "second")
    assert second.held and log_folder._names(second.path, second._fd)
    with pytest.raises(FolderInUse):
        LogFolderLock(tmp_path, "third")
    second.release()
