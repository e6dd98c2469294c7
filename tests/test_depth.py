"""recommend_depth: each candidate rule on synthetic curves, idle blocks, fallbacks and bad input."""

import pytest

from isiwatch.measure.analysis import Analysis
from isiwatch.measure.depth import RULES, candidate_drops, knee, recommend_depth


def analysis_of(**layers) -> Analysis:
    depth = len(next(iter(layers.values())))
    return Analysis({k: list(map(float, v)) for k, v in layers.items()}, {}, {"depth": depth})


RISING_THEN_FLAT = [0.3, 0.5, 0.7, 0.85, 0.895, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]
BUSY = [0.3] * 12


def test_knee_is_the_first_block_within_tolerance_of_the_last():
    assert knee(RISING_THEN_FLAT, 0.01) == 4
    assert knee(RISING_THEN_FLAT, 0.0) == 5
    assert knee(RISING_THEN_FLAT, 0.2) == 2
    assert knee([0.9, 0.5, 0.9], 0.01) == 0  # a dip after the first block does not move the knee


PROBE_KNEE = ("probe_knee",)


def test_probe_knee_keeps_the_blocks_up_to_the_knee():
    result = recommend_depth(analysis_of(probe_cls=RISING_THEN_FLAT, probe_patch_mean=[0.1] * 12,
                                         block_influence=BUSY), rules=PROBE_KNEE)
    assert (result.depth, result.signal) == (5, "probe_knee")
    assert result.blocks_to_drop == tuple(range(5, 12)) and result.source_depth == 12
    # the better of the two probes counts: a patch-mean probe that is already good at block 1 wins
    early = [0.2, 0.9] + [0.9] * 10
    assert recommend_depth(analysis_of(probe_cls=RISING_THEN_FLAT, probe_patch_mean=early,
                                       block_influence=BUSY), rules=PROBE_KNEE).depth == 2
    # a looser tolerance cuts deeper
    assert recommend_depth(analysis_of(probe_cls=RISING_THEN_FLAT, block_influence=BUSY), tolerance=0.2,
                           rules=PROBE_KNEE).depth == 3


def test_default_drops_low_influence_blocks_and_falls_back_to_the_probe_knee():
    influence = [0.3, 0.2, 0.05, 0.2, 0.1, 0.2, 0.059, 0.061, 0.1, 0.0, 0.1, 0.1]  # 0.2 × max = 0.06
    result = recommend_depth(analysis_of(probe_cls=RISING_THEN_FLAT, block_influence=influence))
    assert (result.signal, result.blocks_to_drop, result.depth) == ("block_influence_0.2", (2, 6, 9), 9)
    old_file = recommend_depth(analysis_of(probe_cls=RISING_THEN_FLAT))  # an analysis without block influence
    assert (old_file.signal, old_file.depth) == ("probe_knee", 5)


def test_idle_blocks_are_dropped_wherever_they_are():
    influence = [0.3, 0.2, 0.0, 0.2, 0.1, 0.2, 0.0, 0.1, 0.1, 0.0, 0.1, 0.1]
    flat_probe = [0.9] * 12  # the knee is block 0: every later block is dropped by the probe rule
    result = recommend_depth(analysis_of(probe_cls=flat_probe, block_influence=influence), rules=PROBE_KNEE)
    assert result.depth == 1 and result.blocks_to_drop == tuple(range(1, 12))
    late_knee = [0.1] * 10 + [0.9, 0.9]  # knee at block 10: only the idle blocks go besides block 11
    result = recommend_depth(analysis_of(probe_cls=late_knee, block_influence=influence), rules=PROBE_KNEE)
    assert result.blocks_to_drop == (2, 6, 9, 11) and result.signal == "probe_knee+idle"
    # a rule whose signal is absent (no probe curves) leaves the idle blocks alone to decide
    result = recommend_depth(analysis_of(block_influence=influence), rules=PROBE_KNEE)
    assert result.signal == "idle" and result.blocks_to_drop == (2, 6, 9)


def test_no_signal_keeps_every_block_and_a_model_of_idle_blocks_keeps_one():
    result = recommend_depth(analysis_of(token_similarity=[0.1 * i for i in range(8)]))
    assert (result.depth, result.signal, result.blocks_to_drop) == (8, "none", ())
    result = recommend_depth(analysis_of(block_influence=[0.0, 0.0, 1e-6, 0.0]), rules=("block_influence_0.1",))
    assert result.depth == 1 and result.blocks_to_drop == (0, 1, 3)  # block 2 moves its input most


def test_plateau_rules_drop_the_plateau_after_its_first_block():
    curve = [0.1, 0.3, 0.5, 0.5, 0.5, 0.5, 0.7, 0.9]
    drops = candidate_drops(analysis_of(token_similarity=curve, isi=[0.1 * i for i in range(8)]))
    assert drops["token_similarity_plateau"] == [3, 4, 5]
    assert drops["isi_plateau"] is None  # a straight line has no plateau
    assert drops["probe_knee"] is None and drops["block_influence_0.1"] is None  # no such curves
    assert set(drops) == set(RULES)


def test_bad_arguments_are_refused():
    a = analysis_of(probe_cls=RISING_THEN_FLAT)
    with pytest.raises(ValueError, match="tolerance must be in"):
        recommend_depth(a, tolerance=-0.1)
    with pytest.raises(ValueError, match="unknown depth rule 'knee'"):
        recommend_depth(a, rules=("knee",))
