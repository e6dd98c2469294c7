"""MLflow: every sample's series as metrics at the training step, alert records as metrics and tags.

Needs ``pip install isiwatch[mlflow]`` (``mlflow-skinny``); mlflow is imported when the exporter is built, never by
``import isiwatch``. MLflow 3's default store, ``sqlite:///mlflow.db`` in the working directory, also needs SQLAlchemy
and Alembic, which mlflow-skinny does not install.

Every call to MLflow (a tracking server over the network, or a database) runs on a short-lived worker thread and
is waited for at most `CALL_DEADLINE` seconds (`CLOSE_DEADLINE` at the close): a server that holds the connection
or trickles its answer, which MLflow itself would wait on for minutes (two minutes a request, with retries), costs
the training loop that long once, and is reported by the Watch like any failing exporter; while that call is still
stuck, later calls fail at once instead of piling up, and the first one after it returns goes through.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from ..alerts import Alert
from ..sample import Sample
from .base import Exporter, SampleContext, episode_value, present_series

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

#: The URI schemes of MLflow's SQLAlchemy stores (``mlflow.store.db.db_types.DATABASE_ENGINES``), and what those
#: stores import that mlflow-skinny does not install.
_DATABASE_SCHEMES = {"sqlite", "mysql", "postgresql", "mssql"}
_DATABASE_PACKAGES = ("sqlalchemy", "alembic")


#: Seconds the training thread waits for one MLflow call (the call goes on in the background after that).
CALL_DEADLINE = 5.0
#: Seconds the close waits for MLflow to end the run (`Watch.close` returns within 2 s whatever a server does).
CLOSE_DEADLINE = 1.5

_calls = threading.local()


class _Deadline:
    """Runs blocking calls on a worker thread each and waits at most a deadline for them; see the module
    docstring."""

    def __init__(self, what: str):
        self.what = what
        self._stuck: threading.Thread | None = None  # a call past its deadline that has not returned yet
        self._stuck_since = 0.0

    def __call__(self, call: Callable[[], object], deadline: float) -> None:
        """Run ``call`` and return when it has; raise ``TimeoutError`` past ``deadline`` seconds, or at once
        while an earlier call is still stuck, and what ``call`` raised otherwise."""
        if self._stuck is not None and self._stuck.is_alive():
            raise TimeoutError(f"{self.what} has not answered a call made {time.monotonic() - self._stuck_since:.0f}"
                               f" s ago; this one is skipped")
        self._stuck = None
        failure: list[BaseException] = []

        def run() -> None:
            try:
                call()
            except BaseException as exc:  # handed to the caller's thread
                failure.append(exc)

        worker = threading.Thread(target=run, name="isiwatch-mlflow", daemon=True)
        worker.start()
        worker.join(deadline)
        if worker.is_alive():
            self._stuck, self._stuck_since = worker, time.monotonic() - deadline
            raise TimeoutError(f"{self.what} did not answer within {deadline:.1f} s")
        if failure:
            raise failure[0]


class _DuringExporterCalls(logging.Filter):
    """Drops what MLflow logs on this thread while one of the exporter's own calls runs: the Watch reports a failed
    call in one line, while MLflow's SQL store logs every failed statement with its traceback (hundreds of stderr
    lines on a full disk). What MLflow logs for the user's own calls passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_calls, "active", False)


_FILTER = _DuringExporterCalls()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Run an MLflow call with MLflow's own log output of it dropped (see ``_DuringExporterCalls``)."""
    for name in ("mlflow", "sqlalchemy.engine", "alembic"):  # the loggers MLflow gives its stderr handler
        for handler in logging.getLogger(name).handlers:
            if _FILTER not in handler.filters:
                handler.addFilter(_FILTER)
    _calls.active = True
    try:
        yield
    finally:
        _calls.active = False


def _client(tracking_uri: str | None) -> MlflowClient:
    """MLflow's client on its store, which it opens at once: a store MLflow refuses is refused here, when the
    exporter is built, in one line that says what to install or set."""
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    uri = tracking_uri or mlflow.get_tracking_uri()
    try:
        return MlflowClient(uri)
    except (MlflowException, ImportError) as error:
        raise ValueError(f"MlflowExporter cannot open the MLflow store {uri}: {_remedy(uri, error)}") from None


def _remedy(uri: str, error: Exception) -> str:
    """One line for MLflow's refusal, whose own words are a paragraph and, for a scheme it has no store for
    (``sqlite`` without SQLAlchemy among them), blame the model registry."""
    import mlflow

    scheme = urlparse(uri).scheme.split("+")[0]
    if "MLFLOW_ALLOW_FILE_STORE" in str(error):
        return (f"MLflow {mlflow.__version__} refuses its file store unless MLFLOW_ALLOW_FILE_STORE=true is set; "
                "pass a tracking_uri such as 'sqlite:///mlflow.db' instead, or set that variable")
    if scheme in _DATABASE_SCHEMES and (missing := [name for name in _DATABASE_PACKAGES if find_spec(name) is None]):
        return f"MLflow's {scheme} store needs SQLAlchemy and Alembic: pip install {' '.join(missing)}"
    known = getattr(error, "supported_uri_schemes", None)
    if known is not None:
        return f"MLflow has no store for {scheme!r} URIs; it knows {', '.join(repr(k) for k in known if k)}"
    return str(error).strip().splitlines()[0]


class MlflowExporter(Exporter):
    """Logs through ``MlflowClient`` with an explicit run id, since the fluent API's active run is not seen from
    other threads (a framework's callback thread, for one).

    Metric ``<prefix><series>`` holds each series of `isiwatch.watch.sample.Sample.series` at the sample's
    step (no point where a sample has no plateau span); metric ``<prefix>alerts/<kind>`` is 1 when an episode
    opens (and at ``early_stop``) and 0 when it clears; tag ``isiwatch.alert.<kind>`` holds the last record's
    step and message. A new run starts at the first sample or alert, named after the Watch's run.

    Args:
        tracking_uri: The tracking server or store; MLflow's default when None (``MLFLOW_TRACKING_URI``, else
            ``sqlite:///mlflow.db`` in the working directory). A store MLflow refuses (its file store, unless
            ``MLFLOW_ALLOW_FILE_STORE=true``) raises ``ValueError`` here, in one line naming what to set.
        experiment: The experiment of a new run, created if missing; MLflow's default experiment when None.
        run_id: Log into this existing run (e.g. ``mlflow.active_run().info.run_id``), which the close leaves
            open, instead of starting one.
        params: Logged once, when the run is first written to.
        prefix: Prepended to every metric name.
    """

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None, run_id: str | None = None,
                 params: Mapping[str, Any] | None = None, prefix: str = "isiwatch/"):
        self.client = _client(tracking_uri)
        self.experiment = experiment
        self.run_id = run_id
        self.params = dict(params or {})
        self.prefix = prefix
        self._owned = run_id is None  # a run this exporter starts, it also ends
        self._started = False
        self._deadline = _Deadline("MLflow")

    def _call(self, call: Callable[[], object], deadline: float | None = None) -> None:
        """Run ``call`` (MLflow calls) with MLflow's own log output dropped, within ``deadline`` seconds
        (`CALL_DEADLINE` by default)."""
        def quietly() -> None:
            with _quiet():
                call()
        self._deadline(quietly, CALL_DEADLINE if deadline is None else deadline)

    def _start(self, run: str) -> str:
        """The run id, starting the run and logging the params on the first call (its own calls run inside the
        caller's `_call`)."""
        return self._started_run(run)

    def _started_run(self, run: str) -> str:
        if self.run_id is None:
            experiment_id = "0"  # MLflow's default experiment
            if self.experiment is not None:
                found = self.client.get_experiment_by_name(self.experiment)
                experiment_id = found.experiment_id if found else self.client.create_experiment(self.experiment)
            self.run_id = self.client.create_run(experiment_id, run_name=run).info.run_id
        if not self._started:
            from mlflow.entities import Param

            self.client.log_batch(self.run_id, params=[Param(k, str(v)) for k, v in self.params.items()])
            self._started = True
        return self.run_id

    def write_sample(self, sample: Sample, context: SampleContext) -> None:
        from mlflow.entities import Metric

        ms = int(sample.time * 1000)
        metrics = [Metric(self.prefix + name, value, ms, sample.step) for name, value in present_series(sample).items()]
        self._call(lambda: self.client.log_batch(self._start(context.run), metrics=metrics))

    def write_alert(self, alert: Alert) -> None:
        from mlflow.entities import Metric, RunTag

        kind, value = episode_value(alert)
        metrics = [Metric(f"{self.prefix}alerts/{kind}", value, int(alert.time * 1000), alert.step)]
        tags = [RunTag(f"isiwatch.alert.{kind}", f"step {alert.step}: {alert.message}")]
        self._call(lambda: self.client.log_batch(self._start(alert.run), metrics=metrics, tags=tags))

    def rename(self, run: str) -> None:
        if self._owned and (run_id := self.run_id) is not None:
            self._call(lambda: self.client.set_tag(run_id, "mlflow.runName", run))

    def close(self, context: SampleContext) -> None:
        if self._owned and (run_id := self.run_id) is not None:
            self._call(lambda: self.client.set_terminated(run_id), CLOSE_DEADLINE)
