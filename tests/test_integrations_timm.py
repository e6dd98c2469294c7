"""isiwatch.integrations.timm in a loop shaped like timm's train.py (``main`` + ``train_one_epoch``), built from
the training utilities train.py uses: create_dataset/create_loader, Mixup, ClassificationTask, ModelEmaV3,
create_optimizer_v2, create_scheduler_v2 and CheckpointSaver."""

import json
import random
from itertools import islice

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from run_dirs import run_dir
from timm.data import Mixup, create_dataset, create_loader
from timm.loss import SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.task import ClassificationTask, resume_task_checkpoint
from timm.utils import CheckpointSaver

from isiwatch.integrations.timm import probe_batch
from isiwatch.io.data import MNIST_MEAN, MNIST_STD, digit_pixels


@pytest.fixture(scope="module")
def image_folders(tmp_path_factory):
    """96 training and 48 validation digits as an ImageFolder tree of PNGs, as train.py reads them."""
    pixels, labels = (t.numpy() for t in digit_pixels())
    root = tmp_path_factory.mktemp("digits")
    for split, start, count in (("train", 0, 96), ("validation", 4000, 48)):
        for i in range(start, start + count):
            folder = root / split / str(labels[i])
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels[i].reshape(28, 28).astype("uint8"), mode="L").save(folder / f"{i}.png")
    return root


def loader(root, split, training, **kw):
    dataset = create_dataset("", root=str(root), split=split, is_training=training, input_img_mode="L")
    return create_loader(dataset, input_size=(1, 28, 28), batch_size=32, is_training=training, no_aug=True,
                         mean=(MNIST_MEAN,), std=(MNIST_STD,), **{"num_workers": 0, "use_prefetcher": False, **kw},
                         device=torch.device("cpu"), crop_pct=1.0)


def train_one_epoch(epoch, task, loader_train, optimizer, lr_scheduler, mixup_fn):
    """train.py's per-update order: forward through the task, backward, step, zero_grad, EMA, scheduler."""
    task.get_trainable_module().train()
    num_updates = epoch * len(loader_train)
    for input, target in loader_train:
        input, target = mixup_fn(input, target)
        loss = task(input, target)["loss"]
        loss.backward()
        optimizer.step()
        num_updates += 1
        optimizer.zero_grad()
        task.update_ema(step=num_updates)
        lr_scheduler.step_update(num_updates=num_updates, metric=loss.item())
    return num_updates


def main(root, out, num_epochs=3, resume="", **watch_options):
    """train.py's ``main`` with the two-line isiwatch patch (``resume``: train.py's ``--resume``); returns the
    updates done, the saver, the TrainScriptWatch and the task."""
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7, in_chans=1,
                              num_classes=10, embed_dim=32, depth=3, num_heads=2)
    loader_train, loader_eval = loader(root, "train", True), loader(root, "validation", False)
    mixup_fn = Mixup(mixup_alpha=0.2, label_smoothing=0.1, num_classes=10)
    task = ClassificationTask(model, criterion=SoftTargetCrossEntropy(), device=torch.device("cpu"), verbose=False)
    task.setup_ema(decay=0.9)
    optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
    lr_scheduler, num_epochs = create_scheduler_v2(optimizer, sched="cosine", num_epochs=num_epochs,
                                                   updates_per_epoch=len(loader_train))
    resume_epoch = resume_task_checkpoint(task, resume, optimizer=optimizer) if resume else None
    output_dir = str(out)
    saver = CheckpointSaver(model, optimizer, checkpoint_dir=output_dir, recovery_dir=output_dir, task=task)
    start_epoch, updates_per_epoch = resume_epoch or 0, len(loader_train)
    num_updates = start_epoch * updates_per_epoch

    # the two-line patch of docs/integrations.md (timm's train.py), with a 48-image probe batch
    from isiwatch.integrations.timm import TrainScriptWatch, probe_batch
    isiwatch_run = TrainScriptWatch(task, optimizer, *probe_batch(loader_eval, 48),
                                    start_step=start_epoch * updates_per_epoch, resume=resume, log_dir=output_dir,
                                    **watch_options)

    try:
        for epoch in range(start_epoch, num_epochs):
            num_updates = train_one_epoch(epoch, task, loader_train, optimizer, lr_scheduler, mixup_fn)
            saver.save_checkpoint(epoch, metric=float(epoch))
            lr_scheduler.step(epoch + 1)
    except KeyboardInterrupt:
        num_updates = isiwatch_run.num_updates
    return num_updates, saver, isiwatch_run, task


def test_train_script_patch_samples_every_n_updates(image_folders, tmp_path):
    num_updates, saver, run, task = main(image_folders, tmp_path, every_n_steps=2)
    run.close()
    assert num_updates == 9 and [epoch for _, epoch in saver.checkpoint_files] == [2, 1, 0]
    records = [json.loads(line) for line in (run_dir(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4, 6, 8, 9]  # 9: the final sample, at close
    assert all(r["loss"] > 0 for r in records) and len(records[0]["layers"]["probe_cls"]) == 3
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in task.modules())
    assert run.watch.probe_images.shape == (48, 1, 28, 28)


def test_isiwatch_stop_ends_the_train_script_mid_epoch(image_folders, tmp_path):
    num_updates, saver, run, _ = main(image_folders, tmp_path, every_n_steps=2, monitor="loss", warmup=1,
                                      stopping_threshold=100.0)
    assert num_updates == 4  # second sample, in the second epoch
    assert [epoch for _, epoch in saver.checkpoint_files] == [0]
    assert run.watch.should_stop and not run.watch.exporters  # closed itself
    records = [json.loads(line) for line in (run_dir(tmp_path) / "alerts.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in records if r["kind"] == "early_stop"] == [("early_stop", 4)]


def test_a_resumed_train_script_run_keeps_its_name_and_alert_episodes(image_folders, tmp_path):
    """train.py saves, a new process resumes with --resume: one run, the open episode is not raised again."""
    options = {"every_n_steps": 2, "norm_friction_threshold": -2.0}  # always above: one episode, opened at once
    _, saver, first, _ = main(image_folders, tmp_path / "a", num_epochs=2, **options)
    first.close()
    last = tmp_path / "a" / "last.pth.tar"
    assert [epoch for _, epoch in saver.checkpoint_files] == [1, 0] and last.exists()
    saved = torch.load(last, weights_only=False)["optimizer"]["isiwatch"]
    assert saved["run"] == first.watch.run and "norm_friction_high" in saved["alerts"]["active"]

    num_updates, _, second, _ = main(image_folders, tmp_path / "b", num_epochs=3, resume=str(last), **options)
    second.close()
    assert num_updates == 9 and second.watch.run == first.watch.run  # a fresh Watch would draw a new name
    runs, steps = set(), []
    for log in (tmp_path / "a", tmp_path / "b"):
        records = [json.loads(line) for line in (run_dir(log) / "metrics.jsonl").read_text().splitlines()]
        runs |= {r["run"] for r in records}
        steps += [r["step"] for r in records]
    assert runs == {first.watch.run} and steps == [2, 4, 6, 8, 9]  # 9: the final sample, at close
    opened = [json.loads(line) for line in (run_dir(tmp_path / "b") / "alerts.jsonl").read_text().splitlines()]
    assert [a["kind"] for a in opened] == []  # the episode carried over: no second norm_friction_high
    assert second.watch.alerts.opened["norm_friction_high"].step == 2


def rng_states():
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def assert_same_rng(a, b):
    assert torch.equal(a[0], b[0]) and a[1] == b[1]
    assert a[2][0] == b[2][0] and np.array_equal(a[2][1], b[2][1]) and a[2][2:] == b[2][2:]


def test_probe_batch_touches_no_rng_and_no_loader_state(image_folders):
    plain = loader(image_folders, "validation", False)
    persistent = loader(image_folders, "validation", False, num_workers=1)  # timm's default: persistent workers
    prefetched = loader(image_folders, "validation", False, use_prefetcher=True)  # normalises on the "device"
    results = []
    for source in (plain, persistent, prefetched):
        before = rng_states()
        results.append(probe_batch(source, 40))
        assert_same_rng(before, rng_states())
    assert persistent._iterator is None  # no worker started and no iterator kept for the eval loop
    expected = [torch.cat(parts)[:40] for parts in zip(*plain)]
    for images, labels in results:
        assert torch.allclose(images, expected[0], atol=1e-5) and torch.equal(labels, expected[1])
        assert images.shape == (40, 1, 28, 28)


def first_losses(root, read_probe_batch, updates=3):
    """train.py's first updates (shuffled loader, Mixup, drop-path), with or without the probe batch read first."""
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7, in_chans=1,
                              num_classes=10, embed_dim=32, depth=3, num_heads=2, drop_path_rate=0.2)
    loader_train, loader_eval = loader(root, "train", True), loader(root, "validation", False)
    if read_probe_batch:
        probe_batch(loader_eval, 48)
    mixup_fn = Mixup(mixup_alpha=0.2, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=10)
    task = ClassificationTask(model, criterion=SoftTargetCrossEntropy(), device=torch.device("cpu"), verbose=False)
    optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3)
    losses = []
    for input, target in islice(loader_train, updates):
        loss = task(*mixup_fn(input, target))["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_reading_the_probe_batch_does_not_change_training(image_folders):
    assert first_losses(image_folders, True) == first_losses(image_folders, False)
