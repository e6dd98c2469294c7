"""The truncation report in sentences (isiwatch.truncation.explain): the recommended depth and the cut reconciled,
the strategy's reason for the dropped blocks, the one sequence the search tested."""

import pytest

from isiwatch.truncation.explain import depth_story, dropped_line, sequence_line, story_lines


def candidate(keep, points, bound, qualifies, repair="heal", steps=64, winner=False):
    healed = "heal" in repair
    return {"strategy": "bi", "keep": keep, "kept_blocks": list(range(keep)), "repair": repair,
            "choice": {"calibration_images": 1000, "predicted_bound_points": {"cut": 8.1, "bridged": 5.6},
                       "heal": healed},
            "healing_steps": steps if healed else 0,
            "validation_accuracy": {"cut": 0.85, "healed": 0.87},
            "validation_drop": {"points": points, "upper_bound_points": bound, "images": 500},
            "qualifies": qualifies, "winner": winner, "resumed": False}


def report(recommended, dropped, candidates, *, depth=12, plateau=(6, 8), strategy="auto: bi", heal_steps=64,
           recommended_drop=None):
    winner = next((c for c in candidates if c["winner"]), None)
    stopped = next((c["keep"] for c in candidates if not c["qualifies"]), None)
    kept = [b for b in range(depth) if b not in dropped]
    return {"strategy": strategy if winner else "auto: nothing cut", "kept_blocks": kept, "dropped_blocks": dropped,
            "metric": "token_similarity", "healing_steps": winner["healing_steps"] if winner else 0,
            "phases": {"cliff": [0, 5], "plateau": list(plateau), "climb": [9, 11]} if plateau else None,
            "recommendation": {"depth": recommended, "signal": "block_influence_0.2", "source_depth": depth,
                               "blocks_to_drop": recommended_drop if recommended_drop is not None
                               else list(range(recommended, depth))},
            "search": {"max_drop": 5.0, "confidence": 0.95, "heal_steps": heal_steps, "budget": 5,
                       "rule": {"max_drop": 5.0, "confidence": 0.95, "alpha": 0.05}, "order": depth - 1,
                       "candidates": candidates, "winner": winner, "stopped_at": stopped,
                       "message": None if winner else "no cut: ...; kept the uncut model"}}


#: The full demo: 12 of 12 recommended, 9 of 12 cut, a plateau at 6-8 and blocks 4, 7, 8 dropped; the winner,
#: healed in full, within 2.34 points.
DEMO = report(12, [4, 7, 8], [candidate(11, 0.2, 1.9, True, repair="bridge"),
                              candidate(10, 0.8, 2.9, True),
                              candidate(9, -0.2, 2.34, True, winner=True),
                              candidate(8, 4.0, 7.1, False)],
              recommended_drop=[])


def test_the_demo_reads_as_one_story():
    """Issue 40: the recommended depth, the phases and the cut in short lines, one fact each, in the analysis's
    phase words, not one long sentence; issue 49: the sequence it tested, its level, where it stopped and how the
    repairs were chosen."""
    story = depth_story(DEMO)
    assert story == [
        "recommended: 12 of 12 blocks (block_influence_0.2, one analysis pass of the uncut model; no accuracy "
        "measured)",
        "phases (token_similarity): Cliff blocks 0–5, plateau blocks 6–8, Climb blocks 9–11",
        "cut: 9 of 12 blocks (dropped 4, 7, 8), the fewest certified of the cuts tested",
        "certified: validation drop within 5 points at 95 % confidence (upper bound 2.34), healed (64 healing "
        "steps)",
        "why they differ: one analysis pass cannot see what healing recovers; the search measured real cuts"]
    assert all(len(line) <= 120 for line in story)
    assert dropped_line(DEMO) == (
        "dropped blocks 4, 7, 8 by bi (ShortGPT block influence: drop the blocks that turn their input least, "
        "measured on the uncut model's healing images); the token_similarity plateau (blocks 6–8) is another signal, "
        "which bi does not follow")
    assert sequence_line(DEMO) == (
        "sequence: 4 of 11 candidates tested in one fixed order at alpha 0.05, each repaired before the test as its "
        "discordant healing images chose (1 bridged, 3 healed); it stopped at 8 blocks (healed, upper bound 7.10 > 5 "
        "points)")
    assert story_lines(DEMO) == [*story, dropped_line(DEMO), sequence_line(DEMO)]


def test_a_cut_deeper_than_recommended_names_where_the_search_stopped():
    r = report(3, [3, 4], [candidate(5, 0.4, 2.0, True, repair="none"),
                           candidate(4, 1.0, 3.0, True, repair="none", winner=True),
                           candidate(3, 4.4, 8.54, False, repair="none")], depth=6, plateau=None)
    story = depth_story(r)
    assert story[1].startswith("cut: 4 of 6 blocks") and story[2].endswith("as cut, without healing")
    assert story[-1] == ("why they differ: no cut to fewer than 4 blocks was certified: the first that failed, "
                         "keeping 3 (as cut), had an upper bound of 8.54 points > 5")
    assert sequence_line(r).endswith("(3 as cut); it stopped at 3 blocks (as cut, upper bound 8.54 > 5 points)")
    assert dropped_line(r).endswith("healing images)")  # no plateau to compare with
    r["search"]["winner"]["repair"] = "bridge"
    assert depth_story(r)[2].endswith("bridged, without healing")  # the repair it was certified with


@pytest.mark.parametrize("dropped, agree", [([4, 5], "they agree"),
                                            ([1, 5], "they agree on the depth, not on the blocks (recommended to drop "
                                                     "4, 5)")])
def test_the_same_depth_agrees_and_says_when_the_blocks_differ(dropped, agree):
    r = report(4, dropped, [candidate(5, 0.1, 1.0, True), candidate(4, 0.5, 2.0, True, winner=True),
                            candidate(3, 6.0, 9.0, False)], depth=6, plateau=None)
    story = depth_story(r)
    assert story[-1] == agree
    assert story[-2].endswith("at 95 % confidence (upper bound 2.00), healed (64 healing steps)")


def test_every_candidate_qualifying_is_said_so():
    r = report(4, [4, 5], [candidate(5, 0.1, 1.0, True, repair="none"),
                           candidate(4, 0.5, 2.0, True, repair="none", winner=True)], depth=6, plateau=None)
    r["search"]["order"] = 2
    assert sequence_line(r).endswith("(2 as cut); every candidate tested qualified")


def test_no_cut_and_a_fixed_strategy():
    r = report(9, [], [candidate(11, 6.0, 9.0, False)])
    assert depth_story(r)[2:] == ["cut: none certified, so all 12 blocks stay and nothing is written",
                                  "why they differ: no real cut passed the bound on the validation images"]
    assert dropped_line(r) is None
    assert sequence_line(r).endswith("(1 healed); it stopped at 11 blocks (healed, upper bound 9.00 > 5 points)")
    fixed = {**DEMO, "strategy": "tail", "search": None}
    assert depth_story(fixed) is None and sequence_line(fixed) is None
    assert dropped_line(fixed).startswith("dropped blocks 4, 7, 8 by tail (keep the first blocks)")
