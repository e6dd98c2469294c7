"""Freeze the blocks whose representation has settled (the Watch's ``freeze_settled`` option; experimental).

The signal comes from the Watch's own probe pass: for each block, the mean over patch tokens of its output on
every probe image, an (images × width) matrix ``Z``. Between two consecutive samples a block *moves* by the
relative change of that matrix, centred over the images (a shift common to every image is no change of what
separates them):

    change = ‖Zc(t) − Zc(t−1)‖_F / ‖Zc(t−1)‖_F,   Zc = Z − mean over images of Z

A block has *settled* once its change stayed at or below ``tolerance`` for ``patience`` samples in a row. At each
sample the longest prefix of settled blocks is frozen: ``requires_grad`` off on the blocks' parameters and on every
parameter upstream of them (patch, position and class embeddings), found by walking the autograd graph of the
last frozen block's output, so it holds for every family. Their gradients are dropped (``.grad = None``), so
optimizers skip them and their weights stay bit-identical; the optimizer keeps their state. The first trainable
block then gets an input that needs no gradient, and backward stops there. The prefix only grows: nothing is
unfrozen unless [`Freezer.unfreeze`][isiwatch.watch.freezing.Freezer.unfreeze] is called.

The defaults are not tuned to a benchmark: ``tolerance=0.01`` is the change the phase detector already treats as
noise on these O(1) curves (``min_range`` in [`analyze`][isiwatch.analyze]), ``patience=3`` the Watch's
``plateau_patience``. The change is measured per sampling interval, so a longer ``every_n_steps`` sees larger
changes.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor, nn

from .._utils.option_error import MAX_COUNT
from .._utils.state import checked, is_count
from ..measure.flops import count_flops
from ..taps import ViTParts, preserved_state
from ..taps.parts import first_output
from .ranks import distributed

#: The alert kind of a freeze record (one record per freeze, like ``early_stop``: no episode to clear).
KIND = "blocks_frozen"


class PolicyError(ValueError):
    """A `FreezePolicy` field that is unknown or out of range; ``key`` names it (a YAML error points at its line)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class FreezePolicy:
    """When a block counts as settled.

    Args:
        tolerance: The largest relative change of a block's centred, token-pooled output on the probe batch
            between two consecutive samples that counts as settled (0.01: 1 %).
        patience: Samples in a row a block must stay settled before it may be frozen.
    """

    tolerance: float = 0.01
    patience: int = 3

    def __post_init__(self) -> None:
        if isinstance(self.tolerance, bool) or not isinstance(self.tolerance, (int, float)) \
                or not math.isfinite(self.tolerance) or self.tolerance < 0:
            raise PolicyError("tolerance", f"tolerance must be a finite number >= 0, got {self.tolerance!r}")
        if not is_count(self.patience) or not 1 <= self.patience <= MAX_COUNT:
            raise PolicyError("patience", f"patience must be an int from 1 to {MAX_COUNT:,}, "
                                          f"got {str(self.patience)[:40]}")
        object.__setattr__(self, "tolerance", float(self.tolerance))

    @classmethod
    def from_mapping(cls, value: Mapping[str, object]) -> FreezePolicy:
        """A policy from a YAML mapping such as ``{tolerance: 0.02, patience: 5}``; an unknown key is an error."""
        names = [f.name for f in fields(cls)]
        unknown = [k for k in value if k not in names]
        if unknown:
            raise PolicyError(str(unknown[0]), f"has no key {str(unknown[0])[:40]!r} (keys: {', '.join(names)})")
        return cls(**value)  # type: ignore[arg-type]  # __post_init__ checks the types


def policy_of(option: bool | FreezePolicy) -> FreezePolicy | None:
    """The policy the ``freeze_settled`` option asks for: None when off, the defaults for ``True``."""
    if isinstance(option, FreezePolicy):
        return option
    return FreezePolicy() if option else None


def representation_change(current: Tensor, previous: Tensor) -> float:
    """The relative change of an (images × width) representation, both centred over the images (see the module
    docstring); infinite when the shapes differ or the previous one is constant, NaN when a value is not finite."""
    if current.shape != previous.shape:
        return math.inf
    now, before = current.double(), previous.double()
    now, before = now - now.mean(0), before - before.mean(0)
    scale = float(torch.linalg.vector_norm(before))
    if not math.isfinite(scale):
        return math.nan
    return float(torch.linalg.vector_norm(now - before)) / scale if scale > 0 else math.inf


def settled_prefix(streaks: Sequence[int], patience: int) -> int:
    """How many leading blocks have been settled for ``patience`` samples."""
    return next((i for i, streak in enumerate(streaks) if streak < patience), len(streaks))


class _Reached(Exception):  # noqa: N818  # control flow, not an error: the forward got where it needed to
    """Ends a forward once the block whose output is wanted has run."""

    def __init__(self, output: Tensor):
        super().__init__()
        self.output = output


def _leaf_parameters(output: Tensor) -> list[Tensor]:
    """The leaf tensors that require grad anywhere upstream of ``output``, in the order the graph walk meets them."""
    found: dict[int, Tensor] = {}
    seen: set[Any] = set()
    stack = [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad: a leaf that receives a gradient
        if isinstance(variable, Tensor):
            found.setdefault(id(variable), variable)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return list(found.values())


def _scalar(output: Any) -> Tensor:
    """A scalar that depends on the model's prediction: the sum of its first tensor output (logits)."""
    if isinstance(output, Mapping):
        output = next(v for v in output.values() if isinstance(v, Tensor))
    tensor: Tensor = first_output(output)
    return tensor.float().sum()


@contextlib.contextmanager
def _requires_grad(params: Iterable[Tensor], flag: bool) -> Iterator[None]:
    """Set ``requires_grad`` of ``params`` to ``flag`` for the block, then back to what each was."""
    before = [(p, p.requires_grad) for p in params]
    try:
        for p, _ in before:
            p.requires_grad_(flag)
        yield
    finally:
        for p, flag_before in before:
            p.requires_grad_(flag_before)


def step_flops(model: nn.Module, image: Tensor) -> int:
    """FLOPs (``torch.utils.flop_counter``) of one training step of ``model`` on ``image`` as its parameters'
    ``requires_grad`` stand now: the forward and the backward to every parameter that requires grad. Runs in eval
    mode, restores the model's modes and the RNG, and accumulates no gradient (``torch.autograd.grad``)."""
    def step() -> None:
        model.eval()
        loss = _scalar(model(image))
        trainable = [p for p in model.parameters() if p.requires_grad]
        if loss.requires_grad and trainable:
            torch.autograd.grad(loss, trainable, allow_unused=True)

    with preserved_state(model), torch.enable_grad():
        return count_flops(step)


def wrapper_problem(model: nn.Module, inner: nn.Module) -> str | None:
    """Why blocks of ``inner`` (the plain module of ``model``) cannot be frozen under the data-parallel wrapper that
    trains it, or None. DDP must look for unused parameters and have no static graph (the frozen parameters stop
    receiving gradients); sharded models (FSDP) are not supported. Under torch.distributed the wrappers that
    hold ``inner`` are found among the live objects, so the check also holds when the Watch got the inner model
    (Lightning, transformers)."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel

    if any(isinstance(p, DTensor) for p in inner.parameters()) or any(
            isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        return "freeze_settled does not support sharded models (FSDP): turn it off or train with DDP"
    wrappers: list[object] = [model]
    if distributed():
        wrappers += gc.get_objects()  # the framework's DDP wrapper around inner, which the Watch may not have
    for wrapper in wrappers:
        if isinstance(wrapper, FullyShardedDataParallel) and any(m is inner for m in wrapper.modules()):
            return "freeze_settled does not support sharded models (FSDP): turn it off or train with DDP"
        if isinstance(wrapper, DistributedDataParallel) and any(m is inner for m in wrapper.module.modules()) \
                and (wrapper.static_graph or not wrapper.find_unused_parameters):
            return ("freeze_settled needs DistributedDataParallel(find_unused_parameters=True) without static_graph, "
                    "since frozen parameters stop receiving gradients (Lightning: "
                    "strategy='ddp_find_unused_parameters_true'; transformers: ddp_find_unused_parameters=True)")
    return None


@dataclass
class FreezePlan:
    """A freeze to apply: the prefix of ``blocks`` blocks, the ``parameters`` it newly freezes and the share of a
    full training step's FLOPs the whole frozen prefix saves (``flops_saved``, 0..1; a full step is one with
    nothing the policy froze)."""

    blocks: int
    parameters: list[Tensor] = field(repr=False)
    flops_saved: float


class Freezer:
    """The freeze policy's state and actions for one Watch (see the module docstring).

    The Watch calls [`recording`][isiwatch.watch.freezing.Freezer.recording] around each probe pass and
    [`update`][isiwatch.watch.freezing.Freezer.update] after each sample that updates its policies. Its state
    (the frozen prefix and each block's settled streak, not the probe features) is part of the Watch's
    ``state_dict``; loading it freezes the saved prefix again, and a resumed run compares its first sample with
    nothing (one sample later, streaks go on).
    """

    def __init__(self, model: nn.Module, parts: ViTParts, policy: FreezePolicy, probe_image: Tensor):
        self.model, self.parts, self.policy = model, parts, policy
        self.probe_image = probe_image[:1]
        #: Blocks in the frozen prefix.
        self.frozen = 0
        #: Consecutive settled samples of each block.
        self.streaks = [0] * parts.depth
        #: Each block's change at the last sample (NaN before a second sample).
        self.changes = [math.nan] * parts.depth
        #: Why the policy stopped freezing (a wrapper it cannot work under), or None.
        self.refused: str | None = None
        self._frozen_params: list[Tensor] = []
        self._reference: list[Tensor] | None = None
        self._pending: list[Tensor] | None = None

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Keep each block's token-pooled output of the probe pass run inside the block (all its chunks)."""
        chunks: list[list[Tensor]] = [[] for _ in self.parts.blocks]
        handles = []
        for index, bp in enumerate(self.parts.blocks):
            def keep(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any,
                     index: int = index, prefix: int = bp.num_prefix_tokens) -> None:
                _, z = self.parts.blocks[index].tokens(args, kwargs, output)
                chunks[index].append(z[:, prefix:].mean(1).float())
            handles.append(bp.block.register_forward_hook(keep, with_kwargs=True))
        self._pending = None
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
        self._pending = [torch.cat(c) if c else torch.zeros(0) for c in chunks]

    def settled(self) -> int:
        """Compare the last recorded probe pass with the one before, update the streaks and return the longest
        settled prefix (never shorter than the frozen one)."""
        current, self._pending = self._pending, None
        if current is None:
            return self.frozen
        if self._reference is not None:
            self.changes = [representation_change(now, before) for now, before in zip(current, self._reference)]
            self.streaks = [s + 1 if change <= self.policy.tolerance else 0
                            for s, change in zip(self.streaks, self.changes)]
        self._reference = current
        return max(self.frozen, settled_prefix(self.streaks, self.policy.patience))

    def upstream(self, blocks: int) -> list[Tensor]:
        """The parameters that still require grad in the first ``blocks`` blocks and everything before them: the
        leaves of the autograd graph of block ``blocks - 1``'s output, from one probe image (the forward stops
        there)."""
        bp = self.parts.blocks[blocks - 1]

        def reached(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            raise _Reached(bp.tokens(args, kwargs, output)[1])

        handle = bp.block.register_forward_hook(reached, with_kwargs=True)
        try:
            with preserved_state(self.model), torch.enable_grad():
                self.model.eval()
                self.model(self._image())
        except _Reached as stop:
            return _leaf_parameters(stop.output)
        finally:
            handle.remove()
        raise RuntimeError(f"block {blocks - 1} did not run in the model's forward")

    def plan(self, blocks: int) -> FreezePlan:
        """What freezing the first ``blocks`` blocks means now: the parameters to freeze and the FLOPs it saves."""
        problem = wrapper_problem(self.model, self.model)
        if problem:
            self.refused = problem
            raise RuntimeError(problem)
        params = self.upstream(blocks)
        image = self._image()
        with _requires_grad(self._frozen_params, True):
            full = step_flops(self.model, image)
        with _requires_grad(params, False):
            after = step_flops(self.model, image)
        return FreezePlan(blocks, params, 1 - after / full if full else 0.0)

    def _image(self) -> Tensor:
        """The first probe image, on the model's device and in its dtype (as the probe pass takes it)."""
        param = next(self.model.parameters())
        return self.probe_image.to(param.device, param.dtype)

    def apply(self, plan: FreezePlan) -> None:
        """Freeze ``plan``'s parameters: no gradient from now on, and none left for the optimizer's next step."""
        for p in plan.parameters:
            p.requires_grad_(False)
            p.grad = None
        self._frozen_params += plan.parameters
        self.frozen = plan.blocks

    def update(self, agree: Callable[[int], int], guard: contextlib.AbstractContextManager[object]
               ) -> FreezePlan | None:
        """One sample of the policy: the settled prefix, agreed over ranks (``agree``: the smallest value any
        rank gives, identity without torch.distributed), planned and applied. Every rank makes the same calls to
        ``agree`` in the same order whatever fails where; ``guard`` (the Watch's
        [`FaultGuard`][isiwatch.watch.faults.FaultGuard]) contains a failure, which freezes nothing on any rank.
        Returns the plan applied, if any."""
        wanted = self.frozen
        with guard:
            wanted = self.frozen if self.refused else self.settled()
        blocks = agree(wanted)
        if blocks <= self.frozen:
            return None
        plan: FreezePlan | None = None
        with guard:
            plan = self.plan(blocks)
        if not agree(int(plan is not None)) or plan is None:
            return None
        self.apply(plan)
        return plan

    def unfreeze(self) -> None:
        """Make everything the policy froze trainable again and start its streaks over (it freezes again once
        blocks settle anew)."""
        for p in self._frozen_params:
            p.requires_grad_(True)
        self._frozen_params, self.frozen = [], 0
        self.streaks = [0] * self.parts.depth

    def message(self, plan: FreezePlan, before: int) -> str:
        """The alert record's text for ``plan``, applied over a prefix of ``before`` blocks."""
        last = plan.blocks - 1
        span = f"blocks {before}–{last}" if last > before else f"block {last}"
        span = f"the embeddings and {span}" if before == 0 else span
        return (f"froze {span}: their output on the probe batch changed by at most {self.policy.tolerance:g} "
                f"(relative) for {self.policy.patience} samples; {plan.flops_saved:.1%} of a training step's FLOPs "
                f"saved")

    def record_data(self, plan: FreezePlan, before: int) -> dict[str, Any]:
        """The alert record's data for ``plan``: the blocks newly frozen, the prefix, what it saves."""
        return {"blocks": list(range(before, plan.blocks)), "frozen_blocks": plan.blocks,
                "parameters": sum(p.numel() for p in plan.parameters), "step_flops_saved": plan.flops_saved,
                "changes": [c if math.isfinite(c) else None for c in self.changes[:plan.blocks]]}

    def state_dict(self) -> dict[str, Any]:
        return {"frozen": self.frozen, "streaks": list(self.streaks)}

    def load_state_dict(self, state: Mapping[str, Any], where: str = "Freezer state") -> None:
        """Restore `state_dict`'s output and freeze the saved prefix again (the same blocks and embeddings)."""
        depth = self.parts.depth
        s = checked(state, where,
                    frozen=(lambda v: isinstance(v, int) and is_count(v) and v <= depth,
                            f"an int between 0 and {depth}"),
                    streaks=(lambda v: isinstance(v, (list, tuple)) and len(v) == depth and all(map(is_count, v)),
                             f"a list of {depth} ints >= 0"))
        if s["frozen"] > self.frozen:
            self.apply(FreezePlan(s["frozen"], self.upstream(s["frozen"]), math.nan))
        self.streaks = list(s["streaks"])
        self._reference = None
