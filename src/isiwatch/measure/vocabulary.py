"""The words isiwatch shows for phases and alert states, one name per concept, each with its definition.

The terminal (``analyze``, ``demo``), alert records, the HTML report, TensorBoard's text and the docs
(``docs/metrics.md``, ``docs/alerts.md``, checked against this table by ``tests/test_vocabulary.py``) all take their
words from here, so one stretch of blocks never has two names.
"""

from __future__ import annotations

#: The phases of a per-layer curve (`isiwatch.measure.phases`), in depth order. A flat stretch has one name by where
#: it starts (`plateau_name`): "slow start" from block 0, else "plateau".
PHASES = {
    "cliff": "a steep change of the curve over the first blocks, before a flat stretch (the paper's Cliff)",
    "plateau": "a flat stretch after a Cliff (the paper's Plateau): the blocks there barely change the curve",
    "slow start": "a flat stretch from block 0, with no Cliff before it: the first blocks barely change the curve yet",
    "climb": "the change after the flat stretch, to the last block",
}

#: The states of an alert episode, as the report writes them after the step an episode opened at.
EPISODES = {
    "open": "the alert's condition still held at the last sample: no cleared record has closed the episode yet",
    "cleared": "the condition went away at that step: a cleared record (kind plateau_onset_cleared for plateau_onset, "
               "and so on) closed the episode",
}

#: Every kind of alert record: the episode kinds (a ``<kind>_cleared`` record closes each), then the two records
#: of an action (no episode).
ALERTS = {
    "plateau_onset": "a plateau (after a Cliff) has kept a stable span for plateau_patience samples",
    "slow_start": "a slow start (a flat stretch from block 0) has kept a stable span for plateau_patience samples",
    "isi_stall": "over the last isi_stall_window samples the mean ISI rose by at most isi_stall_min_rise while the "
                 "loss fell by at least isi_stall_min_loss_drop (both relative)",
    "cls_marginalized": ("the [CLS] probe scores below the mean-patch probe at the last block, beyond the probes' "
                         "noise (exact paired test at probe_confidence; closes once [CLS] is not behind at all)"),
    "non_finite": "NaN or infinite values in a curve or the loss",
    "norm_friction_high": "norm_friction reaches norm_friction_threshold at some block",
    "monitor_error": "a part of the Watch failed (the probe pass, an exporter, the alert rules, alert_callback, the "
                     "freeze policy); training goes on",
    "early_stop": "the Watch asked training to stop (an action: no episode to clear)",
    "blocks_frozen": "freeze_settled froze the settled blocks (an action: no episode to clear)",
    "sampling_interval": "overhead_budget changed the steps between samples (at most doubled per sample, never past "
                         "16 x every_n_steps; a record, no episode to clear)",
}

#: The alert kinds that record an action, not a condition: no episode, so nothing to clear or to leave open.
ACTIONS = ("early_stop", "blocks_frozen", "sampling_interval")

#: Every word above with its definition: what a glossary renders.
VOCABULARY = {**PHASES, **EPISODES, **ALERTS}


def plateau_name(span: tuple[int, int]) -> str:
    """The name of a flat stretch of blocks ``span``: "slow start" from block 0 (no Cliff before it), else
    "plateau"."""
    return "slow start" if span[0] == 0 else "plateau"


def legend(words: list[str] | tuple[str, ...]) -> str:
    """One line defining ``words`` (in their order, each once): ``slow start: ...; climb: ...``."""
    return "; ".join(f"{w}: {VOCABULARY[w]}" for w in dict.fromkeys(words))


#: The tables the docs pages hold between ``<!-- vocabulary: NAME -->`` and ``<!-- /vocabulary: NAME -->``
#: (``tests/test_vocabulary.py`` keeps each equal to `markdown_table`): name → (first column's header, words,
#: whether the words are code).
DOC_TABLES = {"phases": ("phase", PHASES, False), "alerts": ("alert kind", ALERTS, True),
              "episodes": ("episode", EPISODES, False)}


def markdown_table(name: str) -> str:
    """The Markdown table ``name`` of `DOC_TABLES`: each word and its definition."""
    header, words, code = DOC_TABLES[name]
    rows = [f"| {header} | meaning |", "|---|---|"]
    return "\n".join(rows + [f"| {f'`{w}`' if code else w} | {d} |" for w, d in words.items()])


def alert_words(kind: str) -> list[str]:
    """The words that define alert record ``kind``: the kind, plus "cleared" for a ``<kind>_cleared`` record; none
    for a kind this table does not know (a record of another version)."""
    opened = kind.removesuffix("_cleared")
    return ([opened] if opened in ALERTS else []) + (["cleared"] if opened != kind else [])


class Glossary:
    """Defines each word the first time it is shown, so a terminal log says what a word means without repeating
    it on every line."""

    def __init__(self) -> None:
        self.shown: set[str] = set()

    def new(self, words: list[str]) -> str:
        """`legend` of the ``words`` not shown before ("" when none), now counted as shown."""
        fresh = [w for w in dict.fromkeys(words) if w not in self.shown]
        self.shown.update(fresh)
        return legend(fresh)
