"""An integration whose framework is not installed says, in one line, which extra installs it: the Hugging Face
Trainer needs ``accelerate`` besides ``transformers`` (transformers does not install it, and the Trainer fails
only once built), and ``lightning`` is not in the base install (``lightning_fabric`` is)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Makes ``import NAME`` fail for each name in $BLOCK_IMPORTS, as on a machine that lacks the package.
BLOCKER = """import os, sys
for name in filter(None, os.environ.get("BLOCK_IMPORTS", "").split(",")):
    sys.modules[name] = None
"""


@pytest.mark.parametrize(("module", "blocked", "extra"), [
    ("transformers", "accelerate", "transformers"),
    ("transformers", "transformers", "transformers"),
    ("lightning", "lightning", "lightning"),
])
def test_a_missing_framework_is_one_line_naming_the_extra(tmp_path, module, blocked, extra):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "BLOCK_IMPORTS": blocked,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src")])}
    done = subprocess.run([sys.executable, "-c", f"import isiwatch.integrations.{module}"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"ModuleNotFoundError: isiwatch's {extra} integration needs {blocked}, not installed: "
        f'pip install "isiwatch[{extra}]"')


def test_the_extras_install_what_the_integrations_import():
    text = (ROOT / "pyproject.toml").read_text()  # Python 3.10 has no tomllib
    assert 'transformers = ["transformers", "accelerate"]' in text and 'lightning = ["lightning"]' in text
