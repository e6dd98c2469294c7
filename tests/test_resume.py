"""A resumed run keeps its identity: the Watch state carries the run name, so metrics.jsonl, alerts and the
Prometheus ``run`` label show one run across a save (torch.save, weights_only load) and a resume."""

import json

import pytest
import torch
import torch.nn.functional as F
from prometheus_client import CollectorRegistry
from run_dirs import run_dir
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_watch import digits, tiny_vit, train  # noqa: F401  (digits: fixture)

from isiwatch import Watch


def run_labels(registry: CollectorRegistry) -> set[str]:
    return {s.labels["run"] for m in registry.collect() for s in m.samples if "run" in s.labels}


def saved_and_loaded(watch: Watch, path) -> dict:
    torch.save({"watch": watch.state_dict()}, path)
    return torch.load(path, weights_only=True)["watch"]


def test_resumed_watch_keeps_the_saved_run_name_everywhere(digits, tmp_path):  # noqa: F811
    x, y, px, py = digits
    model = tiny_vit()
    first = Watch(model, px[:32], py[:32], every_n_steps=2, log_dir=tmp_path, norm_friction_threshold=-2.0)
    train(model, x, y, 4, first)
    first.close()
    state = saved_and_loaded(first, tmp_path / "ckpt.pt")

    registry = CollectorRegistry()
    second = Watch(model, px[:32], py[:32], every_n_steps=2, log_dir=tmp_path, registry=registry,
                   norm_friction_threshold=-2.0)
    assert second.run != first.run  # a fresh default name, until the state arrives
    second.load_state_dict(state)
    assert second.run == first.run
    second.step(6, 1.0)
    second.close()
    records = [json.loads(line) for line in (run_dir(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    assert [(r["run"], r["step"]) for r in records] == [(first.run, 2), (first.run, 4), (first.run, 6)]
    alerts = [json.loads(line) for line in (run_dir(tmp_path) / "alerts.jsonl").read_text().splitlines()]
    assert {a["run"] for a in alerts} == {first.run}
    friction = [a["step"] for a in alerts if a["kind"] == "norm_friction_high"]
    assert friction == [2]  # opened before the resume, not raised again after it (other rules may fire on 32 images)
    assert run_labels(registry) == {first.run}
    assert second.alerts.opened["norm_friction_high"].run == first.run


def test_prometheus_series_published_before_the_resume_move_to_the_saved_name(digits, tmp_path):  # noqa: F811
    x, y, px, py = digits
    model = tiny_vit()
    first = Watch(model, px[:32], py[:32], every_n_steps=1)
    first.sample(1)
    registry = CollectorRegistry()
    second = Watch(model, px[:32], py[:32], every_n_steps=1, registry=registry)
    second.sample(1)
    second.load_state_dict(saved_and_loaded(first, tmp_path / "ckpt.pt"))
    assert run_labels(registry) == set()  # the other name's series are gone, the saved name has none yet
    second.sample(2)
    assert run_labels(registry) == {first.run}


def test_an_explicit_run_name_wins_and_old_states_without_a_name_load(digits):  # noqa: F811
    x, y, px, py = digits
    model = tiny_vit()
    first = Watch(model, px[:32], py[:32], every_n_steps=1)
    first.sample(1)
    named = Watch(model, px[:32], py[:32], every_n_steps=1, run_name="mine")
    named.load_state_dict(first.state_dict())
    assert named.run == "mine" and named.alerts.run == "mine" and named.last_step == 1
    old = {k: v for k, v in first.state_dict().items() if k != "run"}  # saved before the name was recorded
    fresh = Watch(model, px[:32], py[:32], every_n_steps=1)
    name = fresh.run
    fresh.load_state_dict(old)
    assert fresh.run == name and fresh.last_step == 1


@pytest.mark.parametrize("run", [3, "", None, ["a"]])
def test_a_bad_run_name_in_the_state_is_refused_and_changes_nothing(digits, run):  # noqa: F811
    x, y, px, py = digits
    watch = Watch(tiny_vit(), px[:32], py[:32], every_n_steps=1)
    state, name = watch.state_dict(), watch.run
    state["run"], state["last_step"] = run, 7
    with pytest.raises(ValueError, match="'run' must be a non-empty string"):
        watch.load_state_dict(state)
    assert watch.run == name and watch.last_step is None


def test_a_resumed_run_never_repeats_an_episodes_opening_or_clearing(digits, tmp_path):  # noqa: F811
    """As a framework does: the last checkpoint is written at the last step, then the close takes the final sample
    of that step; the resumed run starts from the checkpoint. Each record of the episode appears once."""
    _, _, px, py = digits
    model = tiny_vit()
    records = []
    first = Watch(model, px, py, every_n_steps=4, run_name="r", alert_callback=records.append)
    for step in range(1, 7):
        first.step(step, float("nan") if step == 4 else 1.0)  # non_finite opens at the sample of step 4
    checkpoint = saved_and_loaded(first, tmp_path / "last.pt")  # step 6: not a sampling step
    first.close()  # the final sample, of step 6: its loss is finite again
    assert [s.step for s in first.history] == [4, 6]
    resumed = Watch(model, px, py, every_n_steps=4, run_name="r", alert_callback=records.append)
    resumed.load_state_dict(checkpoint)
    for step in range(7, 9):
        resumed.step(step, 1.0)
    resumed.close()
    assert [(r.kind, r.step) for r in records] == [("non_finite", 4), ("non_finite_cleared", 8)]


# -- logs that stay true across a crash ---------------------------------------------------------------------------
def logged(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_resume_drops_what_the_crashed_run_logged_after_the_checkpoint(digits, tmp_path):  # noqa: F811
    """The run checkpoints at step 4, samples at 6 (where non_finite clears) and is killed in the middle of a line;
    resumed from step 4, it samples 6 again (non_finite still open) and clears at 8. The logs hold each step once,
    and the alert log agrees with the resumed state: no clearing at 6, a torn line nowhere."""
    _, _, px, py = digits
    model = tiny_vit()
    crashed = Watch(model, px, py, every_n_steps=2, log_dir=tmp_path, run_name="r", heatmap_every=1000)
    for step in range(1, 8):
        crashed.step(step, float("nan") if step <= 4 else 1.0)
        if step == 4:
            checkpoint = saved_and_loaded(crashed, tmp_path / "ckpt.pt")
    crashed.close(final_sample=False)  # the process dies: its files close and the folder's lock goes with it
    with open(run_dir(tmp_path) / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 8, "run": "r", "lay')  # killed while writing
    assert [r["step"] for r in logged(run_dir(tmp_path) / "alerts.jsonl")] == [2, 6]  # opened at 2, cleared at 6

    resumed = Watch(model, px, py, every_n_steps=2, log_dir=tmp_path, heatmap_every=1000)
    resumed.load_state_dict(checkpoint)
    assert [r["step"] for r in logged(run_dir(tmp_path) / "metrics.jsonl")] == [2, 4]
    for step in range(5, 9):
        resumed.step(step, float("nan") if step <= 6 else 1.0)
    resumed.close()
    samples = logged(run_dir(tmp_path) / "metrics.jsonl")
    assert [r["step"] for r in samples] == [2, 4, 6, 8] and samples[2]["loss"] is None  # the resumed run's 6
    assert [(a["kind"], a["step"]) for a in logged(run_dir(tmp_path) / "alerts.jsonl")] == [
        ("non_finite", 2), ("non_finite_cleared", 8)]
    events = EventAccumulator(str(run_dir(tmp_path)))
    events.Reload()  # TensorBoard purges the crashed run's later events (a SessionLog START at step 5)
    assert [e.step for e in events.Scalars("isiwatch/isi/layer_00")] == [2, 4, 6, 8]


def test_a_resume_leaves_other_runs_and_records_up_to_the_checkpoint_alone(digits, tmp_path):  # noqa: F811
    _, _, px, py = digits
    model = tiny_vit()
    for name in ("other", "r"):  # one run after the other in one folder
        with Watch(model, px, py, every_n_steps=1, log_dir=tmp_path, run_folder=".", run_name=name,
                   heatmap_every=1000) as first:
            for step in (1, 2, 3):
                first.step(step, 1.0)
            state = first.state_dict()  # at step 3: nothing after it
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines(keepends=True)
    resumed = Watch(model, px, py, every_n_steps=1, log_dir=tmp_path, run_folder=".", heatmap_every=1000)
    resumed.load_state_dict({**state, "step": 1})  # as if the checkpoint had been taken at step 1
    assert (tmp_path / "metrics.jsonl").read_text() == "".join(lines[:4])  # other 1-3, r 1
    inode = (tmp_path / "metrics.jsonl").stat().st_ino
    resumed.load_state_dict({**state, "step": 1})  # nothing more to drop: the file is not rewritten
    assert (tmp_path / "metrics.jsonl").stat().st_ino == inode
    resumed.close(final_sample=False)


@pytest.mark.slow
def test_a_lightning_run_crashed_between_a_sample_and_the_next_checkpoint_resumes_with_true_logs(digits,  # noqa: F811
                                                                                                 tmp_path):
    """Samples every 2 steps, checkpoints every 4: the run crashes at step 7, after the sample of step 6 (where
    non_finite cleared), and resumes from the step-4 checkpoint, whose state holds non_finite open; the resumed
    run's data order differs, so its sample of step 6 has another loss. The logs end with one record per step, the
    resumed run's, and an alert log that agrees with its state."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    from isiwatch.integrations.lightning import ISIWatchCallback

    class CrashingViT(pl.LightningModule):
        """Its probe pass gives NaN while ``trainer.global_step <= nan_until``; its training step raises at global
        step ``crash_at`` (the batch after that step's sample)."""

        def __init__(self, nan_until, crash_at=None):
            super().__init__()
            self.net = tiny_vit(depth=2, dim=16)
            self.nan_until, self.crash_at = nan_until, crash_at
            self.net.blocks[1].register_forward_hook(self.nan_on_probe)

        def nan_on_probe(self, module, inputs, output):
            if inputs[0].shape[0] == len(px) and self.trainer.global_step <= self.nan_until:
                return output * float("nan")
            return None

        def training_step(self, batch, batch_idx):
            if self.global_step == self.crash_at:
                raise RuntimeError("the job was killed (injected)")
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), 1e-3)

    x, y, px, py = digits
    log_dir = tmp_path / "isiwatch"

    def fit(module, max_steps, ckpt_path=None):
        callback = ISIWatchCallback(px, py, every_n_steps=2, log_dir=log_dir, heatmap_every=1000)
        checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False,
                             callbacks=[callback, checkpoints], enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=tmp_path, num_sanity_val_steps=0)
        trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True), ckpt_path=ckpt_path)
        return callback

    with pytest.raises(RuntimeError, match="killed"):
        fit(CrashingViT(nan_until=4, crash_at=6), max_steps=12)
    assert [r["step"] for r in logged(run_dir(log_dir) / "metrics.jsonl")] == [2, 4, 6]
    assert [(a["kind"], a["step"]) for a in logged(run_dir(log_dir) / "alerts.jsonl")
            if a["kind"].startswith("non_finite")] \
        == [("non_finite", 2), ("non_finite_cleared", 6)]
    crashed_loss = logged(run_dir(log_dir) / "metrics.jsonl")[-1]["loss"]

    resumed = fit(CrashingViT(nan_until=6), max_steps=8, ckpt_path=tmp_path / "ckpt" / "epoch=0-step=4.ckpt")
    samples = logged(run_dir(log_dir) / "metrics.jsonl")
    assert [r["step"] for r in samples] == [2, 4, 6, 8]
    assert samples[2]["loss"] == resumed.watch.history[0].loss != crashed_loss
    assert [(a["kind"], a["step"]) for a in logged(run_dir(log_dir) / "alerts.jsonl")
            if a["kind"].startswith("non_finite")] \
        == [("non_finite", 2), ("non_finite_cleared", 8)]
    assert {a["run"] for a in logged(run_dir(log_dir) / "alerts.jsonl")} == {resumed.watch.run}
