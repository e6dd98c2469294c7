"""Does acting on the Watch during training pay? Freezing settled blocks while fine-tuning, and stopping early
from scratch, against the field's rules, in training FLOPs, wall time and held-out accuracy.

*Fine-tuning.* A 12-block digits ViT (width 64, 4 heads, patch 7) is pre-trained here on ``digits``
(``depth_tasks.py``: 4,000 training digits, label = the digit; AdamW + one-cycle at 3e-3, batch 128) and
fine-tuned on ``max_pair`` (two digits side by side, label = the larger; 8,000 training pairs): the position
embeddings are resampled from the 4×4 to the 4×8 patch grid (timm's ``resample_abs_pos_embed``) and the head is
new, drawn from the seed. Every arm fine-tunes with the same recipe (AdamW, lr 1e-3, weight decay 0.05, batch 128,
cosine to 0 without warm-up, the healing recipe), on the same batches in the same order for the same steps:

- ``full``: every parameter trains;
- ``head``: the embeddings and all 12 blocks frozen (the final norm and the head train);
- ``half``: the embeddings and the first 6 blocks frozen (truncate's healing default, the late half trains);
- ``freezeout``: FreezeOut (Brock et al., 2017), linear schedule with t0 = 0.5: block i's learning rate anneals
  (cosine) to 0 at t_i = t0 + (1 - t0) i / 11 of training, then it is frozen (the embeddings with block 0);
- ``gradnorm``: a rule in the spirit of AutoFreeze (Liu et al., 2021): at every check, each trainable block's
  gradient norm summed over the interval; the longest prefix of blocks whose relative change since the last check
  is below the median change of the trainable blocks is frozen;
- ``isiwatch``: ``Watch(freeze_settled=True)`` with its documented defaults (tolerance 0.01, patience 3), probe
  batch 256 training pairs without labels, its cost in the wall time.

The checks of ``gradnorm`` and the Watch's samples come every ``interval`` steps, a twentieth of the run (chosen
before any run, not tuned). Training FLOPs are exact per step (``torch.utils.flop_counter``: forward and backward
with the step's frozen prefix, times the batch's images), plus the Watch's probe passes (its FLOPs counted on one
pass). Held-out accuracy is on the 2,000 held-out pairs (drawn from held-out digits only).

*From scratch.* The 12-block ViT on ``digits`` in Lightning (AdamW + one-cycle at 3e-3, batch 128) for the same
steps: ``full``; Lightning's ``EarlyStopping`` on validation loss (the 500 ``val`` digits, checked every
``interval`` steps, patience 3); isiwatch's ``stop_on_plateau`` (``ISIWatchCallback``, a sample every ``interval``
steps, 256 training digits with labels). Accuracy is on the 500 ``test`` digits, which neither rule sees.

*A constant learning rate* (``--schedule constant``, fine-tuning only). Under the cosine schedule a block's change
between samples shrinks with the step size, so nothing settles before the schedule ends. The second run asks
whether the signal finds settled blocks when the step size does not decay: the same arms, data, steps and Watch
defaults, with every arm's learning rate held at 1e-3 (FreezeOut keeps its own per-block annealing, the head the
constant rate). Its configuration was fixed before it ran; nothing in it was tuned to its outcome.

FLOPs and accuracy are deterministic (given torch's CPU kernels); wall times depend on the machine and its load,
which the JSON records per run. For final wall times run it alone on an idle machine:

    python benchmarks/bench_freeze.py                     # the committed run: results/freeze/freeze.json + .png
    python benchmarks/bench_freeze.py --schedule constant # results/freeze/freeze_constant.json + .png
    python benchmarks/bench_freeze.py --quick --out /tmp/freeze.json    # a small configuration, for a test

Finished runs are appended to ``--work``/items.jsonl (a rerun with the same configuration skips them);
``--fresh`` starts over. ``benchmarks/report.py`` renders RESULTS.md's section from the JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).parent))
from bench_truncate import Items  # noqa: E402
from depth_tasks import Task, load_task  # noqa: E402
from intervals import fmt_ci, mean_ci  # noqa: E402
from machine import machine  # noqa: E402

from isiwatch._utils.files import write_json  # noqa: E402
from isiwatch._utils.threads import add_threads_argument, current_load, set_torch_threads  # noqa: E402
from isiwatch.measure.analysis import analyze  # noqa: E402
from isiwatch.measure.flops import count_flops  # noqa: E402
from isiwatch.truncation.classifier_layout import block_list, modules_after_blocks  # noqa: E402
from isiwatch.truncation.cost import forward_flops  # noqa: E402
from isiwatch.truncation.healing import make_digits_vit, train_classifier  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "freeze"
FINETUNE_ARMS = ("full", "head", "half", "freezeout", "gradnorm", "isiwatch")
SCRATCH_ARMS = ("full", "early_stopping", "stop_on_plateau")
GOAL_SPEEDUP, GOAL_POINTS = 1.4, 0.005  # the goal: >= 1.4x faster at <= 0.5 points held-out accuracy


@dataclass(frozen=True)
class Config:
    """One benchmark configuration (the run's key: a rerun with another one starts over)."""

    seeds: tuple[int, ...] = (0, 1, 2)
    depth: int = 12
    batch: int = 128
    pretrain_epochs: int = 10
    finetune_epochs: int = 4
    scratch_epochs: int = 12
    train_limit: int | None = None  # use only the first N training images of each task (the quick run)
    held_out_limit: int | None = None
    probe_images: int = 256
    checks_per_run: int = 20  # interval = steps / checks_per_run
    pretrain_lr: float = 3e-3
    finetune_lr: float = 1e-3
    weight_decay: float = 0.05
    freezeout_t0: float = 0.5
    schedule: str = "cosine"  # the fine-tuning learning rate: "cosine" to 0, or "constant" (see --schedule)

    def key(self, fields: tuple[str, ...] | None = None) -> str:
        """A hash of the configuration, or of only ``fields``."""
        values = {k: v for k, v in dataclasses.asdict(self).items() if fields is None or k in fields}
        return hashlib.sha1(json.dumps(values, sort_keys=True).encode()).hexdigest()[:10]


#: What pre-training reads: runs that differ only in fine-tuning share one pre-trained model.
PRETRAINING = ("depth", "batch", "pretrain_epochs", "train_limit", "held_out_limit", "pretrain_lr")

QUICK = Config(seeds=(0,), depth=4, batch=32, pretrain_epochs=1, finetune_epochs=2, scratch_epochs=2,
               train_limit=256, held_out_limit=128, probe_images=64, checks_per_run=8)


# -- data and models -------------------------------------------------------------------------------------------
def limited(task: Task, cfg: Config) -> Task:
    """``task`` cut to the configuration's limits (the quick run)."""
    n, m = cfg.train_limit, cfg.held_out_limit
    return dataclasses.replace(task, train_x=task.train_x[:n], train_y=task.train_y[:n], val_x=task.val_x[:m],
                               val_y=task.val_y[:m], test_x=task.test_x[:m], test_y=task.test_y[:m])


def batches(task: Task, cfg: Config, seed: int) -> list[tuple[Tensor, Tensor]]:
    """Every step's batch, in one seeded order per epoch: the same for every arm of a seed."""
    order = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(cfg.finetune_epochs):
        perm = torch.randperm(len(task.train_x), generator=order)
        out += [(task.train_x[i], task.train_y[i]) for i in perm.split(cfg.batch)]
    return out


def pretrained(cfg: Config, work: Path) -> dict[str, Tensor]:
    """The digits ViT pre-trained on ``digits`` (seed 0), cached in ``work``."""
    path = work / f"pretrained_{cfg.key(PRETRAINING)}.pt"
    if path.exists():
        return torch.load(path, weights_only=True)
    task = limited(load_task("digits"), cfg)
    model, _ = make_digits_vit(0, depth=cfg.depth)
    start = time.perf_counter()
    steps = train_classifier(model, task.train_x, task.train_y, epochs=cfg.pretrain_epochs, batch_size=cfg.batch,
                             lr=cfg.pretrain_lr, seed=0)
    x, y = task.held_out
    print(f"pre-trained on digits: {steps} steps in {time.perf_counter() - start:.0f} s, held-out accuracy "
          f"{evaluate(model, x, y)[0]:.3f}", flush=True)
    state = model.state_dict()
    torch.save(state, path)
    return state


def transferred(state: dict[str, Tensor], task: Task, seed: int, cfg: Config) -> nn.Module:
    """The pre-trained blocks on ``task``'s images: position embeddings resampled to its patch grid, a new head."""
    from timm.layers import resample_abs_pos_embed

    model, _ = make_digits_vit(seed, depth=cfg.depth, img_size=tuple(task.train_x.shape[-2:]))  # patch 7 kept
    own = model.state_dict()
    grid = model.patch_embed.grid_size
    old = int(math.isqrt(state["pos_embed"].shape[1] - 1))
    loaded = {k: v for k, v in state.items() if not k.startswith("head.")}
    loaded["pos_embed"] = resample_abs_pos_embed(state["pos_embed"], list(grid), [old, old], num_prefix_tokens=1)
    model.load_state_dict({**own, **loaded})
    return model


def evaluate(model: nn.Module, x: Tensor, y: Tensor) -> tuple[float, float]:
    """Held-out accuracy and mean cross-entropy, in eval mode."""
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(chunk) for chunk in x.split(500)])
    model.train()
    return float((logits.argmax(-1) == y).float().mean()), float(F.cross_entropy(logits, y))


def prefix_parameters(model: nn.Module, blocks: int) -> list[nn.Parameter]:
    """The embeddings and the first ``blocks`` blocks: everything not in the later blocks nor after the blocks."""
    later = {id(p) for b in list(block_list(model))[blocks:] for p in b.parameters()}
    later |= {id(p) for m in modules_after_blocks(model) for p in m.parameters()}
    return [p for p in model.parameters() if id(p) not in later]


def freeze(model: nn.Module, blocks: int) -> None:
    for p in prefix_parameters(model, blocks):
        p.requires_grad_(False)
        p.grad = None


def cosine(progress: float) -> float:
    return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


SCHEDULES: dict[str, Callable[[float], float]] = {"cosine": cosine, "constant": lambda progress: 1.0}
SCHEDULE_TEXT = {"cosine": "cosine to 0", "constant": "constant"}


# -- the fine-tuning arms ----------------------------------------------------------------------------------------
class Arm:
    """What an arm does around the shared loop: its frozen prefix, its parameter groups' learning rates and its
    hooks after backward and after the optimizer step."""

    def __init__(self, model: nn.Module, steps: int, interval: int, cfg: Config):
        self.model, self.steps, self.interval, self.cfg = model, steps, interval, cfg
        self.depth = len(block_list(model))
        self.frozen = 0

    def groups(self) -> list[list[nn.Parameter]]:
        return [list(self.model.parameters())]

    def lr_factor(self, group: int, step: int) -> float:
        return SCHEDULES[self.cfg.schedule](step / self.steps)

    def freeze_to(self, blocks: int) -> None:
        if blocks > self.frozen:
            freeze(self.model, blocks)
            self.frozen = blocks

    def before_step(self, step: int) -> None:
        """Before the forward of step ``step`` (0-based)."""

    def after_backward(self) -> None:
        """After the backward, before the optimizer step."""

    def after_step(self, step: int, loss: Tensor) -> None:
        """After the optimizer step ``step`` (1-based, as the Watch counts)."""

    def close(self) -> dict:
        return {}


class Static(Arm):
    """A prefix frozen from the start: ``head`` (every block) or ``half`` (truncate's healing default)."""

    def __init__(self, model: nn.Module, steps: int, interval: int, cfg: Config, blocks: Callable[[int], int]):
        super().__init__(model, steps, interval, cfg)
        self.freeze_to(blocks(self.depth))


class FreezeOut(Arm):
    """Block i's learning rate anneals (cosine) to 0 at t_i of training, then it is frozen; the head keeps the
    run's schedule."""

    def __init__(self, model: nn.Module, steps: int, interval: int, cfg: Config):
        super().__init__(model, steps, interval, cfg)
        t0, last = cfg.freezeout_t0, max(self.depth - 1, 1)
        self.t = [t0 + (1 - t0) * i / last for i in range(self.depth)] + [1.0]

    def groups(self) -> list[list[nn.Parameter]]:
        blocks = list(block_list(self.model))
        stem = prefix_parameters(self.model, 0)
        groups = [list(b.parameters()) for b in blocks]
        groups[0] = stem + groups[0]
        return groups + [[p for m in modules_after_blocks(self.model) for p in m.parameters()]]

    def lr_factor(self, group: int, step: int) -> float:
        if group == self.depth:
            return super().lr_factor(group, step)
        return cosine(step / (self.t[group] * self.steps))

    def before_step(self, step: int) -> None:
        self.freeze_to(sum(step >= t * self.steps for t in self.t[:-1]))


class GradNorm(Arm):
    """AutoFreeze's idea: freeze the front blocks whose gradient norm changes less than the median block's."""

    def __init__(self, model: nn.Module, steps: int, interval: int, cfg: Config):
        super().__init__(model, steps, interval, cfg)
        self.blocks = list(block_list(model))
        self.norms = [0.0] * self.depth
        self.previous: list[float] | None = None

    def after_backward(self) -> None:
        for i in range(self.frozen, self.depth):
            grads = [p.grad for p in self.blocks[i].parameters() if p.grad is not None]
            self.norms[i] += float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))) if grads else 0

    def after_step(self, step: int, loss: Tensor) -> None:
        if step % self.interval or self.frozen == self.depth:
            return
        if self.previous is not None:
            live = range(self.frozen, self.depth)
            rates = {i: abs(self.norms[i] - self.previous[i]) / self.previous[i] if self.previous[i] else math.inf
                     for i in live}
            threshold = statistics.median(rates.values())
            blocks = self.frozen
            while blocks < self.depth and rates[blocks] < threshold:
                blocks += 1
            self.freeze_to(blocks)
        self.previous, self.norms = self.norms, [0.0] * self.depth


class Isiwatch(Arm):
    """``Watch(freeze_settled=True)``: its defaults, a sample every ``interval`` steps, no probe labels."""

    def __init__(self, model: nn.Module, steps: int, interval: int, cfg: Config, probe: Tensor):
        from isiwatch import Watch

        super().__init__(model, steps, interval, cfg)
        self.watch = Watch(model, probe, every_n_steps=interval, freeze_settled=True)
        self.changes: list[list] = []  # [step, each block's change since the previous sample]

    def after_step(self, step: int, loss: Tensor) -> None:
        freezer = self.watch.freezer
        assert freezer is not None
        self.watch.step(step, loss)
        self.frozen = freezer.frozen
        if self.watch.last_step == step and all(map(math.isfinite, freezer.changes)):
            self.changes.append([step, [float(f"{c:.4g}") for c in freezer.changes]])

    def close(self) -> dict:
        self.watch.close(final_sample=False)
        return {"watch_samples": len(self.watch.history),
                "watch_s": sum(s.overhead_s or 0.0 for s in self.watch.history), "changes": self.changes}


def make_arm(arm: str, model: nn.Module, steps: int, interval: int, cfg: Config, probe: Tensor) -> Arm:
    if arm == "full":
        return Arm(model, steps, interval, cfg)
    if arm in ("head", "half"):
        return Static(model, steps, interval, cfg, (lambda d: d) if arm == "head" else (lambda d: d - math.ceil(d / 2)))
    if arm == "freezeout":
        return FreezeOut(model, steps, interval, cfg)
    if arm == "gradnorm":
        return GradNorm(model, steps, interval, cfg)
    return Isiwatch(model, steps, interval, cfg, probe)


def per_image_step_flops(model: nn.Module, image: Tensor, label: Tensor, blocks: int) -> int:
    """FLOPs of one training step's forward and backward on one image with the first ``blocks`` blocks frozen."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    model.requires_grad_(True)
    freeze(model, blocks)
    try:
        flops = count_flops(lambda: F.cross_entropy(model(image), label).backward())
    finally:
        model.zero_grad(set_to_none=True)
        for p, flag in flags:
            p.requires_grad_(flag)
    return flops


def finetune(arm_name: str, state: dict[str, Tensor], task: Task, seed: int, cfg: Config) -> dict:
    """One arm, one seed: train, then count its FLOPs and evaluate it."""
    model = transferred(state, task, seed, cfg)
    steps_batches = batches(task, cfg, seed)
    steps = len(steps_batches)
    interval = max(1, round(steps / cfg.checks_per_run))
    probe = task.train_x[:cfg.probe_images]
    torch.manual_seed(seed)
    load_start = current_load()
    start = time.perf_counter()
    arm = make_arm(arm_name, model, steps, interval, cfg, probe)
    groups = arm.groups()
    optimizer = torch.optim.AdamW([{"params": g} for g in groups], lr=cfg.finetune_lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, [lambda s, g=g: arm.lr_factor(g, s) for g in range(len(groups))])
    model.train()
    prefixes, freezes = [], []
    for step, (x, y) in enumerate(steps_batches):
        arm.before_step(step)
        prefixes.append((arm.frozen, len(x)))
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        arm.after_backward()
        optimizer.step()
        scheduler.step()
        before = arm.frozen
        arm.after_step(step + 1, loss.detach())
        if arm.frozen != before:
            freezes.append([step + 1, arm.frozen])
    extra = arm.close()
    wall = time.perf_counter() - start
    load_end = current_load()

    image, label = task.train_x[:1], task.train_y[:1]
    per_image = {k: per_image_step_flops(model, image, label, k) for k in sorted({k for k, _ in prefixes})}
    train_flops = sum(per_image[k] * n for k, n in prefixes)
    watch_flops = 0
    if "watch_samples" in extra:
        watch_flops = extra["watch_samples"] * count_flops(lambda: analyze(model, probe))
    accuracy, loss = evaluate(model, *task.held_out)
    return {"arm": arm_name, "seed": seed, "steps": steps, "interval": interval, "accuracy": accuracy,
            "loss": loss, "train_flops": train_flops, "watch_flops": watch_flops,
            "flops": train_flops + watch_flops, "wall_s": wall, "load_start": round(load_start, 2),
            "load_end": round(load_end, 2), "freezes": freezes, "frozen_at_end": arm.frozen, **extra}


# -- from scratch, in Lightning ----------------------------------------------------------------------------------
def scratch(arm: str, task: Task, seed: int, cfg: Config) -> dict:
    """The 12-block ViT on ``digits`` from scratch under Lightning: ``full``, ``early_stopping`` or
    ``stop_on_plateau``."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import EarlyStopping
    from torch.utils.data import DataLoader, TensorDataset

    from isiwatch.integrations.lightning import ISIWatchCallback

    steps = cfg.scratch_epochs * math.ceil(len(task.train_x) / cfg.batch)
    interval = max(1, round(steps / cfg.checks_per_run))

    class Classifier(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_digits_vit(seed, depth=cfg.depth)[0]
            self.images, self.validations, self.val_losses = 0, 0, []

        def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
            self.images += len(batch[0])
            return F.cross_entropy(self.net(batch[0]), batch[1])

        def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
            self.val_losses.append(F.cross_entropy(self.net(batch[0]), batch[1], reduction="sum"))

        def on_validation_epoch_end(self) -> None:
            self.validations += 1
            self.log("val_loss", torch.stack(self.val_losses).sum() / len(task.val_x))
            self.val_losses.clear()

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            opt = torch.optim.AdamW(self.parameters(), lr=cfg.pretrain_lr, weight_decay=cfg.weight_decay)
            sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.pretrain_lr, total_steps=steps)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    torch.manual_seed(seed)
    module = Classifier()
    callbacks: list[pl.Callback] = []
    watch_cb = None
    if arm == "early_stopping":
        callbacks.append(EarlyStopping(monitor="val_loss", mode="min", patience=3))
    elif arm == "stop_on_plateau":
        watch_cb = ISIWatchCallback(task.train_x[:cfg.probe_images], task.train_y[:cfg.probe_images],
                                    every_n_steps=interval, stop_on_plateau=True)
        callbacks.append(watch_cb)
    validating = arm == "early_stopping"
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=callbacks, val_check_interval=interval if validating else None,
                         check_val_every_n_epoch=None if validating else 1)
    train = DataLoader(TensorDataset(task.train_x, task.train_y), batch_size=cfg.batch, shuffle=True,
                       generator=torch.Generator().manual_seed(seed))
    val = DataLoader(TensorDataset(task.val_x, task.val_y), batch_size=500) if validating else None
    load_start = current_load()
    start = time.perf_counter()
    trainer.fit(module, train, val)
    wall = time.perf_counter() - start
    load_end = current_load()

    net = module.net
    per_image = per_image_step_flops(net, task.train_x[:1], task.train_y[:1], 0)
    val_flops = module.validations * forward_flops(net, task.val_x)
    watch = watch_cb.watch if watch_cb is not None else None
    samples = len(watch.history) if watch is not None else 0
    probe = task.train_x[:cfg.probe_images], task.train_y[:cfg.probe_images]
    watch_flops = samples * count_flops(lambda: analyze(net, *probe)) if samples else 0
    accuracy, loss = evaluate(net, task.test_x, task.test_y)
    return {"arm": arm, "seed": seed, "steps": trainer.global_step, "max_steps": steps, "interval": interval,
            "accuracy": accuracy, "loss": loss, "train_flops": per_image * module.images,
            "check_flops": val_flops + watch_flops, "flops": per_image * module.images + val_flops + watch_flops,
            "validations": module.validations, "watch_samples": samples,
            "watch_s": sum(s.overhead_s or 0.0 for s in watch.history) if watch is not None else 0.0,
            "stop_reason": watch.stop_reason if watch is not None else None, "wall_s": wall,
            "load_start": round(load_start, 2), "load_end": round(load_end, 2)}


# -- summary -----------------------------------------------------------------------------------------------------
def interval_of(values: list[float]) -> list[float | None]:
    """[mean, 95 % half-width] (None with one value), as the JSON holds it."""
    return list(mean_ci(values))


def summarize(runs: list[dict], arms: tuple[str, ...]) -> dict:
    """Per arm: accuracy, paired differences to ``full``, FLOPs and wall-time ratios (full / arm), per seed."""
    by = {(r["arm"], r["seed"]): r for r in runs}
    seeds = sorted({r["seed"] for r in runs if (("full", r["seed"]) in by)})
    out = {}
    for arm in arms:
        rows = [(by[arm, s], by["full", s]) for s in seeds if (arm, s) in by]
        if not rows:
            continue
        out[arm] = {"seeds": [r["seed"] for r, _ in rows],
                    "accuracy": interval_of([r["accuracy"] for r, _ in rows]),
                    "accuracy_diff": interval_of([r["accuracy"] - f["accuracy"] for r, f in rows]),
                    "loss": interval_of([r["loss"] for r, _ in rows]),
                    "flops": statistics.fmean(r["flops"] for r, _ in rows),
                    "flops_ratio": interval_of([f["flops"] / r["flops"] for r, f in rows]),
                    "wall_s": statistics.fmean(r["wall_s"] for r, _ in rows),
                    "speedup": interval_of([f["wall_s"] / r["wall_s"] for r, f in rows]),
                    "steps": [r["steps"] for r, _ in rows]}
    return out


def goal(summary: dict) -> dict:
    """The issue's goal for isiwatch's policy: >= 1.4x faster than full fine-tuning (mean paired wall-time ratio) at
    <= 0.5 points of held-out accuracy lost (the low end of the paired 95 % interval), and the comparison with
    FreezeOut and the gradient-norm rule (paired per seed)."""
    ours = summary.get("isiwatch")
    if ours is None:
        return {}
    low = ours["accuracy_diff"][0] - (ours["accuracy_diff"][1] or 0.0)
    return {"speedup": ours["speedup"][0], "flops_ratio": ours["flops_ratio"][0],
            "accuracy_diff": ours["accuracy_diff"], "accuracy_diff_low": low,
            "met": ours["speedup"][0] >= GOAL_SPEEDUP and low >= -GOAL_POINTS}


def versus(runs: list[dict], ours: str, other: str) -> dict | None:
    """Paired per seed: ours − other in accuracy; other / ours in FLOPs and wall time (> 1: ours is cheaper)."""
    by = {(r["arm"], r["seed"]): r for r in runs}
    pairs = [(by[ours, s], by[other, s]) for s in sorted({r["seed"] for r in runs}) if (ours, s) in by
             and (other, s) in by]
    if not pairs:
        return None
    return {"accuracy_diff": interval_of([a["accuracy"] - b["accuracy"] for a, b in pairs]),
            "flops_ratio": interval_of([b["flops"] / a["flops"] for a, b in pairs]),
            "speedup": interval_of([b["wall_s"] / a["wall_s"] for a, b in pairs])}


def points(pair: list, signed: bool = True) -> str:
    return fmt_ci(pair, signed, digits=2)


def ratio(pair: list) -> str:
    return fmt_ci(pair, scale=1.0, digits=2, unit="×")


def tables(data: dict) -> list[str]:
    """The markdown tables of a result (the script prints them; ``report.py`` renders RESULTS.md with them)."""
    ft, sc = data["finetune"], data["scratch"]
    runs = data["finetune_runs"]
    lines = [f"Fine-tuning (pre-trained on `digits`, fine-tuned on `max_pair`, learning rate "
             f"{SCHEDULE_TEXT[data['config']['schedule']]}): held-out accuracy (%, mean ± 95 % interval over seeds), "
             "its paired difference to full fine-tuning (points), training FLOPs (the Watch's probe passes included) "
             "and wall time as full / arm ratios (paired per seed).", "",
             "| arm | accuracy | vs full (points) | FLOPs | FLOPs: full / arm | wall time: full / arm "
             "| frozen blocks at end |",
             "|---|---|---|---|---|---|---|"]
    for arm, s in ft.items():
        frozen = sorted({r["frozen_at_end"] for r in runs if r["arm"] == arm})
        lines.append(f"| {arm} | {points(s['accuracy'], False)} | {points(s['accuracy_diff'])} | "
                     f"{s['flops'] / 1e12:.3g} T | {ratio(s['flops_ratio'])} | {ratio(s['speedup'])} | "
                     f"{', '.join(map(str, frozen))} |")
    g = data.get("goal") or {}
    if g:
        lines += ["", f"Goal (≥ {GOAL_SPEEDUP}× wall time at ≤ {100 * GOAL_POINTS:.1f} points lost, low end of the "
                  f"paired interval): speed-up {g['speedup']:.2f}×, accuracy {points(g['accuracy_diff'])} points "
                  f"(low end {100 * g['accuracy_diff_low']:+.2f}): **{'met' if g['met'] else 'not met'}**."]
    for other, cmp in (data.get("versus") or {}).items():
        if cmp:
            lines.append(f"- isiwatch vs {other}: accuracy {points(cmp['accuracy_diff'])} points, "
                         f"FLOPs {ratio(cmp['flops_ratio'])} ({other} / isiwatch), "
                         f"wall time {ratio(cmp['speedup'])}.")
    freezes = [f"seed {r['seed']}: " + (", ".join(f"{k} at step {s}" for s, k in r["freezes"]) or "none")
               for r in runs if r["arm"] == "isiwatch"]
    if freezes:
        lines.append(f"- isiwatch's freezes (blocks frozen, step; of {runs[0]['steps']} steps): {'; '.join(freezes)}.")
    lines += signal_lines([r for r in runs if r["arm"] == "isiwatch" and r.get("changes")])
    if not sc:
        return lines
    lines += ["", "From scratch on `digits` (Lightning): test accuracy (%), paired difference to full training, "
              "steps taken, FLOPs (validation passes and the Watch's probe passes included) and wall time as "
              "full / arm ratios.", "",
              "| arm | accuracy | vs full (points) | steps | FLOPs: full / arm | wall time: full / arm |",
              "|---|---|---|---|---|---|"]
    for arm, s in sc.items():
        lines.append(f"| {arm} | {points(s['accuracy'], False)} | {points(s['accuracy_diff'])} | "
                     f"{', '.join(map(str, s['steps']))} | {ratio(s['flops_ratio'])} | {ratio(s['speedup'])} |")
    stopped = [f"{arm} in {sum(r['steps'] < r['max_steps'] for r in data['scratch_runs'] if r['arm'] == arm)} of "
               f"{len(s['steps'])} runs" for arm, s in sc.items() if arm != "full"]
    if stopped:
        lines += ["", f"- Stopped before the last step: {'; '.join(stopped)}."]
    return lines


def signal_lines(runs: list[dict]) -> list[str]:
    """What the freeze signal read: the first and last block's change between samples, at the first sample
    compared and at the last, per seed, against the tolerance (0.01)."""
    if not runs:
        return []
    parts = []
    for r in runs:
        (first_step, first), (last_step, last) = r["changes"][0], r["changes"][-1]
        parts.append(f"seed {r['seed']}: block 0 {first[0]:.3g} at step {first_step} → {last[0]:.3g} at step "
                     f"{last_step}, block {len(first) - 1} {first[-1]:.3g} → {last[-1]:.3g}")
    return [f"- The signal (a block's relative change between samples; settled at ≤ 0.01): {'; '.join(parts)}."]


def figure(data: dict, path: Path) -> None:
    """Accuracy difference to full fine-tuning against the FLOPs ratio, per arm (mean ± 95 % interval)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for arm, s in data["finetune"].items():
        x, xh = s["flops_ratio"]
        y, yh = s["accuracy_diff"]
        ax.errorbar(x, 100 * y, xerr=xh or 0, yerr=100 * (yh or 0), fmt="o", capsize=3,
                    color="#d62728" if arm == "isiwatch" else "#1f77b4")
        ax.annotate(arm, (x, 100 * y), textcoords="offset points", fontsize=9,
                    xytext=(-48, -14) if arm == "isiwatch" else (6, 4))  # isiwatch sits beside full
    ax.axhline(-100 * GOAL_POINTS, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("training FLOPs saved: full / arm (×)")
    ax.set_ylabel("held-out accuracy vs full fine-tuning (points)")
    ax.set_title(f"Fine-tuning digits → max_pair, 12-block ViT, learning rate "
                 f"{SCHEDULE_TEXT[data['config']['schedule']]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# -- main --------------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small configuration (4 blocks, 256 images, 1 seed)")
    parser.add_argument("--seeds", type=int, nargs="+", help="fine-tuning and training seeds (default 0 1 2)")
    parser.add_argument("--arms", nargs="+", choices=sorted(set(FINETUNE_ARMS + SCRATCH_ARMS)),
                        help="run only these arms (full always runs: the others are paired with it)")
    parser.add_argument("--skip-scratch", action="store_true", help="only the fine-tuning part")
    parser.add_argument("--schedule", choices=sorted(SCHEDULES), default="cosine",
                        help="the fine-tuning learning rate: cosine to 0 (the committed run) or constant (writes "
                             "freeze_constant.json; fine-tuning only, the from-scratch part does not use it)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/isiwatch-bench-freeze"))
    parser.add_argument("--fresh", action="store_true", help="forget the finished runs in --work")
    parser.add_argument("--summarize-only", action="store_true",
                        help="rebuild the JSON, tables and figure from the finished runs in --work (trains nothing)")
    parser.add_argument("--out", type=Path, help="the JSON to write (default: results/freeze/freeze.json, "
                                                 "freeze_constant.json with --schedule constant)")
    add_threads_argument(parser)
    args = parser.parse_args()
    if args.quick and args.out is None:
        parser.error("--quick writes elsewhere: give --out (the committed JSON holds the full run)")
    args.out = args.out or RESULTS / ("freeze.json" if args.schedule == "cosine" else f"freeze_{args.schedule}.json")
    args.skip_scratch |= args.schedule != "cosine"
    cfg = dataclasses.replace(QUICK if args.quick else Config(), schedule=args.schedule)
    if args.seeds:
        cfg = dataclasses.replace(cfg, seeds=tuple(args.seeds))
    threads = set_torch_threads(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no banner per Trainer
    args.work.mkdir(parents=True, exist_ok=True)
    items_path = args.work / "items.jsonl"
    if args.fresh and items_path.exists():
        items_path.unlink()
    items = Items(items_path)
    record = machine(threads)
    wanted = set(args.arms or FINETUNE_ARMS + SCRATCH_ARMS) | {"full"}

    state = {} if args.summarize_only else pretrained(cfg, args.work)
    target = limited(load_task("max_pair"), cfg)
    digits = limited(load_task("digits"), cfg)
    ft_runs, sc_runs = [], []
    for seed in cfg.seeds:
        for arm in (a for a in FINETUNE_ARMS if a in wanted):
            key = f"finetune/{cfg.key()}/{arm}/{seed}"
            if args.summarize_only and key not in items.done:
                parser.error(f"--summarize-only: {key} is not in {items_path}")
            row = items.done.get(key) or items.add({"key": key, **finetune(arm, state, target, seed, cfg)})
            print(f"fine-tune {arm:>10} seed {seed}: accuracy {row['accuracy']:.4f}, {row['flops'] / 1e12:.3f} TFLOPs, "
                  f"{row['wall_s']:.0f} s, frozen {row['frozen_at_end']} {row['freezes']}", flush=True)
            ft_runs.append(row)
        for arm in () if args.skip_scratch else (a for a in SCRATCH_ARMS if a in wanted):
            key = f"scratch/{cfg.key()}/{arm}/{seed}"
            if args.summarize_only and key not in items.done:
                parser.error(f"--summarize-only: {key} is not in {items_path}")
            row = items.done.get(key) or items.add({"key": key, **scratch(arm, digits, seed, cfg)})
            print(f"scratch {arm:>15} seed {seed}: accuracy {row['accuracy']:.4f}, {row['steps']} steps, "
                  f"{row['wall_s']:.0f} s", flush=True)
            sc_runs.append(row)

    finetune_summary = summarize(ft_runs, FINETUNE_ARMS)
    command = " ".join(["python benchmarks/bench_freeze.py", *(a for a in sys.argv[1:] if a != "--summarize-only")])
    data = {"config": dataclasses.asdict(cfg), "command": command,
            "finetune": finetune_summary, "scratch": summarize(sc_runs, SCRATCH_ARMS), "goal": goal(finetune_summary),
            "versus": {other: versus(ft_runs, "isiwatch", other) for other in ("freezeout", "gradnorm")},
            "finetune_runs": [{k: v for k, v in r.items() if k != "key"} for r in ft_runs],
            "scratch_runs": [{k: v for k, v in r.items() if k != "key"} for r in sc_runs],
            "machine": {**record, "load_1min_end": round(current_load(), 2)}}
    if args.summarize_only and args.out.exists():  # the machine and load of the run, not of this summary
        data["machine"] = json.loads(args.out.read_text())["machine"]
    data["markdown"] = tables(data)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, data)
    figure(data, args.out.with_suffix(".png"))
    print("\n".join(data["markdown"]))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
