"""`isiwatch specialize` end to end, and its refusals of bad input."""

import hashlib
import os
import re

import pytest
import timm
import torch
from click.testing import CliRunner

from isiwatch.cli.commands import main
from isiwatch.io.checkpoint import load_checkpoint, save_checkpoint
from isiwatch.io.models import build_model
from isiwatch.specialization.convert import SpecializeOptions, specialization

KWARGS = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=32, depth=3, num_heads=2)
ARCH = "vit_tiny_patch16_224"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    torch.manual_seed(0)
    model = timm.create_model(ARCH, pretrained=False, **KWARGS)
    return save_checkpoint(tmp_path_factory.mktemp("src") / "model.pt", ARCH, KWARGS, model.state_dict())


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_specialize_writes_a_checkpoint_that_loads_and_analyzes(source, tmp_path, fmt):
    before = digest(source)
    out = tmp_path / f"special.{fmt}"
    result = run("specialize", source, "--out", out, "--qkv-blocks", "first_third", "--lora-rank", 4,
                 "--format", fmt)
    assert result.exit_code == 0, result.output
    assert "max |output change| at conversion 0.0e+00" in result.output and f"wrote {out}" in result.output
    assert digest(source) == before
    ckpt = load_checkpoint(out)
    assert ckpt.metadata["specialized_from"]["sha256"] == before
    model, plain = build_model(ckpt).eval(), build_model(load_checkpoint(source)).eval()
    assert specialization(model) == SpecializeOptions(True, (0,), 4, False)
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        assert (model(x) - plain(x)).abs().max() <= 1e-5
    analyzed = run("analyze", out, "--images", 60, "--out", tmp_path / "analysis")
    assert analyzed.exit_code == 0, analyzed.output


@pytest.mark.parametrize("args, message", [
    (["--lora-rank", "2"], "lora_rank needs qkv_blocks"),
    (["--qkv-blocks", "a,b"], "--qkv-blocks"),
    (["--qkv-blocks", "7"], "has 3 blocks"),
    (["--layer-scale"], "no LayerScale"),
    (["--no-norms"], "nothing to specialise"),
])
def test_bad_options_fail_in_one_line_without_output(source, tmp_path, args, message):
    before = digest(source)
    result = run("specialize", source, "--out", tmp_path / "o.pt", *args)
    assert result.exit_code == 1 and message in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not (tmp_path / "o.pt").exists() and digest(source) == before


def test_bad_inputs_fail_in_one_line(source, tmp_path):
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint at all")
    special = tmp_path / "special.pt"
    assert run("specialize", source, "--out", special).exit_code == 0
    link = tmp_path / "link.pt"
    os.link(source, link)  # the input under another name: same device and inode
    cases = [(tmp_path / "missing.pt", tmp_path / "a.pt", "no such checkpoint"),
             (corrupt, tmp_path / "b.pt", "not a readable"),
             (source, source, "--out must differ"),
             (source, link, "--out must differ"),
             (special, tmp_path / "c.pt", "already specialised")]
    before = digest(source)
    for ckpt, out, message in cases:
        result = run("specialize", ckpt, "--out", out)
        assert result.exit_code == 1 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
        assert ckpt == out or out == link or not out.exists()
    assert digest(source) == before and os.path.samefile(source, link)  # the link was not replaced either


def test_bare_state_dict_needs_num_heads(tmp_path):
    torch.manual_seed(0)
    model = timm.create_model(ARCH, pretrained=False, **KWARGS).eval()
    bare = tmp_path / "bare.pt"
    torch.save(model.state_dict(), bare)
    result = run("specialize", bare, "--out", tmp_path / "refused.pt")
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert "--num-heads N" in result.output and not (tmp_path / "refused.pt").exists()
    result = run("specialize", bare, "--num-heads", 2, "--out", tmp_path / "special.pt")
    assert result.exit_code == 0, result.output
    special = load_checkpoint(tmp_path / "special.pt")
    assert special.model_kwargs["num_heads"] == 2
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        assert (build_model(special).eval()(x) - model(x)).abs().max() <= 1e-5


def test_a_conversion_whose_outputs_differ_is_refused_without_output(tmp_path):
    """The exactness guard (outputs within 1e-5 or nothing is written) on a real checkpoint whose outputs
    cannot be compared: finite head weights near float32's limit overflow every first logit to Inf or NaN, so the
    difference is not <= 1e-5 either (NaN/Inf weights themselves are refused at load: test_bad_input.py)."""
    torch.manual_seed(0)
    state = timm.create_model(ARCH, pretrained=False, **KWARGS).state_dict()
    state["head.weight"][0] = 3e38
    ckpt = save_checkpoint(tmp_path / "huge.pt", ARCH, KWARGS, state)
    result = run("specialize", ckpt, "--out", tmp_path / "out.pt")
    assert result.exit_code == 1
    assert re.fullmatch(r"Error: conversion changed the outputs by (nan|inf) > 1e-05; nothing written\n",
                        result.output), result.output  # a refusal
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.pt"]
