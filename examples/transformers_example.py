"""isiwatch in a Hugging Face Trainer run: a small transformers ViT (built from a config, no download) on the
embedded MNIST digits. The per-layer curves go to isiwatch's own log (OUT/isiwatch: TensorBoard, metrics.jsonl,
alerts.jsonl); log_summary=True adds a small summary to the Trainer's own log rows and its TensorBoard logs.

    python examples/transformers_example.py --steps 300 --out runs/transformers
    tensorboard --logdir runs/transformers
"""

import argparse

import torch
from transformers import Trainer, TrainingArguments, ViTConfig, ViTForImageClassification

from isiwatch.integrations.transformers import ISIWatchCallback, add_callback
from isiwatch.io.data import DIGITS_TRAIN, embedded_digits


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=50, help="sample every N optimizer steps")
    parser.add_argument("--out", default="runs/transformers")
    args = parser.parse_args()

    images, labels = embedded_digits()
    probe_x, probe_y = images[DIGITS_TRAIN:DIGITS_TRAIN + 256], labels[DIGITS_TRAIN:DIGITS_TRAIN + 256]
    torch.manual_seed(0)
    model = ViTForImageClassification(ViTConfig(image_size=28, patch_size=7, num_channels=1, hidden_size=64,
                                                num_hidden_layers=8, num_attention_heads=4, intermediate_size=256,
                                                num_labels=10))
    training = TrainingArguments(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=128,
                                 learning_rate=1e-3, use_cpu=True, logging_steps=args.every, save_strategy="no",
                                 report_to="tensorboard", disable_tqdm=True)
    train = [{"pixel_values": images[i], "labels": labels[i]} for i in range(DIGITS_TRAIN)]
    trainer = Trainer(model=model, args=training, train_dataset=train)
    isiwatch_cb = ISIWatchCallback(probe_x, probe_y, every_n_steps=args.every, log_dir=f"{args.out}/isiwatch",
                                   stop_on_plateau=True, log_summary=True)
    add_callback(trainer, isiwatch_cb)  # ahead of the reporting callbacks, so TensorBoard gets the isiwatch summary
    trainer.train()
    print(f"stopped at step {trainer.state.global_step}: {isiwatch_cb.watch.stop_reason or 'max_steps'}")


if __name__ == "__main__":
    main()
