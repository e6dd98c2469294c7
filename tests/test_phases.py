import json
from pathlib import Path

import numpy as np
import pytest

from isiwatch import Phases, detect_phases
from isiwatch.measure.analysis import DEFAULT_PHASE_OPTIONS
from isiwatch.measure.phases import LINE_NOISE

#: The demo's token_similarity curves, measured by ``benchmarks/demo_curves.py`` (both demos run for real).
DEMO_CURVES = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "demo" / "curves.json"


def cliff_plateau_climb(rng):
    """A noisy piecewise-linear Cliff → Plateau → Climb curve and its true plateau span."""
    n = int(rng.integers(8, 33))
    cliff = int(rng.integers(1, max(2, n // 5) + 1))
    plateau = int(rng.integers(max(3, n // 4), max(4, n // 2) + 1))
    climb = n - cliff - plateau
    if climb < 2:
        plateau -= 2 - climb
        climb = 2
    y = np.zeros(n)
    y[:cliff + 1] = np.linspace(rng.uniform(0.5, 1.5), 0, cliff + 1)
    y[cliff + plateau - 1:] = np.linspace(0, rng.uniform(0.4, 1.0), climb + 1)
    y[cliff:cliff + plateau] = 0.0
    y = y * rng.choice([-1.0, 1.0]) * rng.uniform(0.01, 100) + rng.normal()
    noise = rng.uniform(0.0, 0.05)
    y += rng.uniform(-noise, noise, n) * np.ptp(y)
    return y, (cliff, cliff + plateau - 1)


def test_recovers_plateau_within_one_layer_on_noisy_curves():
    rng = np.random.default_rng(2026)
    hits = 0
    trials = 400
    for _ in range(trials):
        y, (start, end) = cliff_plateau_climb(rng)
        found = detect_phases(y)
        if found and abs(found.plateau[0] - start) <= 1 and abs(found.plateau[1] - end) <= 1:
            hits += 1
            assert found.cliff == (0, found.plateau[0] - 1)
            assert found.climb == (found.plateau[1] + 1, len(y) - 1)
    assert hits / trials >= 0.95


@pytest.mark.parametrize("n", [4, 8, 16, 32])
@pytest.mark.parametrize("sign", [1, -1])
def test_linear_ramp_has_no_plateau(n, sign):
    rng = np.random.default_rng(n)
    ramp = sign * np.linspace(0, 1, n)
    assert detect_phases(ramp) is None
    assert detect_phases(ramp + rng.uniform(-0.05, 0.05, n)) is None


def test_defined_answers_for_degenerate_curves():
    assert detect_phases([0.3] * 12) is None
    with pytest.raises(ValueError, match="NaN"):
        detect_phases([0.1, 0.2, float("nan"), 0.3, 0.4])
    with pytest.raises(ValueError, match="at least 4"):
        detect_phases([0.1, 0.2, 0.3])
    with pytest.raises(ValueError):
        detect_phases([0.1, 0.2, 0.3, float("inf")])


def test_plateau_at_an_end_and_observed_demo_shape():
    flat_then_climb = [0.11, 0.11, 0.11, 0.12, 0.13, 0.15, 0.18, 0.22, 0.25, 0.30, 0.35, 0.39]
    found = detect_phases(flat_then_climb)
    assert found is not None and found.cliff is None and found.plateau[0] == 0 and 3 <= found.plateau[1] <= 4
    saturating = [0.0, 0.3, 0.6, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    found = detect_phases(saturating)
    assert found.plateau[0] in (3, 4) and found.plateau[1] == 9 and found.climb is None
    assert found == Phases(plateau=found.plateau, cliff=(0, found.plateau[0] - 1), climb=None)
    assert found.to_dict()["length"] == 10 - found.plateau[0]


def test_min_layers_is_respected():
    curve = [1.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0]
    assert detect_phases(curve, min_layers=3).plateau == (1, 3)
    assert detect_phases(curve, min_layers=4) is None  # the only flat stretch is 3 blocks long
    longer = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0]
    assert detect_phases(longer, min_layers=4).plateau == (1, 4)
    assert detect_phases(longer, min_layers=5) is None


def demo_curves():
    return {run["mode"]: run for run in json.loads(DEMO_CURVES.read_text())["runs"]}


def test_the_full_demos_even_rise_has_no_cliff():
    """Issue 40: the full demo's trained model has a token_similarity curve that rises from 0.125 to 0.297, at about
    the same slope over blocks 0–8 and faster after; it was printed as "cliff 0–5, plateau 6–8, climb 9–11" (the
    JSON's ``printed_phases``). A first piece no steeper than the flat stretch after it is no Cliff."""
    full = demo_curves()["full"]
    assert full["depth"] == 12 and full["metric"] == "token_similarity"
    assert detect_phases(full["analysis_curve"], **DEFAULT_PHASE_OPTIONS) is None


def test_no_phases_on_a_demo_curve_a_straight_line_fits_within_the_noise():
    """Every curve of both demos (the analysis and each Watch sample) that a least-squares line fits within the
    detector's noise level — ``min_range``, or `LINE_NOISE` of the curve's range — at every block has no phases:
    the quick demo printed "slow start 0–2" and raised slow_start on such curves."""
    options = DEFAULT_PHASE_OPTIONS
    within = []
    for run in demo_curves().values():
        for curve in [run["analysis_curve"], *(s["curve"] for s in run["samples"])]:
            y = np.asarray(curve)
            i = np.arange(len(y))
            departure = np.abs(y - np.polyval(np.polyfit(i, y, 1), i)).max()
            if np.ptp(y) > options["min_range"] and departure <= max(options["min_range"], LINE_NOISE * np.ptp(y)):
                within.append(curve)
    assert len(within) >= 3  # the demos' early samples: profiles taking shape, still within the noise of a line
    assert [detect_phases(curve, **options) for curve in within] == [None] * len(within)
