"""Cut a trained ViT to the cheapest depth that stays within 1 accuracy point, and heal it, from Python.

    python examples/truncate_example.py --checkpoint isiwatch-demo/model.pt --out truncated.pt
    python examples/truncate_example.py --out truncated.pt   # trains a small ViT first (about a minute)
"""

import argparse
import tempfile
from pathlib import Path

import timm
import torch

from isiwatch.io.checkpoint import load_checkpoint, save_checkpoint
from isiwatch.io.data import DIGITS_TRAIN, embedded_digits
from isiwatch.truncation.healing import DIGITS_VIT_ARCH, make_digits_vit, train_classifier
from isiwatch.truncation.truncate import candidates_table, report_table, truncate
from isiwatch.truncation.truncate_report import no_cut_line


def train_small_vit(path: Path, epochs: int) -> Path:
    images, labels = embedded_digits()
    model, kwargs = make_digits_vit(0, depth=8)
    train_classifier(model, images[:DIGITS_TRAIN], labels[:DIGITS_TRAIN], epochs=epochs)
    return save_checkpoint(path, DIGITS_VIT_ARCH, kwargs, model.state_dict())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", type=Path, help="a trained timm ViT (default: train a small one)")
    parser.add_argument("--out", type=Path, default=Path("truncated.pt"))
    parser.add_argument("--train-epochs", type=int, default=4, help="when training the small ViT")
    parser.add_argument("--heal-epochs", type=int, default=2)
    parser.add_argument("--budget", type=int, default=6, help="cuts healed at most while searching")
    args = parser.parse_args()

    checkpoint = args.checkpoint or train_small_vit(Path(tempfile.mkdtemp()) / "model.pt", args.train_epochs)
    # strategy "auto": start from the recommended depth, heal candidate cuts, keep the cheapest one whose
    # validation accuracy is within max_drop points of the uncut model's; when none is, nothing is written
    result = truncate(checkpoint, args.out, epochs=args.heal_epochs, max_drop=1.0, budget=args.budget)
    print(candidates_table(result.report))
    print(report_table(result.report))
    if not result.cut:
        raise SystemExit(no_cut_line(result.report))

    # The output is a plain timm model: rebuild it and load the weights strictly.
    saved = load_checkpoint(args.out)
    model = timm.create_model(saved.arch, pretrained=False, **saved.model_kwargs)
    model.load_state_dict(saved.state_dict, strict=True)
    raw = torch.load(args.out, weights_only=True)
    print(f"{args.out}: {len(model.blocks)} blocks, kept source blocks {raw['isiwatch']['kept_blocks']}")


if __name__ == "__main__":
    main()
