"""isiwatch: watch Vision Transformers while they train (ISI, probes, Cliff → Plateau → Climb).

The public names are imported on first use (PEP 562 module ``__getattr__``): ``import isiwatch`` and the
command line's start-up stay free of torch, timm and torchvision until a name that needs them is touched.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name → the submodule that defines it.
_EXPORTS = {
    "METRICS": "measure.analysis", "Analysis": "measure.analysis", "analyze": "measure.analysis",
    "Phases": "measure.phases", "detect_phases": "measure.phases",
    "DepthRecommendation": "measure.depth", "recommend_depth": "measure.depth",
    "Alert": "watch.alerts",
    "friction_alert": "watch.friction",
    "Watch": "watch.monitor",
    "FreezePolicy": "watch.freezing",
    "WatchOptions": "watch.config",
    "Exporter": "watch.exporters", "SampleContext": "watch.exporters", "JsonlExporter": "watch.exporters",
    "TensorBoardExporter": "watch.exporters", "PrometheusExporter": "watch.exporters",
    "MlflowExporter": "watch.exporters", "WandbExporter": "watch.exporters",
    "truncate": "truncation.truncate", "cut": "truncation.surgery", "heal": "truncation.healing",
    "prepare_healing": "truncation.healing",
    "specialize": "specialization.convert",
    "TapError": "taps", "custom_parts": "taps", "vit_parts": "taps",
}

if TYPE_CHECKING:
    from .measure.analysis import METRICS, Analysis, analyze
    from .measure.depth import DepthRecommendation, recommend_depth
    from .measure.phases import Phases, detect_phases
    from .specialization.convert import specialize
    from .taps import TapError, custom_parts, vit_parts
    from .truncation.healing import heal, prepare_healing
    from .truncation.surgery import cut
    from .truncation.truncate import truncate
    from .watch.alerts import Alert
    from .watch.config import WatchOptions
    from .watch.exporters import (
        Exporter,
        JsonlExporter,
        MlflowExporter,
        PrometheusExporter,
        SampleContext,
        TensorBoardExporter,
        WandbExporter,
    )
    from .watch.freezing import FreezePolicy
    from .watch.friction import friction_alert
    from .watch.monitor import Watch

# A library prints nothing unasked: without the application's own logging config, records of the "isiwatch"
# logger (alerts included) go nowhere instead of to logging's last-resort stderr handler.
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    # measure a model, recommend its depth
    "analyze", "Analysis", "METRICS", "Phases", "detect_phases", "recommend_depth", "DepthRecommendation",
    # watch a training run
    "Watch", "WatchOptions", "FreezePolicy", "Alert", "friction_alert",
    "Exporter", "SampleContext", "JsonlExporter", "TensorBoardExporter", "PrometheusExporter", "MlflowExporter",
    "WandbExporter",
    # cut a trained model
    "truncate", "cut", "heal", "prepare_healing",
    # specialise its prefix tokens
    "specialize",
    # adapters for ViT families
    "vit_parts", "custom_parts", "TapError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """Import the submodule that defines ``name`` on first access and cache the value in this module."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
