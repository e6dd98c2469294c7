"""``isiwatch demo``: train a small ViT on the embedded digits and analyse its depth profile."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from .analysis import analyze
from .checkpoint import save_checkpoint
from .data import DIGITS_TRAIN, embedded_digits
from .files import write_json
from .plots import plot_curves
from .tables import analysis_table, phases_line
from .training import DIGITS_VIT_ARCH, accuracy, make_digits_vit, train_classifier


def run_demo(out: str | Path, *, epochs: int = 10, device: str = "cpu", seed: int = 0,
             echo: Callable[[str], None] = print) -> dict:
    """Train, analyse on the held-out digits, write the run directory; returns a summary dict."""
    out = Path(out)
    images, labels = embedded_digits()
    train_x, train_y = images[:DIGITS_TRAIN], labels[:DIGITS_TRAIN]
    test_x, test_y = images[DIGITS_TRAIN:], labels[DIGITS_TRAIN:]
    model, kwargs = make_digits_vit(seed)
    model.to(device)
    echo(f"training a {kwargs['depth']}-block ViT (width {kwargs['embed_dim']}) on {len(train_x)} embedded "
         f"MNIST digits for {epochs} epochs on {device}")
    start = time.perf_counter()
    steps = train_classifier(model, train_x, train_y, epochs=epochs, seed=seed, progress=True)
    train_seconds = time.perf_counter() - start
    acc = accuracy(model, test_x, test_y)
    echo(f"trained {steps} steps in {train_seconds:.1f} s; held-out accuracy {acc:.3f}")

    result = analyze(model, test_x, test_y, batch_size=len(test_x))
    result.model.update({"arch": DIGITS_VIT_ARCH, "model_kwargs": kwargs, "held_out_accuracy": acc})
    ckpt = save_checkpoint(out / "model.pt", DIGITS_VIT_ARCH, kwargs,
                           model.state_dict(),
                           metadata={"held_out_accuracy": acc, "steps": steps})
    paths = [ckpt, write_json(out / "analysis.json", result.to_dict()), plot_curves(result, out / "curves.png")]
    echo(analysis_table(result))
    echo(phases_line(result))
    for path in paths:
        echo(f"wrote {path}")
    return {"accuracy": acc, "steps": steps, "train_seconds": train_seconds, "analysis": result}
