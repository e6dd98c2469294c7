"""The exporter extension point: a user's exporter gets every sample with the Watch's context, and the MLflow and
W&B exporters write each sample's series at its step into the real libraries' stores (offline, in tmp_path)."""

import dataclasses
import json
import os
import struct
import subprocess
import sys
import textwrap

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
    lines = (watch.run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2]  # the built-ins ran alongside


def test_user_exporter_hooks_default_to_nothing():
    context = SampleContext("r", (), None, frozenset(), {}, False)
    exporter = Exporter()
    exporter.open()
    exporter.write_alert(None)
    exporter.rename("other")
    exporter.resume("other", 4)
    exporter.close(context)


@pytest.fixture
def mlflow_cwd(tmp_path, monkeypatch):
    """A fresh working directory with MLflow on its defaults: no tracking URI, no file-store opt-in."""
    pytest.importorskip("mlflow")
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", "WARNING")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("store", ["default", "sqlite"])
def test_mlflow_exporter_writes_each_series_at_its_step(digits, mlflow_cwd, store):  # noqa: F811
    from mlflow.tracking import MlflowClient

    # MLflow 3's default store is ./mlflow.db (SQLite) when no URI is given
    uri = f"sqlite:///{mlflow_cwd / 'mlflow.db'}" if store == "default" else f"sqlite:///{mlflow_cwd / 'runs.db'}"
    x, y, px, py = digits
    model = tiny_vit()
    exporter = MlflowExporter(None if store == "default" else uri, experiment="isiwatch-test", params={"lr": 1e-3})
    watch = Watch(model, px[:32], py[:32], every_n_steps=2, exporters=[exporter], norm_friction_threshold=-2.0,
                  strict=True)
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


@pytest.mark.parametrize("store", ["file URI", "plain path", "default with an old ./mlruns", "unknown scheme"])
def test_mlflow_exporter_refuses_a_store_mlflow_refuses_in_one_line(mlflow_cwd, store):
    """MLflow 3 refuses its file store unless MLFLOW_ALLOW_FILE_STORE=true, and blames the model registry for a
    scheme it has no store for; the exporter says what to set or use when it is built, and writes nothing."""
    uri = {"file URI": (mlflow_cwd / "mlruns").as_uri(), "plain path": "mlruns", "unknown scheme": "s3://bucket/runs"}
    if store not in uri:  # MLflow keeps ./mlruns as the default where it already holds an experiment
        (mlflow_cwd / "mlruns" / "0").mkdir(parents=True)
        (mlflow_cwd / "mlruns" / "0" / "meta.yaml").write_text("name: Default\n")
    with pytest.raises(ValueError) as refused:
        MlflowExporter(uri.get(store))
    message = str(refused.value)
    assert "\n" not in message and message.startswith("MlflowExporter cannot open the MLflow store ")
    if store == "unknown scheme":
        assert "no store for 's3' URIs" in message and "'sqlite'" in message and "registry" not in message
    else:
        assert "MLFLOW_ALLOW_FILE_STORE=true" in message and "'sqlite:///mlflow.db'" in message
    assert store == "plain path" or (mlflow_cwd / "mlruns").as_uri() in message or "s3://" in message
    assert sorted(p.name for p in mlflow_cwd.iterdir()) == (["mlruns"] if store not in uri else [])  # wrote nothing


def test_mlflow_exporter_names_what_mlflow_skinny_lacks_for_sqlite(tmp_path):
    """mlflow-skinny installs neither SQLAlchemy nor Alembic, without which MLflow knows no sqlite:// store (its
    error blames the model registry); the exporter names the packages instead. Run where neither imports."""
    pytest.importorskip("mlflow")
    script = tmp_path / "no_sqlalchemy.py"
    script.write_text(textwrap.dedent("""
        import sys

        sys.modules["sqlalchemy"] = sys.modules["alembic"] = None  # as if not installed: import and find_spec fail
        from isiwatch import MlflowExporter

        try:
            MlflowExporter("sqlite:///runs.db")
        except ValueError as error:
            print(error)
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert "sqlite:///runs.db" in line and "pip install sqlalchemy alembic" in line
    assert not (tmp_path / "runs.db").exists()


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


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """wandb, quiet, its settings and caches in tmp_path; the runs themselves ask for ``mode="offline"``."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    for name, value in {"WANDB_ERROR_REPORTING": "false", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true",
                        "WANDB_DISABLE_CODE": "true", "WANDB_CONSOLE": "off",
                        "WANDB_CONFIG_DIR": str(tmp_path / "config"), "WANDB_CACHE_DIR": str(tmp_path / "cache"),
                        "WANDB_DATA_DIR": str(tmp_path / "data")}.items():
        monkeypatch.setenv(name, value)
    return wandb


def wandb_settings(wandb):
    return wandb.Settings(console="off", x_disable_stats=True, x_save_requirements=False)


def wandb_run_log(tmp_path):
    """({step: row} of the history, [display names]) of the one offline run under tmp_path."""
    (path,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    rows, names = {}, []
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            rows.setdefault(row["_step"], {}).update(row)
        elif kind == "run":
            names.append(record.run.display_name)
    return rows, names


def assert_watch_rows(rows, history):
    """Every sample's series at its step, and the alert series beside them."""
    expected = expected_points(history)
    assert [s.step for s in history] == [2, 4, 5] and "isiwatch/isi/layer_03" in expected
    for key, points in expected.items():
        assert [(step, rows[step][key]) for step, _ in points] == points, key
    extra = {k for row in rows.values() for k in row if not k.startswith(("_", "user/"))} - set(expected)
    assert "isiwatch/alerts/norm_friction_high" in extra and all(k.startswith("isiwatch/alerts/") for k in extra)
    assert rows[2]["isiwatch/alerts/norm_friction_high"] == 1


def test_wandb_exporter_logs_each_series_at_its_step_offline(digits, tmp_path, wandb_offline):  # noqa: F811
    wandb = wandb_offline
    x, y, px, py = digits
    model = tiny_vit()
    exporter = WandbExporter(project="isiwatch-test", mode="offline", dir=str(tmp_path),
                             settings=wandb_settings(wandb))
    watch = Watch(model, px[:32], py[:32], every_n_steps=2, exporters=[exporter], norm_friction_threshold=-2.0,
                  strict=True)
    train(model, x, y, 5, watch)
    watch.load_state_dict({**watch.state_dict(), "run": "wb"})  # a resume renames the run
    watch.close()
    assert wandb.run is None  # the run it started, it finished
    wandb.teardown()  # the finished run's log is complete once the wandb-core process has exited

    rows, names = wandb_run_log(tmp_path)
    assert names[0].startswith("run-") and names[-1] == "wb"
    assert sorted(rows) == [2, 4, 5]
    assert_watch_rows(rows, watch.history)


@pytest.mark.parametrize("options", [{}, {"project": "isiwatch-test", "mode": "offline"}], ids=["plain", "project"])
def test_wandb_exporter_logs_into_the_users_run_and_leaves_it_open(digits, tmp_path, wandb_offline,  # noqa: F811
                                                                   options):
    """After the user's own ``wandb.init``, the exporter logs into that run and the close leaves it open: the
    user's ``wandb.log`` after the Watch closed lands in the same run."""
    wandb = wandb_offline
    x, y, px, py = digits
    model = tiny_vit()
    mine = wandb.init(project="mine", name="my-run", mode="offline", dir=str(tmp_path), settings=wandb_settings(wandb))
    watch = Watch(model, px[:32], py[:32], every_n_steps=2, exporters=[WandbExporter(**options)],
                  norm_friction_threshold=-2.0, strict=True)
    train(model, x, y, 5, watch)
    watch.load_state_dict({**watch.state_dict(), "run": "wb"})  # a resume renames only a run the exporter started
    watch.close()
    assert wandb.run is mine  # still open
    wandb.log({"user/accuracy": 0.5}, step=6)
    mine.finish()
    wandb.teardown()

    rows, names = wandb_run_log(tmp_path)  # one run only: the user's
    assert set(names) == {"my-run"}
    assert sorted(rows) == [2, 4, 5, 6] and rows[6]["user/accuracy"] == 0.5
    assert_watch_rows(rows, watch.history)
