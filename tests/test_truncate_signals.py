"""`isiwatch truncate` stopped by SIGTERM (what SLURM, Kubernetes and ``timeout`` send) or SIGINT: one line saying
what was kept and how to go on, no partial output, exit 128 + the signal's number; ``--resume`` then continues
the search where it stopped (issue 57)."""

import json
import signal
import subprocess
import sys

from click.testing import CliRunner
from test_truncate_auto import four_blocks, idle_ckpt  # noqa: F401  (fixtures)

import isiwatch.truncation.writing as writing_module
from isiwatch.cli.commands import main
from isiwatch.cli.interrupts import Interrupted

#: ``isiwatch truncate ARGS`` whose heal number ``HOLD`` (the first argument) waits for a signal instead of
#: healing, saying so first: the signal lands in the search at a known point (the heals before it finished and
#: journalled), however loaded the machine.
HOLDING = """import sys, time
import isiwatch.truncation.plan as plan
from isiwatch.cli.commands import main
hold, real, heals = int(sys.argv[1]), plan.heal, []
def heal(*args, **kwargs):
    heals.append(1)
    if len(heals) == hold:
        print("holding in heal", hold, flush=True)
        time.sleep(3600)
    return real(*args, **kwargs)
plan.heal = heal
main(["truncate", *sys.argv[2:]], prog_name="isiwatch")
"""

#: The identity cuts and K=3 as they are, then K=2 and K=1 healed (the point estimate: a heal qualifies).
SEARCH = ["--heal-steps", "4", "--max-drop", "2", "--confidence", "0", "--bridge", "none", "--budget", "4",
          "--images", "200", "--seed", "0", "--workers", "0", "--device", "cpu", "--no-progress"]


def stopped(signum, hold, *args):
    """Run ``isiwatch truncate ARGS`` holding in heal ``hold``, send it ``signum`` there; its exit status and
    output (stdout and stderr)."""
    child = subprocess.Popen([sys.executable, "-c", HOLDING, str(hold), *map(str, args)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in child.stdout:
        lines.append(line)
        if line.startswith("holding in heal"):
            child.send_signal(signum)
            break
    rest, _ = child.communicate(timeout=120)
    return child.returncode, "".join(lines) + rest


def scored(report):
    """The candidates as scored, without what a resumed run measures again (latencies, bridge timing)."""
    return [{k: v for k, v in c.items() if k not in ("resumed", "latency_ms", "latency_quartiles_ms")}
            for c in report["search"]["candidates"]]


def test_sigterm_keeps_the_journal_says_so_in_one_line_and_resume_continues_the_search(idle_ckpt,  # noqa: F811
                                                                                       tmp_path):
    reference = tmp_path / "reference"
    result = CliRunner().invoke(main, ["truncate", str(idle_ckpt), "--out", str(reference / "cut.pt"), *SEARCH,
                                       "--report", str(reference / "report.json")])
    assert result.exit_code == 0, result.output
    expected = json.loads((reference / "report.json").read_text())
    assert [c["healing_steps"] for c in expected["search"]["candidates"]].count(4) >= 2

    runs = tmp_path / "runs"
    out, report, journal = runs / "cut.pt", runs / "report.json", runs / "cut.pt.search.jsonl"
    args = [idle_ckpt, "--out", out, *SEARCH, "--report", report]
    status, output = stopped(signal.SIGTERM, 2, *args)
    assert status == 143, output
    last = output.strip().splitlines()[-1]
    assert last == (f"SIGTERM: stopped; kept the search journal {journal} (1 finished candidate) and wrote nothing "
                    "else; run the same command with --resume to continue the search from it"), output
    assert "Traceback" not in output and "Aborted" not in output
    assert sorted(runs.iterdir()) == [journal]  # the state --resume needs, and no partial output
    assert len(journal.read_text().splitlines()) == 1 + 1

    resumed = subprocess.run([sys.executable, "-m", "isiwatch", "truncate", *map(str, args), "--resume"],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming the search journalled in {journal}: 1 finished candidate taken from it" in resumed.stdout
    got = json.loads(report.read_text())
    assert got["search"]["resumed_candidates"] == 1
    for key in ("kept_blocks", "accuracy", "healing_steps"):
        assert got[key] == expected[key]
    assert scored(got) == scored(expected)
    assert out.exists()


def test_sigint_before_any_finished_candidate_leaves_nothing_and_exits_130(idle_ckpt, tmp_path):  # noqa: F811
    status, output = stopped(signal.SIGINT, 1, idle_ckpt, "--out", tmp_path / "cut.pt", *SEARCH)
    assert status == 130, output
    assert output.strip().splitlines()[-1] == ("SIGINT: stopped before the search finished a candidate; nothing "
                                               "was written; run the same command to start again"), output
    assert "Aborted" not in output and "Traceback" not in output
    assert list(tmp_path.iterdir()) == []  # the journal held nothing to resume: removed


def test_a_signal_between_the_two_outputs_leaves_neither_and_the_handlers_are_restored(idle_ckpt,  # noqa: F811
                                                                                      tmp_path,
                                                                                      monkeypatch):
    """A signal after the model was written and before the report was: the run wrote nothing (one new output
    without the other would pass for a finished run). The command's handlers are its own: afterwards the
    caller's are back."""
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)

    def interrupted(*args):
        raise Interrupted(signal.SIGTERM)
    monkeypatch.setattr(writing_module, "_write_report", interrupted)
    out = tmp_path / "cut.pt"
    result = CliRunner().invoke(main, ["truncate", str(idle_ckpt), "--out", str(out), "--strategy", "tail",
                                       "--keep", "4", "--epochs", "0", "--images", "200", "--report",
                                       str(tmp_path / "report.json")])
    assert result.exit_code == 143, result.output
    assert result.output.strip().splitlines()[-1] == ("SIGTERM: stopped before the cut was written; nothing was "
                                                      "written; run the same command to start again")
    assert list(tmp_path.iterdir()) == []
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
