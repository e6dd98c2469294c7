"""How many blocks a trained ViT needs, read from one analysis: candidate depth rules and the recommendation.

Each rule looks at an [`Analysis`][isiwatch.Analysis] and names the blocks it would drop (None when
its signal is absent, e.g. no plateau or no probe labels):

- ``token_similarity_plateau`` / ``isi_plateau``: the blocks of that curve's plateau after its first
  (what ``truncate --strategy plateau`` drops).
- ``probe_knee_cls`` / ``probe_knee_patch`` / ``probe_knee``: every block after the first one whose [CLS]
  probe / patch-mean probe / better of the two comes within ``tolerance`` (accuracy, 0.01 = 1 point) of
  the last block's.
- ``block_influence_<τ>``: every block whose block influence (1 − cos between its input and output,
  mean over tokens) is below τ times the largest block influence in the model, contiguous or not.

Whatever the rule, blocks that change nothing (block influence below `IDLE_INFLUENCE`) are always
dropped. Which rule [`recommend_depth`][isiwatch.recommend_depth] uses by default was decided by
``benchmarks/score_depth_rules.py`` on the depth sweep of ``benchmarks/bench_depth.py`` (see ``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .analysis import Analysis
from .phases import Phases

#: Block influence below which a block counts as doing nothing (an identity block measures ~1e-7).
IDLE_INFLUENCE = 1e-4
#: Relative block-influence thresholds scored as candidate rules.
INFLUENCE_THRESHOLDS = (0.05, 0.1, 0.2)

Rule = Callable[[Analysis, float], "list[int] | None"]


def _finite(curve: list[float]) -> bool:
    return bool(curve) and all(math.isfinite(v) for v in curve)


def plateau_blocks(phases: Phases) -> list[int]:
    """The plateau's blocks after its first: the curve is measured on block outputs, so block ``start`` already
    reached the plateau level and the blocks after it only kept it there (what ``truncate --strategy plateau``
    drops)."""
    start, end = phases.plateau
    return list(range(start + 1, end + 1))


def _plateau_rule(metric: str) -> Rule:
    def rule(analysis: Analysis, tolerance: float) -> list[int] | None:
        phases: Phases | None = analysis.detect_phases(metric) if metric in analysis.layers else None
        return None if phases is None else plateau_blocks(phases)
    return rule


def knee(curve: list[float], tolerance: float) -> int:
    """Index of the first block whose value is within ``tolerance`` of the last block's."""
    return next(i for i, v in enumerate(curve) if v >= curve[-1] - tolerance)


def _knee_rule(metrics: tuple[str, ...]) -> Rule:
    def rule(analysis: Analysis, tolerance: float) -> list[int] | None:
        curves = [analysis.layers[m] for m in metrics if m in analysis.layers and _finite(analysis.layers[m])]
        if not curves:
            return None
        best = [max(values) for values in zip(*curves)]
        return list(range(knee(best, tolerance) + 1, len(best)))
    return rule


def _influence_rule(threshold: float) -> Rule:
    def rule(analysis: Analysis, tolerance: float) -> list[int] | None:
        influence = analysis.layers.get("block_influence")
        if not influence or not _finite(influence):
            return None
        top = max(influence)
        return [i for i, v in enumerate(influence) if v < threshold * top]
    return rule


RULES: dict[str, Rule] = {
    "token_similarity_plateau": _plateau_rule("token_similarity"),
    "isi_plateau": _plateau_rule("isi"),
    "probe_knee_cls": _knee_rule(("probe_cls",)),
    "probe_knee_patch": _knee_rule(("probe_patch_mean",)),
    "probe_knee": _knee_rule(("probe_cls", "probe_patch_mean")),
    **{f"block_influence_{t:g}": _influence_rule(t) for t in INFLUENCE_THRESHOLDS},
}
#: The rule with the smallest error against the depth sweep's needed depth (mean absolute error 3.2 blocks on
#: the 16- and 24-block models, benchmarks/results/depth/rule_scores.json; every probe and plateau rule
#: overestimated by 6-11 blocks), then the rule used where the analysis has no block influence.
DEFAULT_RULES = ("block_influence_0.2", "probe_knee")


@dataclass(frozen=True)
class DepthRecommendation:
    """``depth`` blocks to keep out of ``source_depth``; ``blocks_to_drop`` (ascending source indices);
    ``signal``: the rule that decided it (``+idle`` when blocks that change nothing were dropped as well,
    ``idle`` or ``none`` when no rule had a signal)."""

    depth: int
    signal: str
    blocks_to_drop: tuple[int, ...]
    source_depth: int

    @property
    def kept_blocks(self) -> list[int]:
        """The source blocks kept, ascending."""
        return sorted(set(range(self.source_depth)) - set(self.blocks_to_drop))

    def to_dict(self) -> dict[str, Any]:
        return {"depth": self.depth, "signal": self.signal, "blocks_to_drop": list(self.blocks_to_drop),
                "source_depth": self.source_depth}


def idle_blocks(analysis: Analysis) -> list[int]:
    """Blocks whose output equals their input (block influence below IDLE_INFLUENCE)."""
    influence = analysis.layers.get("block_influence", [])
    return [i for i, v in enumerate(influence) if math.isfinite(v) and v < IDLE_INFLUENCE]


def candidate_drops(analysis: Analysis, tolerance: float = 0.01) -> dict[str, list[int] | None]:
    """Every rule's dropped blocks (None where its signal is absent)."""
    return {name: rule(analysis, tolerance) for name, rule in RULES.items()}


def recommend_depth(analysis: Analysis | Mapping[str, Any], tolerance: float = 0.01,
                    rules: tuple[str, ...] = DEFAULT_RULES) -> DepthRecommendation:
    """The number of blocks ``analysis``'s model needs and which blocks to drop.

    The first of ``rules`` with a signal decides; idle blocks are dropped in any case; at least one block is
    kept. The default rule scored best on the depth sweep (``benchmarks/RESULTS.md``); it is a starting point,
    which ``isiwatch truncate`` checks by healing and validating real cuts.

    Args:
        analysis: An [`Analysis`][isiwatch.Analysis], or its ``to_dict()`` form (``analysis.json``).
        tolerance: Accuracy the probe-based rules may give up, as a fraction (0.01 = 1 point).
        rules: Names from `RULES`, tried in order.

    Returns:
        The kept depth, the rule that decided, and the dropped blocks.

    Raises:
        ValueError: ``tolerance`` outside [0, 1), an unknown rule, or a dict that is not an analysis.
    """
    if isinstance(analysis, Mapping):
        try:
            analysis = Analysis.from_dict(analysis)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"analysis: not an Analysis.to_dict() mapping ({type(exc).__name__}: {exc})") from None
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
    unknown = [r for r in rules if r not in RULES]
    if unknown:
        raise ValueError(f"unknown depth rule {unknown[0]!r}; choose from {', '.join(RULES)}")
    depth = analysis.depth
    idle = set(idle_blocks(analysis))
    signal, dropped = ("idle" if idle else "none"), set(idle)
    for name in rules:
        found = RULES[name](analysis, tolerance)
        if found is not None:
            signal = f"{name}+idle" if idle - set(found) else name
            dropped |= set(found)
            break
    if len(dropped) >= depth:  # keep the most influential block
        influence = analysis.layers.get("block_influence") or [0.0] * depth
        dropped.discard(max(range(depth), key=lambda i: influence[i] if math.isfinite(influence[i]) else -1))
    return DepthRecommendation(depth - len(dropped), signal, tuple(sorted(dropped)), depth)
