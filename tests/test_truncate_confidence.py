"""The acceptance rule of ``truncate --strategy auto`` (an exact upper bound on the paired accuracy drop) and the
K-first search, on synthetic correctness vectors: no model is healed here."""

import numpy as np
import pytest

from isiwatch.truncation.confidence import AcceptanceRule, PairedDrop, upper_bound
from isiwatch.truncation.journal import SearchJournal
from isiwatch.truncation.search import CutSearch, Score, SearchProgress


def correctness(images, both, uncut_only, cut_only):
    """Per-image correctness of an uncut and a cut model: ``both`` right, then the discordant images."""
    uncut = [True] * (both + uncut_only) + [False] * cut_only
    cut = [True] * both + [False] * uncut_only + [True] * cut_only
    pad = images - len(uncut)
    return uncut + [False] * pad, cut + [False] * pad


def test_paired_counts_come_from_correctness_vectors():
    uncut, cut = correctness(500, 400, 6, 2)
    pair = PairedDrop.from_correct(uncut, cut)
    assert (pair.images, pair.uncut_only, pair.cut_only) == (500, 6, 2)
    assert pair.drop == pytest.approx((sum(uncut) - sum(cut)) / 500)
    with pytest.raises(ValueError, match="not the same images"):
        PairedDrop.from_correct(uncut, cut[:-1])


def test_the_point_estimate_passes_where_the_bound_does_not():
    pair = PairedDrop.from_correct(*correctness(500, 430, 6, 2))  # 0.8 points lost on validation
    assert AcceptanceRule(max_drop=1.0, confidence=0, tests=16).qualifies(pair)
    strict = AcceptanceRule(max_drop=1.0, confidence=0.95, tests=16)
    assert not strict.qualifies(pair) and strict.bound(pair) > 0.01
    # the same drop on many more images is certified
    assert AcceptanceRule(max_drop=1.0, confidence=0.95, tests=16).qualifies(PairedDrop(50_000, 200, 100))


def test_bonferroni_divides_the_error_over_the_tests_and_tightens_the_bound():
    pair = PairedDrop(1000, 12, 4)
    one, many = AcceptanceRule(2, 0.95, 1), AcceptanceRule(2, 0.95, 16)
    assert many.alpha == pytest.approx(0.05 / 16) and one.alpha == pytest.approx(0.05)
    assert pair.drop < one.bound(pair) < many.bound(pair)
    assert AcceptanceRule(2, 0, 16).bound(pair) == pair.drop


@pytest.mark.parametrize("images, uncut_only_rate, cut_only_rate", [
    (300, 0.03, 0.02),   # a true drop of 1 point among many discordant images
    (200, 0.01, 0.0),    # rare discordance, where normal approximations undercover
    (1000, 0.05, 0.05),  # no true drop
])
def test_the_bound_covers_the_true_drop_at_least_at_its_nominal_rate(images, uncut_only_rate, cut_only_rate):
    draws = np.random.default_rng(0).multinomial(images, [uncut_only_rate, cut_only_rate,
                                                          1 - uncut_only_rate - cut_only_rate], size=2000)
    true_drop = uncut_only_rate - cut_only_rate
    covered = np.mean([upper_bound(PairedDrop(images, int(a), int(b)), 0.05) >= true_drop - 1e-12
                       for a, b, _ in draws])
    assert covered >= 0.95


def test_images_needed_is_the_fewest_on_which_a_perfect_cut_qualifies():
    rule = AcceptanceRule(max_drop=1.0, confidence=0.95, tests=17)
    needed = rule.images_needed()
    assert needed is not None and 500 < needed < 1000  # the 500 validation digits cannot certify 1 point
    assert rule.qualifies(PairedDrop(needed, 0, 0)) and not rule.qualifies(PairedDrop(needed - 1, 0, 0))
    assert not rule.certifiable(500) and rule.certifiable(needed)
    assert AcceptanceRule(0.0, 0.95, 4).images_needed() is None  # nothing certifies a zero drop
    assert AcceptanceRule(0.0, 0.0, 4).images_needed() == 1


def search_with(accuracy_of, depth=12, max_drop=1.0, budget=16, reference=0.9, confidence=0.0, images=1000,
                journal=None):
    """A CutSearch whose healed accuracy is ``accuracy_of(strategy, keep)``; the cut loses or gains the
    difference to ``reference`` on that many discordant images."""
    def heal_and_score(strategy, kept):
        healed = accuracy_of(strategy, len(kept))
        worse = round((reference - healed) * images)
        return Score(0.0, healed, PairedDrop(images, max(worse, 0), max(-worse, 0)), 1)

    def blocks_for(strategy, keep):
        order = {"bi": range(depth), "angular": range(depth - 1, -1, -1), "tail": range(depth)}.get(strategy)
        return None if order is None else sorted(list(order)[:keep])
    rule = AcceptanceRule(max_drop, confidence, budget)
    return CutSearch(depth, rule, budget, blocks_for, heal_and_score, journal=journal)


def test_search_moves_along_k_with_the_best_strategy_first():
    search = search_with(lambda s, k: 0.9 if k >= 5 else 0.5)
    winner = search.run(start=8)
    assert winner.keep == 5 and winner.qualifies and winner.strategy == "bi"
    # bisection with bi from the recommended K; the others only at K=4, just below the answer (tail's cut is bi's)
    assert [(c.strategy, c.keep) for c in search.candidates] == [("bi", 8), ("bi", 4), ("bi", 6), ("bi", 5),
                                                                 ("angular", 4)]


def test_search_without_a_recommendation_starts_in_the_middle_and_reaches_a_cut():
    search = search_with(lambda s, k: 0.9 if k >= 9 else 0.5, budget=4)
    winner = search.run(start=None)
    assert [(c.strategy, c.keep) for c in search.candidates] == [("bi", 6), ("bi", 9), ("bi", 8), ("angular", 8)]
    assert winner.keep == 9


def test_another_strategy_decides_the_answer_below_the_best_ones():
    search = search_with(lambda s, k: 0.9 if k >= 6 or (s == "angular" and k >= 4) else 0.5)
    winner = search.run(start=None)
    assert (winner.strategy, winner.keep) == ("angular", 4)
    assert ("angular", 3) in [(c.strategy, c.keep) for c in search.candidates]  # kept going down while it won


def test_the_bound_can_refuse_what_the_point_estimate_accepts():
    accuracy_of = lambda s, k: 0.895 if k >= 6 else 0.5  # noqa: E731  (0.5 points below the uncut model)
    assert search_with(accuracy_of, images=500).run(start=8).keep == 6
    certified = search_with(accuracy_of, images=500, confidence=0.95)
    assert certified.run(start=8) is None
    assert all(c.bound > 0.01 for c in certified.candidates)
    assert certified.closest().keep == 8  # nearest to qualifying (all tie here: the fewest blocks)


def test_budget_bounds_the_candidates_screened():
    search = search_with(lambda s, k: 0.9 if k >= 5 else 0.5, budget=2)
    assert search.run(start=8).keep == 8 and len(search.candidates) == 2


def test_a_journal_replays_finished_candidates_without_healing_them(tmp_path):
    path = tmp_path / "search.jsonl"
    accuracy_of = lambda s, k: 0.9 if k >= 5 else 0.5  # noqa: E731
    first = search_with(accuracy_of, budget=3, journal=SearchJournal(path, {"run": 1}))
    first.run(start=8)
    assert len(path.read_text().splitlines()) == 1 + 3
    healed = []

    def counting(s, k):
        healed.append(k)
        return accuracy_of(s, k)
    resumed = search_with(counting, journal=SearchJournal(path, {"run": 1}, resume=True))
    full = search_with(accuracy_of)
    assert resumed.run(start=8).kept == full.run(start=8).kept
    assert healed == [c.keep for c in full.candidates[3:]]  # only those the first run had not finished
    assert [c.resumed for c in resumed.candidates] == [True] * 3 + [False] * (len(full.candidates) - 3)
    with pytest.raises(ValueError, match="journals a different search \\(run differ\\)"):
        SearchJournal(path, {"run": 2}, resume=True)


def test_no_progress_bar_when_stderr_is_not_a_terminal():
    progress = SearchProgress(100, 4, enabled=True)  # pytest captures stderr: not a TTY
    assert not progress.shown
    progress.close()


def report_of(uncut_blocks, cut_blocks, uncut_ms, cut_ms, differs):
    cost = {"uncut": {"blocks": uncut_blocks, "parameters": 100, "flops_per_image": 2e6, "latency_ms": uncut_ms},
            "truncated": {"blocks": cut_blocks, "parameters": 50, "flops_per_image": 1e6, "latency_ms": cut_ms}}
    return {"cost": cost, "accuracy": {"uncut": 0.9, "cut": 0.8, "healed": 0.89},
            "agreement": {"cut": 0.85, "healed": 0.95}, "latency_batch": 64, "latency_differs": differs,
            "kept_blocks": list(range(cut_blocks)), "strategy": "auto: bi"}


def test_an_uncut_result_is_one_row_and_a_speedup_within_noise_reads_so():
    from isiwatch.truncation.cost import differs
    from isiwatch.truncation.truncate_report import report_rows, report_table

    _, rows = report_rows(report_of(12, 12, 61.3, 65.9, differs=False))
    assert [r[0] for r in rows] == ["uncut"]  # no cut/healed rows identical to the uncut model
    assert "uncut model kept" in report_table(report_of(12, 12, 61.3, 65.9, differs=False))
    _, rows = report_rows(report_of(12, 11, 61.3, 60.9, differs=False))
    assert [r[5] for r in rows] == ["", "within noise", "within noise"]
    _, rows = report_rows(report_of(12, 6, 61.3, 30.0, differs=True))
    assert rows[1][5] == "2.04x"
    assert differs([30, 31, 30.5, 29.8], [60, 61, 62, 59]) and not differs([30, 33, 31, 35], [32, 36, 30, 34])
