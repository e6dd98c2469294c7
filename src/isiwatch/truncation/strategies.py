"""Which blocks a cut drops: the strategies, in one registry, and the defaults of ``truncate --strategy auto``.

A strategy is one `Strategy` in `STRATEGIES`: the function naming the blocks it drops and the
inputs it reads from the uncut model (`CutInputs`), so that a new strategy is one entry here; the command
line's choices, `choose_blocks`, what `isiwatch.truncation.plan.plan` measures and whether (and in which
order) ``auto`` tries it (its ``auto_rank``) all follow the registry. This module imports neither torch nor timm
(the command line reads it to list its options); the functions import what they use when a cut is chosen.

``auto`` (`isiwatch.truncation.search`) searches over the number of kept blocks with the strategies of
`AUTO_STRATEGIES`, the registry's ranked entries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._utils.option_error import OptionError

if TYPE_CHECKING:
    from ..measure.boundary_distances import BoundaryDistances
    from ..measure.phases import Phases


@dataclass(frozen=True)
class CutInputs:
    """What a strategy may read about the uncut model: the phases of a per-layer curve, the boundary distances
    (`isiwatch.measure.boundary_distances`) and a seed."""

    phases: Phases | None = None
    distances: BoundaryDistances | None = None
    seed: int = 0


#: The inputs a strategy may need, as `CutInputs` fields, with what each is in an error message.
INPUTS = {"phases": "phases (of a curve with a plateau)", "distances": "boundary distances of the uncut model"}


@dataclass(frozen=True)
class Strategy:
    """One cut strategy: ``drop(depth, count, inputs)`` names ``count`` distinct blocks to drop out of ``depth``;
    ``needs`` the `INPUTS` it reads (nothing else is measured for it); ``default_keep(depth, inputs)`` the
    depth it cuts to when none is asked for (None: the recommended depth); ``auto_rank`` where ``auto`` tries it,
    best first (0 first; None: ``auto`` never tries it)."""

    name: str
    drop: Callable[[int, int, CutInputs], Iterable[int]]
    needs: frozenset[str]
    description: str
    default_keep: Callable[[int, CutInputs], int] | None = None
    auto_rank: int | None = None

    def missing(self, inputs: CutInputs) -> list[str]:
        """The needed inputs that ``inputs`` lacks."""
        return sorted(n for n in self.needs if getattr(inputs, n) is None)


def _plateau_run(inputs: CutInputs) -> list[int]:
    from ..measure.depth import plateau_blocks

    assert inputs.phases is not None  # choose_blocks checked the needs
    return plateau_blocks(inputs.phases)


def _plateau(depth: int, count: int, inputs: CutInputs) -> list[int]:
    """The plateau's blocks after its first (`plateau_blocks`), nearest the middle
    of that run first, then outwards (later blocks first on equal distance): any ``count`` cuts the plateau
    from its middle."""
    run = _plateau_run(inputs)
    middle = (run[0] + run[-1]) / 2  # a plateau spans at least 2 blocks
    return sorted(range(depth), key=lambda i: (abs(i - middle), -i))[:count]


def _plateau_keep(depth: int, inputs: CutInputs) -> int:
    return depth - len(_plateau_run(inputs))


def _block_influence(depth: int, count: int, inputs: CutInputs) -> list[int]:
    from ..measure.boundary_distances import block_influence

    assert inputs.distances is not None  # choose_blocks checked the needs
    dropped: list[int] = block_influence(inputs.distances).argsort(stable=True)[:count].tolist()
    return dropped


def _angular(depth: int, count: int, inputs: CutInputs) -> range:
    from ..measure.boundary_distances import angular_distance

    assert inputs.distances is not None  # choose_blocks checked the needs
    start = int(angular_distance(inputs.distances, count).argmin())
    return range(start, start + count)


def _random(depth: int, count: int, inputs: CutInputs) -> list[int]:
    import torch

    dropped: list[int] = torch.randperm(depth, generator=torch.Generator().manual_seed(inputs.seed))[:count].tolist()
    return dropped


#: Every fixed cut strategy, by name.
STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("plateau", _plateau, frozenset({"phases"}),
             "drop the blocks on the plateau of a per-layer curve after its first (default keep: all others)",
             default_keep=_plateau_keep, auto_rank=3),
    Strategy("tail", lambda depth, count, _: range(depth - count, depth), frozenset(), "keep the first blocks",
             auto_rank=2),
    Strategy("bi", _block_influence, frozenset({"distances"}),
             "ShortGPT block influence: drop the blocks that turn their input least", auto_rank=0),
    Strategy("angular", _angular, frozenset({"distances"}),
             "Gromov angular distance: drop the consecutive blocks whose input and output are closest", auto_rank=1),
    Strategy("random", _random, frozenset(), "drop blocks chosen by a seeded permutation"),
)}
#: Chosen from the evaluation in ``benchmarks/RESULTS.md``: block influence had the highest mean healed accuracy
#: over all paired comparisons (ahead of ``tail`` by less than the noise); the plateau cut lost to both.
DEFAULT_STRATEGY = "bi"
#: Strategies ``auto`` may cut with, best first: the registry's entries with an ``auto_rank``, in that order. Its
#: fixed order of candidates (K from depth − 1 down) is cut by the first that applies (one whose inputs are
#: missing, e.g. plateau without a plateau, is skipped): every other candidate tested would cost error budget.
AUTO_STRATEGIES = tuple(name for _, name in sorted((s.auto_rank, s.name) for s in STRATEGIES.values()
                                                   if s.auto_rank is not None))
#: Defaults: accuracy loss allowed (points), confidence of its bound (0: the point estimate) and candidates
#: healed at most (each in full).
DEFAULT_MAX_DROP = 1.0
DEFAULT_CONFIDENCE = 0.95
DEFAULT_BUDGET = 16
#: Healing defaults: a short fine-tune of already trained weights.
HEAL_EPOCHS = 2
HEAL_LR = 1e-3
#: Fits of the linear bridge (`isiwatch.truncation.bridge`); "none" leaves a cut as it is. Least squares is the
#: default: closed form, deterministic and one pass over the calibration images.
BRIDGE_METHODS = ("lstsq", "cosine", "none")
DEFAULT_BRIDGE = "lstsq"


def get_strategy(name: str) -> Strategy:
    """The registered strategy ``name``; ``ValueError`` naming the choices otherwise."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)} (or auto, which "
                         "truncate runs)")
    return STRATEGIES[name]


def inputs_needed(name: str) -> frozenset[str]:
    """The `INPUTS` strategy ``name`` reads; for ``auto`` those of every strategy it tries."""
    names = AUTO_STRATEGIES if name == "auto" else (name,)
    return frozenset().union(*(get_strategy(n).needs for n in names))


def choose_blocks(name: str, depth: int, keep: int, *, phases: Phases | None = None,
                  distances: BoundaryDistances | None = None, seed: int = 0) -> list[int]:
    """The ``keep`` source block indices (ascending) that strategy ``name`` keeps out of ``depth``.

    ``plateau`` needs ``phases``; ``bi`` and ``angular`` need ``distances`` of the uncut model; ``random`` reads
    ``seed``.
    """
    chosen = get_strategy(name)
    if not 1 <= keep < depth:
        raise ValueError(f"keep must be between 1 and {depth - 1} for a {depth}-block model, got {keep}")
    inputs = CutInputs(phases, distances, seed)
    missing = chosen.missing(inputs)
    if missing:
        raise ValueError(f"the {name} strategy needs {' and '.join(INPUTS[n] for n in missing)}")
    return sorted(set(range(depth)) - set(chosen.drop(depth, depth - keep, inputs)))


def check_search_options(max_drop: float, budget: int, confidence: float = DEFAULT_CONFIDENCE,
                         heal_steps: int | None = None, bridge: str = DEFAULT_BRIDGE) -> None:
    """One-line errors for an impossible request, before any work."""
    if bridge not in BRIDGE_METHODS:
        raise OptionError("unknown {bridge} fit {value!r}; choose one of " + ", ".join(BRIDGE_METHODS), value=bridge)
    if not 0 <= max_drop < 100:  # 100 points would allow any cut; the depth recommendation needs less
        raise OptionError("{max_drop} must be at least 0 points and below 100, got {value}", value=max_drop)
    if budget < 1:
        raise OptionError("{budget} must be at least 1 candidate, got {value}", value=budget)
    if not 0 <= confidence < 1:
        raise OptionError("{confidence} must be at least 0 and below 1, got {value}", value=confidence)
    if heal_steps is not None and heal_steps < 1:
        raise OptionError("{heal_steps} must be at least 1 optimizer step, got {value}", value=heal_steps)
