"""The bad-input corpus: every command with each of its bad inputs exits non-zero with exactly one line on
stderr (``Error: ...``, no traceback), leaves every input file byte for byte as it was, and leaves no output
behind (not even a temporary file). Each case runs the ``isiwatch`` CLI in-process (click's CliRunner, stdout
and stderr apart, in the case's own working directory), so the corpus stays fast."""

import hashlib
import os
import pickle
import shutil
from pathlib import Path

import pytest
import timm
import torch
from click.testing import CliRunner

from isiwatch.cli.commands import main
from isiwatch.io.checkpoint import save_checkpoint

KWARGS = {"img_size": 28, "patch_size": 7, "in_chans": 1, "num_classes": 10, "embed_dim": 32, "depth": 2,
          "num_heads": 2}


class RunsCode:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", **KWARGS)
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "model.pt", "vit_tiny_patch16_224", KWARGS,
                           model.state_dict())


def image_folder(root: Path, size: tuple[int, int], count: int = 2) -> None:
    from PIL import Image

    for label in ("0", "1"):
        (root / label).mkdir(parents=True)
        for i in range(count):
            Image.new("L", size, color=i * 40).save(root / label / f"{i}.png")


# Each case: id -> (setup(tmp, good) -> None: writes the inputs into tmp, CLI args with {tmp} and {ckpt}).
def copy_ckpt(tmp, good):
    shutil.copy(good, tmp / "model.pt")


def write(name, data):
    def setup(tmp, good):
        copy_ckpt(tmp, good)
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return setup


def truncated_ckpt(tmp, good):
    data = good.read_bytes()
    (tmp / "cut.pt").write_bytes(data[: len(data) // 2])


def malicious(tmp, good):
    with open(tmp / "evil.pt", "wb") as fh:
        pickle.dump({"state_dict": RunsCode()}, fh)


def folder(size):
    def setup(tmp, good):
        copy_ckpt(tmp, good)
        image_folder(tmp / "data", size)
    return setup


def corrupt_image(tmp, good):
    """An ImageFolder with one file that is no image (other sizes are fine: images are resized to the model)."""
    folder((9, 13))(tmp, good)
    (tmp / "data" / "1" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")


def empty_folder(tmp, good):
    copy_ckpt(tmp, good)
    (tmp / "data").mkdir()


def run_dir_with(name, text):
    def setup(tmp, good):
        (tmp / "run").mkdir()
        (tmp / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
        (tmp / "run" / name).write_text(text)
    return setup


def with_fifo(name):
    """The good checkpoint and a FIFO at ``name``: an output path naming it must be refused, not replaced (and
    never opened: opening a FIFO for writing blocks until a reader comes)."""
    def setup(tmp, good):
        copy_ckpt(tmp, good)
        os.mkfifo(tmp / name)
    return setup


def with_symlink(name, folder=False):
    """The good checkpoint and a symbolic link ``name`` to a file (or folder) beside it."""
    def setup(tmp, good):
        copy_ckpt(tmp, good)
        target = tmp / "target"
        target.mkdir() if folder else target.write_text("kept")
        (tmp / name).symlink_to(target)
    return setup


def with_folder(name):
    def setup(tmp, good):
        copy_ckpt(tmp, good)
        (tmp / name).mkdir()
    return setup


def nan_weights(tmp, good):
    ckpt = torch.load(good, weights_only=True)
    ckpt["state_dict"]["blocks.1.mlp.fc1.weight"][0, 0] = float("nan")
    torch.save(ckpt, tmp / "model.pt")


def huge_config(tmp, good):
    """A 2 MB list in a command section: refused by its size before YAML builds it."""
    copy_ckpt(tmp, good)
    (tmp / "c.yaml").write_text("analyze:\n  images: [" + "1, " * 700_000 + "1]\n")


PY_TAG = "every_n_steps: !!python/object/apply:os.system ['touch PWNED']\n"
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))

CASES = {
    # analyze
    "analyze-missing-file": (None, ["analyze", "{tmp}/nope.pt", "--out", "{tmp}/o"]),
    "analyze-directory": (empty_folder, ["analyze", "{tmp}/data", "--out", "{tmp}/o"]),
    "analyze-garbage": (write("junk.pt", b"\x00garbage" * 100), ["analyze", "{tmp}/junk.pt", "--out", "{tmp}/o"]),
    "analyze-empty-file": (write("empty.pt", b""), ["analyze", "{tmp}/empty.pt", "--out", "{tmp}/o"]),
    "analyze-truncated": (truncated_ckpt, ["analyze", "{tmp}/cut.pt", "--out", "{tmp}/o"]),
    "analyze-pickle-that-runs-code": (malicious, ["analyze", "{tmp}/evil.pt", "--out", "{tmp}/o"]),
    "analyze-json-not-checkpoint": (write("x.pt", '{"a": 1}'), ["analyze", "{tmp}/x.pt", "--out", "{tmp}/o"]),
    "analyze-empty-data": (empty_folder, ["analyze", "{tmp}/model.pt", "--data", "{tmp}/data", "--out", "{tmp}/o"]),
    "analyze-missing-data": (copy_ckpt, ["analyze", "{tmp}/model.pt", "--data", "{tmp}/none", "--out", "{tmp}/o"]),
    "analyze-wrong-arch": (copy_ckpt, ["analyze", "{tmp}/model.pt", "--arch", "resnet18", "--out", "{tmp}/o"]),
    "analyze-images-0": (copy_ckpt, ["analyze", "{tmp}/model.pt", "--images", "0", "--out", "{tmp}/o"]),
    "analyze-bad-mean": (copy_ckpt, ["analyze", "{tmp}/model.pt", "--mean", "abc", "--out", "{tmp}/o"]),
    "analyze-zero-std": (copy_ckpt, ["analyze", "{tmp}/model.pt", "--mean", "0.5", "--std", "0", "--out",
                                     "{tmp}/o"]),
    "analyze-bad-metric": (copy_ckpt, ["analyze", "{tmp}/model.pt", "--metric", "nope", "--out", "{tmp}/o"]),
    "analyze-unknown-option": (copy_ckpt, ["analyze", "{tmp}/model.pt", "--bogus"]),
    "analyze-out-is-a-file": (write("o", "keep me"), ["analyze", "{tmp}/model.pt", "--out", "{tmp}/o"]),
    # truncate
    "truncate-missing": (None, ["truncate", "{tmp}/nope.pt", "--out", "{tmp}/o.pt"]),
    "truncate-garbage": (write("junk.pt", b"PK\x03\x04" + b"\x00" * 64), ["truncate", "{tmp}/junk.pt", "--out",
                                                                         "{tmp}/o.pt"]),
    "truncate-out-is-input": (copy_ckpt, ["truncate", "{tmp}/model.pt", "--out", "{tmp}/model.pt", "--keep", "1"]),
    "truncate-report-is-out": (copy_ckpt, ["truncate", "{tmp}/model.pt", "--out", "{tmp}/o.pt", "--report",
                                           "{tmp}/o.pt", "--keep", "1", "--epochs", "0"]),
    "truncate-negative-max-drop": (copy_ckpt, ["truncate", "{tmp}/model.pt", "--out", "{tmp}/o.pt", "--max-drop",
                                               "-1"]),
    "truncate-nan-max-drop": (copy_ckpt, ["truncate", "{tmp}/model.pt", "--out", "{tmp}/o.pt", "--max-drop", "nan"]),
    "truncate-budget-0": (copy_ckpt, ["truncate", "{tmp}/model.pt", "--out", "{tmp}/o.pt", "--budget", "0"]),
    "truncate-keep-too-many": (copy_ckpt, ["truncate", "{tmp}/model.pt", "--out", "{tmp}/o.pt", "--keep", "5",
                                           "--epochs", "0"]),
    "truncate-bad-analysis": (write("a.json", "{not json"), ["truncate", "{tmp}/model.pt", "--out", "{tmp}/o.pt",
                                                             "--analysis", "{tmp}/a.json", "--strategy", "plateau"]),
    "truncate-bad-strategy": (copy_ckpt, ["truncate", "{tmp}/model.pt", "--out", "{tmp}/o.pt", "--strategy", "x"]),
    "truncate-missing-out": (copy_ckpt, ["truncate", "{tmp}/model.pt"]),
    "truncate-corrupt-image": (corrupt_image, ["truncate", "{tmp}/model.pt", "--out", "{tmp}/o.pt",
                                               "--data", "{tmp}/data", "--keep", "1", "--epochs", "0"]),
    "analyze-corrupt-image": (corrupt_image, ["analyze", "{tmp}/model.pt", "--data", "{tmp}/data", "--out",
                                              "{tmp}/o"]),
    # specialize
    "specialize-garbage": (write("junk.pt", b"junk"), ["specialize", "{tmp}/junk.pt", "--out", "{tmp}/o.pt"]),
    "specialize-bad-qkv-blocks": (copy_ckpt, ["specialize", "{tmp}/model.pt", "--out", "{tmp}/o.pt",
                                              "--qkv-blocks", "abc"]),
    "specialize-lora-rank-0": (copy_ckpt, ["specialize", "{tmp}/model.pt", "--out", "{tmp}/o.pt",
                                           "--lora-rank", "0"]),
    "specialize-out-is-input": (copy_ckpt, ["specialize", "{tmp}/model.pt", "--out", "{tmp}/model.pt"]),
    # report
    "report-missing": (None, ["report", "{tmp}/nowhere"]),
    "report-file-not-dir": (write("run", "x"), ["report", "{tmp}/run"]),
    "report-empty-dir": (empty_folder, ["report", "{tmp}/data"]),
    "report-malformed-line": (run_dir_with("alerts.jsonl", "{bad\n{\"kind\": \"x\"}\n"), ["report", "{tmp}/run"]),
    # demo (refused before anything is trained)
    "demo-port-out-of-range": (None, ["demo", "--quick", "--prometheus-port", "99999", "--out", "{tmp}/d"]),
    "demo-negative-serve": (None, ["demo", "--quick", "--serve", "-5", "--out", "{tmp}/d"]),
    "demo-bad-device": (None, ["demo", "--quick", "--device", "tpu", "--out", "{tmp}/d"]),
    "demo-python-tag-config": (write("w.yaml", PY_TAG), ["demo", "--quick", "--config", "{tmp}/w.yaml", "--out",
                                                         "{tmp}/d"]),
    # config check and --config
    "config-check-missing": (None, ["config", "check", "{tmp}/none.yaml"]),
    "config-check-directory": (empty_folder, ["config", "check", "{tmp}/data"]),
    "config-check-python-tag": (write("c.yaml", PY_TAG), ["config", "check", "{tmp}/c.yaml"]),
    "config-check-alias-bomb": (write("c.yaml", BOMB), ["config", "check", "{tmp}/c.yaml"]),
    "config-check-duplicate-key": (write("c.yaml", "patience: 1\npatience: 2\n"), ["config", "check",
                                                                                 "{tmp}/c.yaml"]),
    "config-check-unknown-key": (write("c.yaml", "evry_n_steps: 5\n"), ["config", "check", "{tmp}/c.yaml"]),
    "config-check-bad-value": (write("c.yaml", "every_n_steps: -5\n"), ["config", "check", "{tmp}/c.yaml"]),
    "config-check-bad-section": (write("c.yaml", "analyze: {images: abc}\n"), ["config", "check", "{tmp}/c.yaml"]),
    "config-check-binary": (write("c.yaml", b"\xff\xfe\x00\x01"), ["config", "check", "{tmp}/c.yaml"]),
    "config-check-not-a-mapping": (write("c.yaml", "- 1\n- 2\n"), ["config", "check", "{tmp}/c.yaml"]),
    "global-config-python-tag": (write("c.yaml", PY_TAG), ["--config", "{tmp}/c.yaml", "analyze", "{tmp}/model.pt"]),
    "global-config-missing": (copy_ckpt, ["--config", "{tmp}/none.yaml", "analyze", "{tmp}/model.pt"]),
    "unknown-command": (None, ["frobnicate"]),
    # output paths: a regular file or nothing; refused before any work, never replaced (issue 23 #6)
    "truncate-out-existing-dir": (with_folder("o"), ["truncate", "{tmp}/model.pt", "--out", "{tmp}/o"]),
    "truncate-out-fifo": (with_fifo("f"), ["truncate", "{tmp}/model.pt", "--out", "{tmp}/f"]),
    "truncate-out-symlink": (with_symlink("link.pt"), ["truncate", "{tmp}/model.pt", "--out", "{tmp}/link.pt"]),
    "truncate-report-fifo": (with_fifo("f"), ["truncate", "{tmp}/model.pt", "--out", "{tmp}/o.pt", "--report",
                                              "{tmp}/f"]),
    "truncate-report-dir": (with_folder("r"), ["truncate", "{tmp}/model.pt", "--out", "{tmp}/o.pt", "--report",
                                               "{tmp}/r"]),
    "truncate-out-under-a-file": (copy_ckpt, ["truncate", "{tmp}/model.pt", "--out", "{tmp}/model.pt/o.pt"]),
    "truncate-nan-weights": (nan_weights, ["truncate", "{tmp}/model.pt", "--out", "{tmp}/o.pt"]),
    "specialize-out-fifo": (with_fifo("f"), ["specialize", "{tmp}/model.pt", "--out", "{tmp}/f"]),
    "specialize-out-dir": (with_folder("o"), ["specialize", "{tmp}/model.pt", "--out", "{tmp}/o"]),
    "specialize-out-symlink": (with_symlink("link.pt"), ["specialize", "{tmp}/model.pt", "--out",
                                                         "{tmp}/link.pt"]),
    "specialize-nan-weights": (nan_weights, ["specialize", "{tmp}/model.pt", "--out", "{tmp}/o.pt"]),
    "analyze-out-fifo": (with_fifo("f"), ["analyze", "{tmp}/model.pt", "--out", "{tmp}/f"]),
    "analyze-out-symlink": (with_symlink("o", folder=True), ["analyze", "{tmp}/model.pt", "--out", "{tmp}/o"]),
    "analyze-nan-weights": (nan_weights, ["analyze", "{tmp}/model.pt", "--out", "{tmp}/o"]),
    "analyze-missing-path-with-newline": (None, ["analyze", "{tmp}/no\nsuch.pt", "--out", "{tmp}/o"]),
    "report-out-fifo": (run_dir_with("alerts.jsonl", ""), ["report", "{tmp}/run", "--out", "{tmp}/run/f"]),
    "demo-out-is-a-file": (write("d", "keep me"), ["demo", "--quick", "--out", "{tmp}/d"]),
    "demo-out-fifo": (with_fifo("d"), ["demo", "--quick", "--out", "{tmp}/d"]),
    "config-check-huge": (huge_config, ["config", "check", "{tmp}/c.yaml"]),
    "global-config-huge": (huge_config, ["--config", "{tmp}/c.yaml", "analyze", "{tmp}/model.pt"]),
}


def read_only(tmp, good):
    """The good checkpoint, a Watch run folder and ``ro``: a folder nobody but root may write in. Root writes there
    anyway, so as root the cases name a folder under /sys instead, which no one can create files in."""
    copy_ckpt(tmp, good)
    run_dir_with("alerts.jsonl", "")(tmp, good)
    (tmp / "ro").mkdir()
    (tmp / "ro").chmod(0o555)


RO = "/sys" if os.geteuid() == 0 else "{tmp}/ro"  # {ro} in a message
TRUNCATE = ["truncate", "{tmp}/model.pt", "--out", "{tmp}/o.pt"]


def path_refusals(command, out, *options):
    """The paths a command that reads a checkpoint and writes ``out`` refuses: a device or a FIFO as the checkpoint,
    and an ``--out`` it cannot write (``options``: what the command needs to get that far)."""
    return {
        f"{command}-checkpoint-dev-null": (None, [command, "/dev/null", "--out", f"{{tmp}}/{out}"],
                                           "/dev/null: is a character device, not a regular file"),
        f"{command}-checkpoint-fifo": (with_fifo("ck.pt"), [command, "{tmp}/ck.pt", "--out", f"{{tmp}}/{out}"],
                                       "ck.pt: is a FIFO, not a regular file"),
        f"{command}-out-read-only": (read_only, [command, "{tmp}/model.pt", "--out", f"{RO}/{out}", *options],
                                     f"--out {{ro}}/{out}: cannot be written ("),
    }

#: truncate's option values refused when the command line is parsed or the command starts: case -> (the options
#: after the checkpoint and --out, what the error line says).
TRUNCATE_REFUSALS = {
    "max-drop-200": (["--max-drop", "200"], "'--max-drop': 200.0 is not in the range 0<=x<100"),
    "max-drop-100": (["--max-drop", "100"], "'--max-drop': 100.0 is not in the range"),
    "max-drop-inf": (["--max-drop", "inf"], "'--max-drop': inf is not in the range"),
    "confidence-negative": (["--confidence", "-0.5"], "'--confidence': -0.5 is not in the range 0<=x<1"),
    "confidence-nan": (["--confidence", "nan"], "'--confidence': nan is not a finite number"),
    "budget-negative": (["--budget", "-3"], "'--budget': -3 is not in the range x>=1"),
    "seed-2**70": (["--keep", "1", "--seed", str(2**70)],
                   "'--seed': 1180591620717411303424 is not in the range 0<=x<=4294967295"),
    "seed-negative": (["--keep", "1", "--seed", "-1"], "'--seed': -1 is not in the range"),
    "epochs-negative": (["--keep", "1", "--epochs", "-1"], "'--epochs': -1 is not in the range 0<=x<=10000"),
    "epochs-absurd": (["--keep", "1", "--epochs", str(10**12)], "'--epochs': 1000000000000 is not in the range"),
    "train-last-negative": (["--keep", "1", "--train-last", "-2"], "'--train-last': -2 is not in the range x>=0"),
    "heal-steps-absurd": (["--keep", "1", "--heal-steps", str(10**12)],
                          "'--heal-steps': 1000000000000 is not in the range 1<=x<=10000000"),
    "heal-steps-0": (["--keep", "1", "--heal-steps", "0"], "'--heal-steps': 0 is not in the range"),
    "lr-0": (["--keep", "1", "--lr", "0"], "'--lr': 0.0 is not in the range x>0"),
    "lr-nan": (["--keep", "1", "--lr", "nan"], "'--lr': nan is not a finite number"),
    "lr-inf": (["--keep", "1", "--lr", "inf"], "'--lr': inf is not a finite number"),
    "keep-0": (["--keep", "0"], "'--keep': 0 is not in the range x>=1"),
    "images-3": (["--keep", "1", "--images", "3"], "'--images': 3 is not in the range x>=4"),
    "num-nodes-without-launcher": (["--keep", "1", "--num-nodes", "4"],
                                   '--num-nodes 4: no launcher started this job on every node'),
}

# Refused before any work (no checkpoint read, no Fabric launched, nothing trained or reported: see WORK), with exit
# status 1 and the flag named (issue 33 #5): numeric options when the command line is parsed, and the paths and the
# launcher when the command starts.
EARLY = {
    "truncate-bad-class-map": (write("classes.json", '{"cat": "zero"}'), [*TRUNCATE, "--class-map",
                                                                          "{tmp}/classes.json"],
                               "classes.json: not a JSON object of class folder name to output index"),
    **{f"truncate-{case}": (copy_ckpt, [*TRUNCATE, *options], says)
       for case, (options, says) in TRUNCATE_REFUSALS.items()},
    **path_refusals("truncate", "o.pt", "--keep", "1"),
    "truncate-report-read-only": (read_only, [*TRUNCATE, "--keep", "1", "--report", RO + "/r.json"],
                                  '--report {ro}/r.json: cannot be written ('),
    "analyze-mean-nan": (copy_ckpt, ["analyze", "{tmp}/model.pt", "--mean", "nan", "--out", "{tmp}/o"],
                         "'--mean': 'nan': every value must be a finite number"),
    "analyze-std-inf": (copy_ckpt, ["analyze", "{tmp}/model.pt", "--mean", "0.5", "--std", "inf", "--out",
                                    "{tmp}/o"],
                        "'--std': 'inf': every value must be a finite number"),
    **path_refusals("analyze", "o"),
    **path_refusals("specialize", "o.pt"),
    "report-out-read-only": (read_only, ["report", "{tmp}/run", "--out", RO + "/r"],
                             '--out {ro}/r: cannot be written ('),
    "demo-out-read-only": (read_only, ["demo", "--quick", "--out", RO + "/d"],
                           '--out {ro}/d: cannot be written ('),
    "demo-out-read-only-folder": (read_only, ["demo", "--quick", "--out", RO],
                                  '--out {ro}: cannot be written ('),
    "demo-serve-absurd": (None, ["demo", "--quick", "--serve", "1e12", "--out", "{tmp}/d"],
                          "'--serve': 1000000000000.0 is not in the range 0<=x<=604800"),
    "demo-serve-nan": (None, ["demo", "--quick", "--serve", "nan", "--out", "{tmp}/d"],
                       "'--serve': nan is not a finite number"),
}
CASES.update({case: (setup, args) for case, (setup, args, _) in EARLY.items()})
#: Where a command's work starts: reading a checkpoint, launching Fabric, the demo's run, the report's.
WORK = ("isiwatch.io.checkpoint.read_raw", "isiwatch.truncation.engine.FabricOptions.launch",
        "isiwatch.cli.demo.run_demo", "isiwatch.cli.report.write_report")
#: What tells Fabric a launcher started the job on every node: cleared, so --num-nodes 4 has none.
LAUNCHER_VARIABLES = ("TORCHELASTIC_RUN_ID", "LSB_JOBID", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "MASTER_ADDR")


class WorkStarted(BaseException):
    """Raised where a command's work starts in an EARLY case: no ``except Exception`` turns it into an error line."""


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root``: a link as its target, a FIFO as such, a file by its hash."""
    def state(p: Path) -> str:
        if p.is_symlink():
            return f"link to {os.readlink(p)}"
        if p.is_fifo():
            return "fifo"
        return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"

    return {str(p.relative_to(root)): state(p) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_one_line_error_inputs_unchanged_nothing_left(case, good_checkpoint, tmp_path, monkeypatch):
    setup, args = CASES[case]
    if setup is not None:
        setup(tmp_path, good_checkpoint)
    before = snapshot(tmp_path)
    args = [a.format(tmp=tmp_path) for a in args]
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ISIWATCH_DEBUG", raising=False)
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    if case in EARLY:
        def work(*args, **kwargs):
            raise WorkStarted(f"{case}: work started before the refusal")
        for target in WORK:
            monkeypatch.setattr(target, work)
    result = CliRunner().invoke(main, args)
    assert isinstance(result.exception, SystemExit), result.exc_info  # not an exception that escaped the CLI
    errors = result.stderr.splitlines()
    assert result.exit_code == 1 if case in EARLY else result.exit_code != 0, result.stdout[-2000:]
    assert len(errors) == 1 and errors[0].startswith("Error: "), result.stderr[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    assert len(errors[0]) < 400
    if case in EARLY:  # in the user's words: the flag, the path and what is wrong with it
        says = EARLY[case][2].format(ro=RO.format(tmp=tmp_path))
        assert says in errors[0], errors[0]
    assert snapshot(tmp_path) == before  # inputs unchanged, no output, no temporary file
    assert not (tmp_path / "PWNED").exists()


def test_dev_null_is_refused_as_an_output_by_the_check_every_command_makes_first():
    """As root, replacing /dev/null with a regular file breaks the machine. Read-only: the test asks the check each
    command runs before any work (the FIFO cases above run the commands themselves on the same code path), so a
    regression cannot replace the real /dev/null."""
    import stat

    from isiwatch._utils.files import PathError, check_output

    for folder in (False, True):
        with pytest.raises(PathError, match="^--out /dev/null: is a character device, not a"):
            check_output("/dev/null", "--out", folder=folder)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_refusals_name_the_problem_and_come_before_any_work(good_checkpoint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "o").mkdir()
    result = CliRunner().invoke(main, ["truncate", str(good_checkpoint), "--out", "o"])
    assert result.stderr == "Error: --out o: is a directory, not a regular file; give a regular file or a path " \
                            "that does not exist yet\n"
    assert "candidates" not in result.stdout + result.stderr  # refused before the search
    result = CliRunner().invoke(main, ["analyze", "no\nsuch.pt"])
    assert result.stderr == "Error: 'no\\nsuch.pt': no such checkpoint\n"
    bad = tmp_path / "nan.pt"
    nan_weights(tmp_path, good_checkpoint)
    (tmp_path / "model.pt").rename(bad)
    result = CliRunner().invoke(main, ["analyze", str(bad)])
    assert result.stderr == (f"Error: {bad}: 1 weight tensor holds NaN or Inf (first: 'blocks.1.mlp.fc1.weight'); "
                             "a diverged or corrupted checkpoint cannot be used\n")


def test_the_python_api_refuses_the_same_before_any_work(good_checkpoint, tmp_path, monkeypatch):
    """What the command line refuses when it parses, the API refuses on its own terms before reading anything:
    a 100-point tolerance (it failed after the analysis, as "tolerance must be in [0, 1)"), several nodes without
    a launcher (Fabric waited for them for ever), a checkpoint that is a device or a FIFO (called missing)."""
    from isiwatch.io.checkpoint import CheckpointError, load_checkpoint
    from isiwatch.truncation.engine import FabricOptions
    from isiwatch.truncation.truncate import TruncateRequest

    with pytest.raises(ValueError, match=r"^max_drop must be at least 0 points and below 100, got 100"):
        TruncateRequest(good_checkpoint, max_drop=100)
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=r"^num_nodes=2: no launcher started this job on every node; run it under "):
        FabricOptions(num_nodes=2)
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_JOB_NAME", "bash")  # an interactive allocation: Fabric would start the processes
    with pytest.raises(ValueError, match=r"no launcher"):
        FabricOptions(num_nodes=2)
    monkeypatch.setenv("SLURM_JOB_NAME", "heal.sbatch")  # srun in a batch job: every node runs the command
    assert FabricOptions(num_nodes=2).num_nodes == 2
    monkeypatch.delenv("SLURM_NTASKS")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")  # torchrun
    assert FabricOptions(num_nodes=2).num_nodes == 2
    os.mkfifo(tmp_path / "ck.pt")
    with pytest.raises(CheckpointError, match="ck.pt: is a FIFO, not a regular file$"):
        load_checkpoint(tmp_path / "ck.pt")
    with pytest.raises(CheckpointError, match="^/dev/null: is a character device, not a regular file$"):
        load_checkpoint("/dev/null")
    with pytest.raises(CheckpointError, match="none.pt: no such checkpoint file$"):
        load_checkpoint(tmp_path / "none.pt")


def test_a_folder_output_is_checked_writable_by_a_write_that_leaves_nothing(tmp_path):
    """The check writes and removes a temporary file where the output goes, so that whatever forbids the real
    write (a read-only file system, permissions, /sys refusing new files even to root) refuses it first."""
    from isiwatch._utils.files import PathError, check_output

    assert check_output(tmp_path / "new" / "deeper" / "o.pt", "--out") == tmp_path / "new" / "deeper" / "o.pt"
    assert check_output(tmp_path, "--out", folder=True) == tmp_path
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(PathError, match=r"^--out /sys/o: cannot be written \("):
        check_output("/sys/o", "--out", folder=True)
