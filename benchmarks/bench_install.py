"""What a plain ``pip install isiwatch`` puts on disk, and how much of it is CUDA that a CPU-only machine never runs.

Sizes every distribution installed in a venv (the files its RECORD lists) and adds up the ones that a CPU-only torch
wheel does without: NVIDIA's CUDA libraries (``nvidia-*``, ``cuda-*``) and Triton, the GPU kernel compiler.

    python -m venv VENV && VENV/bin/pip install dist/isiwatch-*.whl
    python benchmarks/bench_install.py --venv VENV
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

RESULT = Path(__file__).parent / "results" / "install" / "install.json"
#: Distributions a CUDA build of torch pulls in and a CPU-only build does not.
CUDA_ONLY = ("nvidia-", "cuda-", "triton")
SIZES = """
import importlib.metadata as m, json, os
sizes = {}
for dist in m.distributions():
    total = 0
    for f in dist.files or []:
        path = f.locate()
        if os.path.isfile(path):
            total += os.path.getsize(path)
    sizes[dist.metadata["Name"].lower()] = total
print(json.dumps(sizes))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, required=True, help="A venv with isiwatch installed from its wheel.")
    args = parser.parse_args()
    python = args.venv / "bin" / "python"
    sizes: dict[str, int] = json.loads(subprocess.run([str(python), "-c", SIZES], check=True, capture_output=True,
                                                      text=True).stdout)
    cuda = {name: size for name, size in sizes.items() if name.startswith(CUDA_ONLY)}
    torch_version = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], check=True,
                                   capture_output=True, text=True).stdout.strip()
    result = {"torch": torch_version, "distributions": len(sizes), "total_gb": sum(sizes.values()) / 1e9,
              "cuda_only_gb": sum(cuda.values()) / 1e9, "torch_gb": sizes.get("torch", 0) / 1e9,
              "cuda_only": dict(sorted(cuda.items(), key=lambda kv: -kv[1]))}
    print(f"{result['distributions']} distributions, {result['total_gb']:.2f} GB in all; CUDA-only "
          f"({', '.join(CUDA_ONLY)}): {result['cuda_only_gb']:.2f} GB; torch itself {result['torch_gb']:.2f} GB "
          f"({torch_version})")
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
