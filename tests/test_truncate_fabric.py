"""Healing and evaluation on Lightning Fabric over 2 CPU processes (gloo), started by Fabric's own launcher: the
healed weights are identical on both processes, evaluation gathers every image once (the uncut accuracy equals a
single process's), and only process 0 prints and writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_truncate_data import KWARGS, folders, train_py_ckpt  # noqa: F401  (fixtures)

from isiwatch.truncation.truncate import truncate

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}


def test_heal_on_two_processes_leaves_the_same_weights_on_both(tmp_path):
    script = tmp_path / "heal_ddp.py"
    script.write_text(textwrap.dedent(f"""
        import torch
        from lightning_fabric import Fabric
        from torch.utils.data import DataLoader, TensorDataset

        import isiwatch
        from isiwatch.truncation.healing import make_digits_vit

        fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
        fabric.launch()
        model, _ = make_digits_vit(0, depth=4, embed_dim=32, num_heads=2)
        cut = isiwatch.cut(model, 2, strategy="tail")
        before = {{k: v.clone() for k, v in cut.state_dict().items()}}
        x = torch.randn(64, 1, 28, 28, generator=torch.Generator().manual_seed(0))
        y = torch.arange(64) % 10
        loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
        steps = isiwatch.heal(cut, loader, epochs=1, fabric=fabric)
        torch.save({{"steps": steps, "before": before, "after": cut.state_dict()}},
                   r"{tmp_path}/rank%d.pt" % fabric.global_rank)
    """))
    done = subprocess.run([sys.executable, str(script)], env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert ranks[0]["steps"] == ranks[1]["steps"] == 4  # 64 images, 32 per process, batches of 8
    for key, value in ranks[0]["after"].items():
        assert torch.equal(value, ranks[1]["after"][key]), key
    changed = [k for k, v in ranks[0]["after"].items() if not torch.equal(v, ranks[0]["before"][k])]
    assert "head.weight" in changed and not any(k.startswith(("patch_embed", "blocks.0.")) for k in changed)


def test_truncate_on_two_processes_writes_once_and_evaluates_every_image(folders, train_py_ckpt, tmp_path):  # noqa: F811
    common = ["--data", str(folders), "--strategy", "tail", "--keep", "2", "--epochs", "1", "--images", "16",
              "--workers", "0", "--accelerator", "cpu"]
    done = subprocess.run([sys.executable, "-m", "isiwatch.cli", "truncate", str(train_py_ckpt), "--out",
                           str(tmp_path / "cut.pt"), "--report", str(tmp_path / "r.json"), "--devices", "2",
                           "--dist-strategy", "ddp", *common], env=_env(), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(f"wrote {tmp_path / 'cut.pt'}") == 1 and done.stdout.count("kept blocks") == 1
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["processes"] == 2 and report["held_out_images"] == 30
    single = truncate(train_py_ckpt, data=str(folders), strategy="tail", keep=2, epochs=1, images=16, workers=0)
    assert report["accuracy"]["uncut"] == single.report["accuracy"]["uncut"]
    assert report["accuracy"]["cut"] == single.report["accuracy"]["cut"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["cut.pt", "model_best.pth.tar", "r.json"]


@pytest.mark.slow
def test_two_processes_heal_the_model_one_process_heals(train_py_ckpt, tmp_path):  # noqa: F811
    """``--batch-size`` is the global batch, and the processes share one seeded order: 2 processes read 64 digits
    each per step, together the 128 one process reads, for one process's 32 steps (16 of 256 before). Without
    augmentation (none recorded) they heal the same weights but for the order of floating-point sums, so the
    healed accuracy on the 1,000 held-out digits agrees within 2 images."""
    source = torch.load(train_py_ckpt, weights_only=False)
    plain = tmp_path / "plain.pt"  # the same weights, no train.py args: no augmentation to draw per process
    torch.save({"arch": source["arch"], "model_kwargs": {**KWARGS}, "state_dict": source["state_dict"]}, plain)
    common = ["--data", "mnist", "--strategy", "tail", "--keep", "2", "--epochs", "1", "--images", "16",
              "--workers", "0", "--accelerator", "cpu"]
    reports = {}
    for devices in (1, 2):
        report = tmp_path / f"r{devices}.json"
        done = subprocess.run([sys.executable, "-m", "isiwatch.cli", "truncate", str(plain), "--out",
                               str(tmp_path / f"cut{devices}.pt"), "--report", str(report), "--devices", str(devices),
                               *(["--dist-strategy", "ddp"] if devices > 1 else []), *common], env=_env(),
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        reports[devices] = json.loads(report.read_text())
    one, two = reports[1], reports[2]
    assert one["batch"] == {"per_process": 128, "processes": 1, "global": 128}
    assert two["batch"] == {"per_process": 64, "processes": 2, "global": 128}
    assert one["healing_steps"] == two["healing_steps"] == 32
    assert one["accuracy"]["uncut"] == two["accuracy"]["uncut"]
    assert one["accuracy"]["healed"] != one["accuracy"]["cut"]  # healing changed the model
    assert abs(one["accuracy"]["healed"] - two["accuracy"]["healed"]) <= 0.002
