"""One probe pass that streams each block's tensors to a consumer.

The hooks live only for the duration of `Tap.capture`; the consumer sees one block at a time, so
memory does not grow with depth. Attention scores come from `AttentionRecorder`, so the
model's fused attention stays on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from .attention import AttentionRecorder, AttentionScores
from .parts import BlockParts, BranchFn, TapError, ViTParts

#: Receives the patch embedding E (None without a separate patch embedding) and block 0's input X0.
StemFn = Callable[[Tensor | None, Tensor], None]


@dataclass
class BlockTensors:
    """Tensors of block ``index`` on the probe batch, all fp32, (B,T,D) unless said.

    ``x``: block input X; ``x_normed``: norm1(X) (X itself for post-norm blocks); ``branch``: what the
    attention adds to X (zero on tokens it does not update), so Y = X + branch; ``z``: block output;
    ``attention``: the block's attention scores; ``p`` / ``has_cls``: prefix tokens in this block's sequence
    and whether the first is a [CLS].
    """

    index: int
    x: Tensor
    x_normed: Tensor
    branch: Tensor
    z: Tensor
    attention: AttentionScores
    p: int
    has_cls: bool


class Tap:
    """Runs one probe pass and streams per-block tensors to consumers.

    ``on_stem(E, X0)`` receives the patch embedding before positional encoding (None when the model has
    no separate patch embedding) and the input of block 0; ``on_block(BlockTensors)`` is called as each
    block finishes.
    """

    def __init__(self, parts: ViTParts):
        self.parts = parts

    @contextlib.contextmanager
    def _hooks(self, on_stem: StemFn, on_block: Callable[[BlockTensors], None]) -> Iterator[None]:
        parts = self.parts
        recorder = AttentionRecorder()
        handles: list[RemovableHandle] = []
        state: dict[str, Any] = {}

        if parts.patch_embed is not None:
            def keep_embedding(_module: nn.Module, _inputs: tuple[Any, ...], output: Any) -> None:
                state["E"] = parts.embed_tokens(output).float()
            handles.append(parts.patch_embed.register_forward_hook(keep_embedding))

        for index, bp in enumerate(parts.blocks):
            def block_start(_module: nn.Module, _args: tuple[Any, ...], index: int = index) -> None:
                state.update(block=index, branch=[], records=[])
                state.pop("Xn", None)

            def attention_start(_module: nn.Module, _args: tuple[Any, ...]) -> None:
                # the mode only while attention modules run: no cost elsewhere (torch leaves its __enter__ untyped)
                recorder.__enter__()  # type: ignore[no-untyped-call]
                recorder.active = True

            def attention_end(module: nn.Module, _args: tuple[Any, ...], _output: Any, index: int = index) -> None:
                recorder.active = False
                recorder.__exit__(None, None, None)  # type: ignore[no-untyped-call]  # torch: untyped
                new = list(recorder.records)
                recorder.records.clear()
                if not new:
                    raise TapError(f"block {index}: {type(module).__name__} computes no attention scores (it calls "
                                   "neither scaled_dot_product_attention nor a softmax over keys)")
                state["records"] += new  # several for differential attention: both maps, heads side by side

            def keep_norm(_module: nn.Module, _inputs: tuple[Any, ...], output: Any) -> None:
                state["Xn"] = output

            def add_branch(_module: nn.Module, inputs: tuple[Any, ...], output: Any, fn: BranchFn) -> None:
                state["branch"].append(fn(inputs, output).float())

            def block_end(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any,
                          index: int = index, bp: BlockParts = bp) -> None:
                x, z = (t.float() for t in bp.tokens(args, kwargs, output))
                if index == 0:
                    with full_precision(x.device):
                        on_stem(state.pop("E", None), x)
                if not state["records"]:
                    raise TapError(f"block {index}: its attention module did not run")
                branch = torch.stack(state["branch"]).sum(0) if len(state["branch"]) > 1 else state["branch"][0]
                if branch.shape[1] < x.shape[1]:  # CaiT class attention: only [CLS] is updated
                    branch = torch.cat([branch, branch.new_zeros(x.shape[0], x.shape[1] - branch.shape[1],
                                                                 x.shape[2])], dim=1)
                xn = state.pop("Xn", None)
                with full_precision(x.device):
                    on_block(BlockTensors(index, x, x if xn is None else xn.float(), branch, z,
                                          AttentionScores.along_heads(state["records"]), bp.num_prefix_tokens,
                                          bp.has_cls))

            handles.append(bp.block.register_forward_pre_hook(block_start))
            for attn in bp.attention:
                handles += [attn.register_forward_pre_hook(attention_start),
                            attn.register_forward_hook(attention_end)]
            if bp.norm is not None:
                handles.append(bp.norm.register_forward_hook(keep_norm))
            for module, fn in bp.branch:
                handles.append(module.register_forward_hook(lambda m, i, o, fn=fn: add_branch(m, i, o, fn)))
            handles.append(bp.block.register_forward_hook(block_end, with_kwargs=True))
        try:
            yield
        finally:
            if recorder.active:  # an exception inside an attention module: leave torch's mode stack as it was
                recorder.active = False
                recorder.__exit__(None, None, None)  # type: ignore[no-untyped-call]  # torch: untyped
            for h in handles:
                h.remove()
            state.clear()

    @torch.no_grad()
    def capture(self, model: nn.Module, images: Tensor, on_stem: StemFn,
                on_block: Callable[[BlockTensors], None], forward_dtype: torch.dtype | None = None) -> Tensor:
        """One forward of ``images`` through ``model`` with the hooks in place; returns the model output.

        Runs in eval mode and restores every module's mode and the global RNG state afterwards. ``forward_dtype``:
        the forward runs under ``torch.autocast`` in that dtype; the consumers and the attention statistics run
        with autocast off, in float32.
        """
        cast = (torch.autocast(images.device.type, dtype=forward_dtype) if forward_dtype is not None
                else contextlib.nullcontext())
        with preserved_state(model), self._hooks(on_stem, on_block), cast:
            model.eval()
            output: Tensor = model(images)
            return output


def full_precision(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """Autocast off on ``device``'s type: statistics of a forward that runs under autocast stay in float32."""
    if device.type in ("cpu", "cuda", "xpu", "mps"):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


@contextlib.contextmanager
def preserved_state(model: nn.Module) -> Iterator[None]:
    """Restore each module's train/eval flag and the CPU/CUDA RNG states (``torch.random.fork_rng``) on exit."""
    modes = [(m, m.training) for m in model.modules()]
    initialized = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]  # torch leaves it untyped
    devices = list(range(torch.cuda.device_count())) if initialized else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        for m, mode in modes:
            m.training = mode
