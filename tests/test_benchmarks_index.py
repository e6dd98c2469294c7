"""benchmarks/README.md indexes every benchmark script, and every file it names exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
INDEX = (BENCH / "README.md").read_text()


def named(pattern: str) -> set[str]:
    return set(re.findall(pattern, INDEX))


def test_every_script_is_indexed():
    missing = sorted(p.name for p in BENCH.glob("*.py") if f"`{p.name}`" not in INDEX)
    assert not missing, f"add a row for these to benchmarks/README.md: {missing}"


def test_every_named_result_exists():
    paths = named(r"`((?:benchmarks/)?results/[\w./]+)`") | {f"results/{p}" for p in named(
        r"`([a-z_]+/[a-z0-9_]+\.(?:json|png))`")}
    missing = sorted(p for p in paths if not (BENCH / p.removeprefix("benchmarks/")).exists())
    assert paths and not missing, f"benchmarks/README.md names files that do not exist: {missing}"


def test_every_named_page_and_script_exists():
    files = named(r"`((?:docs|tests)/[\w/]+\.(?:md|py))`") | named(r"\b(README\.md|CONTRIBUTING\.md)\b")
    missing = sorted(f for f in files if not (ROOT / f).exists())
    assert not missing, f"benchmarks/README.md names files that do not exist: {missing}"


def test_every_result_is_indexed():
    results = {p.relative_to(BENCH).as_posix() for p in (BENCH / "results").rglob("*.json")
               if p.parent.name != "analyses"}
    missing = sorted(r for r in results if r not in INDEX and r.removeprefix("results/") not in INDEX)
    assert not missing, f"benchmarks/README.md does not say which script writes: {missing}"


def test_the_profiler_example_in_the_docs_is_the_script_s_with_the_table_it_recorded():
    """docs/monitor.md shows benchmarks/profiler_table.py's example as the script runs it, and the table it printed
    (tests/test_readme_snippets.py runs the example too)."""
    import json
    import runpy

    snippet = runpy.run_path(str(BENCH / "profiler_table.py"), run_name="profiler_table")["SNIPPET"]
    record = json.loads((BENCH / "results" / "profiler" / "profiler_table.json").read_text())
    page = (ROOT / "docs" / "monitor.md").read_text()
    assert record["snippet"] == snippet and f"```python\n{snippet}\n```" in page
    assert " isiwatch.sample " in record["table"] and f"```text\n{record['table']}\n```" in page
