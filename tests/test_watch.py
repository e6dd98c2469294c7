"""isiwatch.Watch: non-perturbation, exporters, alerts, early stopping, state, memory."""

import gc
import json
import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import timm
import torch
import torch.nn.functional as F
from prometheus_client import CollectorRegistry
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import isiwatch
from isiwatch import Watch
from isiwatch.measure.analysis import Analysis
from isiwatch.measure.depth import recommend_depth


def tiny_vit(depth=4, dim=32, seed=0, **kw):
    torch.manual_seed(seed)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7, in_chans=1,
                             num_classes=10, embed_dim=dim, depth=depth, num_heads=2, **kw)


@pytest.fixture(scope="module")
def digits():
    from isiwatch.io.data import embedded_digits

    x, y = embedded_digits()
    return x[:256], y[:256], x[4000:4064], y[4000:4064]


def train(model, x, y, steps, watch=None, batch=32):
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    model.train()
    for step in range(1, steps + 1):
        idx = torch.randint(0, len(x), (batch,))
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if watch is not None:
            watch.step(step, loss)
            if watch.should_stop:
                return step
    return steps


def test_watch_does_not_perturb_training(digits, tmp_path):
    x, y, px, py = digits
    runs = []
    for with_watch in (False, True):
        model = tiny_vit(drop_rate=0.1, drop_path_rate=0.2, attn_drop_rate=0.1, proj_drop_rate=0.1)
        torch.manual_seed(42)
        watch = Watch(model, px, py, every_n_steps=5, log_dir=tmp_path / "tb", registry=CollectorRegistry()) \
            if with_watch else None
        train(model, x, y, 30, watch)
        if watch:
            assert len(watch.history) == 6
            watch.close()
        runs.append((model.state_dict(), torch.get_rng_state(), model.training))
    (a, rng_a, mode_a), (b, rng_b, mode_b) = runs
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(rng_a, rng_b) and mode_a == mode_b is True


def test_exporters_and_state_after_a_short_run(digits, tmp_path):
    x, y, px, py = digits
    model = tiny_vit()
    registry = CollectorRegistry()
    watch = Watch(model, px, py, every_n_steps=2, log_dir=tmp_path, registry=registry, run_name="short",
                  heatmap_every=2, monitor="probe_cls/last", mode="max", patience=100)
    train(model, x, y, 8, watch)
    state = watch.state_dict()
    watch.close()

    acc = EventAccumulator(str(watch.run_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    for metric in ("isi", "attn_entropy", "token_similarity", "probe_cls", "probe_patch_mean"):
        assert {f"isiwatch/{metric}/layer_00", f"isiwatch/{metric}/layer_03"} <= scalars
    assert {"isiwatch/plateau/length", "isiwatch/plateau/detected"} <= scalars
    assert [e.step for e in acc.Scalars("isiwatch/isi/layer_00")] == [2, 4, 6, 8]
    assert "isiwatch/heatmap/isi" in acc.Tags()["images"]

    assert registry.get_sample_value("isiwatch_layer_metric",
                                     {"run": "short", "layer": "03", "metric": "isi"}) is not None
    assert registry.get_sample_value("isiwatch_plateau_detected", {"run": "short"}) in (0.0, 1.0)
    assert registry.get_sample_value("isiwatch_last_sample_timestamp_seconds", {"run": "short"}) > 1e9
    assert registry.get_sample_value("isiwatch_sample_duration_seconds_count", {"run": "short"}) == 4
    assert registry.get_sample_value("isiwatch_training_step", {"run": "short"}) == 8

    lines = (watch.run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2, 4, 6, 8]

    # the depth recommendation: proposed from each sample's curves, published unless the probes cannot tell the
    # proposed depth from the published one (depth_evidence), kept on the sample, exported everywhere
    samples = list(watch.history)
    for sample in samples:
        analysis = Analysis(sample.layers, {}, {"depth": 4}, phases=sample.phases)
        proposed = recommend_depth(analysis)
        evidence = sample.depth_evidence
        if evidence is None:
            assert sample.recommendation == proposed
        else:
            assert evidence["proposed"] == proposed.depth and evidence["published"] == sample.recommendation.depth
        assert 1 <= sample.recommendation.depth <= 4
    assert [e.value for e in acc.Scalars("isiwatch/recommended_depth")] == [s.recommendation.depth for s in samples]
    assert [e.step for e in acc.Scalars("isiwatch/recommended_depth")] == [2, 4, 6, 8]
    assert registry.get_sample_value("isiwatch_recommended_depth", {"run": "short"}) == \
        samples[-1].recommendation.depth
    rows = [json.loads(line) for line in lines]
    assert [r["recommendation"] for r in rows] == [s.recommendation.to_dict() for s in samples]
    assert [r["depth_evidence"] for r in rows] == [s.depth_evidence for s in samples]
    assert rows[-1]["recommendation"]["source_depth"] == 4
    assert (watch.run_dir / "alerts.jsonl").exists()

    fresh = Watch(tiny_vit(), px, py, every_n_steps=2, monitor="probe_cls/last", mode="max", patience=100)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    assert fresh.step(8) == []  # already sampled at step 8
    fresh.close()


def mixing(blocks, gamma):
    """Blocks whose attention is uniform and whose value/projection are the identity: each adds gamma ×
    the image's mean token to every token (raising token similarity); gamma = 0 makes the block identity."""
    with torch.no_grad():
        for blk in blocks:
            d = blk.attn.qkv.in_features
            blk.attn.qkv.weight.zero_()
            blk.attn.qkv.bias.zero_()
            blk.attn.qkv.weight[2 * d:] = torch.eye(d)
            blk.attn.proj.weight.copy_(torch.eye(d))
            blk.attn.proj.bias.zero_()
            blk.ls1.gamma.fill_(gamma)
            blk.ls2.gamma.fill_(0.0)


def mixing_vit():
    model = tiny_vit(depth=8, init_values=1.0)
    mixing(model.blocks, 0.2)
    return model


def set_middle_blocks(model, gamma):
    mixing(model.blocks[2:6], gamma)


def test_plateau_onset_fires_once_and_on_plateau_stops(digits):
    _, _, px, py = digits
    model = mixing_vit()
    before = isiwatch.analyze(model, px, py).phases
    seen = []
    watch = Watch(model, px, py, every_n_steps=1, plateau_patience=3, stop_on_plateau=True,
                  alert_callback=seen.append)
    stop_step = None
    for step in range(1, 30):
        if step == 5:  # training "collapses" the middle blocks: identity blocks make a flat stretch
            set_middle_blocks(model, 0.0)
        watch.step(step)
        if watch.should_stop:
            stop_step = step
            break
    assert before is None  # precondition: no plateau before the change
    onsets = [a for a in seen if a.kind == "plateau_onset"]
    assert len(onsets) == 1 and onsets[0].step == 7
    assert onsets[0].data["plateau"] == [1, 5]
    assert stop_step == 7 and "stable for 3 samples" in watch.stop_reason
    assert [a.kind for a in seen if a.kind == "early_stop"] == ["early_stop"]


def test_on_plateau_never_stops_on_a_slow_start(digits):
    """A flat stretch from block 0 is a slow start (info), not the paper's plateau: no stop, whatever its age."""
    _, _, px, py = digits
    model = mixing_vit()
    mixing(model.blocks[:4], 0.0)  # blocks 0-3 change nothing: flat from the start, no Cliff before it
    seen = []
    watch = Watch(model, px, py, every_n_steps=1, plateau_patience=3, stop_on_plateau=True,
                  alert_callback=seen.append)
    for step in range(1, 10):
        watch.step(step)
    assert [a.kind for a in seen if a.kind in ("slow_start", "plateau_onset")] == ["slow_start"]
    assert not watch.should_stop and watch.stop_reason is None


def test_recommended_depth_drops_identity_blocks_and_reaches_prometheus(digits):
    _, _, px, _ = digits
    model = mixing_vit()
    set_middle_blocks(model, 0.0)  # blocks 2-5 change nothing
    registry = CollectorRegistry()
    watch = Watch(model, px, every_n_steps=1, registry=registry, run_name="depth")  # no labels: no probes
    watch.step(1)
    rec = watch.history[-1].recommendation
    assert {2, 3, 4, 5} <= set(rec.blocks_to_drop) and rec.source_depth == 8
    assert rec.depth == 8 - len(rec.blocks_to_drop) <= 4
    assert registry.get_sample_value("isiwatch_recommended_depth", {"run": "depth"}) == rec.depth
    assert watch.history[-1].series()["recommended_depth"] == rec.depth
    set_middle_blocks(model, 1.0)  # the blocks work (hard) again: the recommendation and the gauge follow
    watch.step(2)
    rec2 = watch.history[-1].recommendation
    assert rec2.depth > rec.depth and not {2, 3} & set(rec2.blocks_to_drop)
    assert registry.get_sample_value("isiwatch_recommended_depth", {"run": "depth"}) == rec2.depth
    watch.close()


def test_alerts_once_per_episode_with_cleared_records(digits):
    _, _, px, py = digits
    model = mixing_vit()
    seen = []
    watch = Watch(model, px, py, every_n_steps=1, plateau_patience=2, alert_callback=seen.append)
    pattern = [0.2, 0.0, 0.0, 0.0, 0.0, 0.2, 0.2, 0.2, 0.0, 0.0, 0.0]
    for step, scale in enumerate(pattern, 1):
        set_middle_blocks(model, scale)
        watch.step(step)
    kinds = [(a.kind, a.step) for a in seen if a.kind.startswith("plateau_onset")]
    assert kinds == [("plateau_onset", 3), ("plateau_onset_cleared", 7), ("plateau_onset", 10)]


def test_non_finite_activations_raise_an_alert_not_a_crash(digits, tmp_path):
    _, _, px, py = digits
    model = tiny_vit()
    watch = Watch(model, px, py, every_n_steps=1, log_dir=tmp_path)
    assert [a.kind for a in watch.step(1)] == []  # a healthy model: no alert at all
    with torch.no_grad():
        model.blocks[2].mlp.fc1.weight[0, 0] = float("inf")
        model.blocks[2].mlp.fc2.weight[0, 0] = float("nan")
    alerts = watch.step(2)
    assert [a.kind for a in alerts] == ["non_finite"]
    # block 2's MLP output is NaN: everything read from block 2's output on is; its attention branch is not
    assert {"token_similarity", "block_influence", "probe_cls", "isi"} <= set(alerts[0].data["series"])
    assert watch.step(3) == []  # same episode, no repeat
    watch.close()
    records = [json.loads(line) for line in (watch.run_dir / "alerts.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in records] == [("non_finite", 2)]
    layers = json.loads((watch.run_dir / "metrics.jsonl").read_text().splitlines()[-1])["layers"]
    assert [v is None for v in layers["token_similarity"]] == [False, False, True, True]  # NaN is written null
    assert [v is None for v in layers["isi"]] == [False, False, False, True]
    assert all(isinstance(v, float) for v in layers["isi"][:3])


def test_early_stopping_on_any_series_and_thresholds(digits):
    _, _, px, py = digits
    model = tiny_vit()
    watch = Watch(model, px, py, every_n_steps=1, monitor="loss", mode="min", patience=2, min_delta=0.1)
    for step, loss in enumerate([2.0, 1.5, 1.45, 1.42], 1):
        watch.step(step, loss)
    assert watch.should_stop and "did not improve for 2" in watch.stop_reason
    watch = Watch(model, px, py, every_n_steps=1, monitor="loss", divergence_threshold=5.0)
    watch.step(1, 6.0)
    assert watch.should_stop and "diverged" in watch.stop_reason
    watch = Watch(model, px, py, every_n_steps=1, monitor="loss", warmup=2, check_finite=True)
    watch.step(1, float("nan"))
    assert not watch.should_stop
    watch.step(2, 1.0)
    watch.step(3, float("inf"))
    assert watch.should_stop and "not finite" in watch.stop_reason
    with pytest.raises(ValueError, match="not a tracked series"):
        Watch(model, px, py, every_n_steps=1, monitor="accuracy")  # at construction, not at the first sample


@pytest.mark.parametrize("images, labels, options, message", [
    (None, slice(5), {}, "probe_labels has 5 labels for 64 probe images"),
    (None, "2d", {}, r"probe_labels must be a 1-D tensor of class indices \(B,\), got \(64, 1\)"),
    ("rgb", None, {}, "3-channel images, but the model's patch embedding takes 1 channels"),
    ("32px", None, {}, "32×32 images, but the model takes 28×28"),
    (None, None, {"probe_batch_size": 0}, "option 'probe_batch_size' must be at least 1, got 0"),
    (None, None, {"min_layers": 1}, "option 'min_layers' must be at least 2, got 1"),
    (None, None, {"isi_stall_window": 0}, "option 'isi_stall_window' must be at least 2, got 0"),
    (None, None, {"heatmap_every": 0}, "option 'heatmap_every' must be at least 1, got 0"),
    (None, None, {"with_isi_recon": True, "probe_batch_size": 62}, "at least 4 images in every probe chunk"),
    (None, None, {"monitor": "probe_cls/lst"},
     r"monitor 'probe_cls/lst' is not a tracked series: did you mean 'probe_cls/last'\? series are "
     r"<metric>/layer_00…layer_03, <metric>/last and <metric>/mean for attn_token_change, .*probe_cls"),
    (None, None, {"monitor": "isi/layer_04"}, "monitor 'isi/layer_04' is not a tracked series"),
    (None, "none", {"monitor": "probe_cls/last"}, "probe_cls needs probe labels"),
    (None, "none", {"phase_metric": "probe_patch_mean"}, "phase_metric 'probe_patch_mean' cannot be tracked"),
    (None, None, {"phase_metric": "isi_recon"}, "isi_recon needs with_isi_recon=True"),
])
def test_probe_batch_and_options_are_checked_at_construction(digits, images, labels, options, message):
    _, _, px, py = digits
    images = {None: px, "rgb": px.expand(-1, 3, -1, -1), "32px": F.pad(px, (2, 2, 2, 2))}[images]
    labels = {None: py, "none": None, "2d": py[:, None]}.get(labels) if not isinstance(labels, slice) else py[labels]
    model = tiny_vit()
    with pytest.raises(ValueError, match=message):
        Watch(model, images, labels, every_n_steps=1, **options)


@pytest.mark.parametrize("labels, cls, recon", [(True, True, False), (False, True, True), (True, False, False)])
def test_series_names_are_the_series_samples_hold(digits, labels, cls, recon):
    _, _, px, py = digits
    model = tiny_vit() if cls else tiny_vit(class_token=False, global_pool="avg")
    forwards = []
    model.register_forward_hook(lambda *_: forwards.append(1))
    watch = Watch(model, px, py if labels else None, every_n_steps=1, with_isi_recon=recon)
    assert not forwards  # the names come from the model's structure, not from a forward pass
    watch.step(1, 0.5)
    watch.step(2, 0.5)  # the second sample has an overhead ratio: the first has no training time before it
    assert set(watch.history[-1].series()) == watch.series_names
    assert ("probe_cls/last" in watch.series_names) == (labels and cls)
    assert ("isi_recon/layer_03" in watch.series_names) == recon


@pytest.fixture(scope="module")
def stopped_state(digits):
    """The state of a Watch that stopped at step 5, with every part non-trivial."""
    _, _, px, py = digits
    watch = Watch(mixing_vit(), px, py, every_n_steps=1, monitor="loss", patience=2, stop_on_plateau=True,
                  isi_stall_window=3)
    for step, loss in enumerate([2.0, 1.9, 1.9, 1.9, 1.9], 1):
        watch.step(step, loss)
    state = watch.state_dict()
    assert state["should_stop"] and state["last_step"] == 5 and state["isi_stall"]
    return state


@pytest.mark.parametrize("path, value, message", [
    (("tracker", "run_length"), "x", r"Watch state\['tracker'\]: 'run_length' must be an int >= 0, got 'x'"),
    (("tracker",), {"anchor": None}, r"Watch state\['tracker'\]: 'run_length' is missing"),
    (("alerts", "active"), "plateau_onset", r"Watch state\['alerts'\]: 'active' must be a list of alert kinds"),
    (("stoppers", 0, "best"), None, r"Watch state\['stoppers'\]\[0\]: 'best' must be a number, got None"),
    (("plateau_stopper", "anchor"), [[3], 0.5], r"Watch state\['plateau_stopper'\]: 'anchor' must be null or"),
    (("isi_stall",), [[0.5]], r"Watch state: 'isi_stall' must be a list of \[mean ISI, loss\] pairs"),
    (("stoppers",), [], r"Watch state: 'stoppers' must be a list of 1 early-stopping states"),
    (("interval",), 0, r"Watch state: 'interval' must be an int >= 1, got 0"),
])
def test_load_state_dict_is_all_or_nothing(digits, stopped_state, path, value, message):
    _, _, px, py = digits
    watch = Watch(mixing_vit(), px, py, every_n_steps=1, monitor="loss", patience=2, stop_on_plateau=True,
                  isi_stall_window=3)
    watch.step(1, 3.0)
    before = watch.state_dict()
    bad = json.loads(json.dumps(stopped_state))
    parent = bad
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    with pytest.raises(ValueError, match="^invalid " + message):
        watch.load_state_dict(bad)
    assert watch.state_dict() == before and not watch.should_stop and watch.last_step == 1
    watch.load_state_dict(json.loads(json.dumps(stopped_state)))  # a state through JSON (lists) loads whole
    assert watch.state_dict() == stopped_state


def test_isi_stall_needs_falling_loss(digits):
    _, _, px, py = digits
    seen = []
    watch = Watch(tiny_vit(), px, py, every_n_steps=1, isi_stall_window=3, alert_callback=seen.append)
    for step, loss in enumerate([1.0, 1.0, 1.0, 0.9, 0.8], 1):  # frozen model: ISI is constant
        watch.step(step, loss)
    assert [(a.kind, a.step) for a in seen if "isi_stall" in a.kind] == [("isi_stall", 4)]


def test_port_in_use_keeps_training(digits, caplog):
    _, _, px, py = digits
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with caplog.at_level(logging.WARNING, logger="isiwatch"):
            watch = Watch(tiny_vit(), px, py, every_n_steps=1, prometheus_port=port, registry=CollectorRegistry())
        assert "cannot serve Prometheus metrics" in caplog.text and watch.prometheus.port is None
        watch.step(1)
        assert len(watch.history) == 1
        watch.close()


def test_http_exporter_binds_loopback(digits):
    import urllib.request

    _, _, px, py = digits
    with Watch(tiny_vit(), px, py, every_n_steps=1, prometheus_port=0, run_name="http") as watch:
        watch.step(1)
        host, port = watch.prometheus.server.server_address[:2]
        assert host == "127.0.0.1"
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'isiwatch_plateau_detected{run="http"}' in body


@pytest.mark.slow
def test_memory_flat_over_2000_samples_and_hooks_removed(tmp_path):
    """Counted in a fresh interpreter (`memory_flat_run.py`): in a worker that had run other tests first, objects
    of threads those tests left behind counted too (903 once on CI; 84 alone, 93 beside eight busy loops)."""
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("memory_flat_run.py")), str(tmp_path)],
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-2000:]
    counts = json.loads(run.stdout.splitlines()[-1])
    assert counts["history"] == 50
    assert counts["object_growth"] < 200, counts["grew_most"]
    assert counts["tensor_growth"] <= 0, counts
    assert counts["rss_growth"] < 16 * 2**20, counts
    assert not counts["hooks_left"]


def test_norm_friction_alert_is_wired_and_informational(digits):
    _, _, px, py = digits
    model = tiny_vit()
    assert Watch(model, px, py, every_n_steps=1).options.norm_friction_threshold == 0.1
    quiet = Watch(model, px, py, every_n_steps=1)
    assert all(a.kind != "norm_friction_high" for a in quiet.step(1))  # random ViTs have ~0 friction
    loud = Watch(model, px, py, every_n_steps=1, norm_friction_threshold=-1.0)  # every block exceeds it
    (alert,) = [a for a in loud.step(1) if a.kind == "norm_friction_high"]
    assert alert.severity == "info" and "isiwatch specialize" in alert.message
    assert alert.data["blocks_above"] == [0, 1, 2, 3]


def test_close_samples_the_last_step_once_and_warns_without_samples(digits, tmp_path, caplog):
    x, y, px, py = digits
    model = tiny_vit()
    watch = Watch(model, px, py, every_n_steps=10, log_dir=tmp_path, monitor="loss", stopping_threshold=100.0)
    train(model, x, y, 3, watch)  # shorter than every_n_steps
    assert len(watch.history) == 0
    with caplog.at_level(logging.WARNING, logger="isiwatch"):
        watch.close()
        watch.close()
    assert [s.step for s in watch.history] == [3] and watch.history[0].loss > 0 and not caplog.text
    assert not watch.should_stop  # the final sample does not update early stopping (training is over)
    assert [json.loads(line)["step"] for line in (watch.run_dir / "metrics.jsonl").read_text().splitlines()] == [3]

    sampled = Watch(model, px, py, every_n_steps=2)
    train(model, x, y, 4, sampled)
    sampled.close()
    assert [s.step for s in sampled.history] == [2, 4]  # the last step was sampled: no second sample

    with caplog.at_level(logging.WARNING, logger="isiwatch"):
        Watch(model, px, py, every_n_steps=2, run_name="empty").close()
    assert "run empty ended without a single sample" in caplog.text

    with pytest.raises(RuntimeError), Watch(model, px, py, every_n_steps=2) as crashed:
        crashed.step(1)
        raise RuntimeError("training failed")
    assert len(crashed.history) == 0  # no final probe pass after an exception


def test_prometheus_publishes_open_episodes_not_minus_one(digits):
    """Issue 13 #9: no plateau in the sample → no plateau span series (not -1); the onset span and each open
    episode's start step stay published while the episode is open, and survive a resume."""
    _, _, px, py = digits
    model = mixing_vit()
    registry = CollectorRegistry()
    watch = Watch(model, px, py, every_n_steps=1, plateau_patience=2, registry=registry, run_name="ep")
    run, nf = {"run": "ep"}, {"run": "ep", "kind": "non_finite"}
    value = registry.get_sample_value
    for step, (scale, loss) in enumerate([(0.0, 1.0), (0.0, 1.0), (0.2, float("nan")), (0.2, float("nan"))], 1):
        set_middle_blocks(model, scale)
        watch.step(step, loss)
        if step == 3:  # the plateau is gone from the sample, the plateau_onset episode is still open
            assert value("isiwatch_plateau_start_layer", run) is None is value("isiwatch_plateau_end_layer", run)
            assert value("isiwatch_alert_active", {"run": "ep", "kind": "plateau_onset"}) == 1
            assert (value("isiwatch_plateau_onset_start_layer", run), value("isiwatch_plateau_onset_end_layer", run),
                    value("isiwatch_plateau_onset_step", run)) == (1, 5, 2)
    # step 4: the plateau episode closed; non_finite opened at step 3 and is still open
    assert value("isiwatch_plateau_onset_start_layer", run) is value("isiwatch_plateau_onset_step", run) is None
    assert value("isiwatch_training_step", run) == 4 and value("isiwatch_alert_start_step", nf) == 3
    resumed_registry = CollectorRegistry()
    resumed = Watch(model, px, py, every_n_steps=1, plateau_patience=2, registry=resumed_registry, run_name="ep")
    resumed.load_state_dict(json.loads(json.dumps(watch.state_dict())))
    resumed.step(5, float("nan"))
    assert resumed_registry.get_sample_value("isiwatch_alert_start_step", nf) == 3
    resumed.step(6, 1.0)  # episode closed: the series goes
    assert resumed_registry.get_sample_value("isiwatch_alert_start_step", nf) is None
    old = watch.state_dict()
    del old["alerts"]["opened"]  # a state saved before episodes kept their start
    resumed.load_state_dict(old)
    assert resumed.alerts.active == {"non_finite"} and resumed.alerts.opened == {}
    watch.close()
    resumed.close()


def plateau_alert_run(px, **kw) -> list:
    model = mixing_vit()
    set_middle_blocks(model, 0.0)
    watch = Watch(model, px, every_n_steps=1, plateau_patience=1, **kw)  # no labels: no [CLS] alert
    alerts = watch.step(1)
    watch.close()
    assert [a.kind for a in alerts] == ["plateau_onset"]  # a warning-level alert
    return alerts


def test_alerts_reach_the_console_only_through_the_callers_code(digits, capsys, monkeypatch):
    """Issue 13 #19: the library installs no printing handler (a NullHandler), so without the application's
    logging config an alert is printed once by the caller's own print, not also by logging's last resort."""
    monkeypatch.setattr(logging.root, "handlers", [])  # a script that never configured logging
    assert all(isinstance(h, logging.NullHandler) for h in logging.getLogger("isiwatch").handlers)
    (alert,) = plateau_alert_run(digits[2], alert_callback=lambda a: print(f"[{a.kind}] step {a.step}: {a.message}"))
    out = capsys.readouterr()
    assert (out.out + out.err).count(alert.message) == 1
    (alert,) = plateau_alert_run(digits[2])
    out = capsys.readouterr()
    assert alert.message not in out.out + out.err


def test_alerts_still_reach_the_users_logging_handlers(digits, caplog):
    with caplog.at_level(logging.WARNING, logger="isiwatch"):
        (alert,) = plateau_alert_run(digits[2])
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("isiwatch", logging.WARNING, f"[plateau_onset] step 1: {alert.message} (hint: {alert.hint})")]
    assert alert.hint.startswith("the blocks over the plateau (blocks ") and "isiwatch truncate" in alert.hint


# -- the Watch's own cost ------------------------------------------------------------------------------------
def test_the_overhead_series_reach_tensorboard_jsonl_and_prometheus(digits, tmp_path):
    from prometheus_client import generate_latest

    _, _, px, py = digits
    registry = CollectorRegistry()
    watch = Watch(tiny_vit(), px, py, every_n_steps=2, log_dir=tmp_path, registry=registry, run_name="cost")
    for step in range(1, 7):
        time.sleep(0.01)  # the training step
        watch.step(step, 1.0)
    watch.close()
    samples = list(watch.history)
    assert samples[0].overhead_ratio is None and samples[0].overhead_s > 0  # no training time before the first
    assert all(s.overhead_s > 0 and 0 < s.overhead_ratio < float("inf") for s in samples[1:])
    acc = EventAccumulator(str(watch.run_dir))
    acc.Reload()
    assert [e.step for e in acc.Scalars("isiwatch/overhead/ratio")] == [4, 6]
    assert [e.step for e in acc.Scalars("isiwatch/overhead/seconds")] == [2, 4, 6]  # as isiwatch_overhead_seconds
    assert [e.value for e in acc.Scalars("isiwatch/sample_duration_seconds")] == pytest.approx(
        [s.duration_s for s in samples])  # the other concept, under its own name in both exporters
    assert not [tag for tag in acc.Tags()["scalars"] if "sample_seconds" in tag]
    lines = [json.loads(line) for line in (watch.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["overhead_ratio"] for r in lines] == [None, samples[1].overhead_ratio, samples[2].overhead_ratio]
    assert all(r["overhead_s"] > 0 for r in lines)
    text = generate_latest(registry).decode()
    assert f'isiwatch_overhead_ratio{{run="cost"}} {samples[-1].overhead_ratio!r}' in text
    assert 'isiwatch_overhead_seconds{run="cost"}' in text
    assert 'isiwatch_sample_duration_seconds_count{run="cost"} 3.0' in text


def test_probe_every_runs_the_linear_probes_on_every_kth_sample_only(digits):
    _, _, px, py = digits
    watch = Watch(tiny_vit(), px, py, every_n_steps=1, probe_every=3, monitor="probe_cls/last", mode="max")
    for step in range(1, 8):
        watch.step(step, 1.0)
    probed = [s.step for s in watch.history if "probe_cls" in s.layers]
    assert probed == [1, 4, 7]
    assert all("isi" in s.layers for s in watch.history)  # the other metrics on every sample
    assert watch.stoppers[0].seen == 3  # early stopping sees the probe series only where it exists


def test_overhead_budget_stretches_the_interval_and_logs_each_change(digits, caplog):
    _, _, px, py = digits
    # a step() with no training between: the overhead ratio is far above any budget, so the interval grows
    watch = Watch(tiny_vit(), px, py, every_n_steps=2, overhead_budget=0.005)
    with caplog.at_level(logging.INFO, logger="isiwatch"):
        for step in range(1, 41):
            watch.step(step, 1.0)
    steps = [s.step for s in watch.history]
    assert steps[:2] == [2, 4] and watch.interval > 2 and watch.interval % 2 == 0
    assert len(steps) < 20 and all(s % 2 == 0 for s in steps)
    changes = [r.getMessage() for r in caplog.records if "against a budget of 0.0050" in r.getMessage()]
    assert changes and changes[-1].endswith(f"sampling every {watch.interval} steps instead of "
                                            f"{changes[-1].split()[-1]}")
    # the interval in effect resumes with the run; without a budget the resumed Watch samples every_n_steps
    state = watch.state_dict()
    assert state["interval"] == watch.interval
    resumed = Watch(tiny_vit(), px, py, every_n_steps=2, overhead_budget=0.005)
    resumed.load_state_dict(state)
    assert resumed.interval == watch.interval
    plain = Watch(tiny_vit(), px, py, every_n_steps=2)
    plain.load_state_dict(state)
    assert plain.interval == 2


def test_overhead_budget_shortens_the_interval_again_when_training_is_slow(digits):
    _, _, px, py = digits
    watch = Watch(tiny_vit(), px, py, every_n_steps=1, overhead_budget=0.9)
    watch.interval = 16  # as after a stretch; now 16 steps take far longer than a sample
    for step in (16, 32, 48):
        time.sleep(1.0)
        watch.step(step, 1.0)
    assert watch.history[-1].overhead_ratio < 0.9 / 2 and watch.interval < 16


@pytest.mark.slow
def test_memory_stays_flat_with_a_log_dir_and_heatmaps(digits, tmp_path):
    """Python allocations after the history filled: flat across 200 samples with TensorBoard, its heat-maps (one
    render every 50 samples, off the training thread), JSONL and Prometheus. Measured at the same phase of the
    heat-map cycle, each render written first, so a render in flight does not count."""
    import tracemalloc

    _, _, px, _ = digits
    watch = Watch(tiny_vit(depth=2, dim=16), px[:16], every_n_steps=1, log_dir=tmp_path, history_size=20,
                  heatmap_every=50, registry=CollectorRegistry())
    tracemalloc.start()
    try:
        traced = {}
        for step in range(1, 376):
            watch.step(step, 1.0)
            if step in (175, 375):
                watch.exporters[1].wait_for_heatmaps()
                gc.collect()
                traced[step] = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        watch.close()
    assert traced[375] - traced[175] < 256 * 2**10, traced


def test_the_closing_sample_measures_its_overhead_against_a_full_sampling_interval(digits):
    """The closing sample (close() samples the last step, here one step after the previous sample) is charged
    against the training time of a full interval at the pace since the previous sample, as every other sample
    is: before, its ratio was measured against that one step and jumped by the interval (4x here)."""
    _, _, px, py = digits
    watch = Watch(tiny_vit(), px, py, every_n_steps=4)
    trained = {}  # training seconds since the previous sample, at each sample
    since = 0.0
    for step in range(1, 10):
        start = time.perf_counter()
        time.sleep(0.05)  # the training step
        since += time.perf_counter() - start
        watch.step(step, 1.0)
        if watch.last_step == step:
            trained[step], since = since, 0.0
    watch.close()
    trained[9] = since
    closing, regular = watch.history[-1], watch.history[-2]
    assert [s.step for s in watch.history] == [4, 8, 9]
    assert regular.overhead_ratio == pytest.approx(regular.overhead_s / trained[8], rel=0.25)  # 4 steps
    assert closing.overhead_ratio == pytest.approx(closing.overhead_s / (4 * trained[9]), rel=0.25)  # 1 step of 4
