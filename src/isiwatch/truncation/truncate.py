"""``truncate``: cut a trained timm ViT down to fewer blocks and heal it by fine-tuning its late blocks.

The strategies that choose which blocks to keep are registered in `isiwatch.truncation.strategies`
(``plateau``, ``tail``, ``bi``, ``angular``, ``random``; ``auto`` searches over them); the surgery is
[`cut`][isiwatch.cut] and the healing [`heal`][isiwatch.heal], which freezes the
embeddings and the early kept blocks (in eval mode) and trains the late ``train_last`` kept blocks, the final norm
and the head with AdamW and a cosine schedule, optionally distilling the uncut model's logits. A written checkpoint
loads with ``timm.create_model(arch, **model_kwargs)`` and ``load_state_dict(strict=True)`` and records which source
blocks it kept.

[`truncate`][isiwatch.truncate] is a thin front over its stages, each in its own module and each taking the
previous one's result: `TruncateRequest` (``request``, the options of ``options``) → `plan` (``plan``, its
refusals in ``preflight``) → `execute` (``execution``; ``auto``: `auto_cut` in ``auto_search``, scored by
`CandidateScorer` in ``scoring``) → `report` (``record``) → `write` (``writing``). The names below stay importable
from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ..io.timm_data import DEFAULT_BATCH_SIZE, DEFAULT_WORKERS
from .auto_search import auto_cut
from .data_split import Data, Split, load_split
from .execution import Execution, execute
from .healing import heal
from .plan import TruncationPlan, plan
from .record import certified, report, to_certify
from .request import TruncateRequest
from .strategies import (
    DEFAULT_BRIDGE,
    DEFAULT_BUDGET,
    DEFAULT_CONFIDENCE,
    DEFAULT_MAX_DROP,
    HEAL_EPOCHS,
    STRATEGIES,
    choose_blocks,
)
from .surgery import cut_vit
from .truncate_report import candidates_table, report_table
from .writing import write

__all__ = ["STRATEGIES", "Data", "Execution", "Split", "TruncateRequest", "TruncateResult", "TruncationPlan",
           "auto_cut", "candidates_table", "choose_blocks", "cut_vit", "execute", "heal", "load_split", "plan",
           "report", "report_table", "to_certify", "truncate", "write"]


@dataclass
class TruncateResult:
    """The truncated model, the report dict (also written with ``report=``), the written paths and whether
    this process is the one that writes (process 0 of a distributed run). ``cut`` is False when ``auto``
    certified no cut: ``model`` is then the uncut model, no model file was written (the report was, when asked
    for), and ``report["search"]`` says why (``message``) and what would certify the nearest candidate
    (``to_certify``)."""

    model: nn.Module
    report: dict[str, Any]
    paths: list[Path]
    writer: bool = True
    cut: bool = True


def truncate(
    checkpoint_or_model: str | Path | nn.Module,
    out: str | Path | None = None,
    *,
    data: Data = "mnist",
    eval_data: Data | None = None,
    strategy: str | None = None,
    keep: int | None = None,
    max_drop: float = DEFAULT_MAX_DROP,
    confidence: float = DEFAULT_CONFIDENCE,
    budget: int = DEFAULT_BUDGET,
    train_last: int | None = None,
    epochs: int = HEAL_EPOCHS,
    heal_steps: int | None = None,
    bridge: str = DEFAULT_BRIDGE,
    journal: str | Path | None = None,
    resume: bool = False,
    lr: float | None = None,
    distill: bool = False,
    analysis: str | Path | None = None,
    metric: str | None = None,
    images: int = 1000,
    fmt: str = "pt",
    report: str | Path | None = None,
    arch: str | None = None,
    num_heads: int | None = None,
    prefer_ema: bool = True,
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    workers: int = DEFAULT_WORKERS,
    devices: int = 1,
    num_nodes: int = 1,
    dist_strategy: str = "auto",
    precision: str | None = None,
    echo: Callable[[str], None] | None = None,
    class_map: str | Path | dict[str, int] | None = None,
) -> TruncateResult:
    """Cut a trained ViT down to fewer blocks and heal it by fine-tuning its late blocks.

    By default (``auto``, `isiwatch.truncation.search`) it searches for the cheapest cut, as it is or healed,
    whose accuracy drop is certified within ``max_drop`` points of the uncut model's on the validation images (the
    upper ``confidence`` bound of the paired drop, `isiwatch.truncation.confidence`), heals a healed winner fully
    and scores the winner once on the test images; when none qualifies, nothing is written and the result's
    ``cut`` is False (its model the uncut one, its report saying what would certify the nearest candidate). The steps
    are `TruncateRequest` (checks the options before anything is read), `plan`, `execute`, `report` and `write`;
    [`cut`][isiwatch.cut] and [`heal`][isiwatch.heal] do the surgery and the healing on their own. The input is
    never written; outputs are written atomically, only after everything succeeded.

    Args:
        checkpoint_or_model: A timm ViT classifier (an ``nn.Module``, moved to ``device`` and put in eval mode but
            otherwise untouched), a checkpoint file (timm ``train.py``, isiwatch, Lightning, safetensors) or a
            Hugging Face ``save_pretrained`` directory.
        out: Where to write the healed model (a new directory for a Hugging Face source); None writes nothing.
            Only for a checkpoint or directory: a model object has no architecture record to rebuild from.
        data: Healing and held-out images: ``"mnist"`` (the embedded digits), a folder tree or tar file that
            ``timm.data.create_dataset`` reads (20 % held out, unless it has ``train/`` and ``validation/``
            sub-folders), a split of a dataset timm's readers read (`TimmDataset`,
            e.g. ``TimmDataset("torch/cifar10", root, "train")``; held out as a folder is), model-ready
            ``(images, labels)`` tensors (the last 20 % held out) or a DataLoader of such batches (its dataset
            split the same way, read in its batch size and workers). Images are streamed,
            never all held in memory; those read from a name or a folder are preprocessed as timm's ``train.py``
            (healing) and ``validate.py`` (evaluation) would for this checkpoint.
        eval_data: Images to validate and test on (halved), in any form ``data`` takes; all of ``data`` then heals.
        strategy: Which blocks to keep: ``"auto"`` (the default without ``keep``) or a name in
            `STRATEGIES` (``"bi"`` by default with ``keep``).
        keep: Blocks to keep, for a fixed strategy; None: the plateau cut's depth for ``plateau``, the recommended
            depth ([`recommend_depth`][isiwatch.recommend_depth]) for the others.
        max_drop: ``auto``: accuracy points a cut may lose.
        confidence: ``auto``: confidence that no certified cut loses more than ``max_drop`` (exact bounds of the
            paired drop, fixed-sequence testing; `isiwatch.truncation.confidence`); 0: the observed validation
            drop (a point estimate). Refused before any healing when the validation images cannot certify even
            a cut that changes no prediction.
        budget: ``auto``: candidates healed at most (each in full); cuts tested as they are or bridged cost no
            healing.
        train_last: Kept blocks to fine-tune, counted from the end (``auto``'s cuts that keep fewer train all of
            theirs); None: the late half.
        epochs: Healing epochs (0: cut only), when ``heal_steps`` is None.
        heal_steps: Optimizer steps of a full heal (batches of 128 images); None: ``epochs`` passes.
        bridge: ``auto``: the linear bridge that repairs a cut without training (`isiwatch.truncation.bridge`):
            ``"lstsq"`` (least squares, closed form), ``"cosine"`` (ReplaceMe's cosine-distance refinement) or
            ``"none"``; fitted on the first ``images`` healing images and merged into the kept block before each
            dropped run, so the cut stays a plain shallower model. Each candidate's repair is chosen on those
            images, the least first: as it is, bridged, then healed (`CutRepair`); the guarantee is unchanged.
        journal: ``auto``: a JSON-lines file the search appends each finished candidate to.
        resume: ``auto``: take the candidates an interrupted run of the same search left in ``journal``
            instead of healing them again.
        lr: Peak healing learning rate; None: 1e-3 (`HEAL_LR`), or the rate the checkpoint records it was trained
            at when that is lower (a fine-tune's: isiwatch's ``lr`` metadata or timm ``train.py``'s ``args.lr``).
        distill: Also distil the uncut model's logits while healing.
        analysis: An ``analysis.json`` of this model (default: analyse it on ``images`` healing images).
        metric: The curve whose plateau ``plateau`` cuts (default: the analysis's, else token_similarity).
        images: Healing images the analysis, the block scores and the bridge are measured on.
        fmt: Checkpoint format of ``out``: ``"pt"`` or ``"safetensors"``.
        report: Also write the report here, in the format its extension names: ``.json`` (JSON) or ``.html``
            (a self-contained page, the Truncation section of ``isiwatch report``'s page); another is refused.
        arch: timm architecture of a checkpoint that records none (default: inferred).
        num_heads: Attention heads of a checkpoint that records neither them nor an architecture.
        prefer_ema: Read a checkpoint's ``state_dict_ema`` when it has one.
        mean: Per-channel mean for images read from a name or a folder (with ``std``; default: as the checkpoint
            records, `resolve_data_config`).
        std: Per-channel standard deviation, with ``mean``.
        device: Where to measure and heal (``"cpu"``, ``"cuda"``): Lightning Fabric's accelerator.
        seed: Healing order and ``random`` strategy seed.
        progress: Show progress bars.
        batch_size: Images per batch for images read from a name or a folder, over all processes: each of
            ``devices`` × ``num_nodes`` processes reads its share, so several devices heal with the batch one does
            (the report's ``batch`` records it).
        workers: DataLoader worker processes reading images (0: in this process).
        devices: Devices (processes) per node that heal and evaluate, each on its shard of the images; with
            more than one and no torchrun or SLURM around it, Fabric starts the others by re-running this script.
        num_nodes: Nodes, under torchrun or SLURM.
        dist_strategy: Fabric's strategy: ``"auto"``, ``"ddp"`` or ``"fsdp"``.
        precision: ``"32"``, ``"16-mixed"`` or ``"bf16-mixed"`` (None: bf16-mixed on CUDA, else 32).
        echo: Called (by process 0) with the line that says, before any healing, what ``auto`` can certify on
            the validation images.
        class_map: How class folders map to the model's outputs: a dict or a JSON file of folder name → output
            index (or a JSON list of names in output order); None: the checkpoint's recorded ``class_map``, else
            numeric folder names as indices, else timm's sorted-name numbering. ``auto`` refuses, before any
            healing, an uncut model not above chance on the validation split (one-sided exact test at
            ``confidence``): its labels do not match.

    Returns:
        The truncated model, the report dict (costs, accuracies, every choice made, the ``auto`` search) and the
        written paths.

    Raises:
        ValueError: An impossible option or combination, unreadable inputs or images, a model that cannot be cut;
            raised before any healing, in one line that names the parameters.
    """
    options = dict(locals())  # exactly the parameters: TruncateRequest takes them by the same names
    return _run(TruncateRequest(options.pop("checkpoint_or_model"), **options))


def _run(request: TruncateRequest) -> TruncateResult:
    """`plan`, `execute`, `report` and `write` (out of [`truncate`][isiwatch.truncate], whose ``report``
    parameter hides the function)."""
    planned = plan(request)
    execution = execute(planned)
    result = report(planned, execution)
    return TruncateResult(execution.model, result, write(planned, execution, result), planned.fabric.is_global_zero,
                          certified(result))
