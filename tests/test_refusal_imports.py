"""A refusal that needs no model answers before torch is imported: importing torch alone takes seconds on a
loaded machine (``isiwatch deploy DIR`` on a non-empty folder took 5–17 s to refuse, 0.3 s to succeed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

#: Runs the command line in a fresh interpreter and says, after it exits, whether torch was imported.
PROBE = """import sys
sys.argv = ["isiwatch", *sys.argv[1:]]
try:
    from isiwatch.cli.commands import main
    main()
except SystemExit as exc:
    print("exit", exc.code, "torch imported" if "torch" in sys.modules else "torch not imported", file=sys.stderr)
"""


def refusal(*args: str) -> tuple[str, str]:
    """The command's error line and the probe's last line."""
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    return lines[-2], lines[-1]


@pytest.mark.parametrize("args, error", [
    (["deploy", "{full}"], "is not empty; give a new or empty folder"),
    (["report", "{missing}"], "no such run directory"),
    (["specialize", "{missing}/model.pt", "--out", "{tmp}/out.pt"], "no such checkpoint"),
    (["demo", "--out", "{file}/sub"], "cannot be written"),
    (["analyze", "{missing}/model.pt"], "no such checkpoint"),
    (["truncate", "{missing}/model.pt", "--out", "{tmp}/out.pt"], "no such checkpoint"),
    (["truncate", "{missing}/model.pt", "--out", "{tmp}/out.pt", "--report", "{tmp}/r.txt"],
     "--report {tmp}/r.txt: the extension .txt names no report format"),
], ids=["deploy", "report", "specialize", "demo", "analyze", "truncate", "truncate-report"])
def test_refusals_that_need_no_model_do_not_import_torch(tmp_path, args, error):
    full = tmp_path / "full"
    full.mkdir()
    (full / "prometheus.yml").write_text("")
    (tmp_path / "file").write_text("")
    names = {"full": full, "missing": tmp_path / "missing", "tmp": tmp_path, "file": tmp_path / "file"}
    message, probe = refusal(*(a.format(**names) for a in args))
    assert message.startswith("Error: ") and error.format(**names) in message
    assert probe == "exit 1 torch not imported"
