"""Every network call of an exporter has a deadline (issue 41): an MLflow tracking server that holds the connection
or trickles its answer is a reported fault, sampling goes on, and the close is bounded."""

import time

import pytest
from test_watch_blind import BadGateway, probe, tiny

from isiwatch import Watch
from isiwatch.watch.exporters import mlflow as mlflow_exporter


@pytest.mark.parametrize("mode", ["hold", "trickle"])
def test_a_tracking_server_that_holds_or_trickles_is_a_fault_and_close_is_bounded(mode, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setattr(mlflow_exporter, "CALL_DEADLINE", 0.5)  # the real 5 s, shortened to keep the test quick
    monkeypatch.chdir(tmp_path)
    server = BadGateway(mode)
    records = []
    exporter = mlflow_exporter.MlflowExporter(f"http://127.0.0.1:{server.port}")
    watch = Watch(tiny(), probe(4), every_n_steps=1, exporters=[exporter], alert_callback=records.append)
    try:
        start = time.monotonic()
        for step in range(1, 6):
            watch.step(step, 1.0)
        stepping = time.monotonic() - start
        start = time.monotonic()
        watch.close()
        closing = time.monotonic() - start
    finally:
        server.close()
    assert len(watch.history) == 5  # sampling went on
    assert stepping < 0.5 + 5 * 1.0, f"5 samples took {stepping:.1f} s"  # one wait for the stuck call, then none
    assert closing < 2.0, f"close() took {closing:.1f} s"
    faults = [r for r in records if r.kind == "monitor_error"]
    assert len(faults) == 1 and faults[0].data["source"] == "exporter MlflowExporter"
    assert faults[0].data["error"] == "TimeoutError: MLflow did not answer within 0.5 s"
    assert watch.faults.counts["exporter MlflowExporter"] >= 5  # each later call refused at once, counted
