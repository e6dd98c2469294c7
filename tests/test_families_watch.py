"""The Watch on every ViT family, and the Lightning and Hugging Face callbacks on EVA-02 (timm) and CLIP vision
(transformers) inside the real Trainers."""

import json
import math

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
import transformers as hf
from run_dirs import run_dir
from test_families import HF, HF_SIZE, TIMM, make_hf, make_timm
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import isiwatch
from isiwatch.integrations.lightning import ISIWatchCallback as LightningCallback
from isiwatch.integrations.transformers import ISIWatchCallback as HFCallback
from isiwatch.integrations.transformers import add_callback
from isiwatch.taps import vit_parts

CORE = ("attn_token_change", "attn_entropy", "isi", "token_similarity", "block_influence", "probe_patch_mean")


@pytest.fixture(scope="module")
def digits():
    from isiwatch.io.data import embedded_digits

    x, y = embedded_digits()
    return x[:128], y[:128], x[4000:4032], y[4000:4032]


@pytest.mark.parametrize("family", sorted(TIMM) + sorted(HF))
def test_watch_samples_every_family(family, digits, tmp_path):
    model = make_timm(family) if family in TIMM else make_hf(family)
    _, _, px, py = digits
    depth = vit_parts(model).depth
    with isiwatch.Watch(model, px, py, every_n_steps=1, log_dir=tmp_path, run_folder=".") as watch:
        watch.step(1, 0.5)
        sample = watch.history[-1]
    for metric in CORE:
        values = sample.layers[metric]
        assert len(values) == depth and all(math.isfinite(v) for v in values), (family, metric)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["step"] == 1


class Classifier(pl.LightningModule):
    """A Lightning module around a timm EVA-02 or a transformers CLIP vision classifier."""

    def __init__(self, kind: str):
        super().__init__()
        torch.manual_seed(0)
        if kind == "eva02":
            self.net = make_timm("eva02").train()
        else:
            self.net = hf.CLIPForImageClassification(hf.CLIPConfig(vision_config=HF_SIZE, num_labels=10))

    def forward(self, x):
        out = self.net(x)
        return out if isinstance(out, torch.Tensor) else out.logits

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), 1e-3)


@pytest.mark.parametrize("kind", ["eva02", "clip_vision"])
def test_lightning_callback_on_new_families(kind, digits, tmp_path):
    x, y, px, py = digits
    callback = LightningCallback(px, py, every_n_steps=2, log_dir=tmp_path)
    module = Classifier(kind)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=4, logger=False, callbacks=[callback],
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         default_root_dir=tmp_path, num_sanity_val_steps=0)
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=32))
    records = [json.loads(line) for line in (run_dir(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4]
    depth = vit_parts(module).depth
    assert all(len(r["layers"]["isi"]) == depth for r in records)
    assert not any(m._forward_hooks for m in module.modules())


class TimmForTrainer(nn.Module):
    """What transformers' Trainer expects of a model: keyword inputs, a dict with the loss."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, pixel_values, labels=None):
        logits = self.net(pixel_values)
        return {"logits": logits} if labels is None else {"loss": F.cross_entropy(logits, labels), "logits": logits}


@pytest.mark.parametrize("kind", ["eva02", "clip_vision"])
def test_transformers_callback_on_new_families(kind, digits, tmp_path):
    x, y, px, py = digits
    torch.manual_seed(0)
    model = (TimmForTrainer(make_timm("eva02").train()) if kind == "eva02" else
             hf.CLIPForImageClassification(hf.CLIPConfig(vision_config=HF_SIZE, num_labels=10)))
    args = hf.TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=32,
                                learning_rate=1e-3, use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=1,
                                save_strategy="no", report_to="none", logging_steps=100)
    data = [{"pixel_values": x[i], "labels": y[i]} for i in range(len(x))]
    trainer = hf.Trainer(model=model, args=args, train_dataset=data)
    add_callback(trainer, HFCallback(px, py, every_n_steps=2, log_dir=tmp_path / "isiwatch"))
    trainer.train()
    records = [json.loads(line) for line in (run_dir(tmp_path / "isiwatch") / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4]
    assert all(len(r["layers"]["isi"]) == vit_parts(model).depth for r in records)
