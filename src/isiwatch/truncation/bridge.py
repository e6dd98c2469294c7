"""The linear bridge: a repair of a cut that needs no training (ReplaceMe, arXiv 2505.02819; TBA, arXiv 2410.04941).

A run of consecutive dropped blocks is replaced by one affine map estimated in closed form on calibration
images and merged into the preceding kept block, so the bridged cut is a plain shallower model of the same family
(no parameter added; ``timm.create_model(arch, depth=k)`` loads it strictly).

The residual stream decides what can be merged. The preceding kept block outputs ``h = y + m``: ``y`` the
stream after its attention, ``m = γ ⊙ fc2(a)`` its MLP branch (``γ`` the layer scale, 1 without). A map on the
whole stream, ``h·T + c``, cannot be merged into ``fc2``: ``y`` bypasses it. So, as ReplaceMe does, the map acts
on the MLP branch only and the residual passes through: the next kept block receives ``y + m·A + c``, with ``A``
and ``c`` fitted so that this matches ``z``, the stream the uncut model feeds it (the output of the run's last
dropped block), i.e. a regression of ``z − y`` on ``m``. That form merges exactly: ``fc2``'s weight becomes
``Aᵀ diag(γ) W``, its bias ``(γ ⊙ β)·A + c`` and ``γ`` becomes 1. Blocks whose MLP branch does not end the
residual branch (post-norm: ``ResPostRelPosBlock``) or that have no ``mlp.fc2`` (parallel blocks, SwiGLU
``weights_out``) are refused in one line; a run that starts at block 0 has no kept block before it and stays
as cut.

Fits (``method``): ``lstsq`` (the default) — least squares on every token of every calibration image with a
ridge of `RIDGE` × the mean input energy: closed form, deterministic, one pass over the images, and what the
pilot measured; ``cosine`` — ReplaceMe's cosine-distance variant, started from the least-squares fit and
refined by a few Adam steps on the mean cosine distance between ``y + m·A + c`` and ``z`` (the next block's
pre-norm discards the scale; costs the steps). Each run is fitted on the bridged cut so far, front to back, so
that a later bridge corrects what an earlier one left.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .._utils.option_error import OptionError
from ..taps.tap import preserved_state
from .classifier_layout import block_list
from .strategies import BRIDGE_METHODS, DEFAULT_BRIDGE
from .uncut_stream import BATCH, UncutStream, batches, capture, resumed, until

__all__ = ["BRIDGE_METHODS", "DEFAULT_BRIDGE", "RIDGE", "BridgeFit", "bridge_cut", "check_bridgeable", "dropped_runs",
           "mlp_branch", "resume_position"]

#: Ridge of the least-squares fit, relative to the mean squared input (the pilot's 1e-3).
RIDGE = 1e-3
#: Adam steps and learning rate of the cosine refinement (full batch over the sampled tokens).
COSINE_STEPS = 100
COSINE_LR = 1e-3
#: Tokens the cosine refinement samples from the calibration images (memory: tokens × width × 3 floats).
COSINE_TOKENS = 20_000
#: Where a block keeps the layer scale of its MLP branch: timm ViT (LayerScale), EVA/BEiT/CaiT, transformers
#: BEiT, DINOv2.
SCALES = ("ls2.gamma", "gamma_2", "lambda_2", "layer_scale2.lambda1")


def mlp_branch(block: nn.Module) -> tuple[nn.Linear, nn.Parameter | None]:
    """The linear layer that ends ``block``'s MLP branch (``mlp.fc2``) and its layer scale ``γ`` (None: none);
    `OptionError` for a block without one (parallel blocks, SwiGLU ``weights_out``)."""
    fc2 = getattr(getattr(block, "mlp", None), "fc2", None)
    if not isinstance(fc2, nn.Linear) or fc2.bias is None:
        raise OptionError("cannot bridge a cut of {block}: no MLP output projection with a bias (mlp.fc2) to merge "
                          "the bridge into; use {bridge:'none'}", block=type(block).__name__)
    for path in SCALES:
        try:
            return fc2, block.get_parameter(path)
        except AttributeError:  # not this family's layer scale (or the block has none)
            continue
    return fc2, None


def dropped_runs(kept: list[int], depth: int) -> list[tuple[int, list[int]]]:
    """Each run of consecutive dropped blocks with the source index of the kept block before it (-1: none, the
    run starts at block 0)."""
    runs: list[tuple[int, list[int]]] = []
    previous = -1
    for i in range(depth):
        if i in kept:
            previous = i
        elif runs and runs[-1][1][-1] == i - 1 and runs[-1][0] == previous:
            runs[-1][1].append(i)
        else:
            runs.append((previous, [i]))
    return runs


@dataclass
class BridgeFit:
    """What bridging a cut did: the fit, the runs bridged (source blocks ``after`` → ``dropped``) and left as
    cut, calibration images and seconds."""

    method: str
    bridged: list[dict[str, Any]]
    unbridged: list[list[int]]
    images: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "ridge": RIDGE if self.method != "none" else None, "runs": self.bridged,
                "unbridged_runs": self.unbridged, "calibration_images": self.images,
                "calibration_seconds": self.seconds}


def resume_position(kept: list[int]) -> int:
    """The position a cut keeping ``kept`` runs from on the uncut stream while it is bridged and judged: the
    kept block before its first dropped one (every block before it is the uncut model's, unchanged)."""
    first_dropped = next((i for i, k in enumerate(kept) if i != k), len(kept))
    return max(first_dropped - 1, 0)


def _activations(stream: UncutStream, cut: nn.Module, kept: list[int], position: int, last_dropped: int,
                 scale: Tensor | None) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """Per batch, flattened over tokens: the MLP branch ``m`` and the stream ``y`` of the cut's block at
    ``position`` and the uncut model's stream ``z`` after its block ``last_dropped`` (float64); the cut runs from
    the uncut stream (`resume_position`)."""
    block = block_list(cut)[position]
    fc2, _ = mlp_branch(block)
    device = next(cut.parameters()).device
    resume = resume_position(kept)
    slices = zip(batches(stream.images), stream.entering(resume), stream.entering(last_dropped + 1), strict=True)
    for batch, entry, target in slices:
        f: list[Tensor] = []
        h: list[Tensor] = []
        with capture(fc2, f), capture(block, h, stop=True), resumed(cut, resume, entry.to(device), stream):
            until(cut, batch.to(device))
        width = h[0].shape[-1]
        m = f[0] if scale is None else f[0] * scale
        m, hh, zz = (t.reshape(-1, width).double() for t in (m, h[0], target.to(device)))
        yield m, hh - m, zz


def _fit_lstsq(pairs: Iterable[tuple[Tensor, Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """``A`` and ``c`` minimising ‖m·A + c − (z − y)‖² + ridge‖A‖² over all tokens (normal equations, float64;
    ridge `RIDGE` × the mean input energy, 1 when the branch is silent)."""
    gram: Tensor | None = None
    cross: Tensor | None = None
    for m, y, z in pairs:
        x = torch.cat([m, torch.ones(len(m), 1, dtype=m.dtype, device=m.device)], 1)
        gram = x.T @ x if gram is None else gram + x.T @ x
        cross = x.T @ (z - y) if cross is None else cross + x.T @ (z - y)
    assert gram is not None and cross is not None  # at least one calibration image
    width = len(gram) - 1
    ridge = torch.zeros_like(gram)
    energy = float(gram.diagonal()[:width].mean())
    ridge.diagonal()[:width] = RIDGE * energy if energy > 0 else 1.0  # a silent branch (m = 0): A = 0, c the mean
    solution = torch.linalg.solve(gram + ridge, cross)
    return solution[:width], solution[width]


def _fit_cosine(pairs: Iterable[tuple[Tensor, Tensor, Tensor]], slices: int) -> tuple[Tensor, Tensor]:
    """ReplaceMe's cosine variant: the least-squares fit refined by `COSINE_STEPS` Adam steps on the mean cosine
    distance between ``y + m·A + c`` and ``z``, over a seeded sample of at most `COSINE_TOKENS` tokens."""
    generator = torch.Generator().manual_seed(0)
    per_batch = max(1, COSINE_TOKENS // slices)
    samples = []
    for m, y, z in pairs:
        pick = torch.randperm(len(m), generator=generator)[:per_batch].to(m.device)
        samples.append((m[pick], y[pick], z[pick]))
    a, c = _fit_lstsq(samples)
    m, y, z = (torch.cat([s[i] for s in samples]).float() for i in range(3))
    weight, bias = a.float().clone().requires_grad_(True), c.float().clone().requires_grad_(True)
    optimizer = torch.optim.Adam([weight, bias], lr=COSINE_LR)
    backward: Callable[[Tensor], None] = Tensor.backward  # torch leaves it unannotated
    with torch.enable_grad():
        for _ in range(COSINE_STEPS):
            optimizer.zero_grad()
            loss = (1 - torch.cosine_similarity(y + m @ weight + bias, z, dim=-1)).mean()
            backward(loss)
            optimizer.step()
    return weight.detach().double(), bias.detach().double()


def merge(block: nn.Module, a: Tensor, c: Tensor) -> None:
    """Fold ``m ↦ m·A + c`` into ``block``'s ``fc2`` (weight ``Aᵀ diag(γ) W``, bias ``(γ ⊙ β)·A + c``) and set its
    layer scale ``γ`` to 1, in place."""
    fc2, scale = mlp_branch(block)
    assert fc2.bias is not None  # mlp_branch refuses an fc2 without one
    gamma = torch.ones(fc2.out_features, dtype=torch.float64, device=a.device) if scale is None \
        else scale.detach().double().expand(fc2.out_features)
    with torch.no_grad():
        fc2.weight.copy_(a.T @ (gamma[:, None] * fc2.weight.double()))
        fc2.bias.copy_((gamma * fc2.bias.double()) @ a + c)
        if scale is not None:
            scale.fill_(1.0)


def _check_additive(cut: nn.Module, position: int, images: Tensor) -> None:
    """Refuse (one line) unless the block at ``position`` adds its MLP branch ``γ ⊙ fc2(a)`` to the residual
    stream as it is (what the merge assumes): shifting ``fc2``'s bias by 1 must shift the block's output by
    ``γ`` on every token. A post-norm block (``ResPostRelPosBlock``) normalises the branch first."""
    block = block_list(cut)[position]
    fc2, scale = mlp_branch(block)
    assert fc2.bias is not None  # mlp_branch refuses an fc2 without one
    batch = images[:2].to(fc2.weight.device)
    outputs: list[Tensor] = []
    bias = fc2.bias.detach().clone()
    try:
        with capture(block, outputs, stop=True):
            until(cut, batch)
            fc2.bias.add_(1.0)
            until(cut, batch)
    finally:
        fc2.bias.copy_(bias)
    shift = outputs[1] - outputs[0]
    expected = torch.ones_like(shift) if scale is None else scale.detach().expand_as(shift)
    if not torch.allclose(shift, expected, rtol=1e-3, atol=1e-4 * float(expected.abs().max())):
        raise OptionError("cannot bridge a cut of {block}: it does not add its MLP output to the residual stream "
                          "as it is (a post-norm block), so the bridge does not merge; use {bridge:'none'}",
                          block=type(block).__name__)


def check_bridgeable(model: nn.Module, images: Tensor) -> None:
    """Refuse in one line, before a search cuts anything, a model whose blocks the bridge cannot merge into
    (`mlp_branch`, `_check_additive` on its first block; ``images``: two model-ready images are enough)."""
    with preserved_state(model), torch.no_grad():
        _check_additive(model.eval(), 0, images)


def bridge_cut(uncut: nn.Module, cut: nn.Module, kept: list[int], images: Tensor,
               method: str = DEFAULT_BRIDGE, stream: UncutStream | None = None) -> BridgeFit:
    """Bridge every run of blocks ``cut`` (a `cut_vit` of ``uncut`` keeping ``kept``) dropped, in place, fitted
    on ``images`` (model-ready calibration images: healing images, never validation ones); ``uncut`` is only
    read. ``stream``: the uncut stream on ``images`` kept from earlier cuts (default: computed here). Modes and
    the global RNG are left as they were."""
    if method not in BRIDGE_METHODS:
        raise OptionError("unknown {bridge} fit {method!r}; choose " + ", ".join(BRIDGE_METHODS), method=method)
    if stream is not None and stream.images is not images:
        raise ValueError("the uncut stream was computed on other images")
    stream = stream or UncutStream(uncut, images)  # computes nothing until a run is fitted
    start = time.perf_counter()
    runs = dropped_runs(kept, len(block_list(uncut)))
    bridged: list[dict[str, Any]] = []
    unbridged = [dropped for after, dropped in runs if after < 0 or method == "none"]
    with preserved_state(uncut), preserved_state(cut), torch.no_grad():
        uncut.eval(), cut.eval()
        for after, dropped in runs:
            if after < 0 or method == "none":
                continue
            position = kept.index(after)
            _, scale = mlp_branch(block_list(cut)[position])
            _check_additive(cut, position, images)
            pairs = _activations(stream, cut, kept, position, dropped[-1], scale)
            a, c = (_fit_cosine(pairs, -(-len(images) // BATCH)) if method == "cosine" else _fit_lstsq(pairs))
            merge(block_list(cut)[position], a, c)
            bridged.append({"after": after, "dropped": dropped})
    return BridgeFit(method, bridged, unbridged, len(images), time.perf_counter() - start)

