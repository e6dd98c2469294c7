"""The exporter extension point: one base class whose hooks [`Watch`][isiwatch.Watch] calls.

A new backend is one file with one [`Exporter`][isiwatch.Exporter] subclass, passed to ``Watch(exporters=[...])``; the
Watch needs no change. Every hook has the same signature for every exporter and does nothing by default, so an
exporter implements only the events it cares about (as Lightning's ``Logger`` and prometheus_client's
one-method ``Collector``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..alerts import Alert
from ..sample import Sample


def present_series(sample: Sample) -> dict[str, float]:
    """``sample.series()`` less the plateau span of a sample without a plateau: NaN there means absent, and a
    backend should show a gap, not a value.

    Args:
        sample: The sample.
    """
    return {name: v for name, v in sample.series().items() if math.isfinite(v) or not name.startswith("plateau/")}


def episode_value(alert: Alert) -> tuple[str, float]:
    """An alert record as a point of its kind's episode series: 1 when it opens (and at ``early_stop``), 0 when
    its ``*_cleared`` record closes it.

    Args:
        alert: The record.
    """
    cleared = alert.kind.endswith("_cleared")
    return alert.kind.removesuffix("_cleared"), 0.0 if cleared else 1.0


@dataclass(frozen=True)
class SampleContext:
    """The Watch's state that goes with a sample (and with the close), so that no exporter needs the Watch.

    Args:
        run: The run's name (the saved one after a resume).
        history: The samples the Watch keeps, oldest first, the current one last.
        onset_step: The step of plateau onset while a ``plateau_onset`` episode is open, else None.
        active_alerts: The alert kinds whose episode is open.
        opened: The record that opened each open episode (its step is where the episode began).
        stop_requested: Whether the Watch has asked training to stop.
    """

    run: str
    history: Sequence[Sample]
    onset_step: int | None
    active_alerts: frozenset[str]
    opened: Mapping[str, Alert]
    stop_requested: bool


class Exporter:
    """Receives the Watch's samples and alert records; subclass it and override the hooks you need.

    The Watch calls the hooks on rank 0 only, so an exporter built on every rank of a distributed job should
    open its backend on the first call, not in ``__init__``.
    """

    def open(self) -> None:
        """Open the backend (its files, its connection) now: the Watch calls it once, when it is built, so that a
        backend that cannot be opened (a full or read-only disk) is reported then, not at the first sample. One
        that raises is reported like any failing hook, and its next write tries again; so a constructor should
        refuse bad arguments but leave the opening to this hook, and every write open what is not open yet."""

    def write_sample(self, sample: Sample, context: SampleContext) -> None:
        """Export one sample (called after the sample's alerts and the stopping decision).

        Args:
            sample: The new sample; ``sample.series()`` holds its flat named series.
            context: The Watch's state at this sample.
        """

    def write_alert(self, alert: Alert) -> None:
        """Export one alert record (opening, ``*_cleared`` or ``early_stop``), as it is emitted.

        Args:
            alert: The record.
        """

    def rename(self, run: str) -> None:
        """Use ``run`` as the run's name from now on: a resumed run takes its saved name, so it stays one run.

        Args:
            run: The new name.
        """

    def resume(self, run: str, step: int) -> None:
        """Training of ``run`` resumes after ``step``, from a checkpoint (the Watch's ``load_state_dict``): drop,
        where the backend can, what this exporter wrote for that run's later steps. A run that crashed after the
        checkpoint wrote them, and the resumed run writes those steps anew, so a record that keeps both holds two
        entries for one step and alert episodes the resumed state contradicts.

        Args:
            run: The run's saved name (the one the crashed run wrote under).
            step: The last step the checkpoint covers.
        """

    def background_seconds(self) -> float:
        """CPU seconds this exporter spent off the training thread since the last call (0 by default): the Watch
        adds them to the next sample's overhead, so work moved to a thread is still counted."""
        return 0.0

    def close(self, context: SampleContext) -> None:
        """Flush and release the backend; the Watch calls no hook after this.

        Args:
            context: The Watch's state at the close.
        """
