"""Images through timm's data layer, streamed and never held in memory as a whole: datasets from
``timm.data.create_dataset`` (folder trees, tar files and the splits of its random-access readers,
``torch/<name>`` and ``hfds/<name>``) or the embedded digits, preprocessed as timm's
``train.py`` and ``validate.py`` build it from the checkpoint's data config (``timm.data.resolve_data_config``
over ``train.py``'s recorded args, else the model's ``pretrained_cfg``), read by DataLoaders with workers.

An image that cannot be read is refused in one line naming its file, also from a worker process."""

from __future__ import annotations

import contextlib
import importlib.util
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from .._utils.threads import usable_cpus
from .checkpoint import AUGMENT_ARGS, DATA_ARGS
from .data import MNIST_MEAN, MNIST_STD, DataError, DataOptionError, digit_pixels, per_channel
from .model_images import model_input

#: timm ``train.py``'s default ``--workers``.
DEFAULT_WORKERS = 4
#: Images per batch when healing and evaluating.
DEFAULT_BATCH_SIZE = 128
#: What ``pretrained_cfg`` keys a data config sets, so ``timm.data.resolve_data_config(model=...)`` finds it.
PRETRAINED_CFG_KEYS = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")


def _channels(values: Sequence[float], chans: int) -> tuple[float, ...]:
    """Statistics for ``chans`` channels as timm's loader adapts them (``adapt_to_chs``): kept when the counts
    agree, one value repeated, else their average for every channel (3-channel ``pretrained_cfg`` statistics
    for a 1-channel model)."""
    values = tuple(float(v) for v in values)
    if len(values) == chans:
        return values
    return (sum(values) / len(values),) * chans


@dataclass(frozen=True)
class DataConfig:
    """How images are preprocessed for a model, in timm's terms (``resolve_data_config``'s keys), where the
    statistics came from (``source``: "checkpoint args", "checkpoint metadata", "preprocessor_config.json",
    "--mean/--std", "mnist", "pretrained_cfg" or "timm default") and the train-time augmentation of the
    recorded ``train.py`` args (``augment``: ``create_transform`` keyword arguments; empty: none recorded,
    healing then sees the evaluation preprocessing)."""

    input_size: tuple[int, int, int]
    interpolation: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_pct: float
    crop_mode: str
    source: str
    augment: dict[str, Any] = field(default_factory=dict)

    @property
    def image_mode(self) -> str:
        """The PIL mode images are read in, as ``train.py`` chooses it."""
        return "RGB" if self.input_size[0] == 3 else "L"

    def transform(self, training: bool) -> Callable[[Image.Image], Tensor]:
        """timm's train-time transform (with the recorded augmentation) or its evaluation transform."""
        from timm.data.transforms_factory import create_transform

        common: dict[str, Any] = {"input_size": self.input_size, "mean": self.mean, "std": self.std}
        if training:
            options = {"is_training": True, "interpolation": self.interpolation, **(self.augment or {"no_aug": True})}
        else:
            options = {"interpolation": self.interpolation, "crop_pct": self.crop_pct, "crop_mode": self.crop_mode}
        transform: Callable[[Image.Image], Tensor] = create_transform(**common, **options)
        return transform

    def pretrained_cfg(self) -> dict[str, Any]:
        """The ``pretrained_cfg`` entries that make ``timm.data.resolve_data_config(model=...)`` return this config
        (a cut checkpoint records them as the ``pretrained_cfg_overlay`` model keyword argument)."""
        return {"input_size": list(self.input_size), "interpolation": self.interpolation, "mean": list(self.mean),
                "std": list(self.std), "crop_pct": self.crop_pct, "crop_mode": self.crop_mode}

    def to_dict(self) -> dict[str, Any]:
        return {"mean": list(self.mean), "std": list(self.std), "source": self.source,
                "interpolation": self.interpolation, "crop_pct": self.crop_pct, "crop_mode": self.crop_mode,
                "input_size": list(self.input_size), "augment": self.augment}


def _augmentation(args: Mapping[str, Any]) -> dict[str, Any]:
    """``create_transform`` keyword arguments of the train-time augmentation recorded in ``train.py``'s args."""
    out = {}
    for arg, name in AUGMENT_ARGS.items():
        value = args.get(arg)
        if value is None or (arg == "train_interpolation" and not value):
            continue
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


def resolve_data_config(model: nn.Module, data: str, recorded: Mapping[str, Any] | None = None,
                        mean: Sequence[float] | None = None, std: Sequence[float] | None = None) -> DataConfig:
    """The preprocessing ``model`` was trained with, as timm ``train.py`` resolves it: ``mean``/``std`` given by
    the user; else the recorded data config (``recorded``: ``train.py``'s args, isiwatch's metadata or a
    ``preprocessor_config.json``, see `data_config`); else, for the embedded digits (``data == "mnist"``) of a
    checkpoint that records no training run at all (the demo's), MNIST statistics at the digits' own size; else
    the model's ``pretrained_cfg``, as ``train.py`` takes it for args that leave the statistics unset. The input
    size is the model's own unless the args record one."""
    (height, width), in_chans = model_input(model)
    recorded = dict(recorded or {})
    args: dict[str, Any] = {key: recorded.get(key) for key in DATA_ARGS}
    if args["input_size"] is None and args["img_size"] is None:
        args["input_size"] = (in_chans, height, width)
    if (mean is None) != (std is None):
        raise DataOptionError("{mean} and {std} go together: give both or neither")
    if mean is not None and std is not None:
        args["mean"], args["std"] = per_channel(mean, in_chans, "mean"), per_channel(std, in_chans, "std")
        source = "--mean/--std"
    elif args["mean"] is not None and args["std"] is not None:
        where = recorded.get("source", "checkpoint args")
        args["mean"] = per_channel(args["mean"], in_chans, f"the {where} mean")
        args["std"] = per_channel(args["std"], in_chans, f"the {where} std")
        source = where
    elif data == "mnist" and not set(recorded) - {"source"}:  # no training run recorded
        args.update(mean=(MNIST_MEAN,) * in_chans, std=(MNIST_STD,) * in_chans)
        args["crop_pct"] = args["crop_pct"] or 1.0
        args["interpolation"] = args["interpolation"] or "bilinear"
        source = "mnist"
    else:
        args["mean"] = args["std"] = None
        cfg = getattr(model, "pretrained_cfg", None) or {}
        source = "pretrained_cfg" if cfg.get("mean") else "timm default"
    from timm.data.config import resolve_data_config as timm_resolve

    config = timm_resolve(args=args, model=model)  # type: ignore[no-untyped-call]  # timm leaves it untyped
    size = tuple(int(v) for v in config["input_size"])
    return DataConfig((size[0], size[1], size[2]), str(config["interpolation"]),
                      _channels(config["mean"], size[0]), _channels(config["std"], size[0]),
                      float(config["crop_pct"]), str(config["crop_mode"]), source, _augmentation(recorded))


class ImageSource:
    """Labelled images read one at a time: `image` opens image ``index`` as a PIL image in ``mode``;
    ``classes`` maps class names to labels where the reader names them (folder trees, tar files), else None."""

    name: str
    classes: dict[str, int] | None = None

    def __len__(self) -> int:
        raise NotImplementedError

    def labels(self) -> Tensor:
        """Every image's class, without reading the images."""
        raise NotImplementedError

    def image(self, index: int, mode: str) -> Image.Image:
        raise NotImplementedError


#: Reader prefixes of ``timm.data.create_dataset`` names (``--dataset PREFIX/NAME``); no prefix: a folder tree or tar.
READERS = ("torch", "hfds", "hfids", "tfds", "wds")
#: Readers that stream a dataset in one order (timm's ``IterableImageDataset``): no random access to split,
#: shuffle and label it by index.
STREAMING_READERS = ("hfids", "tfds", "wds")
#: The package a map-style reader needs beyond timm's own dependencies.
READER_PACKAGES = {"hfds": "datasets"}
#: The sub-folder names ``timm.data.create_dataset`` accepts for a training or an evaluation split.
SPLIT_SYNONYMS = (("train", "training"), ("validation", "val", "valid", "eval", "evaluation"))


@dataclass(frozen=True)
class TimmDataset:
    """One split of a dataset as timm's ``train.py`` names it: ``name`` its ``--dataset`` (``""``: a folder tree or
    tar file; ``"torch/<name>"``: a torchvision dataset already under ``root``; ``"hfds/<name>"``: a Hugging Face
    dataset), ``root`` its data folder and ``split`` its ``--train-split``/``--val-split``."""

    name: str
    root: str | Path
    split: str

    def __str__(self) -> str:
        return f"{self.name or 'folder'} ({self.split}) in {self.root}"


def split_folder(root: Path, split: str) -> Path | None:
    """The sub-folder of ``root`` holding ``split`` as ``timm.data.create_dataset`` finds it (the split's own name,
    else one of its synonyms: ``val`` for ``validation``, ...), None when there is none."""
    name = split.split("[")[0]
    names = next(([name, *s] for s in SPLIT_SYNONYMS if name in s), [name])
    return next((root / n for n in names if n and (root / n).is_dir()), None)


def _targets(dataset: Any) -> Tensor:
    """Every image's class without decoding images: the ``targets`` a reader (timm's tar reader) or a torchvision
    dataset records, else the last field of each of a reader's ``samples`` (timm's folder reader: path, class),
    else each item's label read in turn (a pass over the dataset's records)."""
    reader = getattr(dataset, "reader", None)
    items = dataset if reader is None else reader
    targets = getattr(items, "targets", None)
    if targets is not None and torch.as_tensor(targets).ndim == 1:
        return torch.as_tensor(targets).long()
    samples = getattr(items, "samples", None)
    if samples is not None:
        return torch.tensor([int(sample[-1]) for sample in samples], dtype=torch.long)
    return torch.tensor([int(items[i][1]) for i in range(len(items))], dtype=torch.long)


class TimmSource(ImageSource):
    """A dataset of ``timm.data.create_dataset``: a folder tree (one sub-folder per class) or a tar file of one, or
    a split of a dataset that one of timm's random-access readers reads (`TimmDataset`). Only labels (and the
    reader's record of files) are held; images are read one at a time. A reader timm cannot make here (unknown,
    streaming only, its package missing, its files absent) is refused in one line."""

    def __init__(self, data: str | Path | TimmDataset):
        from timm.data.dataset_factory import create_dataset

        spec = data if isinstance(data, TimmDataset) else TimmDataset("", data, "")
        root, name = Path(spec.root), spec.name
        prefix, _, rest = name.partition("/")
        prefix = prefix.lower() if rest else ""
        self.name = str(spec) if isinstance(data, TimmDataset) else str(root)
        if prefix and prefix not in READERS:
            raise DataError(f"{name}: unknown dataset reader {prefix}/ (timm reads " + ", ".join(f"{r}/" for r in
                                                                                               READERS)
                            + "; no prefix: a folder tree or tar file)")
        if prefix in STREAMING_READERS:
            raise DataError(f"{name}: timm's {prefix}/ reader streams images in one order, and truncate reads them by "
                            "index (use a folder tree, a tar file, torch/ or hfds/)")
        package = READER_PACKAGES.get(prefix)
        if package is not None and importlib.util.find_spec(package) is None:
            raise DataError(f"{name}: timm's {prefix}/ reader needs the {package} package (pip install {package})")
        folder_reader = not prefix or rest.lower() in ("folder", "image_folder")
        if prefix in ("", "torch") and not root.exists():
            raise DataError(f"{root}: no such data folder")
        if folder_reader and spec.split:
            if root.is_file():
                raise DataError(f"{root}: a tar file has no {spec.split} split (give it as --data, and the "
                                "evaluation tar as --eval-data, without --dataset)")
            if split_folder(root, spec.split) is None:
                raise DataError(f"{root}: no {spec.split}/ sub-folder for the {spec.split} split")
        try:
            dataset = create_dataset(name, root=str(root), split=spec.split)
        except ImportError as exc:
            raise DataError(f"{self.name}: timm's reader needs a missing package ({exc})") from None
        except (OSError, RuntimeError, AssertionError, ValueError, KeyError) as exc:  # timm: "Found 0 images ..."
            line = (str(exc).splitlines() or [type(exc).__name__])[0]
            if not prefix:
                raise DataError(f"{root}: not an image folder tree or tar of one ({line})") from None
            if "download" in line:  # torchvision: "Dataset not found. You can use download=True ..."
                line = f"not found under {root} (isiwatch downloads nothing: put it there as torchvision would)"
            raise DataError(f"{self.name}: {line}") from None
        self.dataset, self.reader = dataset, getattr(dataset, "reader", None)
        self._labels = _targets(dataset)
        if not len(self._labels):
            raise DataError(f"{self.name}: no images found")
        classes = getattr(self.reader if self.reader is not None else dataset, "class_to_idx", None)
        self.classes = dict(classes) if isinstance(classes, dict) and classes else None
        if self.classes is not None:
            folder = split_folder(root, spec.split) if spec.split else root
            check_class_folders(folder if folder is not None and folder.is_dir() else None, self.classes,
                                self.name)

    def __len__(self) -> int:
        return len(self._labels)

    def labels(self) -> Tensor:
        return self._labels

    def relabel(self, mapping: Mapping[str, int]) -> None:
        """Number the classes as ``mapping`` (class name → model output) says instead of by the reader's sorted
        names; refused in one line naming a class ``mapping`` lacks."""
        assert self.classes is not None  # only a reader that names its classes is relabelled
        missing = sorted(set(self.classes) - set(mapping))
        if missing:
            raise DataError(f"{self.name}: class {missing[0]!r} has no output index in the class map "
                            f"({len(missing)} of its {len(self.classes)} classes missing)")
        lookup = torch.zeros(max(self.classes.values()) + 1, dtype=torch.long)
        for name, label in self.classes.items():
            lookup[label] = int(mapping[name])
        self._labels = lookup[self._labels]
        self.classes = {name: int(mapping[name]) for name in self.classes}

    def _filename(self, index: int) -> str:
        """How an error names image ``index``: its file where the reader records one."""
        if self.reader is not None:
            return str(self.reader.filename(index, absolute=True))
        samples = getattr(self.dataset, "samples", None)
        return str(samples[index][0]) if samples else f"{self.name}: image {index}"

    def image(self, index: int, mode: str) -> Image.Image:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                if self.reader is None:  # a torchvision dataset: a PIL image (no transform is set)
                    image: Image.Image = self.dataset[index][0]
                    return image.convert(mode)
                handle = self.reader[index][0]  # a timm reader: a file (or its path), read here so errors name it
                with contextlib.closing(handle) if hasattr(handle, "close") else contextlib.nullcontext():
                    image = Image.open(handle)
                    image.load()
                    return image.convert(mode)
        except Image.DecompressionBombError as exc:
            raise DataError(f"{self._filename(index)}: refused, too many pixels ({exc})") from None
        except UnidentifiedImageError:
            raise DataError(f"{self._filename(index)}: not an image file PIL can read") from None
        except (OSError, ValueError, SyntaxError) as exc:  # PIL: truncated files
            raise DataError(f"{self._filename(index)}: unreadable image ({exc})") from None


def check_class_folders(folder: Path | None, classes: Mapping[str, int], name: str) -> None:
    """Refuse, in one line naming it, a class that timm's reader numbering would silently drop and so shift the
    labels of the classes after it: a sub-folder of ``folder`` (the tree read; None: a tar file; hidden folders
    aside) with no image timm reads, or a gap in classes named by consecutive numbers (no ``7/`` between ``6/``
    and ``8/``)."""
    if folder is not None:
        from timm.data.readers.img_extensions import get_img_extensions

        images = get_img_extensions(as_set=True)  # type: ignore[no-untyped-call]  # timm leaves it untyped
        for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if sub.name not in classes and not any(f.suffix.lower() in images for f in sub.rglob("*")):
                raise DataError(f"{sub}: an empty class folder; timm's reader skips it and numbers the classes "
                                "after it one lower, so their labels would shift (put its images in, or remove it)")
    if all(c.isdecimal() for c in classes):
        numbers = sorted(int(c) for c in classes)
        missing = sorted(set(range(numbers[0], numbers[-1] + 1)) - set(numbers))
        if missing:
            raise DataError(f"{name}: no class folder {missing[0]} among the numbered class folders {numbers[0]}–"
                            f"{numbers[-1]}; timm numbers classes by their sorted names, so the labels after it "
                            "would shift")


class DigitsSource(ImageSource):
    """The 5,000 embedded MNIST digits (shipped with isiwatch), 28×28 grey, in `embedded_digits`'s fixed
    shuffle."""

    name = "mnist"

    def __init__(self, seed: int = 0):
        pixels, labels = digit_pixels()
        order = torch.randperm(len(pixels), generator=torch.Generator().manual_seed(seed))
        self.pixels, self._labels = pixels[order], labels[order]

    def __len__(self) -> int:
        return len(self._labels)

    def labels(self) -> Tensor:
        return self._labels

    def image(self, index: int, mode: str) -> Image.Image:
        return Image.fromarray(self.pixels[index].numpy(), mode="L").convert(mode)


class Images(Dataset[tuple[Tensor, int]]):
    """The images ``indices`` of ``source``, read in ``config``'s mode and transformed for training or evaluation.

    The indices are kept as one int64 tensor (8 bytes an image; a slice of another is a view, not a copy), not a
    Python list: a list's int objects have their reference counts written on every read, so each forked DataLoader
    worker would copy the pages holding them, a copy per worker that grows with the dataset."""

    def __init__(self, source: ImageSource, indices: Sequence[int] | Tensor, config: DataConfig, training: bool):
        self.source, self.mode = source, config.image_mode
        self.indices = torch.as_tensor(indices, dtype=torch.long)
        self.transform = config.transform(training)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        index = int(self.indices[i])
        return self.transform(self.source.image(index, self.mode)), int(self.source.labels()[index])

    def labels(self) -> Tensor:
        return self.source.labels()[self.indices]


def image_source(data: str | Path | TimmDataset) -> ImageSource:
    """'mnist' (the embedded digits) or a dataset timm reads (a folder tree, a tar file or a `TimmDataset`)."""
    return DigitsSource() if isinstance(data, (str, Path)) and str(data) == "mnist" else TimmSource(data)


def loader(dataset: Dataset[Any], *, batch_size: int = DEFAULT_BATCH_SIZE, workers: int = DEFAULT_WORKERS,
           shuffle: bool = False, seed: int = 0, shard: tuple[int, int] | None = None) -> DataLoader[Any]:
    """A DataLoader over ``dataset``: ``workers`` processes read and transform images (0: in this process), started
    for each pass (a search reads several loaders in turn; none keeps idle workers); with ``shuffle``, a seeded
    order each epoch. Workers beyond the usable CPU cores are not started.

    With ``shard`` (this process's rank, the processes) a shuffled loader reads its share of a
    ``DistributedSampler``'s seeded order: process ``r`` takes its images ``r, r + processes, ...``, so that batches
    of ``batch_size`` on every process together hold the same images, in the same order of batches, whatever
    the number of processes (the sampler's epoch is set by Fabric's loader)."""
    workers = min(workers, usable_cpus())  # more than the usable cores only slows reading down
    if shuffle and shard is not None:
        sampler: DistributedSampler[Any] = DistributedSampler(dataset, num_replicas=shard[1], rank=shard[0],
                                                              shuffle=True, seed=seed)
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers)
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, num_workers=workers, generator=generator)


def batches(data: Iterable[Any]) -> Iterator[Any]:
    """The batches of a DataLoader; an image error raised in a worker process keeps its own one-line message
    (the DataLoader re-raises it with the worker's traceback in the message)."""
    try:
        yield from data
    except DataError as exc:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        if len(lines) > 1 and "DataLoader worker" in lines[0]:
            last = lines[-1]
            raise DataError(last.split("Error: ", 1)[1] if "Error: " in last else last) from None
        raise


def first_images(data: Iterable[Any], count: int) -> tuple[Tensor, Tensor]:
    """The first ``count`` images and labels of a DataLoader's batches (all of them when it has fewer)."""
    xs: list[Tensor] = []
    ys: list[Tensor] = []
    held = 0
    for x, y in batches(data):
        xs.append(x[:count - held])
        ys.append(torch.as_tensor(y)[:count - held])
        held += len(xs[-1])
        if held >= count:
            break
    if not xs:
        raise DataError("no images to read")
    return torch.cat(xs), torch.cat(ys)


def probe_images(model: nn.Module, data: str, count: int, config: DataConfig,
                 workers: int = DEFAULT_WORKERS) -> tuple[Tensor, Tensor]:
    """``count`` labelled images for ``model`` under the evaluation transform of ``config``: 'mnist' = the last
    embedded digits (held out from the demo's training), else a fixed random subset of a timm dataset."""
    if count < 1:
        raise DataOptionError("{images} must be at least 1, got {count}", count=count)
    source = image_source(data)
    if data == "mnist":
        indices = torch.arange(len(source) - 1, -1, -1)[:count]
    else:
        indices = torch.randperm(len(source), generator=torch.Generator().manual_seed(0))[:count]
    images = Images(source, indices, config, training=False)
    threads = 0 if data == "mnist" else min(workers, 1 + len(indices) // DEFAULT_BATCH_SIZE)  # digits: in memory
    return first_images(loader(images, workers=threads), count)


def validate_py_command(data: str | Path | TimmDataset, arch: str, checkpoint: str | Path,
                        model_kwargs: Mapping[str, Any], config: DataConfig, device: str = "cuda") -> list[str]:
    """timm ``validate.py``'s command line that evaluates a written checkpoint on ``data`` with ``config``'s
    preprocessing: the class count, input size and pooling as validate.py's own flags (it passes them to
    ``create_model`` itself), every other keyword argument of the architecture through ``--model-kwargs``."""
    own = {"num_classes", "in_chans", "global_pool", "pretrained_cfg_overlay"}
    kwargs = [f"{key}={value!r}" for key, value in model_kwargs.items() if key not in own and value is not None]
    where = ([str(data.root), "--dataset", data.name, "--split", data.split] if isinstance(data, TimmDataset)
             else [str(data)])
    return ["python", "validate.py", *where, "--model", arch, "--checkpoint", str(checkpoint),
            "--num-classes", str(model_kwargs.get("num_classes", 1000)), "--gp", str(model_kwargs.get("global_pool",
                                                                                                 "token")),
            "--input-size", *(str(v) for v in config.input_size), "--mean", *(f"{v:g}" for v in config.mean),
            "--std", *(f"{v:g}" for v in config.std), "--interpolation", config.interpolation,
            "--crop-pct", f"{config.crop_pct:g}", "--crop-mode", config.crop_mode, "--device", device,
            "--model-kwargs", *kwargs]
