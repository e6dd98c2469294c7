"""isiwatch in a timm train.py-style run, with the same two added lines as the train.py patch in the README:
ClassificationTask, create_optimizer_v2 and create_scheduler_v2 on the embedded MNIST digits.

    python examples/timm_train_example.py --epochs 5 --log-dir runs/timm
    tensorboard --logdir runs/timm
"""

import argparse

import timm
import torch
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.task import ClassificationTask
from torch.utils.data import DataLoader, TensorDataset

from isiwatch.io.data import DIGITS_TRAIN, embedded_digits


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--every", type=int, default=50, help="sample every N optimizer updates")
    parser.add_argument("--log-dir", default="runs/timm")
    args = parser.parse_args()

    images, labels = embedded_digits()
    loader_train = DataLoader(TensorDataset(images[:DIGITS_TRAIN], labels[:DIGITS_TRAIN]), batch_size=128,
                              shuffle=True, drop_last=True)
    loader_eval = DataLoader(TensorDataset(images[DIGITS_TRAIN:], labels[DIGITS_TRAIN:]), batch_size=128)
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7, in_chans=1,
                              num_classes=10, embed_dim=64, depth=8, num_heads=4)
    task = ClassificationTask(model, device=torch.device("cpu"))
    optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
    updates_per_epoch = len(loader_train)
    lr_scheduler, num_epochs = create_scheduler_v2(optimizer, sched="cosine", num_epochs=args.epochs,
                                                   warmup_epochs=1, updates_per_epoch=updates_per_epoch)
    start_epoch = 0

    from isiwatch.integrations.timm import TrainScriptWatch, probe_batch
    isiwatch_run = TrainScriptWatch(task, optimizer, *probe_batch(loader_eval, 256), log_dir=args.log_dir,
                                    start_step=start_epoch * updates_per_epoch, every_n_steps=args.every,
                                    stop_on_plateau=True)

    num_updates = 0
    try:
        for epoch in range(start_epoch, num_epochs):
            task.train()
            for input, target in loader_train:
                loss = task(input, target)["loss"]
                loss.backward()
                optimizer.step()
                num_updates += 1
                optimizer.zero_grad()
                lr_scheduler.step_update(num_updates=num_updates)
            lr_scheduler.step(epoch + 1)
            print(f"epoch {epoch}: loss {loss.item():.3f}")
    except KeyboardInterrupt:  # train.py's own handler; isiwatch's StopTraining lands here
        print(f"stopped early: {isiwatch_run.watch.stop_reason}")
    isiwatch_run.close()


if __name__ == "__main__":
    main()
