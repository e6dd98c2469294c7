"""isiwatch in a plain PyTorch training loop: a small timm ViT on the embedded MNIST digits.

    python examples/plain_loop.py --steps 300 --log-dir runs/plain
    tensorboard --logdir runs/plain
"""

import argparse

import timm
import torch
import torch.nn.functional as F

import isiwatch
from isiwatch.io.data import DIGITS_TRAIN, embedded_digits


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=50, help="sample every N optimizer steps")
    parser.add_argument("--log-dir", default="runs/plain")
    parser.add_argument("--prometheus-port", type=int, default=None, help="serve /metrics on 127.0.0.1")
    args = parser.parse_args()

    images, labels = embedded_digits()
    train_x, train_y = images[:DIGITS_TRAIN], labels[:DIGITS_TRAIN]
    probe_x, probe_y = images[DIGITS_TRAIN:DIGITS_TRAIN + 256], labels[DIGITS_TRAIN:DIGITS_TRAIN + 256]
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7, in_chans=1,
                              num_classes=10, embed_dim=64, depth=8, num_heads=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    with isiwatch.Watch(model, probe_x, probe_y, every_n_steps=args.every, log_dir=args.log_dir,
                        prometheus_port=args.prometheus_port, stop_on_plateau=False) as watch:
        for step in range(1, args.steps + 1):
            idx = torch.randint(0, len(train_x), (128,))
            loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            for alert in watch.step(step, loss):
                print(f"step {step}: {alert.kind}: {alert.message}")
            if watch.should_stop:
                print(f"stopping early: {watch.stop_reason}")
                break
        last = watch.history[-1]
        print(f"last sample at step {last.step}: phases {last.phases}, "
              f"isi {[round(v, 3) for v in last.layers['isi']]}")


if __name__ == "__main__":
    main()
