"""isiwatch.integrations.transformers inside a real transformers Trainer on the CPU."""

import json

import pytest
import torch
from isiwatch.integrations.transformers import ISIWatchCallback, add_callback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import Trainer, TrainingArguments, ViTConfig, ViTForImageClassification


@pytest.fixture(scope="module")
def digits():
    from isiwatch.data import embedded_digits

    x, y = embedded_digits()
    return [{"pixel_values": x[i], "labels": y[i]} for i in range(256)], x[4000:4048], y[4000:4048]


def tiny_hf_vit():
    torch.manual_seed(0)
    return ViTForImageClassification(ViTConfig(image_size=28, patch_size=7, num_channels=1, hidden_size=32,
                                               num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
                                               num_labels=10))


def trainer_for(tmp_path, data, max_steps, callbacks=None, **args):
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=max_steps, per_device_train_batch_size=32,
                             learning_rate=1e-3, use_cpu=True, logging_steps=100, disable_tqdm=True,
                             dataloader_num_workers=0, seed=1, **{"save_strategy": "no", "report_to": "none", **args})
    return Trainer(model=tiny_hf_vit(), args=args, train_dataset=data, callbacks=callbacks)


def test_summary_reaches_reporters_state_resumes(digits, tmp_path):
    data, px, py = digits
    options = dict(every_n_steps=2, log_dir=tmp_path / "isiwatch", monitor="loss", mode="max", min_delta=100.0,
                   patience=100)  # never improves: ``wait`` counts the samples
    callback = ISIWatchCallback(px, py, **options)
    trainer = trainer_for(tmp_path, data, 6, report_to="tensorboard", save_strategy="steps", save_steps=6)
    add_callback(trainer, callback)
    trainer.train()

    lines = (tmp_path / "isiwatch" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2, 4, 6]
    assert all(json.loads(line)["loss"] > 0 for line in lines)
    logged = [h for h in trainer.state.log_history if "isiwatch/probe_cls/last" in h]
    assert [h["step"] for h in logged] == [2, 4, 6] and "loss" in logged[0]
    events = EventAccumulator(str(next((tmp_path / "runs").iterdir())))
    events.Reload()
    assert [e.step for e in events.Scalars("train/isiwatch/probe_cls/last")] == [2, 4, 6]
    assert not any(m._forward_hooks for m in trainer.model.modules())

    saved = json.loads((tmp_path / "checkpoint-6" / "trainer_state.json").read_text())
    assert saved["stateful_callbacks"]["ISIWatchCallback"]["attributes"]["watch_state"]["last_step"] == 6
    resumed = ISIWatchCallback(px, py, **options)
    trainer = trainer_for(tmp_path, data, 8, callbacks=[resumed])
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-6"))
    assert [json.loads(line)["step"] for line in (tmp_path / "isiwatch" / "metrics.jsonl").read_text().splitlines()] \
        == [2, 4, 6, 8]
    assert resumed.state()["attributes"]["watch_state"]["stoppers"][0]["wait"] == 3
    assert "isiwatch/plateau/length" in trainer.state.log_history[-2]  # without add_callback: still in the history


def test_isiwatch_stop_ends_hf_training(digits, tmp_path):
    data, px, py = digits
    callback = ISIWatchCallback(px, py, every_n_steps=2, log_dir=tmp_path, monitor="loss", warmup=1,
                                stopping_threshold=100.0)
    trainer = trainer_for(tmp_path, data, 50, callbacks=[callback])
    trainer.train()
    assert trainer.state.global_step == 4
    records = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in records if r["kind"] == "early_stop"] == [("early_stop", 4)]


def test_rebuilding_callbacks_from_json_is_refused(digits, tmp_path):
    data, px, py = digits
    with pytest.raises(ValueError, match="restore_callback_states_from_checkpoint"):
        trainer_for(tmp_path, data, 2, restore_callback_states_from_checkpoint=True,
                    callbacks=[ISIWatchCallback(px, py)])


def test_final_sample_at_the_end_of_training_reaches_the_logs(digits, tmp_path):
    data, px, py = digits
    callback = ISIWatchCallback(px, py, every_n_steps=2, log_dir=tmp_path / "isiwatch")
    trainer = trainer_for(tmp_path, data, 5)
    add_callback(trainer, callback)
    trainer.train()
    lines = (tmp_path / "isiwatch" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2, 4, 5]  # 5: the final sample
    assert [h["step"] for h in trainer.state.log_history if "isiwatch/probe_cls/last" in h] == [2, 4, 5]
    assert callback.state()["attributes"]["watch_state"]["last_step"] == 5 and not callback.watch.should_stop
