"""Where the monitor's samples and alerts go: one [`Exporter`][isiwatch.Exporter] subclass per backend, one file each.

JSONL, TensorBoard and Prometheus are built in (the Watch builds them from its options); MLflow and W&B are
passed as ``Watch(exporters=[...])`` and import their library only when built.
"""

from .base import Exporter, SampleContext, present_series
from .jsonl import JsonlExporter
from .mlflow import MlflowExporter
from .prometheus import PrometheusExporter
from .tensorboard import TensorBoardExporter
from .wandb import WandbExporter

__all__ = ["Exporter", "JsonlExporter", "MlflowExporter", "PrometheusExporter", "SampleContext",
           "TensorBoardExporter", "WandbExporter", "present_series"]
