"""Start-up stays light: ``import isiwatch`` (even touching the Watch and analyze) and ``isiwatch --help`` import
none of the heavy libraries that only some commands need (timm, torchvision, scikit-learn, matplotlib)."""

import subprocess
import sys

HEAVY = ("timm", "torchvision", "sklearn", "matplotlib")


def imported_modules(*args: str) -> tuple[set[str], str]:
    """Top-level names of every module a fresh interpreter imports running ``python -X importtime ARGS``."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
             if line.startswith("import time:")}
    return names, proc.stdout


def test_import_and_core_api_do_not_import_heavy_libraries():
    names, out = imported_modules("-c", "import isiwatch; print(isiwatch.Watch.__name__, isiwatch.analyze.__name__)")
    assert out.split() == ["Watch", "analyze"]
    assert "torch" in names  # the check sees real imports
    assert not names & set(HEAVY), sorted(names & set(HEAVY))


def test_cli_help_imports_neither_torch_nor_heavy_libraries():
    names, out = imported_modules("-m", "isiwatch.cli", "--help")
    assert "truncate" in out and "analyze" in out
    assert "click" in names
    assert not names & {"torch", *HEAVY}, sorted(names & {"torch", *HEAVY})


def test_lazy_names_resolve_to_the_defining_objects():
    import isiwatch
    from isiwatch.specialization.convert import specialize

    assert isiwatch.specialize is specialize  # the function; no submodule shares a public name
    assert set(isiwatch.__all__) <= set(dir(isiwatch))


def test_a_folder_named_like_the_package_does_not_shadow_it(tmp_path):
    """Python started beside a clone of the repository (a folder ``isiwatch/`` holding ``src/``, ``tests/``…)
    imports the installed package, not the clone as an empty namespace package (the flat layout did)."""
    clone = tmp_path / "isiwatch"
    for folder in ("src/isiwatch", "tests", "benchmarks"):
        (clone / folder).mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-c", "import isiwatch; print(isiwatch.__file__, isiwatch.Watch.__name__)"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    location, name = proc.stdout.split()
    assert name == "Watch" and location.endswith("__init__.py") and not location.startswith(str(tmp_path))
