"""isiwatch.integrations.transformers inside a real transformers Trainer on the CPU."""

import json

import pytest
import torch
from run_dirs import run_dir
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import Trainer, TrainingArguments, ViTConfig, ViTForImageClassification

from isiwatch.integrations.transformers import SUMMARY_SERIES, ISIWatchCallback, add_callback


@pytest.fixture(scope="module")
def digits():
    from isiwatch.io.data import embedded_digits

    x, y = embedded_digits()
    return [{"pixel_values": x[i], "labels": y[i]} for i in range(256)], x[4000:4048], y[4000:4048]


def tiny_hf_vit():
    torch.manual_seed(0)
    return ViTForImageClassification(ViTConfig(image_size=28, patch_size=7, num_channels=1, hidden_size=32,
                                               num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
                                               num_labels=10))


def trainer_for(tmp_path, data, max_steps, callbacks=None, **args):
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=max_steps, learning_rate=1e-3, use_cpu=True,
                             disable_tqdm=True, dataloader_num_workers=0, seed=1,
                             **{"per_device_train_batch_size": 32, "save_strategy": "no", "report_to": "none",
                                "logging_steps": 100, **args})
    return Trainer(model=tiny_hf_vit(), args=args, train_dataset=data, callbacks=callbacks)


def test_summary_reaches_reporters_state_resumes(digits, tmp_path):
    data, px, py = digits
    options = dict(every_n_steps=2, log_dir=tmp_path / "isiwatch", monitor="loss", mode="max", min_delta=100.0,
                   patience=100)  # never improves: ``wait`` counts the samples
    callback = ISIWatchCallback(px, py, log_summary=True, **options)
    trainer = trainer_for(tmp_path, data, 6, report_to="tensorboard", save_strategy="steps", save_steps=6,
                          logging_steps=2)
    add_callback(trainer, callback)
    trainer.train()

    lines = (run_dir(tmp_path / "isiwatch") / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2, 4, 6]
    assert all(json.loads(line)["loss"] > 0 for line in lines)
    logged = [h for h in trainer.state.log_history if "isiwatch/probe_cls/last" in h]
    assert [h["step"] for h in logged] == [2, 4, 6] and "loss" in logged[0]
    assert {k for k in logged[0] if k.startswith("isiwatch/")} == {f"isiwatch/{s}" for s in SUMMARY_SERIES}
    events = EventAccumulator(str(next((tmp_path / "runs").iterdir())))
    events.Reload()
    assert [e.step for e in events.Scalars("train/isiwatch/probe_cls/last")] == [2, 4, 6]
    assert not any(m._forward_hooks for m in trainer.model.modules())

    saved = json.loads((tmp_path / "checkpoint-6" / "trainer_state.json").read_text())
    assert saved["stateful_callbacks"]["ISIWatchCallback"]["attributes"]["watch_state"]["last_step"] == 6
    resumed = ISIWatchCallback(px, py, log_summary=True, **options)
    trainer = trainer_for(tmp_path, data, 8, callbacks=[resumed], logging_steps=2)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-6"))
    records = [json.loads(line) for line in (run_dir(tmp_path / "isiwatch") / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4, 6, 8]
    assert {r["run"] for r in records} == {callback.watch.run}  # the resumed run keeps its name
    assert resumed.state()["attributes"]["watch_state"]["stoppers"][0]["wait"] == 3
    assert "isiwatch/plateau/length" in trainer.state.log_history[-2]  # without add_callback: still in the history


def printed_logs(capsys, tmp_path, data, callbacks):
    """The Trainer's console log lines (PrinterCallback, disable_tqdm) and log history of a 6-step run that
    logs every step."""
    trainer = trainer_for(tmp_path, data, 6, logging_steps=1, callbacks=callbacks)
    capsys.readouterr()
    trainer.train()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    return lines, trainer.state.log_history


def test_the_trainer_console_and_log_rows_stay_as_without_isiwatch(digits, tmp_path, capsys):
    data, px, py = digits
    plain_lines, plain_history = printed_logs(capsys, tmp_path / "plain", data, None)
    callback = ISIWatchCallback(px, py, every_n_steps=3, log_dir=tmp_path / "isiwatch")
    lines, history = printed_logs(capsys, tmp_path / "watched", data, [callback])
    assert len(plain_lines) == len(lines) == 7  # a row per step and the final one: no extra rows
    assert not any("isiwatch" in line for line in lines)
    assert [h["step"] for h in history] == [h["step"] for h in plain_history]
    assert [sorted(h) for h in history] == [sorted(h) for h in plain_history]
    metrics = run_dir(tmp_path / "isiwatch") / "metrics.jsonl"
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == [3, 6]  # the curves went to isiwatch's own log

    asked = ISIWatchCallback(px, py, every_n_steps=3, log_summary=["isi/mean"])
    lines, history = printed_logs(capsys, tmp_path / "asked", data, [asked])
    assert [h["step"] for h in history] == [h["step"] for h in plain_history]
    assert [h["step"] for h in history if "isiwatch/isi/mean" in h] == [3, 6]
    assert all(not k.startswith("isiwatch/") or k == "isiwatch/isi/mean" for h in history for k in h)
    assert sum("isiwatch/isi/mean" in line for line in lines) == 2


def test_log_summary_names_are_checked(digits, tmp_path):
    data, px, py = digits
    trainer = trainer_for(tmp_path, data, 2, callbacks=[ISIWatchCallback(px, py, log_summary=["isi/maen"])])
    with pytest.raises(ValueError, match="'isi/maen' is not a series of this model; did you mean 'isi/mean'"):
        trainer.train()


def test_isiwatch_stop_ends_hf_training(digits, tmp_path):
    data, px, py = digits
    callback = ISIWatchCallback(px, py, every_n_steps=2, log_dir=tmp_path, monitor="loss", warmup=1,
                                stopping_threshold=100.0)
    trainer = trainer_for(tmp_path, data, 50, callbacks=[callback])
    trainer.train()
    assert trainer.state.global_step == 4
    records = [json.loads(line) for line in (run_dir(tmp_path) / "alerts.jsonl").read_text().splitlines()]
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
    lines = (run_dir(tmp_path / "isiwatch") / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2, 4, 5]  # 5: the final sample
    assert callback.state()["attributes"]["watch_state"]["last_step"] == 5 and not callback.watch.should_stop


@pytest.mark.parametrize("accumulation", [1, 2, 4])
def test_the_loss_series_equals_the_loss_the_trainer_logs_under_gradient_accumulation(digits, tmp_path,
                                                                                       accumulation):
    # transformers passes num_items_in_batch, so each micro-batch's outputs.loss is a partial sum of the step's
    data, px, py = digits
    callback = ISIWatchCallback(px, py, every_n_steps=1)
    trainer = trainer_for(tmp_path, data, 4, callbacks=[callback], logging_steps=1,
                          per_device_train_batch_size=32 // accumulation, gradient_accumulation_steps=accumulation)
    trainer.train()
    logged = {row["step"]: row["loss"] for row in trainer.state.log_history if "loss" in row}
    ours = {s.step: s.loss for s in callback.watch.history}
    assert sorted(logged) == sorted(ours) == [1, 2, 3, 4]
    assert ours == pytest.approx(logged, rel=1e-3)
    assert 2.0 < ours[1] < 2.6  # ln 10 at the start: a full cross-entropy, not a half or a quarter of one
