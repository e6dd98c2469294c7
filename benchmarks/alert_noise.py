"""The probe comparisons before and after the exact paired test, on the same samples of a real run.

A 6-block ViT (width 32) trains on the embedded digits with a Watch sampling every 10 steps on 128 probe images (38
held out). The Watch decides ``cls_marginalized`` and the published ``recommended_depth`` with the exact paired test
and its hysteresis (`isiwatch.watch.probe_evidence`); the rules before are replayed on the very same samples: the
alert open while the [CLS] probe's accuracy is below the mean-patch probe's, the depth published as the rule
proposes it. Counts each rule's openings and closings and the changes of the published depth.

    python benchmarks/alert_noise.py --seeds 0 1 2   # writes benchmarks/results/alert_noise/alert_noise.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import timm
import torch
import torch.nn.functional as F

from isiwatch import Watch
from isiwatch.io.data import embedded_digits
from isiwatch.watch.sample import Sample

sys.path.insert(0, str(Path(__file__).parent))
from machine import machine  # noqa: E402

OUT = Path(__file__).parent / "results" / "alert_noise" / "alert_noise.json"


def old_rule(samples: list[Sample]) -> list[tuple[str, int]]:
    """The rule before the test: open while the [CLS] accuracy is below the mean-patch one, close when it is not."""
    records, open_ = [], False
    for s in samples:
        behind = s.layers["probe_cls"][-1] < s.layers["probe_patch_mean"][-1]
        if behind != open_:
            records.append(("cls_marginalized" if behind else "cls_marginalized_cleared", s.step))
            open_ = behind
    return records


def run(seed: int, steps: int, every: int) -> dict[str, Any]:
    """One training run: per sample the step, both probes' accuracies, the rule's and the published depth, and the
    cls_marginalized records of the Watch and of the rule before."""
    x, y = embedded_digits()
    train_x, train_y, probe_x, probe_y = x[:2000], y[:2000], x[4000:4128], y[4000:4128]
    torch.manual_seed(seed)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7, in_chans=1,
                              num_classes=10, embed_dim=32, depth=6, num_heads=2)
    records: list[tuple[str, int]] = []
    watch = Watch(model, probe_x, probe_y, every_n_steps=every, strict=True,
                  alert_callback=lambda a: records.append((a.kind, a.step)))
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    model.train()
    for step in range(1, steps + 1):
        idx = torch.randint(0, len(train_x), (32,))
        loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        watch.step(step, loss)
    watch.close(final_sample=False)
    samples = list(watch.history)
    proposed = [s.depth_evidence["proposed"] if s.depth_evidence else s.recommendation.depth for s in samples
                if s.recommendation is not None]
    published = [s.recommendation.depth for s in samples if s.recommendation is not None]
    old = old_rule(samples)
    new = [r for r in records if r[0].startswith("cls_marginalized")]
    return {"seed": seed, "steps": [s.step for s in samples],
            "probe_cls": [round(s.layers["probe_cls"][-1], 4) for s in samples],
            "probe_patch_mean": [round(s.layers["probe_patch_mean"][-1], 4) for s in samples],
            "depth_before": proposed, "depth_after": published,
            "depth_changes_before": sum(a != b for a, b in zip(proposed, proposed[1:])),
            "depth_changes_after": sum(a != b for a, b in zip(published, published[1:])),
            "cls_marginalized_before": old, "cls_marginalized_after": new}


def records(rows: list[tuple[str, int]]) -> str:
    return ", ".join(f"{'closed' if kind.endswith('_cleared') else 'opened'} {step}" for kind, step in rows) or "none"


def table(runs: list[dict[str, Any]]) -> list[str]:
    """Per seed: the published depth at each sample and the cls_marginalized records, before and after."""
    lines = ["| seed | recommended_depth before (changes) | after (changes) | cls_marginalized before | after |",
             "|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['seed']} | {' '.join(map(str, r['depth_before']))} ({r['depth_changes_before']}) | "
                     f"{' '.join(map(str, r['depth_after']))} ({r['depth_changes_after']}) | "
                     f"{records(r['cls_marginalized_before'])} | {records(r['cls_marginalized_after'])} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.monotonic()
    runs = [run(seed, args.steps, args.every) for seed in args.seeds]
    markdown = table(runs)
    print("\n".join(markdown))
    result = {"machine": machine(1, "cpu"), "steps": args.steps, "every_n_steps": args.every, "probe_images": 128,
              "held_out": 38, "probe_confidence": 0.95, "runs": runs, "seconds": round(time.monotonic() - start, 1),
              "markdown": markdown}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
