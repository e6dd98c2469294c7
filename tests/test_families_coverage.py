"""The README's family coverage table is what runs: recomputed here and compared with the committed JSON and the
README block (regenerate both with ``python benchmarks/family_coverage.py --write``)."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import family_coverage  # noqa: E402


def test_coverage_table_is_regenerated_from_what_runs():
    table = family_coverage.coverage()
    committed = json.loads(family_coverage.RESULT.read_text())["coverage"]
    assert table == committed
    readme = family_coverage.README.read_text()
    assert family_coverage.readme_with(family_coverage.render(table), readme) == readme
    assert all(row["analyze"] == "yes" and row["watch"] == "yes" for row in table.values())
