"""Claims of the docs no other test covers (docs/monitor.md: Prometheus push-gateway and textfile export, read
back with prometheus_client's own parser; the TensorBoard custom-scalar layout, read back from the event files;
the cls_marginalized alert on a real Watch, also in docs/alerts.md; the YAML options file: `isiwatch --config FILE
COMMAND` applying the section's defaults)."""

import http.server
import json
import re
import threading

import pytest
import timm
import torch
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.plugins.custom_scalar import layout_pb2

from isiwatch import Watch
from isiwatch.cli.commands import main
from isiwatch.io.checkpoint import save_checkpoint

ARCH = "vit_tiny_patch16_224"
KWARGS = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=32, depth=4, num_heads=2)


def tiny_vit():
    torch.manual_seed(0)
    return timm.create_model(ARCH, pretrained=False, **KWARGS)


@pytest.fixture(scope="module")
def probe():
    from isiwatch.io.data import embedded_digits

    x, y = embedded_digits()
    return x[4000:4064], y[4000:4064]


def samples(text: str, run: str) -> dict:
    """{(name, sorted labels without run): value} of one run, parsed by prometheus_client."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("run") == run:
                out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "run")))] = s.value
    return out


def assert_matches_sample(parsed: dict, watch: Watch) -> None:
    last = watch.history[-1]
    assert parsed[("isiwatch_training_step", ())] == last.step
    for metric, values in last.layers.items():
        for i, v in enumerate(values):
            assert parsed[("isiwatch_layer_metric", (("layer", f"{i:02d}"), ("metric", metric)))] == \
                pytest.approx(v, rel=1e-12)
    assert parsed[("isiwatch_plateau_detected", ())] == float(last.phases is not None)


def test_textfile_export_is_valid_exposition_of_the_last_sample(probe, tmp_path):
    px, py = probe
    path = tmp_path / "isiwatch.prom"
    watch = Watch(tiny_vit(), px, py, every_n_steps=1, textfile=str(path), run_name="tf")
    watch.step(1, 2.5)
    first = path.read_text()
    watch.step(2, 2.0)
    watch.close()
    parsed = samples(path.read_text(), "tf")
    assert_matches_sample(parsed, watch)
    assert parsed[("isiwatch_training_loss", ())] == 2.0
    assert samples(first, "tf")[("isiwatch_training_step", ())] == 1  # rewritten at every sample
    assert [p.name for p in tmp_path.iterdir()] == ["isiwatch.prom"]  # no temporary file left behind


class Recorder(http.server.BaseHTTPRequestHandler):
    requests: list = []

    def do_PUT(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.requests.append((self.command, self.path, self.headers["Content-Type"], body.decode()))
        self.send_response(200)
        self.end_headers()

    do_POST = do_PUT

    def log_message(self, *args):
        pass


def test_push_gateway_receives_every_sample(probe):
    px, py = probe
    Recorder.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        watch = Watch(tiny_vit(), px, py, every_n_steps=2, pushgateway=f"127.0.0.1:{server.server_port}",
                      run_name="pg")
        for step in range(1, 5):
            watch.step(step, 3.0 - step / 10)
        watch.close(final_sample=False)
    finally:
        server.shutdown()
        server.server_close()
    assert [(method, path) for method, path, _, _ in Recorder.requests] == [("PUT", "/metrics/job/isiwatch/run/pg")] * 2
    assert all(ctype.startswith("text/plain") for _, _, ctype, _ in Recorder.requests)
    assert samples(Recorder.requests[0][3], "pg")[("isiwatch_training_step", ())] == 2
    parsed = samples(Recorder.requests[-1][3], "pg")
    assert_matches_sample(parsed, watch)
    assert parsed[("isiwatch_training_loss", ())] == pytest.approx(2.6)


def test_tensorboard_custom_scalar_layout_charts_every_metric(probe, tmp_path):
    px, py = probe
    watch = Watch(tiny_vit(), px, py, every_n_steps=1, log_dir=tmp_path, run_folder=".", run_name="tb")
    watch.step(1, 2.0)
    watch.step(2, 1.9)
    watch.close()
    layouts, scalar_tags = [], set()
    for events in tmp_path.glob("events.out.tfevents.*"):
        for event in EventFileLoader(str(events)).Load():
            for value in event.summary.value:
                if value.tag == "custom_scalars__config__":
                    layout = layout_pb2.Layout()
                    layout.ParseFromString(value.tensor.string_val[0])
                    layouts.append(layout)
                elif value.metadata.plugin_data.plugin_name == "scalars" or value.HasField("simple_value"):
                    scalar_tags.add(value.tag)
    (layout,) = layouts  # written once
    (category,) = layout.category
    assert category.title == "isiwatch"
    charts = {c.title: list(c.multiline.tag) for c in category.chart}
    metrics = set(watch.history[-1].layers)
    assert set(charts) == metrics | {"plateau", "recommended_depth"}
    for metric in metrics:  # each chart's pattern selects exactly that metric's per-layer scalars
        (pattern,) = charts[metric]
        chosen = sorted(t for t in scalar_tags if re.fullmatch(pattern, t))
        assert chosen == [f"isiwatch/{metric}/layer_{i:02d}" for i in range(4)]
    assert charts["recommended_depth"] == ["isiwatch/recommended_depth"] and \
        "isiwatch/recommended_depth" in scalar_tags


def test_cls_marginalized_opens_and_clears_on_a_real_watch(tmp_path):
    """A forward hook blanks [CLS] at the last block's output: the [CLS] probe falls to chance, below the
    mean-patch probe beyond the probes' noise (512 probe images, 154 held out: the exact paired test's p is about
    3e-10), so the alert opens; without the hook [CLS] carries the image again and it clears. The records carry the
    test's counts."""
    from isiwatch.io.data import embedded_digits

    x, y = embedded_digits()
    px, py = x[4000:4512], y[4000:4512]
    model = tiny_vit()
    seen = []
    watch = Watch(model, px, py, every_n_steps=1, log_dir=tmp_path, run_folder=".", run_name="cls",
                  alert_callback=seen.append)
    watch.step(1)
    healthy = watch.history[-1].layers
    assert healthy["probe_cls"][-1] >= healthy["probe_patch_mean"][-1], "the fixture needs a healthy [CLS] first"

    def blank_cls(_module, _args, out):
        out = out.clone()
        out[:, 0] = 0.0
        return out

    handle = model.blocks[-1].register_forward_hook(blank_cls)
    watch.step(2)
    watch.step(3)
    handle.remove()
    watch.step(4)
    watch.close()
    marginal = watch.history[1].layers
    assert marginal["probe_cls"][-1] < marginal["probe_patch_mean"][-1]
    kinds = [(a.kind, a.step, a.severity) for a in seen if a.kind.startswith("cls_marginalized")]
    assert kinds == [("cls_marginalized", 2, "info"), ("cls_marginalized_cleared", 4, "info")]
    opened = next(a for a in seen if a.kind == "cls_marginalized")
    assert opened.data["probe_cls"] == marginal["probe_cls"][-1]
    assert opened.data["probe_patch_mean"] == marginal["probe_patch_mean"][-1]
    assert opened.data["held_out"] == 154 and opened.data["p_value"] < 0.05 and opened.data["confidence"] == 0.95
    assert opened.data["only_patch_mean"] > opened.data["only_cls"]
    records = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in records] == [("cls_marginalized", 2), ("cls_marginalized_cleared", 4)]


def test_config_file_section_supplies_the_commands_defaults_and_flags_override_them(tmp_path):
    ckpt = save_checkpoint(tmp_path / "model.pt", ARCH, KWARGS, tiny_vit().state_dict())
    out = tmp_path / "from-config"
    config = tmp_path / "isiwatch.yaml"
    config.write_text(f"every_n_steps: 50\nanalyze:\n  images: 40\n  isi_recon: yes\n  out: {out}\n")
    result = CliRunner().invoke(main, ["--config", str(config), "analyze", str(ckpt), "--data", "mnist"])
    assert result.exit_code == 0, result.output
    analysis = json.loads((out / "analysis.json").read_text())
    assert analysis["model"]["images"] == 40
    assert all("isi_recon" in row for row in analysis["layers"])
    result = CliRunner().invoke(main, ["--config", str(config), "analyze", str(ckpt), "--data", "mnist",
                                       "--images", "24"])
    assert result.exit_code == 0, result.output
    analysis = json.loads((out / "analysis.json").read_text())
    assert analysis["model"]["images"] == 24 and all("isi_recon" in row for row in analysis["layers"])
