"""The family coverage table of docs/families.md is what runs: recomputed here and compared with the committed JSON
and the page's block (regenerate both with ``python benchmarks/family_coverage.py --write``)."""

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
    page = family_coverage.PAGE.read_text()
    assert family_coverage.readme_with(family_coverage.render(table), page) == page
    assert all(row["analyze"] == "yes" and row["watch"] == "yes" for row in table.values())
