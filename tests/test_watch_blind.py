"""The Watch never goes blind silently (issue 41, monitor side): the numeric context of the probe pass, refusals at
construction, every record returned by ``step()``, a bounded sampling interval, network deadlines and faults that
heal completely."""

import logging
import socket
import threading
import time

import pytest
import torch
from torch import nn

from isiwatch import Watch
from isiwatch.truncation.healing import make_digits_vit
from isiwatch.watch.config import ConfigError, build_options, load_yaml
from isiwatch.watch.exporters import prometheus
from isiwatch.watch.freezing import FreezePolicy


def tiny(seed=0, depth=4):
    return make_digits_vit(seed, depth=depth, embed_dim=32, num_heads=2)[0]


def probe(n=8, seed=1):
    return torch.randn(n, 1, 28, 28, generator=torch.Generator().manual_seed(seed))


def test_step_inside_cpu_autocast_samples_and_leaves_autocast_on():
    model = tiny()
    watch = Watch(model, probe(), every_n_steps=1, strict=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        watch.step(1)
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16  # as it was
    reference = Watch(tiny(), probe(), every_n_steps=1, strict=True)
    reference.step(1)
    assert watch.history[-1].layers == reference.history[-1].layers  # the same float32 pass, autocast or not


def test_a_loop_that_steps_inside_autocast_trains_bit_identically():
    runs = []
    for watched in (False, True):
        model = tiny()
        torch.manual_seed(0)
        watch = Watch(model, probe(4), every_n_steps=2, strict=True) if watched else None
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(0)
        for step in range(1, 7):
            with torch.autocast("cpu", dtype=torch.bfloat16):  # the whole iteration, step() included
                x, y = torch.randn(16, 1, 28, 28, generator=gen), torch.randint(0, 10, (16,), generator=gen)
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if watch is not None:
                    watch.step(step, loss)
        runs.append((model.state_dict(), torch.get_rng_state(), watch and len(watch.history)))
    (a, rng_a, _), (b, rng_b, samples) = runs
    assert samples == 3 and all(torch.equal(a[k], b[k]) for k in a) and torch.equal(rng_a, rng_b)


def test_a_bf16_model_inside_autocast_samples():
    model = tiny().to(torch.bfloat16)
    watch = Watch(model, probe(), every_n_steps=1, strict=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        watch.step(1)
    assert len(watch.history) == 1 and all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_shared_block_modules_are_refused_at_construction():
    model = tiny()
    model.blocks = nn.Sequential(model.blocks[0], model.blocks[1], model.blocks[0], model.blocks[3])
    with pytest.raises(ValueError, match=r"^block 2 is the same module as block 0 \(Block\)"):
        Watch(model, probe())


@pytest.mark.parametrize("option", ["patience", "plateau_patience", "history_size", "every_n_steps", "warmup"])
def test_counts_are_bounded(option):
    with pytest.raises(ConfigError, match=rf"option '{option}' must be at most 1,000,000,000, got 1180591620717411"):
        build_options(**{option: 2**70})
    with pytest.raises(ConfigError, match="patience must be an int from 1 to 1,000,000,000"):
        build_options(freeze_settled={"patience": 2**70})


def test_a_freeze_settled_error_names_the_line_of_its_key(tmp_path):
    path = tmp_path / "isiwatch.yaml"
    path.write_text("every_n_steps: 5\nfreeze_settled:\n  tolerance: 0.02\n  patience: 0\n")
    with pytest.raises(ConfigError, match=r"isiwatch.yaml:4: option 'freeze_settled' patience must be an int from 1"):
        load_yaml(path)


def test_step_returns_freeze_and_stop_records():
    model = tiny()
    seen = []
    watch = Watch(model, probe(), every_n_steps=1, freeze_settled=FreezePolicy(patience=1), monitor="loss",
                  patience=0, alert_callback=seen.append)
    returned = []
    for step in (1, 2, 3):
        returned += watch.step(step, loss=1.0)
    kinds = [r.kind for r in returned]
    assert "blocks_frozen" in kinds and "early_stop" in kinds
    assert returned == seen  # every record the Watch emitted at those steps, in order, and nothing else


def train_steps(model, watch, steps, before_step=lambda step: None, batch=64):
    """A real training loop on random digits-sized data; returns every record ``step()`` returned."""
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model.train()
    returned = []
    for step in range(1, steps + 1):
        before_step(step)
        x = torch.randn(batch, 1, 28, 28, generator=gen)
        y = torch.randint(0, 10, (batch,), generator=gen)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if watch is not None:
            returned += watch.step(step, loss)
    return returned


def stall_once(model, seconds):
    """A forward hook that sleeps ``seconds`` in the first probe pass after ``armed`` is set (the probe pass runs
    without gradients, training with them): one stalled probe pass, as a descheduled process or a slow disk."""
    state = {"armed": False}

    def hook(*_):
        if state["armed"] and not torch.is_grad_enabled():
            state["armed"] = False
            state["stalled"] = True
            time.sleep(seconds)

    model.blocks[0].register_forward_hook(hook)
    return state


def test_one_stalled_probe_pass_stretches_the_interval_once_and_sampling_goes_on(capsys):
    base = 2
    runs = []
    for watched in (False, True):
        model = tiny()
        torch.manual_seed(0)
        stall = stall_once(model, 1.0)
        watch = Watch(model, probe(4), every_n_steps=base, overhead_budget=0.9) if watched else None
        records = train_steps(model, watch, 66, lambda step, stall=stall: step == 7 and stall.update(armed=True))
        runs.append((model.state_dict(), torch.get_rng_state()))
    (a, rng_a), (b, rng_b) = runs
    assert all(torch.equal(a[k], b[k]) for k in a) and torch.equal(rng_a, rng_b)
    assert stall["stalled"]
    changes = [r for r in records if r.kind == "sampling_interval"]
    assert changes and changes[0].step == 8, "the stalled sample stretched the interval"
    for record in changes:
        assert record.data["interval"] <= max(record.data["previous"] * 2, base)
        assert record.data["interval"] <= record.data["max_interval"] == base * 16
    steps = [s.step for s in watch.history]
    assert len(steps) >= 10 and max(b - a for a, b in zip(steps, steps[1:])) <= base * 16


def test_the_interval_never_passes_its_maximum_and_says_so_once(capsys, monkeypatch):
    monkeypatch.setattr(logging.root, "handlers", [])  # as in a script that set up no logging (pytest's is gone)
    # step() with no training between: the overhead ratio is far above the budget at every sample
    watch = Watch(tiny(), probe(4), every_n_steps=1, overhead_budget=0.001)
    records = []
    for step in range(1, 200):
        records += watch.step(step)
    intervals = [r.data["interval"] for r in records if r.kind == "sampling_interval"]
    assert intervals == [2, 4, 8, 16] and watch.interval == 16  # doubled per sample, then held at the maximum
    steps = [s.step for s in watch.history]
    assert steps[-1] >= 192 and max(b - a for a, b in zip(steps, steps[1:])) == 16  # still sampling
    lines = [line for line in capsys.readouterr().err.splitlines() if "sampling every" in line]
    assert lines == ["isiwatch: warning: step 4: sampling every 4 steps instead of every_n_steps=1: the Watch's "
                     "overhead (ratio " + lines[0].split("(ratio ")[1].split(")")[0] + ") is over "
                     "overhead_budget=0.001; it never samples less often than every 16 steps"]


def test_an_impossible_clock_reading_is_discarded(monkeypatch):
    from isiwatch.watch import sampling_clock

    offset = [0.0]
    monkeypatch.setattr(sampling_clock, "_clock", lambda: time.monotonic() + offset[0])
    watch = Watch(tiny(), probe(4), every_n_steps=1, overhead_budget=0.5)
    records = watch.step(1)
    for jump in (-1000.0, 10.0**9):  # the clock steps back, then leaps forward (a broken clock source)
        offset[0] += jump
        time.sleep(0.05)  # some training time between samples
        records += watch.step(len(watch.history) + 1)
        assert watch.history[-1].overhead_ratio is None and watch.history[-1].overhead_s is None
    assert watch.interval == 1 and not [r for r in records if r.kind == "sampling_interval"]
    time.sleep(0.05)
    watch.step(4)
    assert watch.history[-1].overhead_ratio is not None  # readings count again once the clock is sane


class BadGateway:
    """A real local socket server that reads each request and then trickles its answer one byte every 0.1 s
    (``trickle``) or holds the connection without a byte (``hold``), until the client hangs up."""

    def __init__(self, mode):
        self.mode, self.connections = mode, 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            try:
                conn.recv(65536)
                answer = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10**6
                for byte in answer if self.mode == "trickle" else ():
                    conn.sendall(bytes([byte]))
                    time.sleep(0.1)
                while conn.recv(65536):  # hold: wait for the client to hang up
                    pass
            except OSError:
                pass

    def close(self):
        self.server.close()


def test_a_gateway_that_trickles_or_holds_is_a_fault_and_close_is_bounded(monkeypatch):
    monkeypatch.setattr(prometheus, "PUSH_DEADLINE", 1.0)  # the real 5 s and 1 s, shortened to keep the test quick
    monkeypatch.setattr(prometheus, "MIN_PUSH_DEADLINE", 0.5)
    gateways = {mode: BadGateway(mode) for mode in ("trickle", "hold")}  # watched side by side: one wait for both
    records = {mode: [] for mode in gateways}
    watches = {mode: Watch(tiny(), probe(4), every_n_steps=1, pushgateway=f"127.0.0.1:{gateway.port}",
                           alert_callback=records[mode].append) for mode, gateway in gateways.items()}
    closing = {}

    def sample(step):
        time.sleep(0.3)  # training between samples
        for watch in watches.values():
            watch.step(step, 1.0)

    try:
        for step in range(1, 11):  # the first push has the full (shortened) 1 s deadline, the next ones 0.5 s
            sample(step)
        for mode, watch in watches.items():
            start = time.monotonic()
            watch.close()
            closing[mode] = time.monotonic() - start
    finally:
        for gateway in gateways.values():
            gateway.close()
    for mode, watch in watches.items():
        assert closing[mode] < 2.5, f"{mode}: close() took {closing[mode]:.1f} s"  # 2 s for the pusher, 0.5 spare
        assert len(watch.history) == 10  # sampling never waited for the gateway
        faults = [r for r in records[mode] if r.kind == "monitor_error"]
        assert len(faults) == 1 and faults[0].data["source"] == "exporter PrometheusExporter", mode
        assert "TimeoutError: the push gateway did not answer within 1.0 s" in faults[0].message
        assert gateways[mode].connections >= 3  # a stuck push does not stop the next ones
        assert watch.faults.counts["exporter PrometheusExporter"] >= 3  # close() counted its aborted last push


def test_close_reports_a_last_push_it_had_to_abort():
    gateway = BadGateway("hold")
    records = []
    watch = Watch(tiny(), probe(4), every_n_steps=1, pushgateway=f"127.0.0.1:{gateway.port}",
                  alert_callback=records.append)
    try:
        watch.step(1, 1.0)
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt), watch:  # a signal handler that exits through the with block
            raise KeyboardInterrupt
        assert time.monotonic() - start < 2.2
    finally:
        gateway.close()
    (fault,) = [r for r in records if r.kind == "monitor_error"]
    assert "did not take the last sample within 1.5 s of close()" in fault.message
