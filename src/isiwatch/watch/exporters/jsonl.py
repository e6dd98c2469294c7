"""``metrics.jsonl`` (one line per sample) and ``alerts.jsonl`` (one line per alert record)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from ..alerts import Alert
from ..sample import Sample
from .base import Exporter, SampleContext


class JsonlExporter(Exporter):
    """Appends one JSON object per line and flushes, so a crashed run keeps everything written so far.

    Args:
        log_dir: The folder of ``metrics.jsonl`` and ``alerts.jsonl`` (created if missing; existing files are
            appended to, so a resumed run continues them).
    """

    def __init__(self, log_dir: str | Path):
        self.dir = Path(log_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._metrics = open(self.dir / "metrics.jsonl", "a", encoding="utf-8")
        self._alerts = open(self.dir / "alerts.jsonl", "a", encoding="utf-8")

    @staticmethod
    def _write(fh: TextIO, record: dict[str, Any]) -> None:
        fh.write(json.dumps(record, allow_nan=False) + "\n")
        fh.flush()

    def write_sample(self, sample: Sample, context: SampleContext) -> None:
        self._write(self._metrics, sample.to_dict(context.run))

    def write_alert(self, alert: Alert) -> None:
        self._write(self._alerts, alert.to_dict())

    def close(self, context: SampleContext) -> None:
        self._metrics.close()
        self._alerts.close()
