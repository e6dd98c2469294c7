"""The exporter extension point: a user's exporter gets every sample with the Watch's context, and the MLflow and
W&B exporters write each sample's series at its step into the real libraries' stores (offline, in tmp_path)."""

import dataclasses
import json
import struct

import pytest
from test_watch import digits, tiny_vit, train  # noqa: F401  (digits: fixture)

from isiwatch import Watch
from isiwatch.watch.exporters import Exporter, MlflowExporter, SampleContext, WandbExporter, present_series


def expected_points(history, prefix="isiwatch/"):
    """{key: [(step, value), ...]} the history's samples should leave in a backend."""
    points = {}
    for sample in history:
        for name, value in present_series(sample).items():
            points.setdefault(prefix + name, []).append((sample.step, value))
    return points


class Recorder(Exporter):
    """Implements only write_sample; records what it gets and what the Watch held at that moment."""

    def __init__(self):
        self.watch = None
        self.calls = []

    def write_sample(self, sample, context):
        w = self.watch
        self.calls.append((sample, context, (w.run, w.tracker.onset_step, set(w.alerts.active),
                                             dict(w.alerts.opened), w.should_stop)))


def test_user_exporter_gets_every_sample_with_the_watch_context(digits, tmp_path):  # noqa: F811
    x, y, px, py = digits
    model = tiny_vit()
    recorder = Recorder()
    with pytest.raises(TypeError, match="Exporter"):
        Watch(model, px[:32], py[:32], exporters=[object()])
    watch = Watch(model, px[:32], py[:32], every_n_steps=2, log_dir=tmp_path, run_name="mine", exporters=[recorder],
                  norm_friction_threshold=-2.0, monitor="loss", stopping_threshold=100.0)
    recorder.watch = watch
    assert watch.exporters[-1] is recorder and len(watch.exporters) == 3  # JSONL, TensorBoard, then the user's
    train(model, x, y, 5, watch)  # stops at the first sample: the loss is below stopping_threshold
    watch.close()
    assert not watch.exporters  # closed: no hook is called any more

    samples = [sample for sample, _, _ in recorder.calls]
    assert samples == list(watch.history) and [s.step for s in samples] == [2]
    for sample, context, (run, onset, active, opened, stop) in recorder.calls:
        assert context.history[-1] is sample
        assert (context.run, context.onset_step, set(context.active_alerts), dict(context.opened),
                context.stop_requested) == (run, onset, active, opened, stop)
        assert "norm_friction_high" in context.active_alerts and context.stop_requested
        with pytest.raises(dataclasses.FrozenInstanceError):
            context.run = "other"
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2]  # the built-ins ran alongside


def test_user_exporter_hooks_default_to_nothing():
    context = SampleContext("r", (), None, frozenset(), {}, False)
    exporter = Exporter()
    exporter.write_alert(None)
    exporter.rename("other")
    exporter.close(context)


def test_mlflow_exporter_writes_each_series_at_its_step(digits, tmp_path, monkeypatch):  # noqa: F811
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    for name, value in {"MLFLOW_ALLOW_FILE_STORE": "true", "MLFLOW_DISABLE_TELEMETRY": "true",
                        "MLFLOW_LOGGING_LEVEL": "WARNING"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = (tmp_path / "mlruns").as_uri()
    x, y, px, py = digits
    model = tiny_vit()
    exporter = MlflowExporter(uri, experiment="isiwatch-test", params={"lr": 1e-3})
    watch = Watch(model, px[:32], py[:32], every_n_steps=2, exporters=[exporter], norm_friction_threshold=-2.0)
    train(model, x, y, 5, watch)
    watch.load_state_dict({**watch.state_dict(), "run": "mlf"})  # a resume renames the run
    watch.close()

    client = MlflowClient(uri)
    run = client.get_run(exporter.run_id)
    assert run.info.run_name == "mlf" and run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.001"}
    assert client.get_experiment(run.info.experiment_id).name == "isiwatch-test"
    expected = expected_points(watch.history)
    assert [s.step for s in watch.history] == [2, 4, 5] and "isiwatch/isi/layer_03" in expected
    extra = set(run.data.metrics) - set(expected)  # alert series only (other rules may fire on 32 images)
    assert "isiwatch/alerts/norm_friction_high" in extra and all(k.startswith("isiwatch/alerts/") for k in extra)
    for key, points in expected.items():
        assert [(m.step, m.value) for m in client.get_metric_history(exporter.run_id, key)] == points, key
    alert = client.get_metric_history(exporter.run_id, "isiwatch/alerts/norm_friction_high")
    assert [(m.step, m.value) for m in alert] == [(2, 1.0)]
    assert run.data.tags["isiwatch.alert.norm_friction_high"].startswith("step 2: ")


def wandb_records(path):
    """The records of a .wandb transaction log (LevelDB log format: 32 KiB blocks of CRC-framed chunks)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 or len(chunk) < length:  # preallocated zeros, or a tail still being written
            break
        buf = chunk if kind in (1, 2) else buf + chunk  # FULL, FIRST; MIDDLE and LAST append
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            yield record


def test_wandb_exporter_logs_each_series_at_its_step_offline(digits, tmp_path, monkeypatch):  # noqa: F811
    wandb = pytest.importorskip("wandb")
    for name, value in {"WANDB_MODE": "offline", "WANDB_ERROR_REPORTING": "false", "WANDB_SILENT": "true",
                        "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true", "WANDB_CONSOLE": "off",
                        "WANDB_CONFIG_DIR": str(tmp_path / "config"), "WANDB_CACHE_DIR": str(tmp_path / "cache"),
                        "WANDB_DATA_DIR": str(tmp_path / "data")}.items():
        monkeypatch.setenv(name, value)
    x, y, px, py = digits
    model = tiny_vit()
    exporter = WandbExporter(project="isiwatch-test", dir=str(tmp_path),
                             settings=wandb.Settings(console="off", x_disable_stats=True, x_save_requirements=False))
    watch = Watch(model, px[:32], py[:32], every_n_steps=2, exporters=[exporter], norm_friction_threshold=-2.0)
    train(model, x, y, 5, watch)
    watch.load_state_dict({**watch.state_dict(), "run": "wb"})  # a resume renames the run
    watch.close()
    wandb.teardown()  # the finished run's log is complete once the wandb-core process has exited

    (path,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    rows, names = {}, []
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            rows.setdefault(row["_step"], {}).update(row)
        elif kind == "run":
            names.append(record.run.display_name)
    assert names[0].startswith("run-") and names[-1] == "wb"
    assert sorted(rows) == [s.step for s in watch.history] == [2, 4, 5]
    expected = expected_points(watch.history)
    assert "isiwatch/isi/layer_03" in expected
    for key, points in expected.items():
        assert [(step, rows[step][key]) for step, _ in points] == points, key
    extra = {k for row in rows.values() for k in row if not k.startswith("_")} - set(expected)
    assert "isiwatch/alerts/norm_friction_high" in extra and all(k.startswith("isiwatch/alerts/") for k in extra)
    assert rows[2]["isiwatch/alerts/norm_friction_high"] == 1
