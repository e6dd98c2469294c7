"""``metrics.jsonl`` (one line per sample) and ``alerts.jsonl`` (one line per alert record)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from ..alerts import Alert
from ..sample import Sample


class JsonlExporter:
    """Appends one JSON object per line and flushes, so a crashed run keeps everything written so far."""

    def __init__(self, log_dir: str | Path, run: str):
        self.dir = Path(log_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run = run
        self._metrics = open(self.dir / "metrics.jsonl", "a", encoding="utf-8")
        self._alerts = open(self.dir / "alerts.jsonl", "a", encoding="utf-8")

    @staticmethod
    def _write(fh: TextIO, record: dict[str, Any]) -> None:
        fh.write(json.dumps(record, allow_nan=False) + "\n")
        fh.flush()

    def write_sample(self, sample: Sample) -> None:
        self._write(self._metrics, sample.to_dict(self.run))

    def write_alert(self, alert: Alert) -> None:
        self._write(self._alerts, alert.to_dict())

    def close(self) -> None:
        self._metrics.close()
        self._alerts.close()
