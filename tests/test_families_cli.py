"""`isiwatch analyze` and `truncate` on checkpoints of every timm family and on Hugging Face save_pretrained
directories; outputs load back with the family's own loader."""

import json

import pytest
import timm
import torch
import transformers as hf
from click.testing import CliRunner
from test_families import HF, HF_SIZE, TIMM, TINY, make_hf, make_timm

from isiwatch.cli.commands import main
from isiwatch.io.checkpoint import save_checkpoint
from isiwatch.taps import vit_parts

KWARGS = {k: v for k, v in TINY.items() if k != "pretrained"}


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def checkpoint_of(family, tmp_path):
    arch, extra = TIMM[family]
    model = make_timm(family)
    kwargs = {**KWARGS, **extra}
    return model, arch, kwargs, save_checkpoint(tmp_path / "model.pt", arch, kwargs, model.state_dict())


@pytest.mark.parametrize("family", sorted(TIMM))
def test_analyze_every_timm_family(family, tmp_path):
    model, arch, _, ckpt = checkpoint_of(family, tmp_path)
    result = run("analyze", ckpt, "--images", 64, "--out", tmp_path / "analysis")
    assert result.exit_code == 0, result.output
    analysis = json.loads((tmp_path / "analysis" / "analysis.json").read_text())
    assert len(analysis["layers"]) == vit_parts(model).depth and analysis["model"]["arch"] == arch


#: One family per kind of block list the cut must handle (every family is cut in tests/test_families_coverage.py).
TRUNCATED = ("eva02", "beit", "cait", "parallel_scaling", "relpos_res_post")


@pytest.mark.parametrize("family", TRUNCATED)
def test_truncate_cli_output_loads_with_timm(family, tmp_path):
    model, arch, kwargs, ckpt = checkpoint_of(family, tmp_path)
    out = tmp_path / "cut.pt"
    result = run("truncate", ckpt, "--out", out, "--keep", 2, "--strategy", "tail", "--epochs", 0)
    assert result.exit_code == 0, result.output
    cut = timm.create_model(arch, pretrained=False, **{**kwargs, "depth": 2})
    timm.models.load_checkpoint(cut, str(out), strict=True)  # timm's own loader
    assert len(cut.blocks) == 2
    if family == "cait":  # the class-attention blocks are kept whole
        assert len(cut.blocks_token_only) == len(model.blocks_token_only)
    images = torch.randn(2, 1, 28, 28)
    expected = model.eval()
    expected.blocks = expected.blocks[:2] if isinstance(expected.blocks, torch.nn.Sequential) else \
        torch.nn.ModuleList(list(expected.blocks)[:2])
    torch.testing.assert_close(cut.eval()(images), expected(images))  # no epochs: the cut is the first 2 blocks


@pytest.mark.parametrize("family", sorted(HF))
def test_analyze_a_save_pretrained_directory(family, tmp_path):
    model = make_hf(family)
    model.save_pretrained(tmp_path / "hf")
    result = run("analyze", tmp_path / "hf", "--images", 64, "--out", tmp_path / "analysis")
    assert result.exit_code == 0, result.output
    analysis = json.loads((tmp_path / "analysis" / "analysis.json").read_text())
    assert analysis["model"]["arch"] == type(model).__name__
    assert len(analysis["layers"]) == vit_parts(model).depth


def test_truncating_a_model_without_a_classification_head_is_refused_in_one_line(tmp_path):
    make_hf("hf_vit").save_pretrained(tmp_path / "hf")
    result = CliRunner().invoke(main, ["truncate", str(tmp_path / "hf"), "--out", str(tmp_path / "cut"), "--keep", "1"])
    assert result.exit_code == 1 and not (tmp_path / "cut").exists()
    assert result.output.strip() == ("Error: ViTModel has no classification head to heal and score a cut with (use a "
                                     "classifier, e.g. ViTForImageClassification)")


def test_a_directory_without_config_is_refused_in_one_line(tmp_path):
    result = CliRunner().invoke(main, ["analyze", str(tmp_path)])
    assert result.exit_code != 0
    assert "a directory without config.json" in result.output and len(result.output.strip().splitlines()) == 1


def test_a_save_pretrained_directory_with_nan_weights_is_refused_in_one_line(tmp_path):
    model = make_hf("hf_vit")
    with torch.no_grad():
        model.layers[1].mlp.fc1.weight[0, 0] = float("nan")
    model.save_pretrained(tmp_path / "hf")
    before = {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}
    for command in (["analyze", str(tmp_path / "hf"), "--out", str(tmp_path / "a")],
                    ["truncate", str(tmp_path / "hf"), "--out", str(tmp_path / "cut"), "--keep", "1"]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 1, result.output
        assert result.stderr == (f"Error: {tmp_path / 'hf'}: 1 weight tensor holds NaN or Inf (first: "
                                 "'layers.1.mlp.fc1.weight'); a diverged or corrupted checkpoint "
                                 "cannot be used\n")
    assert not (tmp_path / "a").exists() and not (tmp_path / "cut").exists()
    assert {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()} == before


HF_CLASSIFIERS = {
    "vit": lambda: hf.ViTForImageClassification(hf.ViTConfig(**HF_SIZE, num_labels=10)),
    "clip_vision": lambda: hf.CLIPForImageClassification(hf.CLIPConfig(vision_config=HF_SIZE, num_labels=10)),
}


@pytest.mark.parametrize("kind", sorted(HF_CLASSIFIERS))
def test_truncate_a_save_pretrained_directory(kind, tmp_path):
    torch.manual_seed(0)
    model = HF_CLASSIFIERS[kind]().eval()
    model.save_pretrained(tmp_path / "hf")
    out = tmp_path / "cut"
    result = run("truncate", tmp_path / "hf", "--out", out, "--keep", 2, "--strategy", "tail", "--epochs", 0)
    assert result.exit_code == 0, result.output
    cut = type(model).from_pretrained(out, local_files_only=True).eval()  # the family's own loader
    assert len(vit_parts(cut).blocks) == 2
    assert json.loads((out / "isiwatch.json").read_text())["kept_blocks"] == [0, 1]
    layers = vit_parts(model).blocks
    container = next(m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and m[0] is layers[0].block)
    del container[2:]
    images = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(cut(images).logits, model(images).logits)  # no epochs: the first 2 layers
    again = CliRunner().invoke(main, ["truncate", str(tmp_path / "hf"), "--out", str(out), "--keep", "2"])
    assert again.exit_code != 0 and "exists; a truncated Hugging Face model is written to a new directory" in \
        again.output


def test_truncate_auto_on_a_save_pretrained_directory_checks_its_labels_first(tmp_path):
    """auto (the default strategy) reads a transformers model (which has no ``blocks``) and scores it on the
    validation digits before it certifies anything: an untrained one is refused in one line, nothing written."""
    torch.manual_seed(0)
    HF_CLASSIFIERS["vit"]().eval().save_pretrained(tmp_path / "hf")
    out = tmp_path / "cut"
    result = run("truncate", tmp_path / "hf", "--out", out, "--epochs", 0, "--budget", 1, "--images", 64)
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "on the 500 validation images, not above chance" in result.output and not out.exists()
