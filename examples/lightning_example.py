"""isiwatch in a Lightning run: a small timm ViT on the embedded MNIST digits, sampled every N steps, with the
summary in Lightning's CSV logs and the per-layer curves in isiwatch's TensorBoard/JSONL export.

    python examples/lightning_example.py --steps 300 --log-dir runs/lightning
    tensorboard --logdir runs/lightning
"""

import argparse

import lightning.pytorch as pl
import timm
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from isiwatch.integrations.lightning import ISIWatchCallback
from isiwatch.io.data import DIGITS_TRAIN, embedded_digits


class DigitsViT(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7,
                                     in_chans=1, num_classes=10, embed_dim=64, depth=8, num_heads=4)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = F.cross_entropy(self.net(images), labels)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=50, help="sample every N optimizer steps")
    parser.add_argument("--log-dir", default="runs/lightning")
    args = parser.parse_args()

    images, labels = embedded_digits()
    train = DataLoader(TensorDataset(images[:DIGITS_TRAIN], labels[:DIGITS_TRAIN]), batch_size=128, shuffle=True)
    probe_x, probe_y = images[DIGITS_TRAIN:DIGITS_TRAIN + 256], labels[DIGITS_TRAIN:DIGITS_TRAIN + 256]
    torch.manual_seed(0)
    isiwatch_cb = ISIWatchCallback(probe_x, probe_y, every_n_steps=args.every, log_dir=f"{args.log_dir}/isiwatch",
                                   stop_on_plateau=True)
    trainer = pl.Trainer(accelerator="cpu", max_steps=args.steps, callbacks=[isiwatch_cb],
                         logger=CSVLogger(args.log_dir, name="lightning"), enable_progress_bar=False)
    trainer.fit(DigitsViT(), train)
    print(f"stopped at step {trainer.global_step}: {isiwatch_cb.watch.stop_reason or 'max_steps'}")


if __name__ == "__main__":
    main()
