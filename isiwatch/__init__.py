"""isiwatch: watch Vision Transformers while they train (ISI, probes, Cliff → Plateau → Climb)."""

from .alerts import Alert
from .analysis import METRICS, Analysis, analyze
from .monitor import Watch
from .phases import Phases, detect_phases
from .taps import TapError, custom_parts, vit_parts

__version__ = "0.1.0"

__all__ = ["METRICS", "Alert", "Analysis", "Watch", "Phases", "TapError", "analyze", "custom_parts", "detect_phases",
           "vit_parts", "__version__"]
