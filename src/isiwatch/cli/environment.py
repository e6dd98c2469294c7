"""A broken torch / torchvision / timm install named in one line, with the install line that fixes it.

A CPU torch beside a CUDA torchvision (what ``pip install torch --index-url .../cpu`` followed by a plain
``pip install torchvision`` gives), or a torchvision built for another torch, fails inside ``import torchvision``
with ``operator torchvision::nms does not exist``: an error from deep inside timm's imports that says nothing of the
cause. The command line maps any failure raised while one of these packages is being imported to which installed
versions disagree and how to install a matching pair.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from types import TracebackType

#: The packages whose import failures this names, in the order they import each other.
STACK = ("torch", "torchvision", "timm")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _importing(tb: TracebackType | None) -> str | None:
    """The first package of `STACK` whose module code (an import) the traceback runs through, or None."""
    found: list[str] = []
    while tb is not None:
        code = tb.tb_frame.f_code
        folders = os.path.normpath(code.co_filename).split(os.sep)[:-1]
        if code.co_name == "<module>":  # a module's own code runs: it is being imported
            found += [p for p in STACK if p in folders]
        tb = tb.tb_next
    return next((p for p in STACK if p in found), None)


def broken_install(exc: BaseException) -> str | None:
    """One line naming the packages that disagree and the install line that fixes it, when ``exc`` was raised while
    torch, torchvision or timm was being imported; else None."""
    package = _importing(exc.__traceback__)
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if package is None or (missing and missing.split(".")[0] not in STACK):  # a missing dependency is named as such
        return None
    torch, vision = _version("torch"), _version("torchvision")
    needs = importlib.metadata.requires("torchvision") or [] if vision else []
    pinned = [r for r in needs if re.split(r"[\s<>=!~;(\[]", r, maxsplit=1)[0] == "torch"]
    variant = f" --index-url {CPU_INDEX}" if torch and "+cpu" in torch else ""
    base = torch.split("+")[0] if torch else None
    pair = f"torch=={base} torchvision=={vision.split('+')[0]}" if base and vision else "torch torchvision"
    detail = str(exc).strip().splitlines()
    reason = f"{type(exc).__name__}: {detail[0]}" if detail else type(exc).__name__
    wants = f", which requires {pinned[0]}" if pinned else ""
    return (f"importing {package} failed ({reason[:160]}): the installed torch {torch}, torchvision {vision}{wants} "
            f"do not work together; install a matching pair from one index: pip install --force-reinstall {pair}"
            f"{variant}")
