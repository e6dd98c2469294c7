"""isiwatch.integrations.lightning inside a real Lightning Trainer on the CPU."""

import csv
import json

import lightning.pytorch as pl
import pytest
import timm
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from run_dirs import run_dir
from torch.utils.data import DataLoader, TensorDataset

from isiwatch.integrations.lightning import ISIWatchCallback


class DigitsViT(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7,
                                     in_chans=1, num_classes=10, embed_dim=32, depth=3, num_heads=2,
                                     drop_rate=0.1, drop_path_rate=0.1)
        self.losses = []  # every training_step's loss

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), 1e-3)


@pytest.fixture(scope="module")
def digits():
    from isiwatch.io.data import embedded_digits

    x, y = embedded_digits()
    return TensorDataset(x[:256], y[:256]), x[4000:4048], y[4000:4048]


def fit(tmp_path, data, callbacks, max_steps, ckpt_path=None, logger=False, **trainer_args):
    torch.manual_seed(1)
    module = DigitsViT()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=logger, callbacks=callbacks,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=bool(
                             [c for c in callbacks if isinstance(c, ModelCheckpoint)]),
                         default_root_dir=tmp_path, num_sanity_val_steps=0, **trainer_args)
    trainer.fit(module, DataLoader(data, batch_size=32, shuffle=True), ckpt_path=ckpt_path)
    return trainer, module


def test_callback_logs_exports_checkpoints_and_does_not_perturb(digits, tmp_path):
    data, px, py = digits
    _, plain = fit(tmp_path / "plain", data, [], max_steps=6)

    options = dict(every_n_steps=2, log_dir=tmp_path / "isiwatch", run_name="pl", monitor="loss", mode="max",
                   min_delta=100.0, patience=100)  # never improves: ``wait`` counts the samples
    watch_cb = ISIWatchCallback(px, py, **options)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=6, save_top_k=-1)
    trainer, watched = fit(tmp_path, data, [watch_cb, ckpt], max_steps=6, logger=CSVLogger(tmp_path, name="csv"))

    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), watched.state_dict().values()))
    lines = (run_dir(tmp_path / "isiwatch") / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2, 4, 6]
    with open(trainer.logger.log_dir + "/metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    # Lightning files a batch's values under the batches stepped before it: optimizer step 2 is logged at 1
    assert [int(r["step"]) for r in rows if r.get("isiwatch/probe_cls/last")] == [1, 3, 5]
    assert {"isiwatch/isi/mean", "isiwatch/plateau/length", "isiwatch/loss"} <= set(rows[0])
    assert not watch_cb.watch.exporters and len(watch_cb.watch.history) == 3  # closed at teardown, kept
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in watched.modules())

    saved = torch.load(tmp_path / "ckpt" / "epoch=0-step=6.ckpt", weights_only=True)["callbacks"]["ISIWatchCallback"]
    assert saved["last_step"] == 6 and saved["stoppers"][0]["wait"] == 2
    resumed = ISIWatchCallback(px, py, **options)
    fit(tmp_path, data, [resumed], max_steps=8, ckpt_path=tmp_path / "ckpt" / "epoch=0-step=6.ckpt")
    lines = (run_dir(tmp_path / "isiwatch") / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2, 4, 6, 8]
    assert resumed.state_dict()["stoppers"][0]["wait"] == 3


def test_every_optimizer_step_is_sampled_once_under_accumulation(digits, tmp_path):
    """every_n_steps=1 with accumulate_grad_batches=3: one sample per optimizer step (not per batch, not twice
    for the batches that share a global step), each with the loss of the batch that completed the step."""
    data, px, py = digits
    watch_cb = ISIWatchCallback(px, py, every_n_steps=1, log_dir=tmp_path / "isiwatch")
    trainer, module = fit(tmp_path, data, [watch_cb], max_steps=2, accumulate_grad_batches=3)
    assert trainer.global_step == 2 and len(module.losses) == 6
    records = [json.loads(line) for line in (run_dir(tmp_path / "isiwatch") / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    # Lightning hands over loss / 3; the callback multiplies back, exact up to float32 rounding
    assert [r["loss"] for r in records] == pytest.approx([module.losses[2], module.losses[5]], rel=1e-6)
    assert len(watch_cb.watch.history) == 2


def test_isiwatch_stop_ends_lightning_training(digits, tmp_path):
    data, px, py = digits
    watch_cb = ISIWatchCallback(px, py, every_n_steps=2, log_dir=tmp_path, monitor="loss", warmup=1,
                                stopping_threshold=100.0)
    trainer, _ = fit(tmp_path, data, [watch_cb], max_steps=50)
    assert trainer.global_step == 4 and trainer.should_stop and "stopping threshold" in watch_cb.watch.stop_reason
    records = [json.loads(line) for line in (run_dir(tmp_path) / "alerts.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in records if r["kind"] == "early_stop"] == [("early_stop", 4)]


def test_gradient_accumulation_samples_optimizer_steps_with_the_training_step_loss(digits, tmp_path):
    data, px, py = digits
    watch_cb = ISIWatchCallback(px, py, every_n_steps=2, log_dir=tmp_path / "isiwatch")
    trainer, module = fit(tmp_path, data, [watch_cb], max_steps=5, accumulate_grad_batches=2,
                          logger=CSVLogger(tmp_path, name="csv"))
    assert trainer.global_step == 5 and len(module.losses) == 10  # 8 batches an epoch: optimizer steps 1-4, 5
    records = [json.loads(line) for line in (run_dir(tmp_path / "isiwatch") / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4, 5]  # 5: the final sample, at the end of training
    # optimizer step s completes on batch 2s - 1 (0-based); its training_step loss, not the loss / 2
    assert [r["loss"] for r in records] == [module.losses[2 * s - 1] for s in (2, 4, 5)]
    with open(trainer.logger.log_dir + "/metrics.csv") as fh:
        assert [int(r["step"]) for r in csv.DictReader(fh) if r.get("isiwatch/probe_cls/last")] == [1, 3, 4]
    assert watch_cb.state_dict()["last_step"] == 5 and not watch_cb.watch.should_stop


class LoggingDigitsViT(DigitsViT):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss, on_step=True, on_epoch=False)
        return loss


@pytest.mark.parametrize("accumulation", [1, 2])
def test_the_isiwatch_loss_lands_on_the_step_of_the_modules_own_train_loss(digits, tmp_path, accumulation):
    data, px, py = digits
    torch.manual_seed(1)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=5, logger=CSVLogger(tmp_path, name="csv"),
                         callbacks=[ISIWatchCallback(px, py, every_n_steps=2)], log_every_n_steps=1,
                         accumulate_grad_batches=accumulation, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(LoggingDigitsViT(), DataLoader(data, batch_size=32, shuffle=True))
    with open(trainer.logger.log_dir + "/metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    own = {int(r["step"]): float(r["train_loss"]) for r in rows if r.get("train_loss")}
    ours = {int(r["step"]): float(r["isiwatch/loss"]) for r in rows if r.get("isiwatch/loss")}
    assert sorted(ours) == [1, 3, 4]  # optimizer steps 2 and 4, and the final sample of step 5
    assert all(ours[step] == pytest.approx(own[step], rel=1e-6) for step in ours)
