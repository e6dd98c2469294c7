"""The alert rules on hand-made samples, without a model: each kind's condition and the ISI-stall window."""

import math

from isiwatch.measure.phases import Phases, PlateauTracker
from isiwatch.measure.vocabulary import PHASES
from isiwatch.watch.alerts import AlertEngine, AlertRules
from isiwatch.watch.sample import Sample


def sample(step, layers, loss=None, phases=None):
    return Sample(step, 0.0, layers, phases, 0.0, loss)


def rules(**options):
    return AlertRules(**{"phase_metric": "token_similarity", "isi_stall_window": 3, "isi_stall_min_rise": 0.05,
                         "isi_stall_min_loss_drop": 0.1, "probe_confidence": 0.95, **options})


def test_non_finite_names_every_bad_series_and_the_loss():
    got = rules().conditions(sample(1, {"isi": [0.1, math.nan], "attn_entropy": [0.5, 0.5]}, loss=math.inf),
                             PlateauTracker())
    assert got["non_finite"].active and got["non_finite"].data == {"series": ["isi", "loss"]}
    assert not rules().conditions(sample(1, {"isi": [0.1, 0.2]}, loss=1.0), PlateauTracker())["non_finite"].active


def test_cls_marginalized_only_with_both_probes_and_only_when_cls_is_behind_beyond_noise():
    """It needs both probes' held-out predictions; 10 of 20 images right only for the mean-patch probe and none
    only for [CLS] opens it (exact p 0.001), with the counts in the record; the other way round does not."""
    r, tracker = rules(), PlateauTracker()
    assert "cls_marginalized" not in r.conditions(sample(1, {"probe_cls": [0.2, 0.3]}), tracker)
    accuracies = {"probe_cls": [0.9, 0.5], "probe_patch_mean": [0.1, 1.0]}
    assert "cls_marginalized" not in r.conditions(sample(1, accuracies), tracker)  # no held-out predictions
    cls_right, patch_right = [True] * 10 + [False] * 10, [True] * 20
    behind = Sample(1, 0.0, accuracies, None, 0.0,
                    held_out={"probe_cls": [None, tuple(cls_right)], "probe_patch_mean": [None, tuple(patch_right)]})
    got = r.conditions(behind, tracker)["cls_marginalized"]
    assert got.active
    assert got.data == {"probe_cls": 0.5, "probe_patch_mean": 1.0, "held_out": 20, "both_correct": 10,
                        "only_cls": 0, "only_patch_mean": 10, "neither": 0, "p_value": 0.5 ** 10, "confidence": 0.95}
    assert "10 of 20 held-out images right only for the mean-patch probe, 0 only for [CLS]" in got.message
    ahead = Sample(1, 0.0, {"probe_cls": [0.1, 1.0], "probe_patch_mean": [0.9, 0.5]}, None, 0.0,
                   held_out={"probe_cls": [None, tuple(patch_right)], "probe_patch_mean": [None, tuple(cls_right)]})
    assert not r.conditions(ahead, tracker)["cls_marginalized"].active


def test_norm_friction_high_needs_a_threshold():
    layers = {"norm_friction": [0.01, 0.3, 0.02]}
    assert "norm_friction_high" not in rules().conditions(sample(1, layers), PlateauTracker())
    got = rules(norm_friction_threshold=0.1).conditions(sample(1, layers), PlateauTracker())["norm_friction_high"]
    assert got.active and got.data["layer"] == 1 and got.data["blocks_above"] == [1]


def test_plateau_onset_follows_the_tracker_and_names_the_span():
    r, tracker = rules(), PlateauTracker(patience=2)
    phases = Phases((2, 5), (0, 1), (6, 7))
    opened = []
    engine = AlertEngine("run", [opened.append])
    for step in (1, 2):
        s = sample(step, {"token_similarity": [0.0] * 8}, phases=phases)
        tracker.update(step, phases)
        engine.update(step, r.conditions(s, tracker))
    assert [(a.kind, a.step) for a in opened] == [("plateau_onset", 2)]
    assert opened[0].message == f"plateau over blocks 2–5 of token_similarity ({PHASES['plateau']})"
    assert opened[0].data == {"plateau": [2, 5], "onset_step": 2, "metric": "token_similarity"}


def test_a_plateau_from_block_0_is_a_slow_start_and_its_records_sit_where_the_data_change():
    """No Cliff before the plateau: slow_start (info), not plateau_onset; when the flat stretch moves behind a Cliff
    the slow_start episode closes and plateau_onset opens, at the sample where the new span became stable."""
    r, tracker = rules(), PlateauTracker(patience=2)
    start, paper = Phases((0, 3), None, (4, 7)), Phases((2, 5), (0, 1), (6, 7))
    records = []
    engine = AlertEngine("run", [records.append])
    for step, phases in enumerate((start, start, start, paper, paper, paper, None, None), 1):
        tracker.update(step, phases)
        engine.update(step, r.conditions(sample(step, {"token_similarity": [0.0] * 8}, phases=phases), tracker))
    assert [(a.kind, a.step, a.severity) for a in records] == [
        ("slow_start", 2, "info"), ("slow_start_cleared", 5, "info"), ("plateau_onset", 5, "warning"),
        ("plateau_onset_cleared", 8, "info")]
    # one name per stretch, defined in the message: the alert says "slow start" where the terminal and report do
    assert records[0].message == f"slow start over blocks 0–3 of token_similarity ({PHASES['slow start']})"
    assert records[1].message == (f"slow_start cleared: plateau over blocks 2–5 of token_similarity "
                                  f"({PHASES['plateau']})")
    assert records[-1].message == "plateau_onset cleared: no flat stretch in token_similarity at this sample"
    assert Phases((0, 3), None, (4, 7)).plateau_name == "slow start" and paper.plateau_name == "plateau"


def test_a_tracker_state_saved_before_the_span_existed_keeps_its_open_episode():
    tracker = PlateauTracker(patience=2)
    tracker.load_state_dict({"anchor": [2, 5], "run_length": 3, "absent": 0, "onset_step": 4})
    assert tracker.span == (2, 5)
    assert rules().conditions(sample(5, {"token_similarity": [0.0] * 8}), tracker)["plateau_onset"].active


def test_isi_stall_waits_for_a_full_window_of_finite_samples_and_needs_a_falling_loss():
    r = rules()
    flat_isi = {"isi": [0.2, 0.2]}
    results = [r.isi_stall(sample(i, flat_isi, loss=loss)).active for i, loss in enumerate((3.0, 2.0, 1.0))]
    assert results == [False, False, True]  # window of 3, ISI flat, loss fell by 2/3
    assert not r.isi_stall(sample(4, flat_isi, loss=math.nan)).active and len(r.stall) == 3  # skipped, not stored
    steady = rules()
    assert [steady.isi_stall(sample(i, flat_isi, loss=1.0)).active for i in range(3)] == [False, False, False]
    rising = rules()
    got = [rising.isi_stall(sample(i, {"isi": [v, v]}, loss=loss)).active
           for i, (v, loss) in enumerate(((0.2, 3.0), (0.3, 2.0), (0.4, 1.0)))]
    assert got == [False, False, False]  # ISI rose by 100 %, more than min_rise
