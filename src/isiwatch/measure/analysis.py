"""``analyze``: one probe pass over a ViT → per-layer curves of every metric, probes and phases."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.profiler import record_function

from .._utils.files import finite_or_none
from ..taps import BlockTensors, Tap, ViTParts, unwrap_model, vit_parts
from .metric_table import METRIC_TABLE
from .metrics import BLOCK_METRICS, CLS_METRICS, BlockSums, block_curves, isi, reduce_block, token_similarity
from .phases import Phases, detect_phases
from .probe_batch import ProbeBatch, ProbeTargets
from .probes import coded_probe_correct
from .readback import read_back
from .recon import DEFAULT_RECON_COMPONENTS, isi_recon

#: Every per-layer metric name, in report order (the rows of `METRIC_TABLE`).
METRICS = tuple(m.name for m in METRIC_TABLE)
#: The curve phases, alerts and truncation use unless told otherwise (the paper's phase curve).
DEFAULT_PHASE_METRIC = "token_similarity"
#: Phase-detection defaults for metric curves: changes below 0.01 (all metrics are O(1)) are noise.
DEFAULT_PHASE_OPTIONS = {"min_layers": 3, "min_range": 0.01}
STEM_POINTS = ("pre_pe", "embed")


def untracked_reason(metric: str, has_cls: bool, probes: bool, with_isi_recon: bool) -> str | None:
    """Why [`analyze`][isiwatch.analyze] reports no ``metric`` curve for a model with or without [CLS], with or without
    probe labels and ``with_isi_recon``; None when it reports one."""
    if metric not in METRICS:
        return f"there is no metric {metric!r} (metrics: {', '.join(METRICS)})"
    if metric.startswith("probe_") and not probes:
        return f"{metric} needs probe labels"
    if metric in CLS_METRICS and not has_cls:
        return f"{metric} needs a [CLS] token, which this model lacks"
    if metric == "isi_recon" and not with_isi_recon:
        return "isi_recon needs with_isi_recon=True"
    return None


def tracked_metrics(has_cls: bool, probes: bool = False, with_isi_recon: bool = False) -> list[str]:
    """The metrics [`analyze`][isiwatch.analyze] reports (the keys of ``Analysis.layers``), in
    [`METRICS`][isiwatch.METRICS] order."""
    return [m for m in METRICS if untracked_reason(m, has_cls, probes, with_isi_recon) is None]


@dataclass
class Analysis:
    """Per-layer curves of one model on one probe set.

    ``layers[metric]`` holds one value per block (index 0..L-1); ``stem[point][metric]`` the values before
    block 0 (``pre_pe``: patch embeddings E; ``embed``: X[0]); ``phases`` the Cliff/Plateau/Climb of
    ``phase_metric`` (None when that curve has no plateau); ``model_info`` what is known of the model and
    the data (depth, family, prefix tokens, images, and what the caller adds: arch, weights, checkpoint),
    stored under the ``"model"`` key of ``analysis.json``; ``held_out[probe][block]`` which held-out probe images
    (in the probe split's order) the probe ``probe_cls`` or ``probe_patch_mean`` at that block classifies correctly,
    None where it reads NaN (empty without probes; not in ``analysis.json``): what a paired test of two probes needs.
    """

    layers: dict[str, list[float]]
    stem: dict[str, dict[str, float]]
    model_info: dict[str, Any]
    phase_metric: str = DEFAULT_PHASE_METRIC
    phases: Phases | None = None
    options: dict[str, Any] = field(default_factory=dict)
    held_out: dict[str, list[tuple[bool, ...] | None]] = field(default_factory=dict)

    @property
    def depth(self) -> int:
        return int(self.model_info["depth"])

    def curve(self, metric: str) -> list[float]:
        if metric not in self.layers:
            raise KeyError(f"unknown metric {metric!r}; this analysis has {sorted(self.layers)}")
        return self.layers[metric]

    def detect_phases(self, metric: str | None = None, **options: Any) -> Phases | None:
        """Phases of any tracked curve; None when it has no plateau or holds non-finite values."""
        curve = self.curve(metric or self.phase_metric)
        if len(curve) < 4 or not all(math.isfinite(v) for v in curve):
            return None
        return detect_phases(curve, **{**DEFAULT_PHASE_OPTIONS, **options})

    def first_blocks(self, n: int) -> Analysis:
        """The curves of the first ``n`` blocks only, phases re-detected on them (CaiT: the self-attention
        blocks, the only ones truncation may drop)."""
        if n >= self.depth:
            return self
        cut = Analysis({m: v[:n] for m, v in self.layers.items()}, self.stem, {**self.model_info, "depth": n},
                       self.phase_metric, None, self.options, {m: v[:n] for m, v in self.held_out.items()})
        cut.phases = cut.detect_phases()
        return cut

    def to_dict(self) -> dict[str, Any]:
        """The ``analysis.json`` schema; non-finite numbers become null."""
        rows = [{"index": i, **{m: finite_or_none(v[i]) for m, v in self.layers.items()}} for i in range(self.depth)]
        phases: dict[str, Any] = {"metric": self.phase_metric, "plateau": None, "cliff": None, "climb": None,
                                  "length": 0}
        if self.phases is not None:
            phases.update(self.phases.to_dict())
        stem = {p: {m: finite_or_none(v) for m, v in vals.items()} for p, vals in self.stem.items()}
        return {"model": self.model_info, "layers": rows, "stem": stem, "phases": phases, "options": self.options}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Analysis:
        rows = sorted(data["layers"], key=lambda r: r["index"])
        metrics = [k for k in rows[0] if k != "index"] if rows else []
        layers = {m: [math.nan if r.get(m) is None else float(r[m]) for r in rows] for m in metrics}
        stem = {p: {m: math.nan if v is None else float(v) for m, v in vals.items()}
                for p, vals in data.get("stem", {}).items()}
        ph = data.get("phases") or {}
        phases = None
        if ph.get("plateau"):
            phases = Phases(tuple(ph["plateau"]), tuple(ph["cliff"]) if ph.get("cliff") else None,
                            tuple(ph["climb"]) if ph.get("climb") else None)
        return cls(layers, stem, dict(data.get("model", {})), ph.get("metric", DEFAULT_PHASE_METRIC),
                   phases, dict(data.get("options", {})))


class _Collector:
    """Receives the tap's per-block tensors for each chunk, reduces them on the device while they are alive, and
    turns everything into device tensors of results at the end (`results`): no host read on the way."""

    def __init__(self, parts: ViTParts, batch: ProbeBatch, device: torch.device, recon_k: int | None,
                 probe_features: bool):
        self.parts = parts
        self.batch = batch
        self.device = device
        self.recon_k = recon_k
        self.probe_features = probe_features  # keep pooled features for the probes (only with labels)
        depth = parts.depth
        self.blocks: list[list[BlockSums]] = [[] for _ in range(depth)]
        self.stem_similarity: dict[str, list[Tensor]] = {p: [] for p in STEM_POINTS}
        self.recon: list[list[Tensor]] = [[] for _ in range(depth)]
        self.stem_recon: dict[str, list[Tensor]] = {p: [] for p in STEM_POINTS}
        self.patch_feats: list[list[Tensor]] = [[] for _ in range(depth + 2)]  # pre_pe, embed, blocks
        self.cls_feats: list[list[Tensor]] = [[] for _ in range(depth + 1)]  # embed, blocks (none: no [CLS] yet)
        self.offset = 0
        self.chunk = 0
        self.embeddings: Tensor | None = None

    def start_chunk(self, offset: int, size: int) -> None:
        self.offset, self.chunk = offset, size

    def _store(self, row: int, patch_mean: Tensor, tokens: Tensor, has_cls: bool) -> None:
        if not self.probe_features:
            return
        self.patch_feats[row].append(patch_mean)
        if self.parts.has_cls and row >= 1 and has_cls:
            self.cls_feats[row - 1].append(tokens[:, 0].clone())  # a copy: a view would keep the block's tokens

    def _recon(self, tokens: Tensor) -> Tensor:
        # callers check: recon_k is set and the stem delivered embeddings
        assert self.recon_k is not None and self.embeddings is not None
        train, test = self.batch.chunk_split(self.offset, self.chunk, tokens.device)
        return isi_recon(tokens, self.embeddings, train, test, self.recon_k) * self.chunk

    def on_stem(self, e: Tensor | None, x0: Tensor) -> None:
        self.embeddings = e
        first = self.parts.blocks[0]
        x0_point = ("embed", x0, first.num_prefix_tokens, first.has_cls)
        points = [x0_point] if e is None else [("pre_pe", e, 0, False), x0_point]
        for name, tokens, prefix, has_cls in points:
            self._store(STEM_POINTS.index(name), tokens[:, prefix:].mean(1), tokens, has_cls)
            self.stem_similarity[name].append(token_similarity(tokens, prefix).sum())
            if self.recon_k and e is not None:
                self.stem_recon[name].append(self._recon(tokens[:, prefix:]))

    def on_block(self, bt: BlockTensors) -> None:
        with record_function("isiwatch.metrics"):
            sums, patch_mean = reduce_block(bt)
            self.blocks[bt.index].append(sums)
            self._store(bt.index + 2, patch_mean, bt.z, bt.has_cls)
            if self.recon_k and self.embeddings is not None:
                self.recon[bt.index].append(self._recon(bt.z[:, bt.p:]))

    def results(self, n: int, targets: ProbeTargets | None) -> dict[str, Tensor]:
        """Every number of the analysis as device tensors: ``layer/<metric>`` (L,), ``stem/<point>/<metric>`` (1,)
        and, with ``targets``, the probe accuracies ``probes`` (K,) and which held-out images each probe classifies
        correctly, ``probe_correct`` (K,m)."""
        with record_function("isiwatch.metrics"):
            curves = block_curves([BlockSums.joined(chunks) for chunks in self.blocks])
            out = {f"layer/{m}": curves[m] for m in BLOCK_METRICS if m in curves
                   and (self.parts.has_cls or m not in CLS_METRICS)}
            for point, sums in self.stem_similarity.items():
                if sums:
                    out[f"stem/{point}/token_similarity"] = torch.stack(sums).sum(0, keepdim=True) / n
            if self.recon_k:
                out["layer/isi_recon"] = torch.stack([torch.stack(r).sum() for r in self.recon]) / n
                for point, sums in self.stem_recon.items():
                    if sums:
                        out[f"stem/{point}/isi_recon"] = torch.stack(sums).sum(0, keepdim=True) / n
        if targets is not None:
            with record_function("isiwatch.probes"):
                correct = coded_probe_correct(self._features(), targets.codes, targets.onehot, targets.train,
                                              targets.test)
                out["probes"], out["probe_correct"] = correct.mean(-1), correct
        return out

    def _features(self) -> Tensor:
        """(K,n,D): mean patch tokens at every point (pre_pe, embed, blocks), then [CLS] tokens (embed, blocks);
        rows without a feature (no patch embedding; no [CLS] yet in CaiT) hold NaN, so their probes read NaN."""
        template = next(_joined(c) for c in self.patch_feats if c)
        rows = [_joined(c) if c else torch.full_like(template, torch.nan) for c in self.patch_feats]
        if self.parts.has_cls:
            rows += [_joined(c) if c else torch.full_like(template, torch.nan) for c in self.cls_feats]
        return torch.stack(rows)


def _joined(chunks: list[Tensor]) -> Tensor:
    """The chunks' tensors one after another (no copy for one chunk)."""
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks)


@torch.no_grad()
def analyze(
    model: nn.Module,
    images: Tensor,
    labels: Tensor | None = None,
    *,
    batch_size: int = 256,
    with_isi_recon: bool = False,
    recon_components: int = DEFAULT_RECON_COMPONENTS,
    probe_train_fraction: float = 0.7,
    seed: int = 0,
    phase_metric: str = DEFAULT_PHASE_METRIC,
    phase_options: Mapping[str, Any] | None = None,
    parts: ViTParts | None = None,
) -> Analysis:
    """Run every per-layer metric ([`METRICS`][isiwatch.METRICS]) on ``images`` (B,C,H,W) and segment ``phase_metric``
    into phases.

    The model's modes, flags, parameters and the global RNG are left unchanged.

    Args:
        model: A ViT of a supported family (``DistributedDataParallel``/``torch.compile`` wrappers are unwrapped).
        images: The probe images, (B,C,H,W), preprocessed as the model expects.
        labels: Class indices (B,); they enable the linear probes.
        batch_size: Images per forward pass (the centring mean of ``token_similarity`` and the ``isi_recon``
            split are per chunk).
        with_isi_recon: Also compute the opt-in ``isi_recon`` metric.
        recon_components: Principal components of the patch embeddings ``isi_recon`` recovers.
        probe_train_fraction: Fraction of the images the probes train on (one seeded split over all images, a
            function of the images and the seed, not of their order); the rest is held out for their accuracy.
        seed: Seed of the probe split and of ``isi_recon``.
        phase_metric: The curve segmented into Cliff, Plateau and Climb.
        phase_options: Keyword options of [`detect_phases`][isiwatch.detect_phases].
        parts: The model's adapter ([`isiwatch.vit_parts`][isiwatch.vit_parts]), when the caller already has it.

    Returns:
        The per-layer curves, the pre-block (stem) values, the phases and the options used.
    """
    if images.dim() != 4 or len(images) == 0:
        raise ValueError(f"images must be a non-empty (B,C,H,W) tensor, got shape {tuple(images.shape)}")
    if labels is not None and len(labels) != len(images):
        raise ValueError(f"{len(labels)} labels for {len(images)} images")
    batch = ProbeBatch(images, labels, probe_train_fraction, seed)
    options = {"batch_size": batch_size, "isi_recon": with_isi_recon, "recon_components": recon_components,
               "probe_train_fraction": probe_train_fraction, "seed": seed}
    analysis, _ = analyze_batch(model, batch, options, phase_metric=phase_metric, phase_options=phase_options,
                                parts=parts)
    return analysis


@torch.no_grad()
def analyze_batch(model: nn.Module, batch: ProbeBatch, options: Mapping[str, Any], *, probes: bool = True,
                  phase_metric: str = DEFAULT_PHASE_METRIC, phase_options: Mapping[str, Any] | None = None,
                  parts: ViTParts | None = None, extra: Mapping[str, Tensor] | None = None,
                  forward_dtype: torch.dtype | None = None) -> tuple[Analysis, dict[str, list[float]]]:
    """[`analyze`][isiwatch.analyze] on a `ProbeBatch` whose split, label codes and device copies are kept between
    calls (the Watch's path); ``options`` are analyze's (``batch_size``, ``isi_recon``, ``recon_components``,
    ``probe_train_fraction``, ``seed``), ``probes`` False skips the linear probes. Every number, and the tensors of
    ``extra`` (the Watch's loss), is read on the host once (`read_back`); returns the analysis and ``extra`` read.
    ``forward_dtype`` runs the model's forward under ``torch.autocast`` in that dtype (the Watch's ``probe_dtype``);
    the statistics stay in float32."""
    model = unwrap_model(model)
    parts = parts or vit_parts(model)
    with_isi_recon = bool(options["isi_recon"])
    if parts.patch_embed is None and with_isi_recon:
        raise ValueError("isi_recon needs the patch embeddings, but this model exposes no patch embedding")
    param = next(model.parameters())
    n, batch_size = len(batch), int(options["batch_size"])
    labelled = probes and batch.labels is not None
    collector = _Collector(parts, batch, param.device, int(options["recon_components"]) if with_isi_recon else None,
                           labelled)
    tap = Tap(parts)
    images = batch.images_on(param.device, param.dtype)
    for offset in range(0, n, batch_size):
        chunk = images[offset:offset + batch_size]
        collector.start_chunk(offset, len(chunk))
        with record_function("isiwatch.forward"):
            tap.capture(model, chunk, collector.on_stem, collector.on_block, forward_dtype)
    values = collector.results(n, batch.targets_on(param.device) if labelled else None)
    read = read_back({**values, **{f"extra/{k}": v for k, v in (extra or {}).items()}})

    means = {key.removeprefix("layer/"): v for key, v in read.items() if key.startswith("layer/")}
    means["isi"] = [isi(d, h) for d, h in zip(means["attn_token_change"], means["attn_entropy"])]
    layers = {m: means[m] for m in (*BLOCK_METRICS, "isi_recon") if m in means}
    stem: dict[str, dict[str, float]] = {}
    for key, v in read.items():
        if key.startswith("stem/"):
            _, point, metric = key.split("/")
            stem.setdefault(point, {})[metric] = v[0]
    held_out: dict[str, list[tuple[bool, ...] | None]] = {}
    if labelled:
        _add_probes(read["probes"], parts, layers, stem)
        held_out = _held_out(read["probe_correct"], len(read["probes"]), parts)
    info = {"family": parts.family, "depth": parts.depth, "num_prefix_tokens": parts.num_prefix_tokens,
            "has_cls": parts.has_cls, "images": n}
    result = Analysis(layers, stem, info, phase_metric, None, dict(options), held_out)
    result.phases = result.detect_phases(**dict(phase_options or {}))
    return result, {k.removeprefix("extra/"): v for k, v in read.items() if k.startswith("extra/")}


def _add_probes(acc: list[float], parts: ViTParts, layers: dict[str, list[float]],
                stem: dict[str, dict[str, float]]) -> None:
    depth = parts.depth
    patch, cls = acc[:depth + 2], acc[depth + 2:]
    layers["probe_patch_mean"] = patch[2:]
    for i, point in enumerate(STEM_POINTS):
        if point in stem or point == "embed":
            stem.setdefault(point, {})["probe_patch_mean"] = patch[i]
    if cls:
        layers["probe_cls"] = cls[1:]
        stem.setdefault("embed", {})["probe_cls"] = cls[0]


def _held_out(correct: list[float], probes: int, parts: ViTParts) -> dict[str, list[tuple[bool, ...] | None]]:
    """The blocks' rows of ``correct`` (``probes`` rows of held-out images, laid out as `_Collector._features`)
    as `Analysis.held_out`."""
    m = len(correct) // probes
    rows: list[tuple[bool, ...] | None] = [
        None if any(math.isnan(v) for v in row) else tuple(v == 1.0 for v in row)
        for row in (correct[i * m:(i + 1) * m] for i in range(probes))]
    depth = parts.depth
    held_out = {"probe_patch_mean": rows[2:depth + 2]}
    if parts.has_cls:
        held_out["probe_cls"] = rows[depth + 3:]
    return held_out
