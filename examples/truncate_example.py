"""Cut a trained ViT at its plateau and heal it, from Python.

    python examples/truncate_example.py --checkpoint isiwatch-demo/model.pt --out truncated.pt
    python examples/truncate_example.py --out truncated.pt   # trains a small ViT first (about a minute)
"""

import argparse
import tempfile
from pathlib import Path

import timm
import torch

from isiwatch.checkpoint import load_checkpoint, save_checkpoint
from isiwatch.data import DIGITS_TRAIN, embedded_digits
from isiwatch.training import DIGITS_VIT_ARCH, make_digits_vit, train_classifier
from isiwatch.truncate import report_table, truncate


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
    args = parser.parse_args()

    checkpoint = args.checkpoint or train_small_vit(Path(tempfile.mkdtemp()) / "model.pt", args.train_epochs)
    try:  # the plateau of the token-similarity curve sets how many blocks to keep
        result = truncate(checkpoint, args.out, epochs=args.heal_epochs)
    except ValueError as exc:  # no plateau: choose the depth by hand
        keep = load_checkpoint(checkpoint).model_kwargs["depth"] * 3 // 4
        print(f"{exc}\nkeeping {keep} blocks instead")
        result = truncate(checkpoint, args.out, epochs=args.heal_epochs, keep=keep)
    print(report_table(result.report))

    # The output is a plain timm model: rebuild it and load the weights strictly.
    saved = load_checkpoint(args.out)
    model = timm.create_model(saved.arch, pretrained=False, **saved.model_kwargs)
    model.load_state_dict(saved.state_dict, strict=True)
    raw = torch.load(args.out, weights_only=True)
    print(f"{args.out}: {len(model.blocks)} blocks, kept source blocks {raw['isiwatch']['kept_blocks']}")


if __name__ == "__main__":
    main()
