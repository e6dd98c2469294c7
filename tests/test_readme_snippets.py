"""Every code block of README.md and of the docs pages (docs/*.md) runs as written: each ```python block in a
fresh interpreter (its own empty working directory, offline, one thread), each ```yaml block that names its file
(first line ``# NAME.yaml``) through ``isiwatch config check``. A block preceded by
``<!-- readme-test: skip REASON -->`` is not run (shell commands, patches and command synopses are not Python and
are not collected). A block's test id is its page and its index among that page's blocks of its kind
(``monitor.md-2``); a failure names the page and line.

A ```text block right after a ```python block is what that block prints: each of its lines must be a line the
block printed, numbers with a decimal point read as any such number (they move with the machine's floating point),
every other character as written. So a snippet shows its feature doing something (a cut of 4 of 6 blocks, blocks
frozen), and the page shows what a user will see."""

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


def outputs() -> dict[tuple[str, int], str]:
    """(page, line of the code) → the ```text block that follows a ```python block, what it prints."""
    found = {}
    for page in PAGES:
        text = page.read_text()
        for m in BLOCK.finditer(text):
            after = re.match(r"\n\n```text\n(.*?)\n```", text[m.end():], re.S)
            if m["lang"] == "python" and after:
                found[(page.relative_to(ROOT).as_posix(), text.count("\n", 0, m.start("code")) + 1)] = after[1]
    return found


def printed(expected: str, stdout: str) -> list[str]:
    """The lines of ``expected`` that no line of ``stdout`` matches (decimal numbers match any decimal number)."""
    lines = stdout.splitlines()
    missing = []
    for line in expected.splitlines():
        pattern = re.sub(r"\\-?\d+\\\.\d+|-?\d+\\\.\d+", r"-?\\d+\\.\\d+", re.escape(line))
        if not any(re.fullmatch(pattern, got.rstrip()) for got in lines):
            missing.append(line)
    return missing


def test_printed_reads_decimals_as_any_and_integers_as_written():
    assert printed("kept 4 of 6 blocks; within 3.52 points", "log\nkept 4 of 6 blocks; within 4.37 points\n") == []
    assert printed("kept 4 of 6 blocks; within 3.52 points", "kept 5 of 6 blocks; within 3.52 points") != []
    assert printed("test drop -2.6 points", "test drop 0.4 points") == []


def ids(found: list[tuple[str, int, str, str | None]]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for page, *_ in found:
        seen[page] = seen.get(page, 0) + 1
        out.append(f"{Path(page).name}-{seen[page]}")
    return out


PYTHON = blocks("python")
OUTPUTS = outputs()
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
    expected = OUTPUTS.get((page, line))
    if expected is not None:
        missing = printed(expected, result.stdout)
        assert not missing, f"{page} line {line} did not print {missing}; it printed:\n{result.stdout[-3000:]}"


def test_the_task_pages_open_with_an_example_that_shows_its_output():
    for page in ["docs/monitor.md", "docs/truncate.md", "docs/training.md", "docs/integrations.md"]:
        first = min(line for p, line, _, skip in PYTHON if p == page and skip is None)
        assert (page, first) in OUTPUTS, f"{page}: its first example shows no output (a ```text block after it)"


@pytest.mark.parametrize("page, line, code, skip", YAML, ids=ids(YAML))
def test_yaml_block_passes_config_check(page, line, code, skip, tmp_path):
    name = code.split()[1]
    (tmp_path / name).write_text(code + "\n")
    result = run([sys.executable, "-m", "isiwatch.cli", "config", "check", name], tmp_path, timeout=60)
    assert result.returncode == 0 and "OK" in result.stdout, f"{page} line {line}:\n{result.stderr}"
