"""The images of a truncation, streamed: healing, validation and test DataLoaders over timm datasets (or the
embedded digits, tensors or a caller's DataLoader), healing under timm's train-time transform and evaluation
under its eval transform (`isiwatch.io.timm_data`), each set up by Fabric when one runs them (a shard per
process). Only labels are held in memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.utils.data import ConcatDataset, DataLoader, Dataset, RandomSampler, Subset, TensorDataset

from ..io.data import DIGITS_TRAIN, DataError
from ..io.timm_data import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_WORKERS,
    DataConfig,
    Images,
    ImageSource,
    TimmDataset,
    TimmSource,
    image_source,
    loader,
    resolve_data_config,
    split_folder,
)
from .classifier_layout import num_classes
from .engine import ShardedLoader

if TYPE_CHECKING:
    from lightning_fabric import Fabric

#: Healing and evaluation images: ``"mnist"`` (the embedded digits), a folder tree or tar file timm reads, a split
#: of a dataset timm's readers read (`TimmDataset`), model-ready ``(images, labels)``
#: tensors or a DataLoader of such batches.
Data = str | Path | TimmDataset | tuple[Tensor, Tensor] | DataLoader[Any]
#: The forms of `Data` read from a name, a folder or a timm dataset (preprocessed by isiwatch).
NAMED = (str, Path, TimmDataset)
#: Share of a single source held out (halved into validation and test).
HELD_OUT_FRACTION = 0.2


@dataclass
class Split:
    """Healing images (``train_x``), validation images (``auto`` chooses its cut on them) and test images (the
    reported accuracy of an ``auto`` cut), as DataLoaders (set up by Fabric when one runs them) with their labels
    in order; ``held_out_x`` reads validation and test together (a fixed-strategy cut reports on both), and
    ``probe_x`` the healing images under the evaluation transform, unsharded (the analysis reads its first
    ``--images``)."""

    train_x: DataLoader[Any] | ShardedLoader
    train_y: Tensor
    val_x: DataLoader[Any] | ShardedLoader
    val_y: Tensor
    test_x: DataLoader[Any] | ShardedLoader
    test_y: Tensor
    held_out_x: DataLoader[Any] | ShardedLoader
    probe_x: DataLoader[Any]
    #: Which images each part holds: ``{"heal" | "validation" | "test": {"source", "images", "of"}}`` (``of``:
    #: the images in that source), so a report says whether "held out" really is.
    data: dict[str, dict[str, str | int]] = field(default_factory=dict)
    #: Images per batch: ``{"per_process", "processes", "global"}`` (the global batch is the one asked for, split
    #: over the processes, so several devices heal as one does).
    batch: dict[str, int] = field(default_factory=dict)
    #: How class names became the model's outputs (`number_classes`): ``{"numbering": how, "classes": {name:
    #: output}}``; empty for images without class names (the digits, tensors, a DataLoader).
    labels: dict[str, Any] = field(default_factory=dict)

    @property
    def held_out(self) -> tuple[DataLoader[Any] | ShardedLoader, Tensor]:
        return self.held_out_x, torch.cat([self.val_y, self.test_y])


def train_val_dirs(data: str) -> tuple[Path, Path] | None:
    """``DIR/train`` and ``DIR/validation`` (or a synonym timm accepts, such as ``DIR/val``) when ``data`` has timm
    ``train.py``'s layout."""
    root = Path(data)
    train, val = split_folder(root, "train"), split_folder(root, "validation")
    return (train, val) if train is not None and val is not None else None


def _source(data: Data) -> str:
    """How a report names ``data``."""
    return type(data).__name__ if isinstance(data, DataLoader) else "tensors" if isinstance(data, tuple) else str(data)


def dataset_labels(dataset: Dataset[Any]) -> Tensor:
    """Every item's class in order: read from the dataset's record where it keeps one (timm datasets, tensors,
    subsets of them), else by one pass over its items."""
    if isinstance(dataset, Images):
        return dataset.labels()
    if isinstance(dataset, TensorDataset):
        return dataset.tensors[1].long()
    if isinstance(dataset, Subset):
        return dataset_labels(dataset.dataset)[torch.as_tensor(dataset.indices, dtype=torch.long)]
    if isinstance(dataset, ConcatDataset):
        return torch.cat([dataset_labels(d) for d in dataset.datasets])
    return torch.tensor([int(dataset[i][1]) for i in range(len(dataset))], dtype=torch.long)  # type: ignore[arg-type]


@dataclass
class _Part:
    """One part of a split before it is read: the items for healing (train-time transform) and for evaluation."""

    train: Dataset[Any]
    eval: Dataset[Any]

    def __len__(self) -> int:
        return len(self.eval)  # type: ignore[arg-type]


def _parts(data: Data, config: DataConfig | None, holdout: bool) -> tuple[_Part, _Part | None, int]:
    """``data`` as a healing part and, with ``holdout``, a held-out part (the demo's digit split for 'mnist', else the
    last HELD_OUT_FRACTION of a fixed shuffle of a timm dataset, of tensors or a DataLoader's dataset in order);
    and how many images ``data`` has."""
    if isinstance(data, NAMED):
        assert config is not None  # load_split resolves one for images read from a name or a folder
        source: ImageSource = image_source(data)
        order = (torch.arange(len(source)) if str(data) == "mnist"
                 else torch.randperm(len(source), generator=torch.Generator().manual_seed(0)))
        if holdout:
            cut = DIGITS_TRAIN if str(data) == "mnist" else _holdout_cut(len(source), str(data))
            heal, held = order[:cut], order[cut:]
        else:
            heal, held = order, order[:0]
        part = _Part(Images(source, heal, config, training=True), Images(source, heal, config, training=False))
        return part, (_Part(*(Images(source, held, config, training=t) for t in (True, False))) if holdout
                      else None), len(source)
    dataset: Dataset[Any] = data.dataset if isinstance(data, DataLoader) else TensorDataset(*data)
    count = len(dataset)  # type: ignore[arg-type]
    if not holdout:
        return _Part(dataset, dataset), None, count
    cut = _holdout_cut(count, _source(data))
    heal_set, held_set = Subset(dataset, range(cut)), Subset(dataset, range(cut, count))
    return _Part(heal_set, heal_set), _Part(held_set, held_set), count


def _classes(part: _Part) -> dict[str, int] | None:
    """The class names and labels of a part read through a named source, where its reader names them."""
    return part.eval.source.classes if isinstance(part.eval, Images) else None


def _check_same_classes(heal: _Part, held: _Part, heal_source: str, eval_source: str) -> None:
    """Healing and evaluation images read from two sources must number their classes alike (timm numbers a
    folder tree's classes by the sorted names of those it finds), refused in one line naming the classes."""
    ours, theirs = _classes(heal), _classes(held)
    if ours is None or theirs is None or ours == theirs:
        return
    missing, extra = sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours))
    differ = sorted(c for c in set(ours) & set(theirs) if ours[c] != theirs[c])
    what = "; ".join(part for part in (
        f"no {', '.join(missing)} (which {heal_source} has)" if missing else "",
        f"{', '.join(extra)} (which {heal_source} lacks)" if extra else "",
        f"{', '.join(differ)} numbered differently" if differ and not (missing or extra) else "") if part)
    raise DataError(f"{eval_source}: its classes differ from the healing images': {what}; the labels would not "
                    "match")


def number_classes(classes: dict[str, int], class_map: dict[str, int] | None) -> tuple[dict[str, int] | None, str]:
    """How the classes a reader names (``classes``: name → its sorted-name label) map to the model's outputs,
    and what the mapping is: ``class_map`` when there is one (given, or recorded in the checkpoint), else each
    class's number when every name is a decimal number, else None: timm's numbering by sorted names, as its
    ``train.py`` numbered them (the uncut model's accuracy then shows whether it matches)."""
    if class_map is not None:
        return class_map, "class map"
    if all(name.isdecimal() for name in classes):
        return {name: int(name) for name in classes}, "numeric folder names as indices"
    return None, "sorted folder names (timm's numbering)"


def _relabel(parts: list[_Part], class_map: dict[str, int] | None) -> dict[str, Any]:
    """Number the classes of every named source in ``parts`` as `number_classes` says; the record of it."""
    record: dict[str, Any] = {}
    sources = {id(p.eval.source): p.eval.source for p in parts if isinstance(p.eval, Images)}
    for source in sources.values():
        if not isinstance(source, TimmSource) or source.classes is None:
            continue
        mapping, how = number_classes(source.classes, class_map)
        if mapping is not None:
            source.relabel(mapping)
        record = {"numbering": how, "classes": dict(source.classes)}
    return record


def _holdout_cut(count: int, name: str) -> int:
    if count < 3:
        raise DataError(f"{name}: need at least 3 images to heal, validate and test, found {count}")
    return count - max(2, round(HELD_OUT_FRACTION * count))


def load_split(model: nn.Module, data: Data, eval_data: Data | None = None, config: DataConfig | None = None, *,
               batch_size: int = DEFAULT_BATCH_SIZE, workers: int = DEFAULT_WORKERS, seed: int = 0,
               fabric: Fabric | None = None, class_map: dict[str, int] | None = None) -> Split:
    """Healing, validation and test images; those read from a name or a folder are preprocessed as ``config``
    says (default: `resolve_data_config` of the model alone), tensors and
    DataLoaders are taken as they are (model-ready; a DataLoader's batch size and workers are kept).

    With ``eval_data``, or when ``data`` has ``train/`` and ``validation/`` (or ``val/``) sub-folders (timm
    ``train.py``'s layout), all of ``data`` (its ``train/``) heals and the evaluation images are halved into
    validation and test: a folder split would measure "held-out" accuracy on training images. Otherwise one
    source is split: 'mnist' as the demo does (4,000 healing / 1,000 held-out digits), a folder, tensors or a
    DataLoader by holding out their last HELD_OUT_FRACTION; the held-out images are halved into validation and
    test. With ``fabric`` every loader is set up by it (each process reads a shard). Class folders are numbered
    as `number_classes` says (``class_map``: class name → model output).
    """
    if config is None and isinstance(data, NAMED):
        config = resolve_data_config(model, str(data))
    layout = train_val_dirs(str(data)) if eval_data is None and isinstance(data, (str, Path)) and data != "mnist" \
        else None
    heal_data, eval_data = (str(layout[0]), str(layout[1])) if layout else (data, eval_data)
    heal_source, eval_source = _source(heal_data), None if eval_data is None else _source(eval_data)
    heal, held, total = _parts(heal_data, config, holdout=eval_data is None)
    if held is None:
        assert eval_data is not None  # no hold-out was asked for only with evaluation data
        held, _, _ = _parts(eval_data, config, holdout=False)
        if len(held) < 2:
            raise DataError(f"{eval_source}: need at least 2 images to validate and test, found {len(held)}")
    if len(heal) == 0:
        raise DataError(f"{heal_source}: no images to heal on")
    classes = num_classes(model)
    if classes == 0:
        raise DataError(f"{type(model).__name__} has no classification head to heal and score a cut with "
                        "(use a classifier, e.g. ViTForImageClassification)")
    labels = _relabel([heal, held], class_map)
    heal_y, eval_y = dataset_labels(heal.eval), dataset_labels(held.eval)
    for source, y in ((heal_source, heal_y), (eval_source or heal_source, eval_y)):
        if int(y.max()) >= classes:
            raise DataError(f"{source}: {int(y.max()) + 1} classes but the model's head has {classes} outputs")
    _check_same_classes(heal, held, heal_source, eval_source or heal_source)
    half = len(held) // 2
    user = data if isinstance(data, DataLoader) else None
    processes = 1 if fabric is None else fabric.world_size
    # the global batch (over all processes) is --batch-size, or the DataLoader's, as with one process
    size = -(-((user.batch_size or batch_size) if user is not None else batch_size) // processes)
    in_memory = isinstance(data, tuple) or (data == "mnist" and eval_data is None)  # tensors, the embedded digits
    threads = user.num_workers if user is not None else 0 if in_memory else workers

    def stream(dataset: Dataset[Any], shuffle: bool = False) -> DataLoader[Any] | ShardedLoader:
        shard = None if fabric is None else (fabric.global_rank, processes)  # the same global batches on any count
        made = loader(dataset, batch_size=size, workers=threads, shuffle=shuffle, seed=seed, shard=shard)
        if user is not None:
            made.collate_fn = user.collate_fn
        return made if fabric is None else ShardedLoader(fabric, made)

    val, test = Subset(held.eval, range(half)), Subset(held.eval, range(half, len(held)))
    shuffle = user is None or isinstance(user.sampler, RandomSampler)
    eval_of = len(held) if eval_source else total
    record: dict[str, dict[str, str | int]] = {
        "heal": {"source": heal_source, "images": len(heal), "of": total},
        "validation": {"source": eval_source or heal_source, "images": half, "of": eval_of},
        "test": {"source": eval_source or heal_source, "images": len(held) - half, "of": eval_of}}
    probe = loader(heal.eval, batch_size=size, workers=min(threads, 1))
    return Split(stream(heal.train, shuffle), heal_y, stream(val), eval_y[:half], stream(test), eval_y[half:],
                 stream(held.eval), probe, record, {"per_process": size, "processes": processes,
                                                    "global": size * processes}, labels)

