"""`isiwatch truncate`: block choice per strategy, the cut, healing, the output file and refusals."""

import argparse
import enum
import hashlib
import json
import math
import os
import pathlib
import shutil
from dataclasses import dataclass

import pytest
import timm
import torch
from click.testing import CliRunner
from PIL import Image

from isiwatch.cli.commands import main
from isiwatch.io.checkpoint import load_checkpoint, read_raw
from isiwatch.io.models import build_model
from isiwatch.measure.analysis import analyze
from isiwatch.measure.boundary_distances import BoundaryDistances, angular_distance, block_influence, boundary_distances
from isiwatch.measure.flops import count_flops
from isiwatch.measure.phases import Phases
from isiwatch.truncation.cost import forward_flops, measure_latency
from isiwatch.truncation.healing import train_classifier
from isiwatch.truncation.strategies import AUTO_STRATEGIES, STRATEGIES, CutInputs, inputs_needed
from isiwatch.truncation.truncate import choose_blocks, cut_vit, heal, load_split, truncate

ARCH = "vit_tiny_patch16_224"
KWARGS = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=32, depth=8, num_heads=2)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread here: with two, every small forward spin-waits when the shared 2-core machine is busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return timm.create_model(ARCH, pretrained=False, **KWARGS).eval()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """40 labelled 28×28 random-noise PNGs in an ImageFolder tree (fast to load; the labels carry no signal)."""
    root = tmp_path_factory.mktemp("data")
    gen = torch.Generator().manual_seed(0)
    for i in range(40):
        (root / str(i % 10)).mkdir(exist_ok=True)
        pixels = torch.randint(0, 256, (28, 28), generator=gen, dtype=torch.uint8).numpy()
        Image.fromarray(pixels).save(root / str(i % 10) / f"{i}.png")
    return root


@pytest.fixture
def timm_ckpt(vit, tmp_path):
    """An 8-block checkpoint as timm's train.py writes it (EMA weights differ from the raw ones)."""
    ema = {k: v + 0.01 if v.is_floating_point() else v for k, v in vit.state_dict().items()}
    path = tmp_path / "checkpoint-9.pth.tar"
    torch.save({"epoch": 9, "arch": ARCH, "args": argparse.Namespace(model=ARCH, model_kwargs={"num_heads": 2}),
                "state_dict": vit.state_dict(), "state_dict_ema": ema, "version": 2}, path)
    return path, ema


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_tail_keep_4_writes_a_strict_timm_checkpoint_and_leaves_the_input_alone(timm_ckpt, folder, tmp_path):
    path, ema = timm_ckpt
    before = digest(path)
    out = tmp_path / "cut.pt"
    result = run("truncate", path, "--strategy", "tail", "--keep", 4, "--epochs", 0, "--out", out, "--data", folder,
                 "--report", tmp_path / "report.json")
    assert result.exit_code == 0, result.output
    assert digest(path) == before
    saved = torch.load(out, weights_only=True)
    assert saved["isiwatch"]["kept_blocks"] == [0, 1, 2, 3]
    assert saved["isiwatch"]["source_sha256"] == before
    model = timm.create_model(saved["arch"], **saved["model_kwargs"])
    model.load_state_dict(saved["state_dict"], strict=True)
    assert len(model.blocks) == 4
    # no healing: the kept blocks are the source's EMA weights, unchanged
    assert torch.equal(saved["state_dict"]["blocks.3.mlp.fc2.weight"], ema["blocks.3.mlp.fc2.weight"])
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["cost"]["uncut"]["blocks"] == 8 and report["cost"]["truncated"]["blocks"] == 4
    assert report["cost"]["truncated"]["flops_per_image"] < report["cost"]["uncut"]["flops_per_image"]
    assert "healed" not in report["accuracy"] and "healed" not in result.output  # no healing: no healed model
    assert "kept blocks 0, 1, 2, 3 (tail)" in result.output


def test_default_strategy_drops_the_least_influential_blocks(vit, folder, tmp_path):
    """Blocks 2 and 5 made exact identities (attention and MLP outputs zeroed): their block influence is 0,
    every other block's is not, so keeping 6 of 8 must drop exactly these two, whatever the images."""
    state = {k: v.clone() for k, v in vit.state_dict().items()}
    for b in (2, 5):
        for name in ("attn.proj.weight", "attn.proj.bias", "mlp.fc2.weight", "mlp.fc2.bias"):
            state[f"blocks.{b}.{name}"].zero_()
    path = tmp_path / "idle.pth.tar"
    torch.save({"arch": ARCH, "args": argparse.Namespace(model=ARCH, model_kwargs={"num_heads": 2}),
                "state_dict": state}, path)
    result = run("truncate", path, "--keep", 6, "--epochs", 0, "--out", tmp_path / "cut.pt", "--data", folder)
    assert result.exit_code == 0, result.output
    assert torch.load(tmp_path / "cut.pt", weights_only=True)["isiwatch"]["kept_blocks"] == [0, 1, 3, 4, 6, 7]
    assert "(bi)" in result.output


@pytest.mark.parametrize("extra, message", [
    (["--keep", 0], "Invalid value for '--keep': 0 is not in the range x>=1"),  # refused as the line is parsed
    (["--keep", 8], "--keep must be between 1 and 7"),
    (["--keep", 12], "--keep must be between 1 and 7"),
])
def test_bad_keep_is_refused_without_output(timm_ckpt, tmp_path, extra, message):
    path, _ = timm_ckpt
    out = tmp_path / "cut.pt"
    result = run("truncate", path, "--strategy", "tail", "--out", out, *extra)
    assert result.exit_code == 1
    assert result.output.strip().count("\n") == 0 and message in result.output
    assert not out.exists() and list(tmp_path.iterdir()) == [path]


def test_bare_state_dict_needs_num_heads(vit, folder, tmp_path):
    bare = tmp_path / "bare.pt"
    torch.save(vit.state_dict(), bare)
    args = ("--strategy", "tail", "--keep", 4, "--epochs", 0, "--data", folder)
    result = run("truncate", bare, *args, "--out", tmp_path / "refused.pt")
    assert result.exit_code == 1 and result.output.strip().count("\n") == 0, result.output
    assert "--num-heads N" in result.output and not (tmp_path / "refused.pt").exists()
    result = run("truncate", bare, *args, "--num-heads", 2, "--out", tmp_path / "cut.pt")
    assert result.exit_code == 0, result.output
    saved = torch.load(tmp_path / "cut.pt", weights_only=True)
    assert saved["model_kwargs"]["num_heads"] == 2 and saved["isiwatch"]["kept_blocks"] == [0, 1, 2, 3]
    assert build_model(load_checkpoint(tmp_path / "cut.pt")).blocks[0].attn.num_heads == 2  # recorded: reloads as is


def test_foreign_corrupt_and_self_overwriting_inputs_are_refused(timm_ckpt, tmp_path):
    path, _ = timm_ckpt
    resnet = tmp_path / "resnet.pt"
    torch.save(timm.create_model("resnet18", pretrained=False, num_classes=10).state_dict(), resnet)
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(path.read_bytes()[:300])
    cases = {resnet: "not a ViT checkpoint", corrupt: "not a readable", tmp_path / "missing.pt": "no such"}
    for source, message in cases.items():
        result = run("truncate", source, "--keep", 2, "--strategy", "tail", "--out", tmp_path / "o.pt")
        assert result.exit_code == 1 and message in result.output, result.output
        assert result.output.strip().count("\n") == 0
    before = digest(path)
    result = run("truncate", path, "--keep", 2, "--strategy", "tail", "--out", path)
    assert result.exit_code == 1 and "--out names the same file as the input checkpoint" in result.output
    assert digest(path) == before and not (tmp_path / "o.pt").exists()
    link = tmp_path / "link.pt"
    os.link(path, link)  # another name for the same file: same device and inode
    result = run("truncate", path, "--keep", 2, "--strategy", "tail", "--out", link)
    assert result.exit_code == 1 and "--out names the same file as the input checkpoint" in result.output
    assert digest(path) == before and result.output.strip().count("\n") == 0


@pytest.mark.parametrize("names, message", [
    (("--out", "o.json", "--report", "o.json"), "--report names the same file as the output --out"),
    (("--out", "o.pt", "--analysis", "o.pt"), "--out names the same file as the input --analysis"),
    (("--out", "a.json", "--analysis", "a.json", "--report", "r.json"), "--out names the same file as the input"),
    (("--out", "o.pt", "--analysis", "a.json", "--report", "a.json"), "--report names the same file as the input"),
])
def test_every_output_path_differs_from_the_inputs_and_the_other_outputs(timm_ckpt, tmp_path, names, message):
    path, _ = timm_ckpt
    (tmp_path / "a.json").write_text("{}")
    before = {p.name: digest(p) for p in tmp_path.iterdir()}
    args = [str(tmp_path / a) if a.endswith((".pt", ".json")) else a for a in names]
    result = run("truncate", path, "--keep", 2, "--strategy", "tail", "--epochs", 0, *args)
    assert result.exit_code == 1 and message in result.output, result.output
    assert result.output.strip().count("\n") == 0
    assert {p.name: digest(p) for p in tmp_path.iterdir()} == before  # nothing written, nothing changed


def test_report_naming_the_input_by_a_hard_link_is_refused_before_any_work(timm_ckpt, tmp_path):
    path, _ = timm_ckpt
    before = digest(path)
    link = tmp_path / "link.json"
    os.link(path, link)  # another name for the checkpoint, with an extension --report takes
    result = run("truncate", path, "--keep", 2, "--strategy", "tail", "--out", tmp_path / "o.pt", "--report", link)
    assert result.exit_code == 1 and "--report names the same file as the input checkpoint" in result.output
    assert result.output.strip().count("\n") == 0 and digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-9.pth.tar", "link.json"]


def test_report_writes_the_format_its_extension_names(timm_ckpt, tmp_path):
    """``--report r.json`` is the report as JSON; ``--report r.html`` the truncation's page, as ``isiwatch
    report`` shows it, on its own (it wrote JSON into r.html before)."""
    path, _ = timm_ckpt
    common = ("truncate", path, "--keep", 2, "--strategy", "tail", "--epochs", 0, "--images", 64, "--out",
              tmp_path / "o.pt")
    assert run(*common, "--report", tmp_path / "r.json").exit_code == 0
    report = json.loads((tmp_path / "r.json").read_text())
    result = run(*common, "--report", tmp_path / "r.HTML")
    assert result.exit_code == 0, result.output
    page = (tmp_path / "r.HTML").read_text()
    assert page.startswith("<!doctype html>") and page.endswith("</html>")
    assert f"<title>isiwatch truncate: {path}</title>" in page
    from isiwatch.truncation.report_html import truncation_section
    assert truncation_section(report).split("<table>")[0] in page  # the section isiwatch report draws
    assert "strategy tail, kept blocks [0, 1], 0 healing steps" in page


@pytest.mark.parametrize("name", ["r.txt", "r", "r.json.gz"])
def test_a_report_extension_that_names_no_format_is_refused_in_one_line_before_any_work(timm_ckpt, tmp_path, name):
    path, _ = timm_ckpt
    result = run("truncate", path, "--keep", 2, "--strategy", "tail", "--out", tmp_path / "o.pt",
                 "--report", tmp_path / name)
    assert result.exit_code == 1, result.output
    assert result.output.strip().count("\n") == 0
    assert f"Error: --report {tmp_path / name}: " in result.output
    assert "names no report format; give a path ending in .json (JSON) or .html (HTML)" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-9.pth.tar"]


def test_auto_tries_the_registry_entries_with_an_auto_rank_in_rank_order():
    """A new strategy is one registry entry: its ``auto_rank`` alone decides whether ``auto`` tries it."""
    ranked = sorted((s for s in STRATEGIES.values() if s.auto_rank is not None), key=lambda s: s.auto_rank)
    assert AUTO_STRATEGIES == tuple(s.name for s in ranked) == ("bi", "angular", "tail", "plateau")
    assert inputs_needed("auto") == frozenset().union(*(s.needs for s in ranked)) == {"phases", "distances"}


def test_choose_blocks_per_strategy():
    phases = Phases(plateau=(2, 6), cliff=(0, 1), climb=(7, 11))
    assert STRATEGIES["plateau"].default_keep(12, CutInputs(phases)) == 8
    # block 2 already reached the plateau level; 3..6 only keep it there
    assert choose_blocks("plateau", 12, 8, phases=phases) == [0, 1, 2, 7, 8, 9, 10, 11]
    assert choose_blocks("plateau", 12, 10, phases=phases) == [0, 1, 2, 3, 6, 7, 8, 9, 10, 11]
    assert choose_blocks("tail", 12, 5) == [0, 1, 2, 3, 4]
    cosine = torch.eye(13)
    cosine[torch.arange(12), torch.arange(1, 13)] = torch.tensor([.1, .2, .3, .9, .95, .4, .5, .6, .7, .8, .2, .1])
    angle = torch.ones(13, 13)
    angle[3, 6] = 0.05  # blocks 3, 4, 5 together change the stream least
    dist = BoundaryDistances(cosine, angle)
    assert block_influence(dist)[4] == pytest.approx(0.05)
    assert choose_blocks("bi", 12, 10, distances=dist) == [0, 1, 2, 5, 6, 7, 8, 9, 10, 11]
    assert angular_distance(dist, 3).argmin() == 3
    assert choose_blocks("angular", 12, 9, distances=dist) == [0, 1, 2, 6, 7, 8, 9, 10, 11]
    rand = choose_blocks("random", 12, 6, seed=3)
    assert len(rand) == 6 and rand == choose_blocks("random", 12, 6, seed=3) != choose_blocks("random", 12, 6)
    with pytest.raises(ValueError, match="needs phases"):
        choose_blocks("plateau", 12, 8)
    with pytest.raises(ValueError, match="keep must be between"):
        choose_blocks("tail", 12, 12)


def reference_boundaries(model, images):
    """Residual stream at every block boundary, block by block in float64: hidden[l] enters block l,
    hidden[L] leaves the last block; (L+1, B·T, D)."""
    with torch.no_grad():
        h = model.norm_pre(model._pos_embed(model.patch_embed(images)))
        hidden = [h]
        for blk in model.blocks:
            h = blk(h)
            hidden.append(h)
    return [t.double().flatten(0, 1) for t in hidden]


def test_bi_and_angular_match_the_papers_definitions_on_a_real_vit(vit):
    """ShortGPT BI_l = mean over tokens of 1 - cos(h_l, h_l+1); Gromov d(l, n) = mean arccos(cos(h_l, h_l+n))/pi;
    bi drops the n lowest-BI blocks, angular the n consecutive blocks l..l+n-1 with the smallest d(l, n).
    Written from those definitions, not with isiwatch's helpers; 10 images in chunks of 4."""
    torch.manual_seed(1)
    x = torch.randn(10, 1, 28, 28)
    hidden = reference_boundaries(vit, x)
    depth = len(hidden) - 1

    def cos(i, j):
        return torch.nn.functional.cosine_similarity(hidden[i], hidden[j], dim=-1)

    bi = [float(1 - cos(i, i + 1).mean()) for i in range(depth)]
    dist = boundary_distances(vit, x, batch_size=4)
    assert block_influence(dist).tolist() == pytest.approx(bi, rel=1e-4, abs=1e-6)
    # the Watch's per-block metric (computed in the probe pass, without the boundary matrix) is the same number
    assert analyze(vit, x, batch_size=4).layers["block_influence"] == pytest.approx(bi, rel=1e-4, abs=1e-6)
    for n in (1, 3, 5):
        angular = [float((torch.arccos(cos(i, i + n).clamp(-1, 1)) / math.pi).mean()) for i in range(depth - n + 1)]
        assert angular_distance(dist, n).tolist() == pytest.approx(angular, rel=1e-4, abs=1e-5), n
        keep = depth - n
        lowest = sorted(range(depth), key=lambda i: bi[i])[:n]
        assert choose_blocks("bi", depth, keep, distances=dist) == sorted(set(range(depth)) - set(lowest))
        start = min(range(depth - n + 1), key=lambda i: angular[i])
        assert choose_blocks("angular", depth, keep, distances=dist) == \
            [i for i in range(depth) if not start <= i < start + n]
    assert len(set(bi)) == depth  # no ties: the choices above are unambiguous


def test_cut_vit_runs_the_kept_blocks_and_leaves_the_source(vit):
    x = torch.randn(3, 1, 28, 28)
    cut = cut_vit(vit, [0, 2, 5])
    assert len(vit.blocks) == 8 and len(cut.blocks) == 3
    with torch.no_grad():
        h = vit.norm_pre(vit._pos_embed(vit.patch_embed(x)))
        for i in (0, 2, 5):
            h = vit.blocks[i](h)
        expected = vit.forward_head(vit.norm(h))
        assert torch.allclose(cut(x), expected, atol=1e-5)
    cut.blocks[0].mlp.fc1.weight.data.zero_()
    assert vit.blocks[0].mlp.fc1.weight.abs().sum() > 0


def test_heal_trains_only_the_late_blocks_with_frozen_parts_in_eval_mode(vit):
    images, labels = torch.randn(256, 1, 28, 28), torch.randint(0, 10, (256,))
    cut = cut_vit(vit, [0, 1, 4, 7])
    frozen = {k: v.clone() for k, v in cut.state_dict().items()}
    modes = {"early": [], "late": []}
    cut.blocks[1].register_forward_pre_hook(lambda m, a: modes["early"].append(m.training))
    cut.blocks[3].register_forward_pre_hook(lambda m, a: modes["late"].append(m.training))
    steps = heal(cut, images[:256], labels[:256], train_last=2, epochs=2, lr=3e-3)
    assert steps == 4 and modes["early"] == [False] * 4 and modes["late"] == [True] * 4
    changed = {k for k, v in cut.state_dict().items() if not torch.equal(v, frozen[k])}
    assert changed and all(k.startswith(("blocks.2.", "blocks.3.", "norm.", "head.")) for k in changed)
    assert {"blocks.2.attn.qkv.weight", "blocks.3.mlp.fc1.weight", "head.weight"} <= changed
    assert not cut.training and all(p.requires_grad for p in cut.parameters())


def test_plateau_cut_from_analysis_json_heals_on_an_image_folder(vit, folder, tmp_path):
    ckpt = tmp_path / "m.pt"
    torch.save({"arch": ARCH, "model_kwargs": {**KWARGS, "num_classes": 10}, "state_dict": vit.state_dict()}, ckpt)
    curve = [0.1, 0.3, 0.5, 0.5, 0.5, 0.5, 0.7, 0.9]
    analysis = {"model": {"depth": 8}, "layers": [{"index": i, "token_similarity": v} for i, v in enumerate(curve)],
                "phases": {"metric": "token_similarity"}}
    (tmp_path / "analysis.json").write_text(json.dumps(analysis))
    result = truncate(ckpt, tmp_path / "cut.safetensors", analysis=tmp_path / "analysis.json", strategy="plateau",
                      data=str(folder), epochs=1, distill=True, fmt="safetensors",
                      report=tmp_path / "r.json")
    assert result.report["phases"]["plateau"] == [2, 5]
    assert result.report["kept_blocks"] == [0, 1, 2, 6, 7] and result.report["train_last"] == 3
    assert result.report["healing_steps"] == 1 and result.report["held_out_images"] == 8
    loaded = load_checkpoint(tmp_path / "cut.safetensors")
    assert loaded.metadata["kept_blocks"] == [0, 1, 2, 6, 7] and loaded.model_kwargs["depth"] == 5
    assert len(build_model(loaded).blocks) == 5
    accuracy = json.loads((tmp_path / "r.json").read_text())["accuracy"]
    assert accuracy.keys() == {"split", "images", "uncut", "cut", "healed"}
    assert (accuracy["split"], accuracy["images"]) == ("validation+test", 8)  # labelled with its split and size

    bad = {**analysis, "layers": analysis["layers"][:6]}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="6 blocks but the checkpoint has 8"):
        truncate(ckpt, tmp_path / "x.pt", analysis=tmp_path / "bad.json", data=str(folder))
    flat = {**analysis, "layers": [{"index": i, "token_similarity": 0.1 * i} for i in range(8)]}
    (tmp_path / "flat.json").write_text(json.dumps(flat))
    with pytest.raises(ValueError, match="no plateau in the token_similarity curve"):
        truncate(ckpt, tmp_path / "x.pt", analysis=tmp_path / "flat.json", data=str(folder), strategy="plateau")
    assert not (tmp_path / "x.pt").exists()


class Mode(enum.Enum):
    FAST = 1


@dataclass
class Config:
    width: int = 64


class Boom:
    """Unpickling this would create ``path``: proof that the inert loader never calls a global."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (shutil.copyfile, (__file__, str(self.path)))


def test_lightning_ckpt_with_foreign_hyper_parameters_loads_inertly(vit, tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "epoch=3.ckpt"
    torch.save({"pytorch-lightning_version": "2.6.6", "epoch": 3,
                "state_dict": {f"model.{k}": v for k, v in vit.state_dict().items()},
                "hyper_parameters": {"root": pathlib.Path("/data"), "mode": Mode.FAST, "hook": Boom(marker),
                                     "config": Config(), "act": torch.nn.GELU}}, path)
    ckpt = load_checkpoint(path, num_heads=2)  # not recoverable from shapes
    assert ckpt.model_kwargs["depth"] == 8 and not marker.exists()
    assert torch.equal(ckpt.state_dict["cls_token"], vit.state_dict()["cls_token"])
    assert len(cut_vit(build_model(ckpt), [0, 5]).blocks) == 2
    # a foreign object inside the state dict itself, or a non-Lightning pickle, is still refused
    torch.save({"pytorch-lightning_version": "2.6.6", "state_dict": {"w": Boom(marker)}}, tmp_path / "bad.ckpt")
    torch.save({"state_dict": vit.state_dict(), "extra": Boom(marker)}, tmp_path / "plain.pt")
    for bad in ("bad.ckpt", "plain.pt"):
        with pytest.raises(ValueError, match="refusing to load"):
            read_raw(tmp_path / bad)
    assert not marker.exists()


def test_cost_helpers():
    layer = torch.nn.Linear(8, 4)
    assert count_flops(lambda: layer(torch.randn(5, 8))) == 2 * 5 * 8 * 4
    assert forward_flops(layer, torch.randn(3, 8)) == 2 * 3 * 8 * 4 and layer.training
    latency = measure_latency({"a": layer, "b": torch.nn.Linear(8, 4)}, torch.randn(2, 8), warmup=1, rounds=3)
    assert set(latency) == {"a", "b"} and all(v > 0 for v in latency.values())


class _Sleeps(torch.nn.Module):
    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        import time

        time.sleep(self.seconds)
        return x


def test_measure_latency_times_each_model_and_stays_quiet():
    """A model that sleeps 20 ms reads about 20 ms slower than one that sleeps 1 ms, and timing imports none of
    torch's C++-extension tooling (whose import prints a CUDA_HOME notice on machines with a CUDA folder and no
    GPU: it used to appear in every `isiwatch truncate`)."""
    import subprocess
    import sys

    latency = measure_latency({"slow": _Sleeps(0.02), "fast": _Sleeps(0.001)}, torch.zeros(1), warmup=1, rounds=3)
    assert 15 < latency["slow"] - latency["fast"] < 60, latency
    code = ("import sys, torch; from isiwatch.truncation.cost import measure_latency; "
            "measure_latency({'a': torch.nn.Linear(4, 2)}, torch.zeros(1, 4), warmup=1, rounds=2); "
            "print('torch.utils.cpp_extension' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False" and out.stderr == "", out


def test_train_classifier_stops_at_max_steps_and_rejects_unknown_schedules():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 10))
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    assert train_classifier(model, x, y, epochs=5, batch_size=16, max_steps=7, schedule="cosine") == 7
    assert train_classifier(model, x, y, epochs=2, batch_size=16) == 8
    with pytest.raises(ValueError, match="unknown schedule"):
        train_classifier(model, x, y, epochs=1, schedule="step")


@pytest.fixture(scope="module")
def layout(folder, tmp_path_factory):
    """timm train.py's layout: train/ (the 40 noise PNGs) and validation/ (10 more)."""
    root = tmp_path_factory.mktemp("layout")
    shutil.copytree(folder, root / "train")
    gen = torch.Generator().manual_seed(1)
    for i in range(10):
        (root / "validation" / str(i)).mkdir(parents=True)
        pixels = torch.randint(0, 256, (28, 28), generator=gen, dtype=torch.uint8).numpy()
        Image.fromarray(pixels).save(root / "validation" / str(i) / f"v{i}.png")
    return root


@pytest.fixture
def args_ckpt(vit, tmp_path):
    """A timm train.py checkpoint that records the statistics it was trained with."""
    ema = {k: v + 0.01 if v.is_floating_point() else v for k, v in vit.state_dict().items()}
    path = tmp_path / "checkpoint-9.pth.tar"
    args = argparse.Namespace(model=ARCH, model_kwargs={"num_heads": 2}, mean=(0.5,), std=(0.25,))
    torch.save({"arch": ARCH, "args": args, "state_dict": vit.state_dict(), "state_dict_ema": ema}, path)
    return path


def test_train_validation_layout_heals_on_train_and_evaluates_on_validation(args_ckpt, layout, tmp_path):
    out, report = tmp_path / "cut.pt", tmp_path / "report.json"
    result = run("truncate", args_ckpt, "--strategy", "tail", "--keep", 4, "--epochs", 1, "--out", out, "--data",
                 layout, "--report", report)
    assert result.exit_code == 0, result.output
    recorded = json.loads(report.read_text())
    train, val = str(layout / "train"), str(layout / "validation")
    assert recorded["data"] == {"heal": {"source": train, "images": 40, "of": 40},
                                "validation": {"source": val, "images": 5, "of": 10},
                                "test": {"source": val, "images": 5, "of": 10}}
    assert recorded["held_out_images"] == 10 and recorded["healing_steps"] == 1  # 40 images: one batch
    assert recorded["weights"] == "ema"
    norm = recorded["normalization"]
    assert (norm["mean"], norm["std"], norm["source"]) == ([0.5], [0.25], "checkpoint args")
    assert (norm["interpolation"], norm["input_size"]) == ("bicubic", [1, 28, 28])  # the model's pretrained_cfg
    meta = torch.load(out, weights_only=True)["isiwatch"]
    assert meta["weights"] == "ema" and meta["data"] == recorded["data"]
    assert meta["normalization"] == recorded["normalization"]
    assert "weights: EMA (state_dict_ema); normalised with mean 0.5 std 0.25 (checkpoint args)" in result.output
    assert f"heal 40 of 40 in {train}; validation 5 of 10 in {val}" in result.output
    # the cut keeps the statistics it was healed with
    assert load_checkpoint(out).data_config == {"mean": (0.5,), "std": (0.25,), "source": "checkpoint metadata",
                                                "interpolation": "bicubic", "input_size": [1, 28, 28],
                                                "crop_pct": 0.9, "crop_mode": "center"}


def test_eval_data_separates_healing_from_evaluation(args_ckpt, folder, layout, tmp_path):
    result = truncate(args_ckpt, tmp_path / "cut.pt", data=str(folder), eval_data=str(layout / "validation"),
                      strategy="tail", keep=4, epochs=0, prefer_ema=False, mean=(0.2,), std=(0.5,))
    assert result.report["data"] == {"heal": {"source": str(folder), "images": 40, "of": 40},
                                     "validation": {"source": str(layout / "validation"), "images": 5, "of": 10},
                                     "test": {"source": str(layout / "validation"), "images": 5, "of": 10}}
    assert result.report["weights"] == "state_dict"
    assert result.report["normalization"]["source"] == "--mean/--std"
    # one folder alone: 80/20, recorded as parts of the same source
    model = build_model(load_checkpoint(args_ckpt))
    split = load_split(model, str(folder))
    assert split.data["heal"] == {"source": str(folder), "images": 32, "of": 40}
    assert split.data["test"] == {"source": str(folder), "images": 4, "of": 40} and len(split.test_y) == 4
    assert load_split(model, "mnist").data["validation"] == {"source": "mnist", "images": 500, "of": 5000}
