"""The report page read as a reader meets it: it fits a 1,400 px window in a real browser, its summary names the
alerts still open at the end, its title is the run's name, and the plateau timeline shows a plateau seen once."""

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_demo_report import CHROMIUM_FLAGS, drawn_figures, three_samples, truncation_report
from test_truncate_explain import candidate

from isiwatch.cli.report import write_report


@pytest.fixture(scope="module")
def named_run(tmp_path_factory):
    """Three samples of a Watch named "sweep-7", logged into a folder called "run"."""
    return three_samples(tmp_path_factory.mktemp("named") / "run", run_name="sweep-7")


@pytest.fixture
def run_copy(named_run, tmp_path):
    return Path(shutil.copytree(named_run, tmp_path / "run"))


def page_of(run: Path, out: Path) -> str:
    write_report(run, out)
    return (out / "report.html").read_text()


def many_candidates() -> list[dict]:
    """The candidates of a 24-block model's search, 23 down to 3 blocks kept, with the cost fields a real report
    has; bridged ones carry their bridge's record, as `isiwatch truncate` writes it."""
    out = []
    for keep in range(23, 2, -1):
        c = candidate(keep, 0.1 * keep, 1.0 + 0.2 * keep, keep > 3, winner=keep == 4,
                      repair="bridge" if keep % 2 else "heal")
        c.update(parameters=255050 * keep, flops_per_image=8457472 * keep, latency_ms=6.905,
                 latency_quartiles_ms=[6.86, 6.92], latency_batch=64,
                 bridge={"method": "least_squares", "calibration_images": 1000} if keep % 2 else None)
        out.append(c)
    return out


#: Writes into the DOM how wide the page is against the window and where each table's last header cell ends, and
#: the right edge of the page's column (CSS px), so that --dump-dom can read the layout back.
LAYOUT_SCRIPT = """<script>window.addEventListener('load',function(){var d=document.documentElement,b=document.body;
var ends=[];document.querySelectorAll('table').forEach(function(t){
var last=t.querySelector('thead th:last-child');ends.push(last.textContent+'@'+last.getBoundingClientRect().right);});
b.setAttribute('data-layout',JSON.stringify({scroll:d.scrollWidth,client:d.clientWidth,
column:b.getBoundingClientRect().right,ends:ends}));});</script>"""


def test_the_page_fits_a_1400_px_window_with_the_verdict_column_in_view(run_copy, tmp_path):
    """A truncation of a deep model with many candidates: the page does not scroll sideways, and every table,
    the candidates' verdict column included, ends inside the page's column."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed")
    (run_copy / "truncate_report.json").write_text(json.dumps(truncation_report(candidates=many_candidates())))
    page = tmp_path / "measured.html"
    page.write_text(page_of(run_copy, tmp_path / "r").replace("</body>", LAYOUT_SCRIPT + "</body>"))
    dom = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                          "--window-size=1400,900", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    layout = json.loads(html.unescape(re.search(r'data-layout="([^"]*)"', dom.stdout)[1]))
    assert layout["scroll"] <= layout["client"] <= 1400, layout
    ends = dict(end.rsplit("@", 1) for end in layout["ends"])
    assert "verdict" in ends, layout
    assert all(float(right) <= layout["column"] + 0.5 for right in ends.values()), layout


def test_the_summary_names_the_alerts_still_open_at_the_end(run_copy, tmp_path):
    """An episode with no *_cleared record after its opening is listed with its step and message; a cleared one, an
    action record and an episode cleared then opened again are told apart."""
    records = [("isi_stall", 1, "ISI stalled"), ("isi_stall_cleared", 2, "ISI rises again"),
               ("plateau_onset", 2, "plateau at blocks 1-2"), ("early_stop", 3, "stopping training: plateau"),
               ("cls_marginalized", 1, "CLS below patches"), ("cls_marginalized_cleared", 2, "CLS back"),
               ("cls_marginalized", 3, "CLS below patches again")]
    (run_copy / "alerts.jsonl").write_text("".join(json.dumps(
        {"kind": kind, "step": step, "time": 0.0, "run": "sweep-7", "severity": "warning", "message": message,
         "data": {}}) + "\n" for kind, step, message in records))
    summary = page_of(run_copy, tmp_path / "r").split("<h2>Summary</h2>")[1].split("<h2>")[0]
    opened = re.findall(r"<td>open at the end of the run</td><td>(.*?)</td>", summary)
    assert opened == ["plateau_onset since step 2: plateau at blocks 1-2",
                      "cls_marginalized since step 3: CLS below patches again"]


def test_the_title_is_the_runs_name_and_the_folders_only_without_one(run_copy, tmp_path):
    page = page_of(run_copy, tmp_path / "r")
    assert "<title>isiwatch report: sweep-7</title>" in page and "<h1>isiwatch report: sweep-7</h1>" in page
    assert "<td>run</td><td>sweep-7</td>" in page
    metrics = run_copy / "metrics.jsonl"
    unnamed = [{k: v for k, v in json.loads(line).items() if k != "run"} for line in metrics.read_text().splitlines()]
    metrics.write_text("".join(json.dumps(record) + "\n" for record in unnamed))
    (run_copy / "alerts.jsonl").unlink(missing_ok=True)
    page = page_of(run_copy, tmp_path / "r2")
    assert "<title>isiwatch report: run</title>" in page and "<h1>isiwatch report: run</h1>" in page


def test_a_plateau_seen_at_one_sample_only_is_drawn_one_interval_wide(monkeypatch, tmp_path):
    """The timeline draws each sample's flat stretch across its own interval of steps, so a plateau that one
    sample alone saw is as wide as the others' intervals, not a hairline or nothing."""
    from isiwatch.measure.plots import plot_plateau_timeline

    figures = drawn_figures(monkeypatch)
    steps = [16, 32, 48, 64, 80]
    plot_plateau_timeline(steps, [None, None, (2, 3), None, None], 6, [], tmp_path / "plateau.png", "tok")
    (ax,) = figures[0].axes
    drawn = [artist.get_window_extent() for artist in [*ax.patches, *ax.collections]]
    drawn = [box.transformed(ax.transData.inverted()) for box in drawn]
    covering = [box for box in drawn if box.x0 <= 48 <= box.x1 and box.y0 <= 2 and box.y1 >= 3]
    assert covering and max(box.width for box in covering) >= 16 - 1e-6, [tuple(b.extents) for b in drawn]
