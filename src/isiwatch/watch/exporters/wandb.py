"""Weights & Biases: every sample's series logged at the training step, alert records as series.

Needs ``pip install isiwatch[wandb]``; wandb is imported when the exporter is built, never by ``import isiwatch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..alerts import Alert
from ..sample import Sample
from .base import Exporter, SampleContext, episode_value, present_series

if TYPE_CHECKING:
    from wandb import Run


class WandbExporter(Exporter):
    """Logs ``<prefix><series>`` for each series of `isiwatch.watch.sample.Sample.series` with
    ``step=sample.step`` (no point where a sample has no plateau span), and ``<prefix>alerts/<kind>``: 1 when
    an episode opens (and at ``early_stop``), 0 when it clears.

    W&B drops a row whose step is below the run's current step: when your own code logs to the same run, log
    with the same global step. At the first sample or alert (on rank 0 only) the exporter logs into the run
    your own ``wandb.init`` started, if one is active then, else starts a new run named after the Watch's run;
    the close finishes only a run this exporter started, so your ``wandb.log`` after the Watch closed still
    lands in your run.

    Args:
        project: The W&B project of a new run.
        run: Log into this run instead of the active one or a new one; the close leaves it open.
        prefix: Prepended to every key.
        **init_kwargs: More ``wandb.init`` arguments for a new run (``name`` defaults to the Watch's run).
    """

    def __init__(self, project: str | None = None, run: Run | None = None, prefix: str = "isiwatch/",
                 **init_kwargs: Any):
        import wandb

        self._wandb = wandb
        self.project = project
        self.run = run
        self.prefix = prefix
        self.init_kwargs = init_kwargs
        self._owned = False  # a run this exporter starts, it also finishes

    def _start(self, name: str) -> Run:
        """The run to log into: the given one, else the user's active one, else a new one this exporter owns.
        Never ``wandb.init`` beside an active run: it returns that run (which the close would then finish) or,
        in a notebook, finishes it."""
        if self.run is None:
            self.run = self._wandb.run
        if self.run is None:
            self.run = self._wandb.init(project=self.project, **{"name": name, **self.init_kwargs})
            self._owned = True
        return self.run

    def write_sample(self, sample: Sample, context: SampleContext) -> None:
        series = present_series(sample)
        self._start(context.run).log({self.prefix + name: value for name, value in series.items()}, step=sample.step)

    def write_alert(self, alert: Alert) -> None:
        kind, value = episode_value(alert)
        self._start(alert.run).log({f"{self.prefix}alerts/{kind}": value}, step=alert.step)

    def rename(self, run: str) -> None:
        if self._owned and self.run is not None:
            self.run.name = run

    def close(self, context: SampleContext) -> None:
        if self._owned and self.run is not None:
            self.run.finish()
