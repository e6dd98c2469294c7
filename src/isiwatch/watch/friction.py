"""The informational ``norm_friction_high`` alert: the signal that ``isiwatch.specialization.convert`` may help.

``norm_friction`` is cos([CLS], patch) on a block's input minus the same after its norm1:
how much work the shared norm layer does to pull [CLS] apart from the patches. When it is large, the
shared norm is doing the separation that token-specialised norms would do explicitly (arXiv
2602.08626, Fig. 3), so the alert points at ``isiwatch specialize``. It is informational: friction is
not a failure, and on the embedded digits the remedy did not measurably help (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..measure.vocabulary import alert_hint

if TYPE_CHECKING:
    from ..measure.analysis import Analysis

#: Alert when some block's norm_friction reaches this (cosine units). On the digits ViTs of
#: benchmarks/bench_specialize.py every block stays within |friction| ≤ 0.002 at initialisation and
#: ≤ 0.008 after training, in every variant and seed (benchmarks/RESULTS.md), while the paper's pretrained
#: ViTs see cos([CLS], patch) fall to ≈ 0 after the norm, i.e. friction of the order of the raw cosine.
#: 0.1 is over 10× the largest value seen without friction. It is not calibrated on a model where the
#: remedy helped: none was available offline, and on the digits it did not help.
FRICTION_THRESHOLD = 0.1
ALERT_KIND = "norm_friction_high"


def friction_alert(source: Analysis | Mapping[str, Sequence[float]] | Sequence[float],
                   threshold: float = FRICTION_THRESHOLD) -> dict[str, Any] | None:
    """An alert record when the largest per-block ``norm_friction`` reaches ``threshold``, else None.

    ``source``: an [`Analysis`][isiwatch.Analysis], a ``layers`` mapping of curves, or the
    norm_friction curve itself (one value per block; non-finite values are ignored). Returns
    ``{"kind", "severity": "info", "message", "data", "hint"}`` (the hint: what to try, the kind's
    `isiwatch.measure.vocabulary.HINTS`); the caller adds step/time/run and episodes.
    None as well when the model has no [CLS] (no curve) or no finite value.
    """
    layers: Any = getattr(source, "layers", source)
    curve: Sequence[float] = layers.get("norm_friction", ()) if isinstance(layers, Mapping) else layers
    values = [(i, float(v)) for i, v in enumerate(curve) if math.isfinite(v)]
    if not values:
        return None
    layer, peak = max(values, key=lambda iv: iv[1])
    if peak < threshold:
        return None
    above = [i for i, v in values if v >= threshold]
    return {
        "kind": ALERT_KIND,
        "severity": "info",
        "message": (f"norm_friction {peak:.3f} at block {layer} ≥ {threshold:g} in {len(above)} block(s): the shared "
                    "norms separate [CLS] from the patches; token-specialised norms (isiwatch specialize) may help"),
        "data": {"max_friction": peak, "layer": layer, "threshold": threshold, "blocks_above": above},
        "hint": alert_hint(ALERT_KIND),
    }
