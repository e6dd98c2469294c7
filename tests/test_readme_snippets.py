"""Every code block of README.md runs as written: each ```python block in a fresh interpreter (its own empty
working directory, offline, one thread), each ```yaml block that names its file (first line ``# NAME.yaml``)
through ``isiwatch config check``. A block preceded by ``<!-- readme-test: skip REASON -->`` is not run (shell
commands, patches and command synopses are not Python and are not collected)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"(?:<!-- readme-test: skip (?P<skip>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)\n```", re.S)


def blocks(lang: str) -> list[tuple[int, str, str | None]]:
    text = README.read_text()
    return [(text.count("\n", 0, m.start("code")) + 1, m["code"], m["skip"]) for m in BLOCK.finditer(text)
            if m["lang"] == lang]


PYTHON = blocks("python")
YAML = [b for b in blocks("yaml") if re.match(r"# [\w.-]+\.ya?ml\b", b[1])]


def run(args, cwd, timeout=300):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg",
           "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_readme_has_the_blocks_this_test_runs():
    assert len([b for b in PYTHON if b[2] is None]) >= 6 and len(YAML) == 1


@pytest.mark.parametrize("line, code, skip", PYTHON, ids=[f"line{b[0]}" for b in PYTHON])
def test_python_block_runs_as_written(line, code, skip, tmp_path):
    if skip is not None:
        pytest.skip(f"README line {line}: {skip}")
    script = tmp_path / "snippet.py"
    script.write_text(code + "\n")
    result = run([sys.executable, str(script)], tmp_path)
    assert result.returncode == 0, f"README.md line {line}:\n{result.stderr[-3000:]}"


@pytest.mark.parametrize("line, code, skip", YAML, ids=[f"line{b[0]}" for b in YAML])
def test_yaml_block_passes_config_check(line, code, skip, tmp_path):
    name = code.split()[1]
    (tmp_path / name).write_text(code + "\n")
    result = run([sys.executable, "-m", "isiwatch.cli", "config", "check", name], tmp_path, timeout=60)
    assert result.returncode == 0 and "OK" in result.stdout, f"README.md line {line}:\n{result.stderr}"
