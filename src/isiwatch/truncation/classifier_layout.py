"""Where a ViT classifier keeps the blocks truncation may drop, what runs after them, how many classes it
predicts and how to read its logits: the same questions for timm models and transformers models.

The blocks are the container (``nn.Sequential`` / ``nn.ModuleList``) holding the tap's first droppable block
(timm: ``blocks``; transformers: ``encoder.layer[s]``; CaiT: its self-attention ``blocks``). What runs after
them is read from registration order: at every level from the model down to that container, the siblings
registered after it (timm: ``norm``, ``fc_norm``, ``head``…; CaiT: ``blocks_token_only`` too; transformers:
``layernorm`` / ``post_layernorm``, ``pooler``, ``classifier``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ..taps import TapError, vit_parts


def block_path(model: nn.Module) -> str:
    """Dotted path of the container that holds the droppable blocks (timm: ``blocks``)."""
    first = vit_parts(model).blocks[0].block
    path: str  # torch leaves named_modules() unannotated
    for path, module in model.named_modules():
        if path and isinstance(module, (nn.Sequential, nn.ModuleList)) and len(module) and module[0] is first:
            return path
    raise ValueError(f"cannot truncate {type(model).__name__}: its blocks are not held in one module list")


def block_list(model: nn.Module) -> nn.Sequential | nn.ModuleList:
    """The container of the blocks truncation may drop; ``ValueError`` for a model it cannot cut."""
    try:
        blocks = model.get_submodule(block_path(model))
    except TapError as exc:
        raise ValueError(f"cannot truncate {type(model).__name__}: {exc}") from None
    assert isinstance(blocks, (nn.Sequential, nn.ModuleList))  # block_path found it as one
    return blocks


def with_blocks(model: nn.Module, path: str, blocks: list[nn.Module]) -> None:
    """Put ``blocks`` at ``path`` (`block_path`) in a container of the same type, and record the new depth in
    a transformers config so that ``save_pretrained`` / ``from_pretrained`` rebuild it."""
    parent_path, _, name = path.rpartition(".")
    container = model.get_submodule(path)
    new = nn.Sequential(*blocks) if isinstance(container, nn.Sequential) else nn.ModuleList(blocks)
    setattr(model.get_submodule(parent_path), name, new)
    config = getattr(model, "config", None)
    config = getattr(config, "vision_config", config)
    if config is not None and hasattr(config, "num_hidden_layers"):
        config.num_hidden_layers = len(blocks)
        if hasattr(config, "stage_names"):  # backbone configs (BEiT, DINOv2): stages follow the depth
            config.stage_names = ["stem", *(f"stage{i}" for i in range(1, len(blocks) + 1))]
            config.set_output_features_output_indices(out_features=None, out_indices=None)


def modules_after_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules registered after the blocks on the way from the model to them (the head side)."""
    path = block_path(model).split(".")
    after: list[nn.Module] = []
    module = model
    for name in path:
        names = [n for n, _ in module.named_children()]
        after += [child for n, child in module.named_children() if names.index(n) > names.index(name)]
        module = getattr(module, name)
    return after


def num_classes(model: nn.Module) -> int:
    """Classes the model predicts: timm's ``num_classes``; a transformers model with a ``classifier`` its
    ``num_labels``; 0 for a model without a classification head."""
    if hasattr(model, "num_classes"):
        classes: Any = model.num_classes  # timm: an int attribute
        return int(classes)
    config = getattr(model, "config", None)
    if isinstance(getattr(model, "classifier", None), nn.Module) and config is not None:
        return int(config.num_labels)
    return 0


def logits(output: Any) -> Tensor:
    """The logits of a model output: a tensor (timm) or an output object with ``.logits`` (transformers)."""
    result: Tensor = output if isinstance(output, Tensor) else output.logits
    return result
