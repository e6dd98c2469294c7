"""Fault isolation: whatever fails inside the Watch, training goes on with parameters bit-identical to an unwatched
run, each failure is reported once (``monitor_error``) and cleared when it goes away, and the Watch disables itself
after ``max_consecutive_failures`` failed samples in a row."""

import http.server
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import timm
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from prometheus_client import CollectorRegistry
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from isiwatch import Exporter, SampleContext, Watch
from isiwatch.measure.vocabulary import alert_hint
from isiwatch.watch.config import ConfigError


def tiny_vit(seed=0):
    torch.manual_seed(seed)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7, in_chans=1,
                             num_classes=10, embed_dim=16, depth=2, num_heads=2)


@pytest.fixture(scope="module")
def digits():
    from isiwatch.io.data import embedded_digits

    x, y = embedded_digits()
    return x[:256], y[:256], x[4000:4032], y[4000:4032]


def train(model, x, y, steps, watch=None, before_step=lambda step: None):
    """Training whose batches (16 images) never have the probe batch's size (32), so a hook can tell them apart;
    ``before_step(step)`` injects a fault from outside the Watch."""
    torch.manual_seed(7)
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    model.train()
    for step in range(1, steps + 1):
        before_step(step)
        idx = torch.randint(0, len(x), (16,))
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if watch is not None:
            watch.step(step, loss)
    return model.state_dict(), torch.get_rng_state()


@pytest.fixture(scope="module")
def unwatched(digits):
    x, y, _, _ = digits
    return train(tiny_vit(), x, y, 12)


def assert_unperturbed(result, unwatched):
    (state, rng), (ref_state, ref_rng) = result, unwatched
    assert all(torch.equal(state[k], ref_state[k]) for k in ref_state)
    assert torch.equal(rng, ref_rng)


INJECTED = RuntimeError("probe pass failed (injected)")


class ProbeFault:
    """A forward hook that raises on the probe pass only (the batch of ``size`` images), ``times`` times."""

    def __init__(self, model, size=32, times=None, error=INJECTED):
        self.size, self.left, self.error, self.calls = size, times, error, 0
        self.handle = model.blocks[1].register_forward_hook(self)

    def __call__(self, module, inputs, output):
        if inputs[0].shape[0] == self.size and (self.left is None or self.left > 0):
            self.calls += 1
            if self.left is not None:
                self.left -= 1
            raise self.error


def kinds(records):
    return [(r.kind, r.data.get("source")) for r in records]


def test_a_probe_pass_that_always_fails_never_stops_training(digits, unwatched, capsys, monkeypatch):
    x, y, px, py = digits
    monkeypatch.setattr(logging.root, "handlers", [])  # as in a script that set up no logging (pytest's is gone)
    model = tiny_vit()
    fault = ProbeFault(model)
    records = []
    watch = Watch(model, px, py, every_n_steps=2, max_consecutive_failures=4, alert_callback=records.append)
    result = train(model, x, y, 12, watch)
    watch.close()
    assert_unperturbed(result, unwatched)
    assert fault.calls == 4 and watch.disabled and not watch.history  # disabled after 4 in a row: no 5th pass
    assert kinds(records) == [("monitor_error", "probe pass"), ("monitor_error", "watch")]
    assert records[0].step == 2 and "RuntimeError: probe pass failed (injected)" in records[0].message
    assert records[1].severity == "critical" and "disabled itself after 4" in records[1].message
    err = capsys.readouterr().err  # no logging set up: one line per record on stderr, not a traceback
    assert err.count("isiwatch: [monitor_error]") == 2 and "Traceback" not in err


def test_a_probe_pass_that_fails_twice_is_reported_once_and_cleared(digits, unwatched, tmp_path):
    x, y, px, py = digits
    model = tiny_vit()
    ProbeFault(model, times=2)
    watch = Watch(model, px, py, every_n_steps=2, log_dir=tmp_path, run_folder=".", registry=CollectorRegistry())
    result = train(model, x, y, 12, watch)
    watch.close()
    assert_unperturbed(result, unwatched)
    assert [s.step for s in watch.history] == [6, 8, 10, 12] and not watch.disabled
    alerts = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    faults = [(a["kind"], a["step"]) for a in alerts if a["kind"].startswith("monitor_error")]
    assert faults == [("monitor_error", 2), ("monitor_error_cleared", 8)]  # 6 and 8 worked: two in a row
    assert "after 2 failures since step 2" in next(a["message"] for a in alerts if a["kind"].endswith("cleared"))
    counted = watch.prometheus.registry.get_sample_value(
        "isiwatch_alerts_total", {"run": watch.run, "kind": "monitor_error"})
    assert counted == 1
    assert "monitor_error" not in watch.alerts.active


def test_out_of_memory_is_retried_once_in_smaller_chunks(digits):
    x, y, px, py = digits
    model = tiny_vit()
    fault = ProbeFault(model, error=torch.OutOfMemoryError("CUDA out of memory (simulated)"))
    records = []
    watch = Watch(model, px, py, every_n_steps=2, probe_batch_size=32, alert_callback=records.append)
    train(model, x, y, 4, watch)  # the hook raises for chunks of 32; the retry runs chunks of 8
    watch.close()
    assert fault.calls == 2 and [s.step for s in watch.history] == [2, 4]
    assert not [r for r in records if r.kind.startswith("monitor_error")]


def test_strict_re_raises(digits):
    x, y, px, py = digits
    model = tiny_vit()
    ProbeFault(model)
    watch = Watch(model, px, py, every_n_steps=2, strict=True)
    with pytest.raises(RuntimeError, match="injected"):
        train(model, x, y, 2, watch)


class FlakyExporter(Exporter):
    """Fails its first ``failures`` samples with a full disk, then works."""

    def __init__(self, failures):
        self.failures, self.samples = failures, []

    def write_sample(self, sample, context):
        if self.failures:
            self.failures -= 1
            raise OSError(28, "No space left on device")
        self.samples.append(sample.step)


def test_a_failing_exporter_is_skipped_reported_once_and_recovers(digits, unwatched, caplog):
    x, y, px, py = digits
    model = tiny_vit()
    flaky, healthy = FlakyExporter(3), FlakyExporter(0)
    records = []
    with caplog.at_level(logging.INFO, logger="isiwatch"):
        watch = Watch(model, px, py, every_n_steps=2, exporters=[flaky, healthy], alert_callback=records.append)
        result = train(model, x, y, 12, watch)
        watch.close()
    assert_unperturbed(result, unwatched)
    assert healthy.samples == [2, 4, 6, 8, 10, 12] and flaky.samples == [8, 10, 12]
    # two exporters of one class are told apart by their place in watch.exporters
    faults = [r for r in records if r.kind.startswith("monitor_error")]
    assert kinds(faults) == [("monitor_error", "exporter FlakyExporter[0]"),
                             ("monitor_error_cleared", "exporter FlakyExporter[0]")]
    assert "No space left on device" in faults[0].message
    assert sum("monitor_error" in r.getMessage() for r in caplog.records) == 2  # the user's logging gets both


class ChargingExporter(Exporter):
    """Reports 100 s of background work per sample (far above any real sample); its report raises at the steps in
    ``failing``."""

    def __init__(self, failing):
        self.failing, self.step = failing, None

    def write_sample(self, sample, context):
        self.step = sample.step

    def background_seconds(self):
        if self.step is not None and self.step + 2 in self.failing:
            raise RuntimeError("background accounting failed (injected)")
        return 100.0


def test_a_failing_background_report_costs_nothing_and_training_goes_on(digits, unwatched):
    x, y, px, py = digits
    model = tiny_vit()
    records = []
    watch = Watch(model, px, py, every_n_steps=2, exporters=[ChargingExporter({6})], alert_callback=records.append)
    result = train(model, x, y, 12, watch)
    watch.close()
    assert_unperturbed(result, unwatched)
    assert ("monitor_error", "exporter ChargingExporter") in kinds(records)
    by_step = {sample.step: sample.overhead_s for sample in watch.history}
    assert by_step[4] >= 100 and by_step[6] < 100  # the 100 s are charged, except where the report failed


@pytest.fixture
def small_disk(tmp_path):
    """A real 320 KiB tmpfs (the tests run as root, as CI does)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=320k", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


# TensorBoard's writer thread dies on the full disk, without a traceback (an unhandled thread exception fails the
# test); the exporter raises its failure on the training thread and replaces the writer, as the test checks
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_full_disk_under_log_dir_does_not_stop_training_and_export_recovers(digits, unwatched, small_disk):
    x, y, px, py = digits
    model = tiny_vit()
    ballast = small_disk / "ballast"
    records = []
    watch = Watch(model, px, py, every_n_steps=1, log_dir=small_disk / "run", run_folder=".", heatmap_every=1000,
                  alert_callback=records.append)

    def disk(step):
        if step == 3:  # fill the disk
            with open(ballast, "wb", buffering=0) as fh:
                try:
                    while True:
                        fh.write(b"\0" * 4096)
                except OSError:
                    pass
        if step == 8:
            ballast.unlink()  # free it

    result = train(model, x, y, 12, watch, disk)
    watch.close()
    assert_unperturbed(result, unwatched)
    faults = [(r.kind, r.data["source"], r.step) for r in records if r.kind.startswith("monitor_error")]
    for source in ("exporter JsonlExporter", "exporter TensorBoardExporter"):
        episode = [(kind, step) for kind, s, step in faults if s == source]
        # opened once the disk is full (a JSONL line may still fit in its file's last block for a sample or two);
        # a write that squeezes into a freed page may close and reopen it while the disk stays full; closed for
        # good once the disk has room
        assert episode[0][0] == "monitor_error" and 3 <= episode[0][1] < 8
        assert episode[-1][0] == "monitor_error_cleared"
        assert 8 <= episode[-1][1] <= 9
    lines = (small_disk / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines]  # every line whole: no torn record
    assert steps[:2] == [1, 2] and steps[-4:] == [9, 10, 11, 12]
    events = EventAccumulator(str(small_disk / "run"))
    events.Reload()
    assert 12 in [e.step for e in events.Scalars("isiwatch/isi/layer_00")]


class Gateway(http.server.BaseHTTPRequestHandler):
    """A push gateway that answers 500 until ``healthy`` is set."""

    healthy = False
    pushes: list = []

    def do_PUT(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.pushes.append(self.healthy)
        self.send_response(200 if self.healthy else 500)
        self.end_headers()

    def log_message(self, *args):
        pass


def train_against_gateway(digits, port, heal):
    """12 watched training steps pushing to the gateway on ``port`` every 2 steps; ``heal()`` mends the gateway
    after step 7, once the failed pushes have landed. Returns the training result and the alert records."""
    x, y, px, py = digits
    model = tiny_vit()
    records = []
    watch = Watch(model, px, py, every_n_steps=2, pushgateway=f"127.0.0.1:{port}", alert_callback=records.append)

    def gateway(step):
        time.sleep(0.05)  # as long as a real step, so a push can finish between samples
        if step == 7:
            time.sleep(0.5)
            heal()

    result = train(model, x, y, 12, watch, gateway)
    watch.close()
    return result, records


def test_a_push_gateway_answering_500_is_reported_once_and_recovers(digits, unwatched):
    Gateway.healthy, Gateway.pushes = False, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result, records = train_against_gateway(digits, server.server_port, lambda: setattr(Gateway, "healthy", True))
    finally:
        server.shutdown()
        server.server_close()
    assert_unperturbed(result, unwatched)
    faults = kinds(r for r in records if r.kind.startswith("monitor_error"))
    assert faults == [("monitor_error", "exporter PrometheusExporter"),
                      ("monitor_error_cleared", "exporter PrometheusExporter")]
    assert False in Gateway.pushes and Gateway.pushes[-1] is True


def test_a_gateway_that_never_answers_does_not_block_the_training_step(digits):
    x, y, px, py = digits
    with socket.socket() as silent:  # accepts connections (backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        watch = Watch(tiny_vit(), px, py, every_n_steps=1, pushgateway=f"127.0.0.1:{silent.getsockname()[1]}")
        start = time.perf_counter()
        for step in range(1, 5):
            watch.step(step, 1.0)
        stepping = time.perf_counter() - start
        watch.exporters.clear()  # closing would wait for the pending push's timeout
    assert stepping < 8, f"4 samples took {stepping:.1f} s: a push blocked the training step"


MALFORMED_GATEWAYS = ["http://[::1", "ftp://host:9091", "127.0.0.1:0", "http://:9091", "not a url at all", " ", "\x00",
                      "http://gate way:9091", "http://gateway:9091/\n", "http://gate\x1b[31mway",
                      "http://-gateway:9091", "http://gateway..local:9091"]


@pytest.mark.parametrize("url", MALFORMED_GATEWAYS)
def test_a_malformed_gateway_url_is_refused_at_construction(digits, url):
    """Each would pass construction and then fail every push (InvalidURL, an unknown host), an episode that never
    clears: refused when the Watch, or the exporter alone, is built, in one printable line."""
    from isiwatch.watch.exporters import PrometheusExporter

    _, _, px, py = digits
    with pytest.raises(ConfigError, match="pushgateway") as refused:
        Watch(tiny_vit(), px, py, pushgateway=url)
    with pytest.raises(ValueError, match="^pushgateway ") as alone:
        PrometheusExporter("r", CollectorRegistry(), pushgateway=url)
    for error in (refused, alone):
        assert str(error.value).isprintable(), str(error.value)


@pytest.mark.parametrize("url", ["127.0.0.1:9091", "http://[::1]:9091", "https://push.example.org/prefix",
                                 "pushgateway", "http://push_gateway:9091"])
def test_a_well_formed_gateway_url_is_accepted(digits, url):
    from isiwatch.watch.exporters import PrometheusExporter

    PrometheusExporter("r", CollectorRegistry(), pushgateway=url).close()


# -- torch.distributed: a failure on rank 1 only -------------------------------------------------------------
WORLD = 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_run(rank, x, y, px, py, watched):
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(tiny_vit())
    watch = None
    if watched:
        if rank == 1:
            ProbeFault(model.module, times=1)  # rank 1's first probe pass fails; rank 0's works
        stop = {"monitor": "loss", "warmup": 1, "stopping_threshold": -1.0} if rank == 0 else {}
        watch = Watch(model, px, py, every_n_steps=2, **stop)
    train(model, x, y, 10, watch)
    result = {"state": {k: v.clone() for k, v in model.module.state_dict().items()}}
    if watch is not None:
        watch.close()
        result["samples"] = [s.step for s in watch.history]
        result["faults"] = watch.faults.counts
    return result


def ddp_worker(rank, port, out):
    import io

    from isiwatch.io.data import embedded_digits

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    x, y = embedded_digits()
    args = (x[:256], y[:256], x[4000:4032], y[4000:4032])
    plain = ddp_run(rank, *args, watched=False)
    sys.stderr = io.StringIO()  # what the Watch prints (the job sets up no logging)
    watched = ddp_run(rank, *args, watched=True)
    err, sys.stderr = sys.stderr.getvalue(), sys.__stderr__
    dist.destroy_process_group()
    same = all(torch.equal(plain["state"][k], watched["state"][k]) for k in plain["state"])
    with open(f"{out}/rank{rank}.json", "w") as fh:
        json.dump({"same": same, "samples": watched["samples"], "stderr": err.splitlines()}, fh)


def test_a_failure_on_one_rank_makes_every_rank_skip_that_sample(tmp_path):
    mp.spawn(ddp_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert all(r["same"] for r in ranks)  # both ranks trained exactly as without the Watch
    assert ranks[0]["samples"] == ranks[1]["samples"] == [4, 6, 8, 10]  # step 2 skipped on both
    # rank 0 speaks for the job; rank 1, whose probe pass failed, stays silent (no logging set up there)
    assert ranks[0]["stderr"] == [
        "isiwatch: [monitor_error] step 2: probe pass failed (it failed on another rank); the sample's other parts "
        f"and training continue (hint: {alert_hint('monitor_error')})",
        "isiwatch: [monitor_error_cleared] step 6: probe pass works again after 1 failure since step 2"]
    assert ranks[1]["stderr"] == []


def test_a_port_in_use_is_visible_without_logging_set_up(digits, capsys, monkeypatch):
    _, _, px, py = digits
    monkeypatch.setattr(logging.root, "handlers", [])  # as in a script that set up no logging
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        watch = Watch(tiny_vit(), px, py, prometheus_port=busy.getsockname()[1], registry=CollectorRegistry())
    watch.close(final_sample=False)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("isiwatch: warning: cannot serve Prometheus metrics on 127.0.0.1")


def test_a_closed_stderr_does_not_turn_a_report_into_an_exception(digits, monkeypatch):
    import io

    x, y, px, py = digits
    monkeypatch.setattr(logging.root, "handlers", [])
    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr("sys.stderr", closed)  # e.g. a daemonised job whose terminal went away
    model = tiny_vit()
    ProbeFault(model)
    watch = Watch(model, px, py, every_n_steps=2)
    train(model, x, y, 4, watch)
    watch.close()
    assert watch.faults.counts == {"probe pass": 2}  # the samples of steps 2 and 4 failed, training went on


# -- log_dir made read-only or deleted mid-run ---------------------------------------------------------------
def log_dir_faults(records):
    """Each exporter's monitor_error episode as [(kind, step), ...], by source."""
    episodes = {}
    for r in records:
        if r.kind.startswith("monitor_error"):
            episodes.setdefault(r.data["source"], []).append((r.kind, r.step))
    return episodes


@pytest.fixture
def own_disk(tmp_path):
    """A real tmpfs that the test may remount read-only (root cannot write there either, unlike a chmod)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"mounting a tmpfs is not permitted here ({exc})")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def make_read_only(mount):
    """The tmpfs at ``mount`` becomes read-only, as when the kernel remounts a failing disk: the kernel refuses
    ``remount,ro`` while the Watch holds files open for writing, so the mount is detached and a read-only tmpfs
    takes its place (the open files then point into the detached one, as into a deleted folder)."""
    subprocess.run(["umount", "-l", str(mount)], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=4m", "tmpfs", str(mount)], check=True)


def remount(mount, mode):
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mount)], check=True)


# TensorBoard's writer thread dies on the read-only disk, without a traceback; the exporter replaces the writer
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_log_dir_made_read_only_mid_run_is_reported_once_and_recovers(digits, unwatched, own_disk):
    x, y, px, py = digits
    model = tiny_vit()
    records = []
    watch = Watch(model, px, py, every_n_steps=1, log_dir=own_disk / "run", run_folder=".", heatmap_every=1000,
                  alert_callback=records.append)

    def disk(step):
        if step == 4:
            make_read_only(own_disk)
        if step == 8:
            remount(own_disk, "rw")

    try:
        result = train(model, x, y, 12, watch, disk)
        watch.close()
    finally:
        remount(own_disk, "rw")
    assert_unperturbed(result, unwatched)
    episodes = log_dir_faults(records)
    for source in ("exporter JsonlExporter", "exporter TensorBoardExporter"):
        assert episodes[source] == [("monitor_error", 4), ("monitor_error_cleared", 9)], episodes
    steps = [json.loads(line)["step"] for line in (own_disk / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [8, 9, 10, 11, 12]  # the writable disk that came back holds what was written since
    events = EventAccumulator(str(own_disk / "run"))
    events.Reload()
    assert 12 in [e.step for e in events.Scalars("isiwatch/isi/layer_00")]


# TensorBoard's writer thread dies on the deleted folder, without a traceback; the exporter replaces the writer
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_log_dir_deleted_mid_run_is_reported_once_and_recreated(digits, unwatched, tmp_path):
    import shutil

    x, y, px, py = digits
    model = tiny_vit()
    records = []
    log_dir = tmp_path / "run"
    watch = Watch(model, px, py, every_n_steps=1, log_dir=log_dir, run_folder=".", heatmap_every=1000,
                  alert_callback=records.append)
    result = train(model, x, y, 12, watch, lambda step: shutil.rmtree(log_dir) if step == 5 else None)
    watch.close()
    assert_unperturbed(result, unwatched)
    # writing on into the deleted files would lose every record silently: the write that finds them gone fails,
    # the next one writes into a re-created log_dir (TensorBoard's writer opens its file per write, so its own
    # write fails, and its next one, maybe the same sample's, re-creates the folder)
    episodes = log_dir_faults(records)
    assert episodes["exporter JsonlExporter"] == [("monitor_error", 5), ("monitor_error_cleared", 7)], episodes
    assert episodes["exporter TensorBoardExporter"] in ([("monitor_error", 5), ("monitor_error_cleared", s)]
                                                         for s in (6, 7)), episodes
    assert "was deleted" in next(r.message for r in records if r.data.get("source") == "exporter JsonlExporter")
    steps = [json.loads(line)["step"] for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [6, 7, 8, 9, 10, 11, 12]
    events = EventAccumulator(str(log_dir))
    events.Reload()
    assert [e.step for e in events.Scalars("isiwatch/isi/layer_00")][-7:] == steps


# -- a push gateway that does not speak HTTP -----------------------------------------------------------------
class NotHttp:
    """A TCP server that answers every request with a line that is not an HTTP status line (``BadStatusLine``
    in the client) until ``healthy`` is set, then with ``HTTP/1.1 200 OK``."""

    def __init__(self, garbage=b"SSH-2.0-OpenSSH_9.6\r\n"):
        self.healthy, self.answers, self.garbage = False, [], garbage
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(65536)
                    healthy = self.healthy
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n" if healthy
                                 else self.garbage)
                    self.answers.append(healthy)
                except OSError:
                    pass


def gateway_episode(digits, unwatched, server: NotHttp) -> tuple[list, list]:
    """Train against ``server`` until it heals; training is unperturbed and the gateway's fault is one episode,
    opened and cleared. Returns the fault records and all records."""
    try:
        result, records = train_against_gateway(digits, server.port, lambda: setattr(server, "healthy", True))
    finally:
        server.sock.close()
    assert_unperturbed(result, unwatched)
    faults = [r for r in records if r.kind.startswith("monitor_error")]
    assert kinds(faults) == [("monitor_error", "exporter PrometheusExporter"),
                             ("monitor_error_cleared", "exporter PrometheusExporter")]
    return faults, records


def test_a_gateway_that_does_not_speak_http_is_reported_once_and_recovers(digits, unwatched):
    server = NotHttp()
    faults, _ = gateway_episode(digits, unwatched, server)
    assert "BadStatusLine" in faults[0].message or "RemoteDisconnected" in faults[0].message, faults[0].message
    assert False in server.answers and server.answers[-1] is True


def test_a_gateway_answering_garbage_is_reported_in_one_printable_bounded_line(digits, unwatched, capsys,
                                                                                monkeypatch):
    """What the server sent (a terminal escape sequence, a bell, NUL, kilobytes of junk) reaches neither the alert
    message nor stderr raw: control characters are escaped and the reason is cut at 200 characters."""
    monkeypatch.setattr(logging.root, "handlers", [])
    server = NotHttp(garbage=b"\x1b[2J\x1b[31mpwned\x07\x00" + b"\xff" * 3000 + b"\r\n")
    faults, records = gateway_episode(digits, unwatched, server)
    reason = faults[0].data["error"]
    assert reason.startswith("BadStatusLine: \\x1b[2J\\x1b[31mpwned\\x07\\x00ÿÿÿ") and len(reason) == 200, reason
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and err.replace("\n", "").isprintable()
    assert all(r.message.isprintable() for r in records)


# -- a heat-map render that fails on its background thread ---------------------------------------------------
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_heatmap_render_that_fails_in_the_background_is_reported_once_and_cleared(digits, unwatched, tmp_path,
                                                                                   monkeypatch):
    """The render thread's failure (an out-of-memory while drawing) never escapes as a thread traceback: it is
    raised on the training thread at the next sample's write, where the Watch reports it once, and cleared by the
    next render that works."""
    from isiwatch.measure.plots import HeatmapPanel
    from isiwatch.watch.exporters import tensorboard

    real, calls = HeatmapPanel.draw, []

    def fails_first(panel, steps, grids):
        calls.append(steps[-1])
        if len(calls) == 1:
            raise MemoryError("heat-map render out of memory (injected)")
        yield from real(panel, steps, grids)

    monkeypatch.setattr(HeatmapPanel, "draw", fails_first)
    monkeypatch.setattr(tensorboard, "RENDER_PAUSE", 0.0)

    def render_done(step):  # each render ends before the next step: the steps its outcome is written at are fixed
        for thread in threading.enumerate():
            if thread.name == "isiwatch-heatmaps":
                thread.join()

    x, y, px, py = digits
    model = tiny_vit()
    records = []
    log_dir = tmp_path / "run"
    watch = Watch(model, px, py, every_n_steps=2, log_dir=log_dir, run_folder=".", heatmap_every=1,
                  alert_callback=records.append)
    result = train(model, x, y, 12, watch, render_done)
    watch.close()
    assert_unperturbed(result, unwatched)
    assert calls[:2] == [2, 4]  # the render of step 2 failed; the one of step 4 started all the same
    episodes = log_dir_faults(records)
    assert episodes == {"exporter TensorBoardExporter": [("monitor_error", 4), ("monitor_error_cleared", 8)]}
    assert "heat-map render out of memory" in next(r.message for r in records if r.kind == "monitor_error")
    events = EventAccumulator(str(log_dir), size_guidance={"images": 0})
    events.Reload()
    assert [e.step for e in events.Images("isiwatch/heatmap/isi")] == [4, 6, 8, 10, 12]


# -- NaN activations on the probe pass only ------------------------------------------------------------------
def test_nan_activations_on_the_probe_pass_raise_an_alert_and_leave_training_alone(digits, unwatched):
    x, y, px, py = digits
    model = tiny_vit()

    def nan_on_probe(module, inputs, output):
        return output * float("nan") if inputs[0].shape[0] == 32 else None

    model.blocks[1].register_forward_hook(nan_on_probe)
    records = []
    watch = Watch(model, px, py, every_n_steps=2, alert_callback=records.append)
    result = train(model, x, y, 12, watch)
    watch.close()
    assert_unperturbed(result, unwatched)
    assert [r.kind for r in records] == ["non_finite"] and records[0].step == 2  # one episode, no monitor_error
    assert [s.step for s in watch.history] == [2, 4, 6, 8, 10, 12] and not watch.faults.failing


# -- torch.distributed: the overhead budget's interval is one decision for all ranks ---------------------------
def budget_worker(rank, port, out):
    from isiwatch.io.data import embedded_digits

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    x, y = embedded_digits()
    x, y, px, py = x[:256], y[:256], x[4000:4032], y[4000:4032]
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(tiny_vit())
    watch = Watch(model, px, py, every_n_steps=1, overhead_budget=0.05)
    # rank 1's steps are slow (its ratio is low), rank 0's fast: each would pick another interval alone
    train(model, x, y, 24, watch, lambda step: time.sleep(0.2) if rank == 1 else None)
    watch.close()
    dist.destroy_process_group()
    with open(f"{out}/rank{rank}.json", "w") as fh:
        json.dump({"samples": [s.step for s in watch.history], "interval": watch.interval}, fh)


def test_under_an_overhead_budget_every_rank_samples_the_same_steps(tmp_path):
    mp.spawn(budget_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert ranks[0] == ranks[1]  # no hang, and one interval: the longest any rank asked for
    assert ranks[0]["interval"] > 1 and len(ranks[0]["samples"]) < 24


# -- a closed stderr (a daemonised job): no log file may take descriptor 2 -----------------------------------
CLOSED_STDERR_RUN = """
import os, sys, timm, torch
import torch.nn.functional as F
from isiwatch import Watch
from isiwatch.io.data import embedded_digits

os.close(2)  # as a daemonised job whose terminal went away
torch.manual_seed(0)
model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7, in_chans=1,
                          num_classes=10, embed_dim=16, depth=2, num_heads=2)
x, y = embedded_digits()
failures = [2]  # the probe passes of steps 2 and 4 fail: one episode, one report, one clearing
def probe_fault(module, inputs, output):
    if inputs[0].shape[0] == 32 and failures[0]:
        failures[0] -= 1
        raise RuntimeError("probe pass failed (injected)")
model.blocks[1].register_forward_hook(probe_fault)
watch = Watch(model, x[4000:4032], y[4000:4032], every_n_steps=2, log_dir=sys.argv[1], run_folder=".",
              heatmap_every=1000)
opt = torch.optim.AdamW(model.parameters(), 1e-3)
for step in range(1, 9):
    loss = F.cross_entropy(model(x[:16]), y[:16])
    opt.zero_grad(); loss.backward(); opt.step()
    watch.step(step, loss)
watch.close()
print("done", watch.faults.counts)
"""


def test_a_closed_stderr_never_lets_the_reports_into_the_logs(tmp_path):
    """With descriptor 2 closed, a file opened next takes it, and what the process writes to stderr (the Watch's
    own one-line reports) would land in that file: metrics.jsonl, an event file, a socket."""
    from isiwatch.cli.report import read_run

    done = subprocess.run([sys.executable, "-c", CLOSED_STDERR_RUN, str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("done"), done.stdout
    records = read_run(tmp_path / "run", warn=pytest.fail)  # every line of both logs is JSON
    assert [s["step"] for s in records.samples] == [6, 8]
    faults = [(a["kind"], a["step"]) for a in records.alerts if a["kind"].startswith("monitor_error")]
    assert faults == [("monitor_error", 2), ("monitor_error_cleared", 8)]
    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    assert [e.step for e in events.Scalars("isiwatch/isi/layer_00")] == [6, 8]


# -- the user's alert_callback raises ----------------------------------------------------------------------------
def test_an_alert_callback_that_raises_is_reported_once_and_cleared(digits, unwatched, capsys, monkeypatch):
    """Reported like every contained failure (a monitor_error record and, without logging set up, one line on
    stderr), not only to the ``isiwatch`` logger, whose handler is a NullHandler then; cleared once the callback
    has taken two records of another episode in a row (`faults.CLEAR_AFTER`)."""
    x, y, px, py = digits
    monkeypatch.setattr(logging.root, "handlers", [])  # as in a script that set up no logging
    model = tiny_vit()
    fault = ProbeFault(model, times=0)  # armed at step 4: a record of another source at step 4
    taken = []

    def callback(alert):
        if alert.step < 4:
            raise ValueError(f"callback bug on {alert.kind} (injected)")
        taken.append((alert.kind, alert.data.get("source"), alert.step))

    watch = Watch(model, px, py, every_n_steps=2, norm_friction_threshold=-2.0, alert_callback=callback)
    result = train(model, x, y, 12, watch, lambda step: setattr(fault, "left", 1) if step == 4 else None)
    watch.close()
    assert_unperturbed(result, unwatched)
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["isiwatch: [monitor_error] step 2: alert_callback failed (ValueError: callback bug on "
                     "norm_friction_high (injected)); the sample's other parts and training continue "
                     f"(hint: {alert_hint('monitor_error')})",
                     "isiwatch: [monitor_error] step 4: probe pass failed (RuntimeError: probe pass failed "
                     "(injected)); the sample's other parts and training continue "
                     f"(hint: {alert_hint('monitor_error')})",
                     "isiwatch: [monitor_error_cleared] step 8: probe pass works again after 1 failure since step 4",
                     "isiwatch: [monitor_error_cleared] step 8: alert_callback works again after 2 failures since "
                     "step 2"]
    assert taken == [("monitor_error", "probe pass", 4), ("monitor_error_cleared", "probe pass", 8),
                     ("monitor_error_cleared", "alert_callback", 8)]


# -- a Watch built on a full or read-only disk ----------------------------------------------------------------
def fill(disk):
    """Fill the tmpfs at ``disk`` with one ballast file; returns its path."""
    ballast = disk / "ballast"
    with open(ballast, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError:
            pass
    return ballast


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_a_watch_built_on_a_broken_disk_starts_with_its_exporters_failed_and_recovers(digits, unwatched, own_disk,
                                                                                      fault):
    """The Watch is built, each exporter that cannot open its files is reported once (at step 0) and retried at
    every write, and the disk that heals at step 6 gets the samples from then on."""
    x, y, px, py = digits
    model = tiny_vit()
    log_dir = own_disk / "run"
    if fault == "full":
        ballast = fill(own_disk)
    else:
        remount(own_disk, "ro")
    records = []
    try:
        watch = Watch(model, px, py, every_n_steps=2, log_dir=log_dir, run_folder=".", heatmap_every=1000,
                      alert_callback=records.append)

        def heal(step):
            if step == 6:
                ballast.unlink() if fault == "full" else remount(own_disk, "rw")

        result = train(model, x, y, 12, watch, heal)
        watch.close()
    finally:
        remount(own_disk, "rw")
    assert_unperturbed(result, unwatched)
    episodes = log_dir_faults(records)
    # a full disk still takes an empty file: the JSONL exporter fails on its first line, TensorBoard's failure record
    assert episodes == {"exporter JsonlExporter": [("monitor_error", 0), ("monitor_error_cleared", 8)],
                        "exporter TensorBoardExporter": [("monitor_error", 0), ("monitor_error_cleared", 8)]}
    steps = [json.loads(line)["step"] for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [6, 8, 10, 12]
    events = EventAccumulator(str(log_dir))
    events.Reload()
    assert [e.step for e in events.Scalars("isiwatch/isi/layer_00")] == [6, 8, 10, 12]


def test_a_log_dir_that_is_a_file_is_refused_when_the_watch_is_built(digits, tmp_path):
    _, _, px, py = digits
    (tmp_path / "taken").write_text("")
    for log_dir in (tmp_path / "taken", tmp_path / "taken" / "run"):
        with pytest.raises(ValueError, match=f"^log_dir {log_dir}: {tmp_path / 'taken'} is not a directory$"):
            Watch(tiny_vit(), px, py, log_dir=log_dir, run_folder=".")


def test_tensorboards_writer_threads_print_no_traceback_and_other_threads_still_do(digits, own_disk, capsys,
                                                                                   monkeypatch):
    """TensorBoard's writer thread dies on a full disk and raises its failure through ``threading.excepthook``,
    which prints a traceback; tensorboard also keeps it for the next write on the training thread, where the Watch
    reports it in one line. So the Watch's writer threads print nothing, and every other thread's exception still
    reaches the hook that was there before."""
    x, y, px, py = digits
    reached = []
    monkeypatch.setattr(threading, "excepthook", lambda args: reached.append(args.thread.name))
    fill(own_disk)
    records = []
    watch = Watch(tiny_vit(), px, py, every_n_steps=1, log_dir=own_disk / "run", run_folder=".", heatmap_every=1000,
                  alert_callback=records.append)
    for step in (1, 2):
        watch.step(step, 1.0)
    watch.close()
    foreign = threading.Thread(target=lambda: 1 / 0, name="the user's thread")
    foreign.start()
    foreign.join()
    assert reached == ["the user's thread"]
    assert ("monitor_error", "exporter TensorBoardExporter") in kinds(records)
    assert "Traceback" not in capsys.readouterr().err


# -- NaN on the probe batch: every record is strict JSON, and the clearing names what cleared --------------------
def strict_json(line):
    """``json.loads`` that refuses NaN and Infinity, which Python writes by default but JSON does not have."""
    return json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in {line}"))


def test_non_finite_values_are_written_as_null_in_both_logs(tmp_path):
    """A NaN or infinite number anywhere in a record (an alert's data, a sample's overhead) is written as null, the
    documented form, so the record is not lost to ``ValueError: Out of range float values``."""
    from isiwatch import Alert
    from isiwatch.cli.report import read_run
    from isiwatch.watch.exporters import JsonlExporter
    from isiwatch.watch.sample import Sample

    exporter = JsonlExporter(tmp_path)
    context = SampleContext("r", (), None, frozenset(), {}, False)
    nan, inf = float("nan"), float("inf")
    exporter.write_sample(Sample(2, 0.0, {"isi": [0.5, nan]}, None, 0.1, loss=inf, overhead_s=nan,
                                 overhead_ratio=inf), context)
    exporter.write_alert(Alert("cls_marginalized", 2, 0.0, "r", "info", "[CLS] probe nan",
                               {"probe_cls": nan, "nested": [{"x": -inf}, (1.0, nan)]}))
    exporter.close(context)
    (sample,) = map(strict_json, (tmp_path / "metrics.jsonl").read_text().splitlines())
    assert (sample["layers"], sample["loss"], sample["overhead_s"], sample["overhead_ratio"]) == (
        {"isi": [0.5, None]}, None, None, None)
    (alert,) = map(strict_json, (tmp_path / "alerts.jsonl").read_text().splitlines())
    assert alert["data"] == {"probe_cls": None, "nested": [{"x": None}, [1.0, None]]}
    records = read_run(tmp_path, warn=pytest.fail)
    assert len(records.samples) == len(records.alerts) == 1


def test_nan_on_the_probe_batch_for_a_while_leaves_a_true_alert_log(digits, unwatched, tmp_path):
    """The probe pass gives NaN at the samples of steps 4 and 6: non_finite opens at 4 and its clearing at 8 names
    what had been non-finite; the [CLS] alert, undecidable on NaN probes, keeps its episode as it was."""
    from isiwatch.cli.report import read_run

    x, y, px, py = digits
    model = tiny_vit()
    poisoned = set()

    def nan_on_probe(module, inputs, output):
        return output * float("nan") if inputs[0].shape[0] == 32 and poisoned else None

    model.blocks[1].register_forward_hook(nan_on_probe)
    records = []
    watch = Watch(model, px, py, every_n_steps=2, log_dir=tmp_path, run_folder=".", heatmap_every=1000,
                  alert_callback=records.append)
    result = train(model, x, y, 12, watch, lambda step: (poisoned.add(step) if step in (4, 6)
                                                         else poisoned.clear()))
    watch.close()
    assert_unperturbed(result, unwatched)
    logged = [strict_json(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert [(a["kind"], a["step"]) for a in logged] == [(r.kind, r.step) for r in records]  # none lost
    non_finite = [(a["kind"], a["step"], a["message"]) for a in logged if a["kind"].startswith("non_finite")]
    assert [entry[:2] for entry in non_finite] == [("non_finite", 4), ("non_finite_cleared", 8)]
    assert non_finite[1][2].startswith("non_finite cleared (opened at step 4: non-finite values in ")
    assert non_finite[1][2] != "non_finite cleared (opened at step 4: non-finite values in )"
    assert not [a for a in logged if a["kind"].startswith(("cls_marginalized", "monitor_error")) and
                a["step"] in (4, 6)]
    assert len(read_run(tmp_path, warn=pytest.fail).samples) == 6
