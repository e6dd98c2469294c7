import numpy as np
import pytest

from isiwatch import Phases, detect_phases


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
