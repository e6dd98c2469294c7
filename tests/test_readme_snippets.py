"""Every code block of README.md and of the docs pages (docs/*.md) runs as written: each ```python block in a
fresh interpreter (its own empty working directory, offline, one thread), each ```yaml block that names its file
(first line ``# NAME.yaml``) through ``isiwatch config check``. A block preceded by
``<!-- readme-test: skip REASON -->`` is not run (shell commands, patches and command synopses are not Python and
are not collected). A block's test id is its page and its index among that page's blocks of its kind
(``monitor.md-2``); a failure names the page and line."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!-- readme-test: skip (?P<skip>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)\n```", re.S)


def blocks(lang: str) -> list[tuple[str, int, str, str | None]]:
    """(page, line, code, skip reason) of every ``lang`` block, README first, then the docs pages by name."""
    found = []
    for page in PAGES:
        text = page.read_text()
        found += [(page.relative_to(ROOT).as_posix(), text.count("\n", 0, m.start("code")) + 1, m["code"], m["skip"])
                  for m in BLOCK.finditer(text) if m["lang"] == lang]
    return found


def ids(found: list[tuple[str, int, str, str | None]]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for page, *_ in found:
        seen[page] = seen.get(page, 0) + 1
        out.append(f"{Path(page).name}-{seen[page]}")
    return out


PYTHON = blocks("python")
YAML = [b for b in blocks("yaml") if re.match(r"# [\w.-]+\.ya?ml\b", b[2])]


def run(args, cwd, timeout=300):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg",
           "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_pages_have_the_blocks_this_test_runs():
    pages = {page for page, _, _, skip in PYTHON if skip is None}
    assert "README.md" in pages and {"docs/monitor.md", "docs/truncate.md", "docs/integrations.md"} <= pages
    assert len([b for b in PYTHON if b[3] is None]) >= 8 and len(YAML) >= 1


@pytest.mark.parametrize("page, line, code, skip", PYTHON, ids=ids(PYTHON))
def test_python_block_runs_as_written(page, line, code, skip, tmp_path):
    if skip is not None:
        pytest.skip(f"{page} line {line}: {skip}")
    script = tmp_path / "snippet.py"
    script.write_text(code + "\n")
    result = run([sys.executable, str(script)], tmp_path)
    assert result.returncode == 0, f"{page} line {line}:\n{result.stderr[-3000:]}"


@pytest.mark.parametrize("page, line, code, skip", YAML, ids=ids(YAML))
def test_yaml_block_passes_config_check(page, line, code, skip, tmp_path):
    name = code.split()[1]
    (tmp_path / name).write_text(code + "\n")
    result = run([sys.executable, "-m", "isiwatch.cli", "config", "check", name], tmp_path, timeout=60)
    assert result.returncode == 0 and "OK" in result.stdout, f"{page} line {line}:\n{result.stderr}"
