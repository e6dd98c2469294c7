"""`isiwatch analyze` on every checkpoint flavour, and its refusals of bad input."""

import argparse
import hashlib
import json
import os
import subprocess
import sys

import pytest
import timm
import torch
from click.testing import CliRunner
from PIL import Image
from safetensors.torch import save_file

from isiwatch.cli.commands import main
from isiwatch.cli.offline import analyze_checkpoint
from isiwatch.io.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from isiwatch.io.models import build_model
from isiwatch.io.timm_data import resolve_data_config
from isiwatch.measure.analysis import Analysis
from isiwatch.measure.depth import recommend_depth

KWARGS = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=32, depth=4, num_heads=2)


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, **KWARGS)


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_analyze_isiwatch_checkpoint_writes_outputs(vit, tmp_path):
    ckpt = save_checkpoint(tmp_path / "m.pt", "vit_tiny_patch16_224", KWARGS, vit.state_dict())
    before = digest(ckpt)
    result = run("analyze", ckpt, "--images", 200, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "out" / "analysis.json").read_text())
    assert [row["index"] for row in data["layers"]] == [0, 1, 2, 3]
    assert {"isi", "token_similarity", "probe_cls", "probe_patch_mean"} <= set(data["layers"][0])
    assert data["model"]["arch"] == "vit_tiny_patch16_224" and data["phases"]["metric"] == "token_similarity"
    assert (tmp_path / "out" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert "phases (token_similarity)" in result.output
    assert digest(ckpt) == before
    # the depth recommendation: stored beside the curves, recomputable from them, printed after the table
    rec = data["recommendation"]
    analysis = Analysis.from_dict(data)  # the extra key does not disturb reading the file back
    assert analysis.depth == 4 and set(analysis.layers) == set(data["layers"][0]) - {"index"}
    assert rec == recommend_depth(analysis).to_dict() and 1 <= rec["depth"] <= 4
    assert rec["source_depth"] == 4 and rec["depth"] == 4 - len(rec["blocks_to_drop"])
    line = next(line for line in result.output.splitlines() if line.startswith("recommended depth:"))
    assert line.startswith(f"recommended depth: {rec['depth']} of 4 blocks (signal {rec['signal']}; ")
    lines = result.output.splitlines()
    assert lines.index(line) == next(i for i, x in enumerate(lines) if x.startswith("phases (")) + 1


def test_timm_train_checkpoint_prefers_ema_and_reads_args(vit, tmp_path):
    ema = {k: v + 1.0 if v.is_floating_point() else v for k, v in vit.state_dict().items()}
    args = argparse.Namespace(model="vit_tiny_patch16_224", model_kwargs={"num_heads": 2}, lr=0.1)
    path = tmp_path / "checkpoint-3.pth.tar"
    torch.save({"epoch": 3, "arch": "vit_tiny_patch16_224", "args": args, "state_dict": vit.state_dict(),
                "state_dict_ema": ema, "version": 2, "optimizer": {"state": {}, "param_groups": []}}, path)
    ckpt = load_checkpoint(path)
    assert ckpt.model_kwargs["num_heads"] == 2 and ckpt.model_kwargs["depth"] == 4
    assert torch.equal(ckpt.state_dict["cls_token"], ema["cls_token"])
    model = build_model(ckpt)
    assert model.blocks[0].attn.num_heads == 2
    assert run("analyze", path, "--images", 100, "--out", tmp_path / "o").exit_code == 0


def test_plain_prefixed_and_safetensors_state_dicts(vit, tmp_path):
    plain = tmp_path / "plain.pt"
    torch.save({f"model.{k}": v for k, v in vit.state_dict().items()}, plain)  # Lightning-style prefix
    ckpt = load_checkpoint(plain, num_heads=2)
    assert ckpt.model_kwargs["embed_dim"] == 32 and ckpt.model_kwargs["img_size"] == 28
    assert build_model(ckpt).blocks[0].attn.num_heads == 2
    st = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in vit.state_dict().items()}, str(st))
    with pytest.raises(CheckpointError, match="head count is not in the tensors"):  # no guessing from the width
        load_checkpoint(st)
    assert build_model(load_checkpoint(st, num_heads=2)).blocks[0].attn.num_heads == 2
    reg = timm.create_model("vit_tiny_patch16_224", pretrained=False, reg_tokens=2, class_token=False,
                            global_pool="avg", **KWARGS)
    path = save_checkpoint(tmp_path / "reg.safetensors", "vit_tiny_patch16_224", {"num_heads": 2}, reg.state_dict(),
                           fmt="safetensors")
    inferred = load_checkpoint(path).model_kwargs
    assert inferred["reg_tokens"] == 2 and inferred["class_token"] is False
    assert run("analyze", path, "--images", 50, "--out", tmp_path / "r").exit_code == 0


class RunsCode:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['ISIWATCH_PWNED']}",))


def test_refuses_bad_inputs_with_one_line_errors(vit, tmp_path, monkeypatch):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(os.urandom(4096))
    marker = tmp_path / "pwned"
    monkeypatch.setenv("ISIWATCH_PWNED", str(marker))
    evil = tmp_path / "evil.pt"
    torch.save({"state_dict": vit.state_dict(), "payload": RunsCode()}, evil)
    resnet = tmp_path / "resnet.pt"
    torch.save(timm.create_model("resnet18", pretrained=False, num_classes=10).state_dict(), resnet)
    cases = {garbage: "not a readable", tmp_path / "missing.pt": "no such checkpoint",
             evil: "refusing to load", resnet: "not a ViT checkpoint"}
    for path, expected in cases.items():
        before = digest(path) if path.exists() else None
        out = tmp_path / f"out-{path.stem}"
        result = run("analyze", path, "--out", out)
        assert result.exit_code == 1, (path, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], result.output
        assert not out.exists()
        assert (digest(path) if path.exists() else None) == before
    assert not marker.exists()


def test_wrong_arch_and_bad_data_are_one_line_errors(vit, tmp_path):
    ckpt = save_checkpoint(tmp_path / "m.pt", "vit_tiny_patch16_224", KWARGS, vit.state_dict())
    result = run("analyze", ckpt, "--arch", "resnet18", "--out", tmp_path / "o1")
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    result = run("analyze", ckpt, "--data", tmp_path / "nowhere", "--out", tmp_path / "o2")
    assert result.exit_code == 1 and "no such data folder" in result.output
    (tmp_path / "empty").mkdir()
    result = run("analyze", ckpt, "--data", tmp_path / "empty", "--out", tmp_path / "o3")
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert not any((tmp_path / o).exists() for o in ("o1", "o2", "o3"))


def test_real_process_exit_code_and_no_traceback(tmp_path):
    garbage = tmp_path / "x.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    proc = subprocess.run([sys.executable, "-m", "isiwatch.cli", "analyze", str(garbage)],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0
    version = subprocess.run([sys.executable, "-m", "isiwatch.cli", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and "0.1.0" in version.stdout


def one_line_error(result):
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    return lines[0]


def comparable(out):
    data = json.loads((out / "analysis.json").read_text())
    for key in ("checkpoint", "sha256"):
        data["model"].pop(key)
    return data


def test_bare_state_dict_is_refused_without_the_head_count_and_analysed_with_it(tmp_path):
    torch.manual_seed(1)
    kwargs = {**KWARGS, "num_heads": 4}  # 32 // 64 would have guessed 1 head: same shapes, another model
    four = timm.create_model("vit_tiny_patch16_224", pretrained=False, **kwargs)
    bare = tmp_path / "bare.pt"
    torch.save(four.state_dict(), bare)
    with pytest.raises(CheckpointError, match="records no architecture and no num_heads"):
        load_checkpoint(bare)
    line = one_line_error(run("analyze", bare, "--images", 100, "--out", tmp_path / "refused"))
    assert "--arch NAME" in line and "--num-heads N" in line and not (tmp_path / "refused").exists()
    assert "does not divide" in one_line_error(run("analyze", bare, "--num-heads", 3, "--out", tmp_path / "r3"))
    recorded = save_checkpoint(tmp_path / "recorded.pt", "vit_tiny_patch16_224", kwargs, four.state_dict())
    assert "records num_heads 4" in one_line_error(run("analyze", recorded, "--num-heads", 2, "--out", tmp_path / "r2"))
    for path, extra, out in ((bare, ["--num-heads", 4], "given"), (recorded, [], "recorded")):
        result = run("analyze", path, *extra, "--images", 200, "--out", tmp_path / out)
        assert result.exit_code == 0, result.output
    given, original = comparable(tmp_path / "given"), comparable(tmp_path / "recorded")
    assert given["model"]["model_kwargs"]["num_heads"] == 4
    assert given["layers"] == original["layers"] and given["phases"] == original["phases"]
    assert not any((tmp_path / o).exists() for o in ("r2", "r3"))


def test_arch_default_config_gives_the_head_count_and_must_fit(tmp_path):
    tiny = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10)  # 192 wide, 3 heads
    bare, train = tmp_path / "bare.pt", tmp_path / "train.pth.tar"
    torch.save(tiny.state_dict(), bare)
    torch.save({"arch": "vit_tiny_patch16_224", "args": argparse.Namespace(model_kwargs={}),
                "state_dict": tiny.state_dict()}, train)
    for path, arch in ((bare, "vit_tiny_patch16_224"), (bare, "deit_tiny_patch16_224"), (train, None),
                       (train, "deit_tiny_patch16_224")):  # same default shapes and heads: consistent
        ckpt = load_checkpoint(path, arch=arch)
        assert ckpt.model_kwargs["num_heads"] == 3 and ckpt.arch == (arch or "vit_tiny_patch16_224")
    with pytest.raises(CheckpointError, match=r"'vit_small_patch16_224' \(embed_dim 384\) contradicts "
                                              r"the checkpoint's tensors \(embed_dim 192\)"):
        load_checkpoint(bare, arch="vit_small_patch16_224")  # 6 heads would fit 192 as well: no silent pick
    with pytest.raises(CheckpointError, match=r"'vit_small_patch16_224' \(embed_dim 384, num_heads 6\) contradicts "
                                              r"the checkpoint's recorded arch 'vit_tiny_patch16_224' "
                                              r"\(embed_dim 192, num_heads 3\)"):
        load_checkpoint(train, arch="vit_small_patch16_224")
    with pytest.raises(CheckpointError, match="'resnet18' is not a ViT"):
        load_checkpoint(bare, arch="resnet18")


def test_contradicting_arch_is_a_one_line_error_and_writes_nothing(vit, tmp_path):
    recorded = save_checkpoint(tmp_path / "m.pt", "vit_tiny_patch16_224", KWARGS, vit.state_dict())
    bare = tmp_path / "bare.pt"
    torch.save(vit.state_dict(), bare)
    line = one_line_error(run("analyze", recorded, "--arch", "vit_small_patch16_224", "--out", tmp_path / "o1"))
    assert "--arch 'vit_small_patch16_224'" in line and "recorded arch 'vit_tiny_patch16_224'" in line
    line = one_line_error(run("analyze", bare, "--arch", "vit_base_patch16_224", "--out", tmp_path / "o2"))
    assert "--arch 'vit_base_patch16_224' (embed_dim 768, depth 12, patch_size 16" in line
    assert "contradicts the checkpoint's tensors (embed_dim 32, depth 4, patch_size 7" in line
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    result = run("analyze", recorded, "--arch", "deit_tiny_patch16_224", "--images", 50, "--out", tmp_path / "o3")
    assert result.exit_code == 0, result.output  # an alias with the same default shapes is consistent


def test_more_images_than_the_data_has_are_noted_and_the_real_count_recorded(vit, tmp_path):
    ckpt = save_checkpoint(tmp_path / "m.pt", "vit_tiny_patch16_224", KWARGS, vit.state_dict())
    result = run("analyze", ckpt, "--images", 1000000000, "--out", tmp_path / "o")
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note:")]
    assert notes == ["note: --images 1000000000 requested but mnist has only 5000; analysed 5000 images"]
    assert json.loads((tmp_path / "o" / "analysis.json").read_text())["model"]["images"] == 5000
    result = run("analyze", ckpt, "--images", 60, "--out", tmp_path / "p")
    assert result.exit_code == 0 and "note:" not in result.output
    assert json.loads((tmp_path / "p" / "analysis.json").read_text())["model"]["images"] == 60


def test_malformed_checkpoints_are_named_one_line_errors(vit, tmp_path):
    state = {k: v.contiguous() for k, v in vit.state_dict().items()}
    listed = tmp_path / "listed.safetensors"
    save_file(state, str(listed), metadata={"isiwatch": "[1,2]"})
    flat = tmp_path / "flat.pt"
    torch.save({"arch": "vit_tiny_patch16_224", "model_kwargs": {"num_heads": 2},
                "state_dict": {**state, "patch_embed.proj.weight": torch.zeros(32)}}, flat)
    counted = tmp_path / "counted.pt"
    torch.save({**state, "blocks.0.mlp.fc1.weight": 3}, counted)
    kwargs = tmp_path / "kwargs.pt"
    torch.save({"arch": "vit_tiny_patch16_224", "model_kwargs": [1, 2], "state_dict": state}, kwargs)
    heads = tmp_path / "heads.pt"
    torch.save({"model_kwargs": {"num_heads": "two"}, "state_dict": state}, heads)
    cases = {listed: "its 'isiwatch' metadata is not a JSON object",
             flat: "'patch_embed.proj.weight' has shape (32,); a ViT's has 4 dimensions",
             counted: "state dict entry 'blocks.0.mlp.fc1.weight' is not a tensor (int)",
             kwargs: "model_kwargs is not a mapping (list)",
             heads: "the recorded num_heads 'two' is not a positive integer"}
    for path, expected in cases.items():
        line = one_line_error(run("analyze", path, "--num-heads", 2, "--out", tmp_path / "o"))
        assert line == f"Error: {path}: {expected}", line
        with pytest.raises(CheckpointError, match="^" + str(path)):
            load_checkpoint(path)
    assert not (tmp_path / "o").exists()


def test_analyze_writes_analysis_and_curves_together_or_not_at_all(vit, tmp_path, monkeypatch):
    import isiwatch.cli.offline as offline

    ckpt = save_checkpoint(tmp_path / "m.pt", "vit_tiny_patch16_224", KWARGS, vit.state_dict())
    real_plot = offline.plot_curves

    def plot_then_fail(result, path):
        real_plot(result, path)
        raise RuntimeError("killed after curves.png")

    monkeypatch.setattr(offline, "plot_curves", plot_then_fail)
    out = tmp_path / "new"
    assert one_line_error(run("analyze", ckpt, "--images", 50, "--out", out))
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]  # no staging folder left

    monkeypatch.setattr(offline, "plot_curves", real_plot)
    assert run("analyze", ckpt, "--images", 50, "--out", out).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(before) == {"analysis.json", "curves.png"}
    real_json = offline.write_json

    def json_then_fail(path, data):
        real_json(path, data)
        raise RuntimeError("killed after analysis.json")

    monkeypatch.setattr(offline, "write_json", json_then_fail)
    assert one_line_error(run("analyze", ckpt, "--images", 60, "--out", out))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the old pair, untouched


def test_full_disk_while_analysing_names_the_file_and_writes_nothing(vit, tmp_path, monkeypatch):
    ckpt = save_checkpoint(tmp_path / "m.pt", "vit_tiny_patch16_224", KWARGS, vit.state_dict())
    out = tmp_path / "out"
    real = os.write

    def write(fd, data):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(".analysis.json."):
            raise OSError(28, os.strerror(28))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    line = one_line_error(run("analyze", ckpt, "--images", 50, "--out", out))
    assert line == f"Error: {out / 'analysis.json'}: cannot write (No space left on device)"
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "Error: No such option '--bogus' (see isiwatch --help)"),
    (["nope"], "Error: No such command 'nope' (see isiwatch --help)"),
    (["analyze"], "Error: Missing argument 'CHECKPOINT' (see isiwatch analyze --help)"),
    (["analyze", "m.pt", "--device", "tpu"], "Error: Invalid value for '--device': 'tpu' is not one of 'auto', "
                                             "'cpu', 'cuda' (see isiwatch analyze --help)"),
    (["analyze", "m.pt", "--images", "2"], "Error: Invalid value for '--images': 2 is not in the range x>=4 "
                                           "(see isiwatch analyze --help)"),
    (["truncate", "m.pt", "--out", "o.pt", "--keep", "2", "--budget", "3"],
     "Error: --max-drop, --confidence, --budget, --bridge and --resume apply to --strategy auto only (see "
     "isiwatch truncate --help)"),
    (["config", "check"], "Error: Missing argument 'FILE' (see isiwatch config check --help)"),
])
def test_usage_errors_are_one_line_with_exit_status_1(args, message):
    result = run(*args)
    assert (result.exit_code, result.output) == (1, message + "\n")


def test_help_exits_0_and_a_real_usage_error_exits_1(tmp_path):
    for args in (["--help"], ["analyze", "--help"], ["config", "check", "-h"], [], ["config"]):
        result = run(*args)
        assert result.exit_code == 0 and "Usage: isiwatch" in result.output, (args, result.output)
    proc = subprocess.run([sys.executable, "-m", "isiwatch.cli", "analyze", "--nope"], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("Error: No such option '--nope'") and proc.stderr.count("\n") == 1, proc.stderr


@pytest.fixture
def args_ckpt(vit, tmp_path):
    """A timm train.py checkpoint that records the statistics it trained with (mean 0.5, std 0.25)."""
    ema = {k: v + 0.01 if v.is_floating_point() else v for k, v in vit.state_dict().items()}
    args = argparse.Namespace(model="vit_tiny_patch16_224", model_kwargs={"num_heads": 2}, mean=(0.5,), std=(0.25,),
                              interpolation="bicubic", crop_pct=0.9)
    path = tmp_path / "checkpoint-3.pth.tar"
    torch.save({"arch": "vit_tiny_patch16_224", "args": args, "state_dict": vit.state_dict(),
                "state_dict_ema": ema}, path)
    return path


@pytest.fixture
def pngs(tmp_path):
    """12 distinct 28×28 grey PNGs in an ImageFolder tree, and their pixels in [0, 1]."""
    gen = torch.Generator().manual_seed(1)
    pixels = torch.randint(0, 256, (12, 28, 28), generator=gen, dtype=torch.uint8)
    for i, image in enumerate(pixels):
        (tmp_path / "pngs" / str(i % 3)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image.numpy()).save(tmp_path / "pngs" / str(i % 3) / f"{i}.png")
    return tmp_path / "pngs", pixels.float().div(255).unsqueeze(1)


@pytest.fixture
def probed(monkeypatch):
    """The probe images each analysis runs on."""
    import isiwatch.cli.offline

    seen = []

    def spy(model, x, *args, **kwargs):
        seen.append(x)
        return analyze_fn(model, x, *args, **kwargs)

    analyze_fn = isiwatch.cli.offline.analyze
    monkeypatch.setattr(isiwatch.cli.offline, "analyze", spy)
    return seen


def timm_eval(pixels, **config):
    """``pixels`` through timm's eval transform (what validate.py feeds the model)."""
    from timm.data import create_transform

    transform = create_transform(input_size=(1, 28, 28), **config)
    return torch.stack([transform(Image.fromarray((p[0] * 255).round().byte().numpy())) for p in pixels])


def same_images(x, expected):
    """Each image of ``x`` is one of ``expected`` (the folder is read in a shuffled order)."""
    return len(x) == len(expected) and all((expected - image).abs().amax(dim=(1, 2, 3)).min() < 1e-5 for image in x)


@pytest.mark.parametrize("extra, mean, std, source", [
    ([], 0.5, 0.25, "checkpoint args"),
    (["--mean", "0.2", "--std", "0.5"], 0.2, 0.5, "--mean/--std"),
])
def test_image_folder_is_normalised_as_the_checkpoint_was_trained(args_ckpt, pngs, probed, tmp_path, extra, mean, std,
                                                                  source):
    folder, pixels = pngs
    result = run("analyze", args_ckpt, "--data", folder, "--images", 12, "--out", tmp_path / "o", *extra)
    assert result.exit_code == 0, result.output
    model = json.loads((tmp_path / "o" / "analysis.json").read_text())["model"]
    norm = model["normalization"]
    assert (norm["mean"], norm["std"], norm["source"]) == ([mean], [std], source)
    assert (norm["interpolation"], norm["crop_pct"]) == ("bicubic", 0.9)  # as train.py recorded
    assert model["weights"] == "ema"
    assert same_images(probed[0], timm_eval(pixels, mean=(mean,), std=(std,), interpolation="bicubic", crop_pct=0.9))
    assert f"weights: EMA (state_dict_ema); normalised with mean {mean:g} std {std:g} ({source})" in result.output


def test_without_recorded_statistics_the_source_is_named(vit, pngs, probed, tmp_path):
    ckpt = save_checkpoint(tmp_path / "m.pt", "vit_tiny_patch16_224", KWARGS, vit.state_dict())
    folder, pixels = pngs
    analysis, _ = analyze_checkpoint(ckpt, data=str(folder), images=12)
    norm = analysis.model_info["normalization"]
    assert (norm["source"], norm["mean"], norm["std"]) == ("pretrained_cfg", [0.5], [0.5])  # as train.py takes them
    assert same_images(probed[0], timm_eval(pixels, mean=(0.5,), std=(0.5,), interpolation="bicubic", crop_pct=0.9))
    assert analysis.model_info["weights"] == "state_dict"
    analysis, _ = analyze_checkpoint(ckpt, images=12)
    norm = analysis.model_info["normalization"]
    assert (norm["mean"], norm["std"], norm["source"], norm["crop_pct"]) == ([0.1307], [0.3081], "mnist", 1.0)
    rgb = timm.create_model("vit_tiny_patch16_224", pretrained=False, **{**KWARGS, "in_chans": 3})
    norm = resolve_data_config(rgb, str(folder))
    assert norm.source == "pretrained_cfg" and norm.mean == tuple(rgb.pretrained_cfg["mean"])


def test_mnist_takes_the_checkpoint_statistics_and_no_ema_is_recorded(args_ckpt, tmp_path):
    result = run("analyze", args_ckpt, "--images", 50, "--out", tmp_path / "o", "--no-ema")
    assert result.exit_code == 0, result.output
    model = json.loads((tmp_path / "o" / "analysis.json").read_text())["model"]
    assert model["normalization"]["source"] == "checkpoint args" and model["weights"] == "state_dict"
    result = run("analyze", args_ckpt, "--images", 50, "--out", tmp_path / "p", "--mean", "0.5")
    assert result.exit_code == 1 and "--mean and --std go together" in result.output
    assert result.output.strip().count("\n") == 0 and not (tmp_path / "p").exists()
    result = run("analyze", args_ckpt, "--out", tmp_path / "p", "--mean", "0.5,0.4", "--std", "0.2")
    assert result.exit_code == 1 and "--mean has 2 values but the model takes 1 input channels" in result.output
