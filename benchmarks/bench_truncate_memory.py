"""Peak memory of ``isiwatch truncate`` on a folder of 2,000 vs 20,000 images at 224 px: images are streamed
through timm's data layer, so the peak should not grow with the dataset (goal: within 10 %).

The images are the embedded MNIST digits, upscaled to 224×224 RGB PNGs with a per-copy tint so repeats differ,
written once into ``--work`` in timm ``train.py``'s layout (``train/`` with N images, ``validation/`` with N/10).
The model is a small 224-px ViT made here (4 blocks, width 64) and saved as a timm ``train.py`` checkpoint; each
size runs ``isiwatch truncate --strategy tail --keep 2 --heal-steps S --batch-size B`` in a fresh process, with the
same ``S`` and ``B`` for every size, so that only the dataset differs: the heal reads ``S`` batches drawn from all
the training images (default: 20 batches of 100, one pass over the smallest set), evaluation every validation image
three times. With ``B`` = 100 every batch is full at both sizes (200 validation images halve into one batch each),
so a peak does not shrink merely because the small set's last batch is short.

Peak RSS is the truncate process's own (``ru_maxrss`` from ``wait4``, exact) and the process tree's (itself plus
its DataLoader workers, sampled every 0.2 s; forked workers share pages, so this sum is an upper bound).

    python benchmarks/bench_truncate_memory.py [--sizes 2000 20000] [--heal-steps 20] [--batch-size 100]
        [--work DIR] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import timm
import torch
from machine import machine
from PIL import Image

from isiwatch.io.timm_data import DigitsSource

RESULT = Path(__file__).parent / "results" / "truncate_memory" / "truncate_memory.json"
#: The benchmark model: timm's ViT at 224 px, small enough to heal 20,000 images on a CPU in minutes.
MODEL_KWARGS = {"img_size": 224, "patch_size": 16, "in_chans": 3, "num_classes": 10, "embed_dim": 64, "depth": 4,
                "num_heads": 2}
GOAL = 0.10
#: Images per batch and healing steps, the same for every size: one pass over 2,000 images.
BATCH_SIZE, HEAL_STEPS = 100, 20


def write_images(root: Path, count: int, offset: int) -> None:
    """``count`` 224-px RGB PNGs of the embedded digits in class folders, each repeat of a digit tinted apart."""
    source = DigitsSource()
    for i in range(count):
        digit = (offset + i) % len(source)
        repeat = (offset + i) // len(source)
        label = int(source.labels()[digit])
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        grey = source.image(digit, "L").resize((224, 224), Image.Resampling.BILINEAR)
        tint = ((37 * repeat) % 200 + 55, (91 * repeat) % 200 + 55, (53 * repeat) % 200 + 55)
        Image.merge("RGB", [grey.point(lambda v, t=t: v * t // 255) for t in tint]).save(folder / f"{offset + i}.png")


def dataset(work: Path, size: int) -> Path:
    """The ``train/`` + ``validation/`` tree of ``size`` training images (written once, reused)."""
    root = work / f"images_{size}"
    done = root / ".complete"
    if not done.exists():
        shutil.rmtree(root, ignore_errors=True)
        write_images(root / "train", size, 0)
        write_images(root / "validation", size // 10, size)
        done.touch()
    return root


def checkpoint(work: Path) -> Path:
    """A timm train.py checkpoint of the benchmark model (random weights: memory does not depend on them)."""
    path = work / "vit224.pth.tar"
    if not path.exists():
        torch.manual_seed(0)
        model = timm.create_model("vit_tiny_patch16_224", **MODEL_KWARGS)
        args = argparse.Namespace(model="vit_tiny_patch16_224", model_kwargs={"num_heads": 2},
                                                  mean=None, std=None, img_size=224, in_chans=3)
        torch.save({"arch": "vit_tiny_patch16_224", "args": args, "state_dict": model.state_dict()}, path)
    return path


def peak_rss(command: list[str]) -> dict[str, float]:
    """Run ``command``; its own peak RSS (``wait4``) and the sampled peak RSS sum of its process tree, in MB (no
    timings: memory is what this benchmark measures, and it may run on a busy machine)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    tree_peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal tree_peak
        parent = psutil.Process(process.pid)
        while not done.is_set():
            try:
                members = [parent, *parent.children(recursive=True)]
                tree_peak = max(tree_peak, sum(p.memory_info().rss for p in members if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(process.pid, 0)
    done.set()
    sampler.join()
    stderr = process.stderr.read().decode() if process.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed: {stderr.strip().splitlines()[-1:]}")
    return {"process_mb": usage.ru_maxrss / 1024, "tree_mb": tree_peak / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--work", type=Path, help="Where the images and the model go (default: a temporary folder)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--heal-steps", type=int, default=HEAL_STEPS,
                        help="Optimizer steps of the heal, the same for every size")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="Images per batch, for every size")
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="isiwatch-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    ckpt = checkpoint(work)
    runs = []
    for size in args.sizes:
        root = dataset(work, size)
        command = [sys.executable, "-m", "isiwatch.cli", "truncate", str(ckpt), "--out", str(work / f"cut_{size}.pt"),
                   "--data", str(root), "--strategy", "tail", "--keep", "2", "--heal-steps", str(args.heal_steps),
                   "--batch-size", str(args.batch_size), "--images", "64",
                   "--workers", str(args.workers), "--accelerator", "cpu"]
        (work / f"cut_{size}.pt").unlink(missing_ok=True)
        measured = peak_rss(command)
        runs.append({"images": size, "validation_images": size // 10, **measured})
        print(f"{size:>6} images: truncate process {measured['process_mb']:.0f} MB, with its workers "
              f"{measured['tree_mb']:.0f} MB", flush=True)
    small, large = runs[0], runs[-1]
    growth = {key: large[key] / small[key] - 1 for key in ("process_mb", "tree_mb")}
    result = {"machine": machine(None), "model_kwargs": MODEL_KWARGS, "workers": args.workers, "goal": GOAL,
              "heal_steps": args.heal_steps, "batch_size": args.batch_size,
              "command": f"isiwatch truncate CKPT --data DIR --strategy tail --keep 2 --heal-steps {args.heal_steps} "
                         f"--batch-size {args.batch_size} --images 64 --workers {args.workers} --accelerator cpu",
              "runs": runs, "growth": growth, "within_goal": all(abs(g) <= GOAL for g in growth.values())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"growth from {small['images']} to {large['images']} images: process {100 * growth['process_mb']:+.1f} %, "
          f"tree {100 * growth['tree_mb']:+.1f} % (goal within {100 * GOAL:.0f} %); wrote {args.out}")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
