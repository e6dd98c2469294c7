"""Where the monitor's samples and alerts go: JSONL files, TensorBoard, Prometheus."""

from .jsonl import JsonlExporter
from .prometheus import PrometheusExporter
from .tensorboard import TensorBoardExporter

__all__ = ["JsonlExporter", "PrometheusExporter", "TensorBoardExporter"]
