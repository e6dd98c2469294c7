"""One vocabulary (`isiwatch.measure.vocabulary`): each state word a user sees — the phases, the alert kinds, "open"
and "cleared" — has one name and one definition, and the terminal, the alert records, the HTML report, TensorBoard's
text and the docs all render that table."""

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_watch import tiny_vit

from isiwatch import Watch
from isiwatch.cli.commands import main
from isiwatch.io.data import embedded_digits
from isiwatch.measure.analysis import Analysis
from isiwatch.measure.phases import Phases
from isiwatch.measure.tables import phases_line
from isiwatch.measure.vocabulary import ALERTS, DOC_TABLES, EPISODES, PHASES, alert_hint, markdown_table
from isiwatch.watch.alerts import ALERT_KINDS, Alert
from isiwatch.watch.exporters.tensorboard import TensorBoardExporter
from isiwatch.watch.freezing import KIND as FREEZE_KIND
from isiwatch.watch.monitor import INTERVAL_KIND

DOCS = Path(__file__).resolve().parents[1] / "docs"
#: Where each table of the vocabulary is rendered in the docs.
PAGES = {"phases": "metrics.md", "alerts": "alerts.md", "episodes": "alerts.md"}


@pytest.mark.parametrize("name", DOC_TABLES)
def test_the_docs_tables_are_the_code_table(name):
    text = (DOCS / PAGES[name]).read_text(encoding="utf-8")
    start, end = f"<!-- vocabulary: {name} -->\n", f"\n<!-- /vocabulary: {name} -->"
    assert start in text and end in text, f"docs/{PAGES[name]} lacks the {name} table's markers"
    assert text[text.index(start) + len(start):text.index(end)] == markdown_table(name), (
        f"docs/{PAGES[name]}: the {name} table is not isiwatch.measure.vocabulary's; paste markdown_table({name!r})")


def test_every_alert_kind_is_defined_and_every_definition_is_a_kind():
    assert set(ALERTS) == {*ALERT_KINDS, "early_stop", FREEZE_KIND, INTERVAL_KIND}


def test_the_terminal_names_a_flat_stretch_from_block_0_a_slow_start_and_defines_each_word():
    curves = {"token_similarity": [0.1, 0.1, 0.1, 0.5, 0.9]}
    line = phases_line(Analysis(curves, {}, {"depth": 5}, phases=Phases((0, 2), None, (3, 4))))
    assert line.splitlines() == ["phases (token_similarity): slow start 0–2, climb 3–4",
                                 f"  slow start: {PHASES['slow start']}; climb: {PHASES['climb']}"]
    line = phases_line(Analysis(curves, {}, {"depth": 5}, phases=Phases((1, 3), (0, 0), (4, 4))))
    assert line.splitlines()[0] == "phases (token_similarity): cliff 0–0, plateau 1–3, climb 4–4"
    assert f"plateau: {PHASES['plateau']}" in line and f"cliff: {PHASES['cliff']}" in line


@pytest.fixture(scope="module")
def slow_start_run(tmp_path_factory):
    """A real Watch's run directory whose last sample holds a slow start over blocks 0–2, with a slow_start episode
    still open and an isi_stall episode that cleared."""
    x, y = embedded_digits()
    run = tmp_path_factory.mktemp("vocabulary") / "run"
    with Watch(tiny_vit(), x[4000:4064], y[4000:4064], every_n_steps=1, log_dir=run, run_folder=".") as watch:
        for step in (1, 2, 3):
            watch.step(step)
    samples = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    samples[-1]["phases"] = Phases((0, 2), None, (3, 3)).to_dict()
    (run / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    records = [Alert("isi_stall", 1, 0.0, "r", "warning", "m"), Alert("isi_stall_cleared", 2, 0.0, "r", "info", "m"),
               Alert("slow_start", 3, 0.0, "r", "info", "m")]
    (run / "alerts.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    return run


def test_the_report_names_the_stretch_as_the_terminal_does_and_defines_open_and_cleared(slow_start_run, tmp_path):
    result = CliRunner().invoke(main, ["report", str(slow_start_run), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "r" / "report.html").read_text()
    summary = page[page.index("<h2>Summary</h2>"):page.index("<h2>", page.index("<h2>Summary</h2>") + 1)]
    rows = dict(re.findall(r"<tr><td>(.*?)</td><td>(.*?)</td></tr>", summary))
    assert rows["flat stretch at the last sample"] == "slow start, blocks 0–2"
    # the alert rows name the alert kind, so "slow start" never reads "none" beside a slow start
    assert rows["slow_start alerts"] == "step 3 (open)" and rows["plateau_onset alerts"] == "none"
    assert "slow start" not in rows
    defined = dict(re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", summary.replace("&#x27;", "'")))
    assert {word: defined.get(word) for word in ("slow start", "slow_start", "plateau_onset", "open", "cleared")} == {
        "slow start": PHASES["slow start"], "slow_start": ALERTS["slow_start"],
        "plateau_onset": ALERTS["plateau_onset"], "open": EPISODES["open"], "cleared": EPISODES["cleared"]}
    alerts = page[page.index("<h2>Alerts</h2>"):].replace("&#x27;", "'")
    defined = dict(re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", alerts))
    assert defined == {"isi_stall": ALERTS["isi_stall"], "slow_start": ALERTS["slow_start"],
                       "cleared": EPISODES["cleared"]}


def test_tensorboard_text_defines_the_alert_kind(tmp_path):
    exporter = TensorBoardExporter(tmp_path)
    exporter.write_alert(Alert("slow_start", 4, 0.0, "r", "info", "slow start over blocks 0–2 of token_similarity"))
    exporter.write_alert(Alert("slow_start_cleared", 6, 0.0, "r", "info", "slow_start cleared"))
    exporter.writer.close()
    events = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    events.Reload()
    texts = [e.tensor_proto.string_val[0].decode() for e in events.Tensors("isiwatch/alerts/text_summary")]
    assert texts == [
        f"**slow_start** (info): slow start over blocks 0–2 of token_similarity\n\nhint: {alert_hint('slow_start')}\n\n"
        f"slow_start: {ALERTS['slow_start']}",
        f"**slow_start_cleared** (info): slow_start cleared\n\nslow_start: {ALERTS['slow_start']}; "
        f"cleared: {EPISODES['cleared']}"]
