"""A Hugging Face ``Dinov2Model`` exported to ONNX, read back as a timm ``vit_*_patch14_dinov2`` state dict.

The exporter keeps the names of biases, norms, LayerScale and the [CLS] token, but leaves the six weight matrices
of each block (query, key, value, output, fc1, fc2) and the two position embeddings as anonymous initializers: each
is found through the node that consumes it (``/PREFIX/encoder/layer.{i}/attention/attention/query/MatMul``, ...).
Both attention layouts of transformers are read: 4.x (``attention.attention.query``, ``attention.output.dense``)
and 5.x (``attention.q_proj``, ``attention.o_proj``).
MatMul weights are stored ``[in, out]`` and are transposed to torch's ``[out, in]``; query, key and value
concatenate into timm's ``attn.qkv``. ``onnx`` is imported by the caller (an optional extra), never here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor


class OnnxError(ValueError):
    """The graph is not a Dinov2 backbone this reader understands; the message says which part is missing."""


class _Node(Protocol):
    name: str
    input: Iterable[str]


#: The attention's q, k, v and output projections under each transformers layout (module paths in a block).
_LAYOUTS = ({"q": "attention.attention.query", "k": "attention.attention.key", "v": "attention.attention.value",
             "proj": "attention.output.dense"},
            {"q": "attention.q_proj", "k": "attention.k_proj", "v": "attention.v_proj", "proj": "attention.o_proj"})
_NAMED = {"norm1.weight": "norm1.weight", "norm1.bias": "norm1.bias", "norm2.weight": "norm2.weight",
          "norm2.bias": "norm2.bias", "mlp.fc1.bias": "mlp.fc1.bias", "mlp.fc2.bias": "mlp.fc2.bias",
          "ls1.gamma": "layer_scale1.lambda1", "ls2.gamma": "layer_scale2.lambda1"}


def _consumers(nodes: Iterable[_Node], anonymous: set[str]) -> dict[str, list[str]]:
    """Node name → the anonymous initializers it reads."""
    found: dict[str, list[str]] = {}
    for node in nodes:
        for name in node.input:
            if name in anonymous:
                found.setdefault(node.name, []).append(name)
    return found


def _position_embeddings(weights: Mapping[str, np.ndarray], consumers: Mapping[str, list[str]], prefix: str,
                         width: int) -> Tensor:
    """timm's ``pos_embed`` ``[1, 1 + G*G, D]`` from the two anonymous embedding initializers: the [CLS] position
    ``[1, 1, D]`` and the patch grid ``[1, G*G, D]``, told apart by shape (node counters vary by exporter)."""
    scope = f"/{prefix}/embeddings/"
    tensors = [weights[name] for node, names in consumers.items() if node.startswith(scope) for name in names]
    cls = [t for t in tensors if t.shape == (1, 1, width)]
    grid = [t for t in tensors if t.ndim == 3 and t.shape[0] == 1 and t.shape[1] > 1 and t.shape[2] == width]
    if len(cls) != 1 or len(grid) != 1:
        raise OnnxError(f"expected one [CLS] and one patch position embedding under {scope}, found "
                        f"{len(cls)} and {len(grid)}")
    side = round(grid[0].shape[1] ** 0.5)
    if side * side != grid[0].shape[1]:
        raise OnnxError(f"the patch position embedding has {grid[0].shape[1]} positions, not a square grid")
    return torch.from_numpy(np.concatenate([cls[0], grid[0]], axis=1).copy())


def _block(weights: Mapping[str, np.ndarray], consumers: Mapping[str, list[str]], prefix: str,
           index: int) -> dict[str, Tensor]:
    """One encoder layer as timm's ``blocks.{index}.*``."""
    layer = f"{prefix}.encoder.layer.{index}."

    def named(key: str) -> Tensor:
        if layer + key not in weights:
            raise OnnxError(f"initializer {layer + key} is missing")
        return torch.from_numpy(weights[layer + key].copy())

    def matmul(module: str) -> Tensor:
        node = f"/{prefix}/encoder/layer.{index}/{module.replace('.', '/')}/MatMul"
        if len(consumers.get(node, [])) != 1:
            raise OnnxError(f"node {node} does not read exactly one weight initializer")
        return torch.from_numpy(weights[consumers[node][0]].T.copy())

    layout = next((paths for paths in _LAYOUTS if layer + paths["q"] + ".bias" in weights), _LAYOUTS[0])
    out = {f"blocks.{index}.{timm}": named(hf) for timm, hf in _NAMED.items()}
    out[f"blocks.{index}.attn.qkv.weight"] = torch.cat([matmul(layout[p]) for p in "qkv"])
    out[f"blocks.{index}.attn.qkv.bias"] = torch.cat([named(layout[p] + ".bias") for p in "qkv"])
    out[f"blocks.{index}.attn.proj.weight"] = matmul(layout["proj"])
    out[f"blocks.{index}.attn.proj.bias"] = named(layout["proj"] + ".bias")
    out[f"blocks.{index}.mlp.fc1.weight"] = matmul("mlp.fc1")
    out[f"blocks.{index}.mlp.fc2.weight"] = matmul("mlp.fc2")
    return out


def dinov2_state_dict(model: Any, prefix: str = "backbone") -> dict[str, Tensor]:
    """timm state dict (``num_classes=0``) of the ``Dinov2Model`` under ``prefix`` in an ONNX ``ModelProto``.

    Raises `OnnxError` naming the first missing part. The position grid keeps the size it was exported with
    (``pos_embed`` ``[1, 1 + G*G, D]``); timm resamples it for another ``img_size``.
    """
    from onnx import numpy_helper  # the caller has made sure onnx is installed (isiwatch[pretrained])

    weights = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    anonymous = {name for name in weights if name.startswith("onnx::")}
    consumers = _consumers(model.graph.node, anonymous)
    embed = f"{prefix}.embeddings."
    for key in ("cls_token", "patch_embeddings.projection.weight", "patch_embeddings.projection.bias"):
        if embed + key not in weights:
            raise OnnxError(f"initializer {embed + key} is missing: not a Dinov2 backbone under {prefix!r}")
    width = weights[embed + "cls_token"].shape[-1]
    depth = len({name.split(".")[3] for name in weights if name.startswith(f"{prefix}.encoder.layer.")})
    if depth == 0:
        raise OnnxError(f"no encoder layers under {prefix}.encoder")
    state = {"cls_token": torch.from_numpy(weights[embed + "cls_token"].copy()),
             "pos_embed": _position_embeddings(weights, consumers, prefix, width),
             "patch_embed.proj.weight": torch.from_numpy(weights[embed + "patch_embeddings.projection.weight"].copy()),
             "patch_embed.proj.bias": torch.from_numpy(weights[embed + "patch_embeddings.projection.bias"].copy())}
    for index in range(depth):
        state.update(_block(weights, consumers, prefix, index))
    for part in ("weight", "bias"):
        if f"{prefix}.layernorm.{part}" not in weights:
            raise OnnxError(f"initializer {prefix}.layernorm.{part} is missing")
        state[f"norm.{part}"] = torch.from_numpy(weights[f"{prefix}.layernorm.{part}"].copy())
    return state


def final_norm_output(model: Any, prefix: str = "backbone") -> str:
    """Name of the tensor the backbone's final layernorm writes (the last node that reads its bias): the output
    timm's ``forward_features`` equals, added to the graph's outputs to check a conversion."""
    bias = f"{prefix}.layernorm.bias"
    readers = [node for node in model.graph.node if bias in node.input]
    if not readers:
        raise OnnxError(f"no node reads {bias}")
    return str(readers[-1].output[0])
