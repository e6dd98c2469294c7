"""A resumed run keeps its identity: the Watch state carries the run name, so metrics.jsonl, alerts and the
Prometheus ``run`` label show one run across a save (torch.save, weights_only load) and a resume."""

import json

import pytest
import torch
from prometheus_client import CollectorRegistry
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
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["run"], r["step"]) for r in records] == [(first.run, 2), (first.run, 4), (first.run, 6)]
    alerts = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
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
