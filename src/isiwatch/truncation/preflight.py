"""The refusals `plan` makes once the source and the images are read, before any cut or healing: a depth or a
``train_last`` the model cannot take, an analysis of another model, validation images that can certify nothing,
labels the uncut model does not match. Each is one line (an `OptionError` naming the parameters)."""

from __future__ import annotations

import json
from pathlib import Path

from torch import Tensor, nn

from .._utils.option_error import OptionError
from .._utils.wording import points
from ..measure.analysis import Analysis
from ..measure.binomial import above_chance
from .confidence import SearchGuarantee
from .data_split import Split
from .healing import predict
from .request import TruncateRequest
from .strategies import DEFAULT_CONFIDENCE

__all__ = ["check_certifiable", "check_depth", "check_labels", "check_train_last", "read_analysis"]


def read_analysis(path: Path, depth: int, sha256: str | None) -> Analysis:
    """The ``analysis.json`` at ``path``, refused when unreadable, of another checkpoint (``sha256``) or of
    another depth than the model's tapped ``depth``."""
    try:
        result = Analysis.from_dict(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"{path}: not a readable analysis.json ({type(exc).__name__}: {exc})") from None
    if sha256 is not None and result.model_info.get("sha256") not in (None, sha256):
        raise ValueError(f"{path}: analysis was computed on a different checkpoint (sha256 differs)")
    blocks = len(next(iter(result.layers.values()), []))
    if blocks != depth:
        raise ValueError(f"{path}: analysis has {blocks} blocks but the checkpoint has {depth}")
    return result


def check_depth(request: TruncateRequest, source: Path, depth: int) -> None:
    """Refuse a model with fewer than 2 blocks and a ``keep`` outside 1 … depth − 1."""
    if depth < 2:
        raise OptionError("{source} has {blocks}: nothing can be cut from it (truncate needs at least 2)",
                          source=source, blocks=f"{depth} block" + ("" if depth == 1 else "s"))
    if request.keep is not None and not 1 <= request.keep < depth:
        raise OptionError("{keep} must be between 1 and {top} for this {depth}-block model, got {value}",
                          top=depth - 1, depth=depth, value=request.keep)


def check_train_last(request: TruncateRequest, keep: int) -> None:
    """Refuse a ``train_last`` above ``keep``, the most blocks a cut keeps (``auto``: depth − 1; its smaller cuts
    train all of theirs)."""
    if request.train_last is not None and request.train_last > keep:
        raise OptionError("{train_last} must be at most {keep}, the blocks the cut keeps, got {value}",
                          keep=keep, value=request.train_last)


def check_certifiable(guarantee: SearchGuarantee, images: int) -> str:
    """The line that says what the ``auto`` search can certify on ``images`` validation images; an
    `OptionError` when it can certify nothing (before any analysis or healing)."""
    needed, within = guarantee.images_needed(), points(guarantee.max_drop)
    if guarantee.confidence == 0:
        return (f"auto: {images} validation images; a cut qualifies when its validation drop is within {within} "
                "(a point estimate, nothing certified)")
    confidence = f"{100 * guarantee.confidence:g} %"
    if needed is None:
        raise OptionError("{max_drop:0}: no number of validation images certifies a cut that loses nothing at "
                          "{confidence} above 0; allow a drop above 0 points or give {confidence:0}")
    if images < needed:
        raise OptionError("{count} validation images cannot certify any cut within {points} at {level} "
                          "confidence: even a cut that changes no prediction needs {needed}; give more validation "
                          "images ({eval_data}), a larger {max_drop} or {confidence:0}", count=images,
                          points=within, level=confidence, needed=needed)
    return (f"auto: {images} validation images; a cut that changes no prediction needs {needed} to be certified "
            f"within {within} at {confidence} confidence")


def check_labels(request: TruncateRequest, uncut: nn.Module, split: Split) -> Tensor:
    """Before ``auto`` certifies anything: decode every validation and test image (a bad one is refused now,
    not after the search) and refuse, in one line, an uncut model that is not above chance on the validation
    split (labels that do not match its outputs). "Above chance" is the one-sided exact test at the run's
    confidence (95 % with ``confidence`` 0) that its accuracy exceeds the share of the commonest validation
    class. Returns the uncut model's test predictions."""
    labels = split.val_y
    correct = int((predict(uncut, split.val_x) == labels).sum())
    test = predict(uncut, split.test_x)
    images, chance = len(labels), float(labels.bincount().max()) / max(1, len(labels))
    confidence = request.confidence or DEFAULT_CONFIDENCE
    if not above_chance(correct, images, chance, 1 - confidence):
        how = split.labels.get("numbering")
        raise OptionError("the uncut model scores {accuracy} on the {images} validation images, not above chance "
                          "({chance}, the commonest class's share) at {level} confidence: its outputs do not match "
                          "these labels" + (f" (classes numbered by {how})" if how else "")
                          + "; give {class_map:FILE} (class folder name to output index) or images of its classes",
                          accuracy=f"{correct / images:.3f}", images=images, chance=f"{chance:.3f}",
                          level=f"{100 * confidence:g} %")
    return test
