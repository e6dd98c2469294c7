"""The truncation report in sentences, for the terminal and the HTML report alike, so both tell one story: what
the recommended depth and the cut each mean and why they differ (`depth_story`), why the strategy dropped the
blocks it dropped (`dropped_line`), and the one sequence the search tested: its level, where it stopped and how
each candidate's repair was chosen (`sequence_line`). Each reads only the report dict (``truncate_report.json``);
fields an older report lacks leave their part out."""

from __future__ import annotations

from typing import Any

from .._utils.wording import points
from ..measure.phases import plateau_name
from .strategies import STRATEGIES
from .truncate_report import REPAIRS

__all__ = ["depth_story", "dropped_line", "judged", "sequence_line", "story_lines"]


def _blocks(blocks: list[int]) -> str:
    return ", ".join(map(str, blocks)) if blocks else "none"


def judged(search: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The figures the search's answer stands on, the winner's row (the model it tested is the one written), and
    its repair in words (`REPAIRS`); None when nothing was cut."""
    winner = search.get("winner")
    if not winner:
        return None
    return winner, REPAIRS.get(str(winner.get("repair")), "as cut")


def _validated(search: dict[str, Any], record: dict[str, Any], kind: str) -> str:
    """How the cut was certified: its validation drop (``record``'s, repaired as ``kind`` says) against the rule."""
    steps = record.get("healing_steps", 0)
    how = f"{kind} ({steps} healing steps)" if steps else f"{kind}, without healing"
    drop, confidence = record["validation_drop"], search.get("confidence") or 0
    bound = (f"at {100 * confidence:g} % confidence (upper bound {drop['upper_bound_points']:.2f})"
             if confidence else f"(observed {drop['points']:.2f}, a point estimate)")
    return f"validation drop within {points(search['max_drop'])} {bound}, {how}"


def _phases_line(report: dict[str, Any]) -> str | None:
    """The analysis's phases of the uncut model, in its own words (Cliff, plateau or slow start, Climb)."""
    phases = report.get("phases")
    if not isinstance(phases, dict) or not phases.get("plateau"):
        return None
    plateau = phases["plateau"]
    parts = [f"Cliff blocks {phases['cliff'][0]}–{phases['cliff'][1]}" if phases.get("cliff") else "",
             f"{plateau_name((plateau[0], plateau[1]))} blocks {plateau[0]}–{plateau[1]}",
             f"Climb blocks {phases['climb'][0]}–{phases['climb'][1]}" if phases.get("climb") else ""]
    return f"phases ({report.get('metric', 'analysis')}): " + ", ".join(p for p in parts if p)


def depth_story(report: dict[str, Any]) -> list[str] | None:
    """The recommended depth, the phases and the ``auto`` cut as a few short lines, one fact each: what the
    recommendation is, where the phases lie, what was cut and how it was certified, and why the depths agree or
    differ. None for a fixed strategy or a report without a recommendation."""
    search, recommendation = report.get("search"), report.get("recommendation")
    if not isinstance(search, dict) or not isinstance(recommendation, dict):
        return None
    depth, recommended = recommendation["source_depth"], recommendation["depth"]
    lines = [f"recommended: {recommended} of {depth} blocks ({recommendation['signal']}, one analysis pass of the "
             "uncut model; no accuracy measured)"]
    lines += [line for line in (_phases_line(report),) if line]
    figures = judged(search)
    if figures is None:
        lines.append(f"cut: none certified, so all {depth} blocks stay and nothing is written")
        if recommended < depth:
            lines.append("why they differ: no real cut passed the bound on the validation images")
        return lines
    kept, dropped = len(report["kept_blocks"]), report.get("dropped_blocks", [])
    lines += [f"cut: {kept} of {depth} blocks (dropped {_blocks(dropped)}), the fewest certified of the cuts tested",
              f"certified: {_validated(search, *figures)}"]
    if kept < recommended:
        lines.append("why they differ: " + ("one analysis pass cannot see what healing recovers; the search "
                                            "measured real cuts" if "healed" in figures[1] else
                                            "the search measured what real cuts lose, which one analysis pass "
                                            "cannot see"))
    elif kept > recommended:
        lines.append(f"why they differ: no cut to fewer than {kept} blocks was certified{_first_failure(search, kept)}")
    else:
        wanted = recommendation["blocks_to_drop"]
        lines.append("they agree" + ("" if sorted(dropped) == sorted(wanted) else
                                     f" on the depth, not on the blocks (recommended to drop {_blocks(wanted)})"))
    return lines


def _first_failure(search: dict[str, Any], kept: int) -> str:
    """Where the candidates stopped below ``kept`` blocks, as a clause: the first that failed there, or the
    candidate budget when none was tried."""
    failed = [c for c in search.get("candidates") or [] if c["keep"] < kept and not c["qualifies"]]
    if not failed:
        return " (the candidate budget ran out first)"
    first = max(failed, key=lambda c: c["keep"])
    how = REPAIRS.get(str(first.get("repair")), "as cut")
    return (f": the first that failed, keeping {first['keep']} ({how}), had an upper bound of "
            f"{first['validation_drop']['upper_bound_points']:.2f} points > {search['max_drop']:g}")


def dropped_line(report: dict[str, Any]) -> str | None:
    """The blocks the cut dropped and the strategy's reason for them; None when nothing was cut."""
    dropped = report.get("dropped_blocks")
    if not dropped:
        return None
    strategy = str(report.get("strategy", "")).removeprefix("auto: ")
    reason = STRATEGIES[strategy].description if strategy in STRATEGIES else strategy
    if strategy in ("bi", "angular"):
        reason += ", measured on the uncut model's healing images"
    line = f"dropped blocks {_blocks(dropped)} by {strategy} ({reason})"
    phases = report["phases"] if isinstance(report.get("phases"), dict) else {}
    plateau = phases.get("plateau")
    if plateau and strategy != "plateau" and set(dropped) != set(range(plateau[0] + 1, plateau[1] + 1)):
        name = plateau_name((plateau[0], plateau[1]))
        line += (f"; the {report.get('metric', 'phase')} {name} (blocks {plateau[0]}–{plateau[1]}) is another "
                 f"signal, which {strategy} does not follow")
    return line


def sequence_line(report: dict[str, Any]) -> str | None:
    """The one sequence an ``auto`` search tested: how many candidates, at which level, where it stopped, and how
    the repairs were chosen; None for a fixed strategy or a report without it."""
    search = report.get("search")
    if not isinstance(search, dict) or "stopped_at" not in search or not search.get("candidates"):
        return None
    tested, rule = search["candidates"], search.get("rule") or {}
    level = f"at alpha {rule['alpha']:g}" if search.get("confidence") else "by the point estimate"
    stopped = search["stopped_at"]
    failed = next((c for c in tested if not c["qualifies"]), None)
    where = ("every candidate tested qualified" if failed is None else
             f"it stopped at {stopped} blocks ({REPAIRS.get(str(failed.get('repair')), 'as cut')}, upper bound "
             f"{failed['validation_drop']['upper_bound_points']:.2f} > {search['max_drop']:g} points)")
    repairs = ", ".join(f"{n} {REPAIRS[r]}" for r in REPAIRS if (n := sum(c.get("repair") == r for c in tested)))
    return (f"sequence: {len(tested)} of {search.get('order', len(tested))} candidates tested in one fixed order "
            f"{level}, each repaired before the test as its discordant healing images chose ({repairs}); {where}")


def story_lines(report: dict[str, Any]) -> list[str]:
    """What the terminal prints after the verdict (``isiwatch truncate`` and ``isiwatch demo`` alike): the
    depth story (`depth_story`), the dropped blocks and why, the sequence tested."""
    return [*(depth_story(report) or []),
            *(line for line in (dropped_line(report), sequence_line(report)) if line)]
