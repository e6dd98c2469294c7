"""isiwatch's EarlyStopping against Lightning's own ``EarlyStopping._evaluate_stopping_criteria``, driven side by
side, step by step, on the value sequences of Lightning's test suite
(tests/tests_pytorch/callbacks/test_early_stopping.py) and on non-finite values, signed ``min_delta``, patience 0,
resumed state and random sequences."""

from __future__ import annotations

import math
import random

import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping as LightningEarlyStopping

from isiwatch.watch.stopping import EarlyStopping

INF, NAN = math.inf, math.nan


def _pair(**options):
    return EarlyStopping("m", **options), LightningEarlyStopping(monitor="m", **options)


def _lightning_best(ours: EarlyStopping, theirs: LightningEarlyStopping) -> None:
    best = float(theirs.best_score)
    assert ours.best == best or (math.isnan(ours.best) and math.isnan(best))


def drive(values, ours: EarlyStopping, theirs: LightningEarlyStopping) -> int | None:
    """Feed both the same values (float64 for both, so the rule is compared, not rounding); every step they
    must agree on stopping, the wait and the best value. Returns the first index at which they stop."""
    first = None
    for i, v in enumerate(values):
        reason = ours.update(float(v))
        stop, _ = theirs._evaluate_stopping_criteria(torch.tensor(float(v), dtype=torch.float64))
        assert (reason is not None) == bool(stop), (i, v, reason)
        assert ours.wait == theirs.wait_count, (i, v)
        _lightning_best(ours, theirs)
        if stop and first is None:
            first = i
    return first


# (options, values, index of the value at which Lightning's test expects the stop; None: no stop)
LIGHTNING_SUITE = [
    # test_early_stopping_patience / test_early_stopping_patience_train
    ({"patience": 3}, [6, 5, 5, 5, 5, 5], 4),
    ({"patience": 1}, [6, 5, 4, 4, 3, 3], 3),
    ({"patience": 3}, [6, 5, 6, 5, 5, 5], 4),
    # test_early_stopping_thresholds
    ({}, [8, 4, 2, 3, 4, 5, 8, 10], 5),
    ({"stopping_threshold": 2.9}, [9, 8, 7, 6, 5, 6, 4, 3, 2, 1], 8),
    ({"divergence_threshold": 15.9}, [9, 4, 2, 16, 32, 64], 3),
    # test_early_stopping_on_non_finite_monitor
    ({"check_finite": True}, [4, 3, INF, 2, 1], 2),
    ({"check_finite": True}, [4, 3, NAN, 2, 1], 2),
    # test_multiple_early_stopping_callbacks: "abc", "cba" (a constant 0, patience 3), "abc" diverging on rank 0
    ({}, [8, 4, 2, 3, 4, 5, 8, 10], 5),
    ({"patience": 3}, [0, 0, 0, 0, 0, 0, 0, 0], 3),
    ({"patience": 1}, [8, 4, 10, 10, 10, 10], 2),
    # test_early_stopping_reasons
    ({"patience": 2}, [10.0] * 10, 2),
    ({"stopping_threshold": 0.6, "mode": "min"}, [5.0, 3.0, 1.0, 0.5] + [0.1] * 6, 3),
    ({"divergence_threshold": 8.0, "mode": "min"}, [1.0, 2.0, 5.0, 10.0] + [15.0] * 6, 3),
    ({"check_finite": True}, [1.0, 0.5] + [NAN] * 8, 2),
    ({"patience": 3}, [5.0, 4.0, 3.0], None),
    # test_early_stopping_no_val_step's options (min_delta=0.1, patience=0) on a loss that flattens
    ({"min_delta": 0.1, "patience": 0}, [1.0, 0.8, 0.75, 0.5], 2),
]


@pytest.mark.parametrize("options, values, expected", LIGHTNING_SUITE)
def test_lightning_suite_sequences(options, values, expected):
    assert drive(values, *_pair(**options)) == expected


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("options, values", [
    ({"check_finite": False, "patience": 2}, [3, NAN, NAN, 2]),                     # NaN: no improvement
    ({"check_finite": False, "patience": 2}, [3, NAN, 2, NAN, NAN]),
    ({"check_finite": False, "divergence_threshold": 10.0}, [3, INF]),            # +inf diverges (min)
    ({"check_finite": False, "divergence_threshold": -10.0}, [3, -INF]),          # -inf diverges (max)
    ({"check_finite": False, "stopping_threshold": 0.0}, [3, -INF]),              # -inf reaches the threshold
    ({"check_finite": False, "stopping_threshold": 5.0}, [3, INF]),
    ({"check_finite": False, "patience": 3}, [3, -INF, 2, -INF, 1]),              # ±inf becomes the best
    ({"check_finite": False, "patience": 3}, [3, INF, 4, INF, 5]),
    ({"check_finite": False, "patience": 2}, [INF, INF, INF]),
    ({"check_finite": False, "patience": 2}, [-INF, -INF, -INF]),
    ({"check_finite": True}, [3, -INF]),
    ({"min_delta": -0.5, "patience": 2}, [3.0, 3.4, 3.8, 4.2, 4.3, 4.4, 3.0]),     # negative delta keeps its sign
    ({"min_delta": -0.5, "patience": 2}, [3.0, 2.6, 2.2, 1.8, 1.7, 1.6]),
    ({"min_delta": 0.5, "patience": 2}, [3.0, 2.6, 2.4, 3.6, 3.7, 3.2, 4.3]),
    ({"patience": 0}, [3.0, 2.0, 2.0, 1.0]),
    ({"patience": 1}, [3.0, 3.0]),                                                 # a tie is no improvement
    ({"stopping_threshold": 2.0, "divergence_threshold": 2.0}, [2.0, 2.0, 2.0, 2.0]),
    ({"stopping_threshold": 3.0, "divergence_threshold": 1.0}, [2.0, 0.5, 4.0]),   # threshold order
])
def test_non_finite_signed_delta_ties_and_thresholds(mode, options, values):
    drive(values, *_pair(mode=mode, **options))


def test_check_finite_false_keeps_counting_through_nan():
    ours, theirs = _pair(check_finite=False, patience=2)
    assert drive([3.0, NAN, NAN], ours, theirs) == 2 and ours.best == 3.0


@pytest.mark.parametrize("mode", ["min", "max"])
def test_resume_restores_patience_and_continues_in_step(mode):
    ours, theirs = _pair(mode=mode, patience=4, min_delta=0.25)
    values = [5.0, 4.0, 4.5, 6.0, 3.0, 4.2]
    drive(values, ours, theirs)
    # resumed with a different patience: both take the saved one
    ours2, theirs2 = _pair(mode=mode, patience=1, min_delta=0.25)
    ours2.load_state_dict(ours.state_dict())
    theirs2.load_state_dict(theirs.state_dict())
    assert ours2.patience == theirs2.patience == 4
    assert ours2.wait == theirs2.wait_count == ours.wait
    drive([4.1, 4.1, 4.1, 4.1, 4.1, 0.0, 9.0], ours2, theirs2)


def test_state_without_patience_keeps_the_constructed_one():
    ours = EarlyStopping("m", patience=7)
    ours.load_state_dict({"best": 1.0, "wait": 2, "seen": 5})
    assert (ours.patience, ours.best, ours.wait, ours.seen) == (7, 1.0, 2, 5)
    with pytest.raises(ValueError, match="'patience' must be an int >= 0"):
        ours.load_state_dict({"best": 1.0, "wait": 2, "seen": 5, "patience": -1})


def test_random_sequences_agree_step_by_step():
    rng = random.Random(0)
    pool = [0.0, 1.0, 1.5, 2.0, 3.0, 4.0, NAN, INF, -INF]
    for _ in range(400):
        options = {"mode": rng.choice(["min", "max"]), "patience": rng.randint(0, 4),
                   "min_delta": rng.choice([-1.0, -0.5, 0.0, 0.5, 1.0]),
                   "check_finite": rng.random() < 0.3,
                   "stopping_threshold": rng.choice([None, None, 0.5, 3.5]),
                   "divergence_threshold": rng.choice([None, None, 0.5, 3.5])}
        drive([rng.choice(pool) for _ in range(rng.randint(1, 12))], *_pair(**options))


def test_warmup_is_isiwatch_own_and_ignores_the_first_values():
    with pytest.raises(TypeError):
        LightningEarlyStopping(monitor="m", warmup=1)  # not a Lightning option
    ours, theirs = _pair(patience=1)
    ours.warmup = 2
    assert ours.update(NAN) is None and ours.update(-5.0) is None  # ignored: no check, no best
    assert ours.best == INF and ours.wait == 0
    drive([3.0, 3.0], ours, theirs)
