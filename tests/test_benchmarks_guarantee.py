"""The guarantee benchmark runs end to end on a tiny setting (so its committed command does not rot)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parent.parent / "benchmarks" / "bench_guarantee.py"


@pytest.mark.slow
def test_one_padded_model_one_split(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH), "--models", "padded-a", "--resamples", "1", "--epochs", "1",
                           "--max-drops", "3", "--work", str(tmp_path / "work"), "--results", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "guarantee.json").read_text())
    now, before = (result["summary"]["groups"][f"{rule} @ 3"] for rule in ("fixed sequence", "Bonferroni (before)"))
    assert now["cases"] == before["cases"] == 1
    row = next(r for r in result["rows"] if r["rule"] == "fixed sequence")
    assert now["cuts"] == 1 and row["keep"] <= 4  # at least the 4 identity blocks (a 1-epoch model heals further)
    assert not {1, 3, 5, 7} & set(row["kept"]) and len(row["kept"]) == row["keep"]  # the identity blocks went first
    assert result["summary"]["images_needed"]["3"] == {"fixed sequence": 122, "Bonferroni (before)": 215}
