"""The bridge benchmark runs end to end in its --quick mode (so its committed command does not rot)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parent.parent / "benchmarks" / "bench_bridge.py"


@pytest.mark.slow
def test_quick_mode_compares_the_arms_on_one_split(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--threads", "1", "--work", str(tmp_path / "work"),
                           "--results", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "bridge_quick.json").read_text())
    groups = result["summary"]["groups"]
    arms = ("drop", "drop+heal", "bridge", "bridge+heal", "now: drop+heal", "now: bridge", "now: bridge+heal")
    assert set(groups) == {f"{arm} @ 3" for arm in arms}
    drop = groups["drop @ 3"]
    assert drop["blocks_removed"] == 4 and drop["bridged_cuts"] == 0  # padded-a's 4 identity blocks, as cut
    for arm in ("now: drop+heal", "now: bridge", "now: bridge+heal"):  # a repair never lowers what is certified
        assert groups[f"{arm} @ 3"]["blocks_removed"] >= drop["blocks_removed"], arm
    assert drop["repair_flops_per_case"] == 0 < groups["now: bridge @ 3"]["repair_flops_per_case"]  # judged cuts
    assert groups["drop+heal @ 3"]["repair_flops_per_case"] > 0
    rows = [r for r in result["rows"] if r["arm"] == "now: bridge+heal"]
    assert len(rows) == 1 and rows[0]["keep"] <= 4 and not {1, 3, 5, 7} & set(rows[0]["kept"])
    assert "Goals: coverage >= 95 % everywhere" in "\n".join(result["markdown"])


def test_the_docs_state_the_committed_benchmark_s_figures():
    """docs/explanations.md quotes the findings `bench_bridge.findings` renders from the committed JSON, and shows
    the committed figure: a rerun that changes them fails here until the docs follow."""
    sys.path.insert(0, str(BENCH.parent))
    import bench_bridge

    root = BENCH.parent.parent
    result = json.loads((root / "benchmarks" / "results" / "bridge" / "bridge.json").read_text())
    docs = (root / "docs" / "explanations.md").read_text()
    quoted = docs.split("<!-- bench_bridge: findings -->\n")[1].split("\n<!-- /bench_bridge: findings -->")[0]
    assert quoted == "\n".join(bench_bridge.findings(result["summary"]))
    figure = (root / "docs" / "figures" / "bridge.png").read_bytes()
    assert figure == (root / "benchmarks" / "results" / "bridge" / "bridge.png").read_bytes()
