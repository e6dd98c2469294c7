"""Every alert record says what to try next (its ``hint``, from the one table `isiwatch.measure.vocabulary.HINTS`):
the record, the terminal line, the report's alert table and the friction alert carry it, and records and resume
states written before hints existed still read."""

import json
import re

from click.testing import CliRunner
from test_alert_rules import rules, sample
from test_vocabulary import slow_start_run  # noqa: F401  (the fixture the report test uses)

from isiwatch.cli.commands import main
from isiwatch.measure.phases import Phases, PlateauTracker
from isiwatch.measure.vocabulary import HINTS, alert_hint
from isiwatch.watch.alerts import ALERT_KINDS, Alert, AlertEngine, alert_line
from isiwatch.watch.freezing import KIND as FREEZE_KIND
from isiwatch.watch.friction import friction_alert
from isiwatch.watch.monitor import INTERVAL_KIND


def test_every_alert_kind_and_action_record_has_a_hint_naming_something_to_do():
    assert set(HINTS) == {*ALERT_KINDS, "early_stop", FREEZE_KIND} and all(HINTS.values())
    assert Alert(INTERVAL_KIND, 1, 0.0, "r", "info", "m").hint == ""  # the Watch's own bookkeeping: nothing to do
    for kind in HINTS:  # what each record of the kind carries, however it was made (engine, fault log, action)
        assert Alert(kind, 1, 0.0, "r", "info", "m").hint == alert_hint(kind) == HINTS[kind].replace("{span}", "")
    assert "`isiwatch truncate CHECKPOINT --data DATA --max-drop 1 --out OUT`" in HINTS["plateau_onset"]
    assert "learning rate" in HINTS["isi_stall"] and "warmup" in HINTS["isi_stall"]
    assert "global_pool='avg'" in HINTS["cls_marginalized"]
    assert "clip" in HINTS["non_finite"] and "learning rate" in HINTS["non_finite"]
    assert "isiwatch specialize" in HINTS["norm_friction_high"]


def test_an_opened_record_names_its_span_and_a_cleared_one_has_nothing_to_do():
    r, tracker, records = rules(), PlateauTracker(patience=1), []
    engine = AlertEngine("run", [records.append])
    for step, phases in ((1, Phases((2, 5), (0, 1), (6, 7))), (2, None)):
        tracker.update(step, phases)
        engine.update(step, r.conditions(sample(step, {"token_similarity": [0.0] * 8}, phases=phases), tracker))
    opened, cleared = records
    assert (opened.kind, cleared.kind) == ("plateau_onset", "plateau_onset_cleared")
    assert opened.hint == HINTS["plateau_onset"].replace("{span}", " (blocks 2–5)")
    assert opened.to_dict()["hint"] == opened.hint and cleared.to_dict()["hint"] == ""
    assert alert_line(opened) == f"[plateau_onset] step 1: {opened.message} (hint: {opened.hint})"
    assert alert_line(cleared) == f"[plateau_onset_cleared] step 2: {cleared.message}"


def test_a_resume_state_saved_before_hints_keeps_its_open_episodes_hint():
    engine = AlertEngine("run")
    state = {"active": ["plateau_onset"], "opened": {"plateau_onset": {
        "step": 4, "time": 1.0, "message": "m", "data": {"plateau": [1, 3]}}}}  # no hint: an older state
    engine.load_state_dict(state)
    assert engine.opened["plateau_onset"].hint == alert_hint("plateau_onset", {"plateau": [1, 3]})
    again = AlertEngine("run")
    again.load_state_dict(engine.state_dict())
    assert again.opened["plateau_onset"] == engine.opened["plateau_onset"]


def test_the_friction_alert_carries_its_hint():
    assert friction_alert([0.3])["hint"] == alert_hint("norm_friction_high")


def test_the_reports_alert_table_shows_each_records_hint_and_an_older_records_kind_hint(slow_start_run,  # noqa: F811
                                                                                       tmp_path):
    records = [json.loads(line) for line in (slow_start_run / "alerts.jsonl").read_text().splitlines()]
    older = {k: v for k, v in Alert("non_finite", 4, 0.0, "r", "critical", "m").to_dict().items() if k != "hint"}
    (slow_start_run / "alerts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*records, older]))
    result = CliRunner().invoke(main, ["report", str(slow_start_run), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "r" / "report.html").read_text().replace("&#x27;", "'")
    alerts = page[page.index("<h2>Alerts</h2>"):]
    assert "<th>hint</th>" in alerts
    rows = re.findall(r"<tr><td>(\d+)</td><td>(\w+)</td><td>\w+</td><td>.*?</td><td>(.*?)</td></tr>", alerts)
    assert rows == [("1", "isi_stall", alert_hint("isi_stall")), ("2", "isi_stall_cleared", ""),
                    ("3", "slow_start", alert_hint("slow_start")), ("4", "non_finite", alert_hint("non_finite"))]
    assert "'hint' is not a string" in CliRunner().invoke(main, ["report", str(_with_bad_hint(slow_start_run))]).output


def _with_bad_hint(run):
    """``run`` with a last alert record whose hint is not a string."""
    lines = (run / "alerts.jsonl").read_text().splitlines()
    bad = {**json.loads(lines[-1]), "hint": 3}
    (run / "alerts.jsonl").write_text("\n".join([*lines[:-1], json.dumps(bad)]) + "\n")
    return run
