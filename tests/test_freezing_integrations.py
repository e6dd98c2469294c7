"""The freeze policy in real trainers: Lightning's callback, transformers' Trainer callback and a plain loop
under DDP with 2 gloo processes. Each run freezes (a tolerance no change exceeds, so every block settles after
``patience`` samples), its frozen parameters stay bit-identical to the end while the head trains, and a run resumed
from a checkpoint taken after the freeze starts with the same parameters frozen."""

import json
import os

import lightning.pytorch as pl
import pytest
import timm
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from run_dirs import run_dir
from test_integrations_distributed import free_port, train_steps
from torch.utils.data import DataLoader, TensorDataset

from isiwatch import Watch
from isiwatch.watch.freezing import FreezePolicy

pytestmark = pytest.mark.slow

#: Every block counts as settled: the policy freezes them all once ``patience`` samples agree.
SETTLE_ALL = FreezePolicy(tolerance=1e6, patience=2)


@pytest.fixture(scope="module")
def digits():
    from isiwatch.io.data import embedded_digits

    x, y = embedded_digits()
    return x[:256], y[:256], x[4000:4048], y[4000:4048]


def frozen(model):
    return {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}


def freeze_steps(path):
    return [r["step"] for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "blocks_frozen"]


# -- Lightning ---------------------------------------------------------------------------------------------------
class DigitsViT(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7,
                                     in_chans=1, num_classes=10, embed_dim=32, depth=3, num_heads=2)
        self.at_freeze = None  # the frozen parameters right after the step that froze them

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.at_freeze is None and frozen(self.net):
            self.at_freeze = frozen(self.net)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), 1e-2, weight_decay=0.1)


def lightning_fit(tmp_path, data, callbacks, max_steps, ckpt_path=None):
    from isiwatch.integrations.lightning import ISIWatchCallback

    torch.manual_seed(1)
    module = DigitsViT()
    callback = ISIWatchCallback(data[2], data[3], every_n_steps=1, log_dir=tmp_path / "isiwatch",
                                freeze_settled=SETTLE_ALL)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False,
                         callbacks=[callback, *callbacks], enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=bool(callbacks), default_root_dir=tmp_path, num_sanity_val_steps=0)
    trainer.fit(module, DataLoader(TensorDataset(data[0], data[1]), batch_size=32, shuffle=True),
                ckpt_path=ckpt_path)
    return module, callback


def test_lightning_callback_freezes_and_resumes_frozen(digits, tmp_path):
    head = DigitsViT().net.head.weight.detach().clone()
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    module, callback = lightning_fit(tmp_path, digits, [ckpt], max_steps=6)
    assert freeze_steps(run_dir(tmp_path / "isiwatch") / "alerts.jsonl") == [3]
    assert callback.watch.freezer.frozen == 3
    at_freeze, now = module.at_freeze, frozen(module.net)
    assert {"cls_token", "pos_embed", "blocks.2.mlp.fc2.weight"} <= set(at_freeze) and "head.weight" not in now
    assert all(torch.equal(now[name], value) for name, value in at_freeze.items())
    assert not torch.equal(module.net.head.weight, head)

    resumed, callback = lightning_fit(tmp_path / "resumed", digits, [], max_steps=8,
                                      ckpt_path=tmp_path / "ckpt" / "epoch=0-step=4.ckpt")
    assert set(frozen(resumed.net)) == set(at_freeze) and callback.watch.freezer.frozen == 3
    assert resumed.at_freeze is not None  # frozen from its first step on
    assert all(torch.equal(p, at_freeze[name]) for name, p in frozen(resumed.net).items())
    alerts = run_dir(tmp_path / "resumed" / "isiwatch") / "alerts.jsonl"
    assert not alerts.exists() or not freeze_steps(alerts)  # re-frozen on load, not a new freeze


# -- transformers ------------------------------------------------------------------------------------------------
def hf_train(tmp_path, digits, max_steps, resume=None, **args):
    """A transformers Trainer run; returns the model, the isiwatch callback and the frozen parameters (with the
    head) right after the step that froze them."""
    from transformers import Trainer, TrainerCallback, TrainingArguments, ViTConfig, ViTForImageClassification

    from isiwatch.integrations.transformers import ISIWatchCallback

    class AtFreeze(TrainerCallback):
        params = None

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if self.params is None and frozen(model):
                self.params = {**frozen(model), "classifier.weight": model.classifier.weight.detach().clone()}

    x, y, px, py = digits
    torch.manual_seed(0)
    model = ViTForImageClassification(ViTConfig(image_size=28, patch_size=7, num_channels=1, hidden_size=32,
                                                num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
                                                num_labels=10))
    callback, at_freeze = ISIWatchCallback(px, py, every_n_steps=1, log_dir=tmp_path / "isiwatch",
                                           freeze_settled=SETTLE_ALL), AtFreeze()
    training = TrainingArguments(output_dir=str(tmp_path), max_steps=max_steps, learning_rate=1e-2, weight_decay=0.1,
                                 use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=1,
                                 per_device_train_batch_size=32, report_to="none", logging_steps=100, **args)
    data = [{"pixel_values": x[i], "labels": y[i]} for i in range(len(x))]
    trainer = Trainer(model=model, args=training, train_dataset=data, callbacks=[callback, at_freeze])
    trainer.train(resume_from_checkpoint=resume)
    return model, callback, at_freeze.params


def test_transformers_callback_freezes_and_resumes_frozen(digits, tmp_path):
    model, callback, at_freeze = hf_train(tmp_path, digits, 6, save_strategy="steps", save_steps=4)
    assert freeze_steps(run_dir(tmp_path / "isiwatch") / "alerts.jsonl") == [3] and callback.watch.freezer.frozen == 3
    names = set(frozen(model))
    assert {"vit.embeddings.cls_token", "vit.embeddings.patch_embeddings.projection.weight",
            "vit.layers.2.mlp.fc2.weight"} <= names and "classifier.weight" not in names
    assert all(torch.equal(p, at_freeze[name]) for name, p in frozen(model).items())  # steps 3-6: unchanged
    assert not torch.equal(model.classifier.weight, at_freeze["classifier.weight"])

    resumed, callback, at_start = hf_train(tmp_path, digits, 8, resume=str(tmp_path / "checkpoint-4"),
                                           save_strategy="no")
    assert set(frozen(resumed)) == names and callback.watch.freezer.frozen == 3
    assert set(at_start) == names | {"classifier.weight"}  # frozen from its first step on
    # unchanged from the first step on; not compared with the first run's weights: transformers 5's resume loads a
    # checkpoint saved under legacy key names without renaming them (huggingface/transformers#43701)
    assert all(torch.equal(p, at_start[name]) for name, p in frozen(resumed).items())


# -- DDP, 2 gloo processes ---------------------------------------------------------------------------------------
WORLD = 2


def tiny_vit():
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7, in_chans=1,
                             num_classes=10, embed_dim=16, depth=3, num_heads=2)


def ddp_worker(rank, port, out):
    """Rank 0 would freeze at its second sample (patience 1), rank 1 only at its third (patience 2): both freeze at
    the third, the smallest prefix any rank asks for. The refusals run first: DDP without find_unused_parameters,
    given to the Watch and hidden from it (the Watch gets the inner model, as Lightning and transformers give it)."""
    from isiwatch.io.data import embedded_digits

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    x, y = embedded_digits()
    probe = x[4000:4032], y[4000:4032]
    refusals = []
    strict = torch.nn.parallel.DistributedDataParallel(tiny_vit())
    for given in (strict, strict.module):
        try:
            Watch(given, *probe, freeze_settled=True)
        except ValueError as exc:
            refusals.append(str(exc))
    del strict, given

    model = torch.nn.parallel.DistributedDataParallel(tiny_vit(), find_unused_parameters=True)
    watch = Watch(model.module, *probe, every_n_steps=1, log_dir=f"{out}/rank{rank}", run_folder=".",
                  freeze_settled=FreezePolicy(tolerance=1e6, patience=1 + rank))
    opt = torch.optim.AdamW(model.parameters(), 1e-2, weight_decay=0.1)
    froze_at, at_freeze = None, {}
    for step in train_steps(rank, model, opt, x, y, watch, 6):
        if froze_at is None and watch.freezer.frozen:
            froze_at, at_freeze = step, frozen(model.module)
    watch.close()
    unchanged = all(torch.equal(p, at_freeze[name]) for name, p in frozen(model.module).items())
    head = [float(v) for v in model.module.head.weight.flatten()[:8]]
    with open(f"{out}/result{rank}.json", "w") as fh:
        json.dump({"refusals": refusals, "froze_at": froze_at, "frozen": sorted(at_freeze), "unchanged": unchanged,
                   "head": head}, fh)
    dist.destroy_process_group()


def test_ranks_freeze_the_same_blocks_at_the_same_step_under_ddp(tmp_path):
    mp.spawn(ddp_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    r0, r1 = (json.loads((tmp_path / f"result{r}.json").read_text()) for r in range(WORLD))
    for result in (r0, r1):
        assert len(result["refusals"]) == 2
        assert all(r.startswith("freeze_settled needs DistributedDataParallel(find_unused_parameters=True)")
                   for r in result["refusals"])
    assert r0["froze_at"] == r1["froze_at"] == 3
    assert r0["frozen"] == r1["frozen"] and "blocks.2.mlp.fc2.weight" in r0["frozen"]
    assert r0["unchanged"] and r1["unchanged"]
    assert r0["head"] == r1["head"]  # DDP kept the trained head in sync after the freeze
    assert freeze_steps(tmp_path / "rank0" / "alerts.jsonl") == [3] and not (tmp_path / "rank1").exists()
