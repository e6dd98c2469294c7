"""Probe comparisons beyond the probes' own noise: the exact paired test and its hysteresis, behind the
cls_marginalized alert and the published depth, on hand-made held-out predictions (38 held out, as with 128 probe
images)."""

import sys
from pathlib import Path

import pytest
from scipy.stats import binomtest

from isiwatch.measure.depth import DepthRecommendation
from isiwatch.measure.phases import PlateauTracker
from isiwatch.watch.alerts import AlertEngine, AlertRules
from isiwatch.watch.probe_evidence import PairedProbes, holds
from isiwatch.watch.published_depth import PublishedDepth
from isiwatch.watch.sample import Sample

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from alert_noise import old_rule  # noqa: E402  (the rule the benchmark replays)

HELD_OUT = 38


def right(*images: int) -> tuple[bool, ...]:
    """Correct on exactly ``images`` of the held-out images."""
    return tuple(i in images for i in range(HELD_OUT))


def cls_sample(step: int, cls: tuple[bool, ...], patch: tuple[bool, ...]) -> Sample:
    """A two-block sample whose last-block probes classify the held-out images as ``cls`` and ``patch``."""
    layers = {"probe_cls": [0.1, sum(cls) / HELD_OUT], "probe_patch_mean": [0.1, sum(patch) / HELD_OUT]}
    return Sample(step, 0.0, layers, None, 0.0, held_out={"probe_cls": [None, cls], "probe_patch_mean": [None, patch]})


def cls_records(samples: list[Sample]) -> list[tuple[str, int]]:
    rules = AlertRules("token_similarity", 3, 0.05, 0.1, probe_confidence=0.95)
    engine, tracker = AlertEngine("run"), PlateauTracker()
    records = []
    for s in samples:
        records += engine.update(s.step, rules.conditions(s, tracker, engine.active))
    return [(r.kind, r.step) for r in records if r.kind.startswith("cls_marginalized")]


def test_the_exact_test_is_mcnemars_and_its_p_value_agrees_with_its_decision():
    for only_first in range(12):
        for only_second in range(12):
            pair = PairedProbes(3, only_first, only_second, 2)
            discordant = only_first + only_second
            p = binomtest(only_second, discordant, 0.5, alternative="greater").pvalue if discordant else 1.0
            assert pair.p_value == pytest.approx(p)
            assert pair.second_better(0.95) == (p < 0.05), (only_first, only_second)
    assert PairedProbes.of(right(0, 1, 2), right(1, 2, 3, 4)) == PairedProbes(2, 1, 2, HELD_OUT - 5)
    assert holds(False, PairedProbes(0, 0, 6, 0), 0.95) and not holds(False, PairedProbes(0, 1, 6, 0), 0.95)
    assert holds(True, PairedProbes(0, 1, 2, 0), 0.95) and not holds(True, PairedProbes(0, 2, 2, 0), 0.95)


def test_a_one_image_difference_no_longer_opens_and_closes_cls_marginalized():
    """9 of 38 against 8 or 9 of 38 right, alternating (the demo's step 50 and 60): the old rule opened and closed
    three times, the exact test never opens."""
    patch = right(*range(9))
    samples = [cls_sample(10 * k, right(*range(1, 9)) if k % 2 else right(*range(1, 9), 20), patch)
               for k in range(1, 7)]
    assert old_rule(samples) == [("cls_marginalized", 10), ("cls_marginalized_cleared", 20),
                                 ("cls_marginalized", 30), ("cls_marginalized_cleared", 40),
                                 ("cls_marginalized", 50), ("cls_marginalized_cleared", 60)]
    assert cls_records(samples) == []


def test_a_real_shift_opens_at_the_same_sample_and_the_episode_ends_where_it_did():
    """[CLS] on par for 3 samples, then 10 images behind for 3: opens at the same sample as the old rule; then 3
    behind, which would not open an episode but keeps the open one (the hysteresis), then level: closes, at the same
    sample as the old rule."""
    patch = right(*range(20))
    level, far_behind, three_behind = right(*range(20)), right(*range(10)), right(*range(17))
    samples = [cls_sample(10 * k, c, patch)
               for k, c in enumerate([level] * 3 + [far_behind] * 3 + [three_behind, level], 1)]
    assert old_rule(samples) == [("cls_marginalized", 40), ("cls_marginalized_cleared", 80)]
    assert cls_records(samples) == [("cls_marginalized", 40), ("cls_marginalized_cleared", 80)]
    assert cls_records([cls_sample(70, three_behind, patch)]) == []


def depth_sample(step: int, proposed: int, rows: list[tuple[bool, ...]]) -> Sample:
    """A sample of a ``len(rows)``-block model whose rule proposes ``proposed`` blocks and whose [CLS] probe at
    block b classifies the held-out images as ``rows[b]``."""
    blocks = len(rows)
    proposal = DepthRecommendation(proposed, "block_influence_0.2", tuple(range(proposed, blocks)), blocks)
    return Sample(step, 0.0, {"probe_cls": [sum(r) / HELD_OUT for r in rows]}, None, 0.0, recommendation=proposal,
                  held_out={"probe_cls": list(rows)})


def published(samples: list[Sample], labelled: bool = True) -> list[int]:
    gate = PublishedDepth(0.95, labelled)
    return [gate.publish(s).recommendation.depth for s in samples]


def test_the_published_depth_holds_through_proposals_the_probes_cannot_tell_apart():
    """The rule proposes 2, 1, 3, 2, 1, 1 blocks (a 6-block run's sequence) while each block's probe gets one image
    more right than the block before: published 2 throughout, with the evidence of each refused proposal."""
    rows = [right(*range(8 + b)) for b in range(6)]
    samples = [depth_sample(10 * k, d, rows) for k, d in enumerate([2, 1, 3, 2, 1, 1], 1)]
    assert published(samples, labelled=False) == [2, 1, 3, 2, 1, 1]  # no labels, nothing to weigh: the rule's
    assert published(samples) == [2] * 6
    evidence = samples[2].depth_evidence
    assert evidence == {"proposed": 3, "previous": 2, "probe": "probe_cls", "held_out": HELD_OUT,
                        "both_correct": 9, "only_shallow": 0, "only_deep": 1, "neither": 28, "p_value": 0.5,
                        "confidence": 0.95, "published": 2}
    assert samples[0].depth_evidence is None


def test_the_published_depth_follows_a_real_change():
    """Block 3's probe 12 images ahead of block 1's: a proposal of 4 blocks is published at once; blocks that stop
    being observed better are dropped again at once; a sample without probes keeps the published depth."""
    flat = [right(*range(10))] * 6
    better = [right(*range(10))] * 3 + [right(*range(22))] * 3
    samples = [depth_sample(10, 2, flat), depth_sample(20, 4, better), depth_sample(30, 2, better),
               depth_sample(40, 2, flat)]
    no_probes = depth_sample(50, 5, flat)
    no_probes.held_out = {}
    assert published([*samples, no_probes]) == [2, 4, 4, 2, 2]


def test_a_watch_sample_holds_the_probes_held_out_predictions_behind_its_accuracies():
    """Each probe's held-out predictions, read in the sample's one host read, average to its accuracy: 19 of the 64
    probe images are held out."""
    import timm
    import torch

    from isiwatch import Watch
    from isiwatch.io.data import embedded_digits

    x, y = embedded_digits()
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=28, patch_size=7, in_chans=1, num_classes=10,
                              embed_dim=32, depth=3, num_heads=2)
    watch = Watch(model, x[4000:4064], y[4000:4064], every_n_steps=1, strict=True)
    watch.sample(1)
    s = watch.history[-1]
    watch.close(final_sample=False)
    assert set(s.held_out) == {"probe_cls", "probe_patch_mean"}
    for probe, rows in s.held_out.items():
        assert len(rows) == 3 and all(row is not None and len(row) == 19 for row in rows)
        assert [sum(row) / 19 for row in rows] == pytest.approx(s.layers[probe], abs=1e-6)
