"""isiwatch: watch Vision Transformers while they train (ISI, probes, Cliff → Plateau → Climb)."""

import logging

from .alerts import Alert
from .analysis import METRICS, Analysis, analyze
from .friction import friction_alert
from .monitor import Watch
from .phases import Phases, detect_phases
from .specialize import specialize
from .taps import TapError, custom_parts, vit_parts

__version__ = "0.1.0"

# A library prints nothing unasked: without the application's own logging config, records of the "isiwatch"
# logger (alerts included) go nowhere instead of to logging's last-resort stderr handler.
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = ["METRICS", "Alert", "Analysis", "Phases", "TapError", "Watch", "__version__", "analyze", "custom_parts",
           "detect_phases", "friction_alert", "specialize", "vit_parts"]
