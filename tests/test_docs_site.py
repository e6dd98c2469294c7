"""The docs site as a reader gets it: built as CI builds it (``mkdocs build --strict``), then read as HTML.

``--strict`` catches broken links, but not a Sphinx role (``:class:`X```) in a docstring: mkdocstrings renders it
as the raw text ``:class:<code>X</code>``, not as a link. The figures the pages show live next to them
(``docs/figures/``, copies of what the benchmark scripts write), so the pages read on GitHub too; CONTRIBUTING.md is a
page of the site.

The pages as a reader meets them on GitHub and in the site: task pages (how-tos) open with an example, keep to the
task (at most `PROSE_LIMIT` words of prose) and leave the reasoning to the Explanations page; no ``!!!``
admonition (raw text on GitHub); the Watch's options table is the code's; the API reference shows each public
object under its own heading, with its signature and the real values of its defaults.
"""

from __future__ import annotations

import dataclasses
import html
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urljoin

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: A Sphinx role as mkdocstrings leaves it in the HTML (``:class:<code>X</code>``), or as written.
RAW_ROLE = re.compile(r":(?:class|meth|attr|mod|func|data|exc|obj):(?:<code>|`)")
#: The figures, as committed under benchmarks/results/, and the pages that must show them.
FIGURES = [
    ("depth/depth.png", "index.html"),
    ("depth/depth.png", "benchmarks/index.html"),
    ("demo/report_heatmaps.png", "index.html"),
    ("freeze/freeze.png", "explanations/index.html"),
]
#: The pages a user reads to do one task: each opens with a runnable example and keeps to the task.
TASK_PAGES = ["monitor.md", "truncate.md", "training.md", "integrations.md", "specialize.md", "cli.md"]
#: Words of prose a task page may hold (code, tables, headings and comments not counted).
PROSE_LIMIT = 2000
#: The public objects whose API entry must show a heading and a signature.
API_OBJECTS = ["Watch", "analyze", "truncate", "cut", "heal", "specialize", "WatchOptions"]
DOC_PAGES = sorted((ROOT / "docs").glob("*.md"))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def _pages(site: Path) -> dict[str, str]:
    return {p.relative_to(site).as_posix(): p.read_text(encoding="utf-8") for p in site.rglob("*.html")}


def _images(site: Path, page: str, html: str) -> set[Path]:
    """The files the page's ``<img>`` tags load, as paths in the built site."""
    base = "file://" + (site / page).as_posix()
    return {Path(unquote(urljoin(base, src)[len("file://"):]))
            for src in re.findall(r'<img[^>]*\ssrc="([^"]+)"', html) if not src.startswith(("http", "data:"))}


def test_no_page_shows_a_raw_sphinx_role(site: Path) -> None:
    raw = {page: sorted(set(re.findall(r".{0,40}" + RAW_ROLE.pattern + r".{0,30}", html)))
           for page, html in _pages(site).items() if RAW_ROLE.search(html)}
    assert not raw, f"Sphinx roles rendered as text (write [`Name`][isiwatch.Name] or `name`): {raw}"


def test_no_docstring_uses_a_sphinx_role() -> None:
    """The same rule at its source, for the docstrings the API page does not render (yet)."""
    found = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "src").rglob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if RAW_ROLE.search(line)]
    assert not found, f"Sphinx roles in src (write [`Name`][isiwatch.Name] or `name`): {found}"


def test_api_cross_references_are_links(site: Path) -> None:
    """The docstrings' references are autorefs links to the entries they name (the Watch's docstring names its
    ``state_dict``)."""
    api = _pages(site)["api/index.html"]
    assert re.search(r'<a class="autorefs autorefs-internal"[^>]*href="#isiwatch\.Watch\.state_dict"', api)


@pytest.mark.parametrize(("figure", "page"), FIGURES)
def test_pages_show_the_committed_figures(site: Path, figure: str, page: str) -> None:
    html = _pages(site)[page]
    shown = _images(site, page, html)
    copy = next((p for p in shown if p.name == Path(figure).name), None)
    assert copy is not None, f"{page} shows no {figure}: its images are {sorted(map(str, shown))}"
    assert copy.is_file(), f"{page} shows {copy}, which the built site lacks"
    assert copy.read_bytes() == (ROOT / "benchmarks" / "results" / figure).read_bytes(), \
        f"docs/figures/{copy.name} differs from benchmarks/results/{figure}: copy the new figure into docs/figures/"


@pytest.mark.parametrize("page", [ROOT / "README.md", *DOC_PAGES], ids=lambda p: p.name)
def test_every_image_a_page_links_lives_next_to_it(page: Path) -> None:
    """On GitHub a page shows only what the repository holds at the linked path (no build-time copies)."""
    links = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text(encoding="utf-8"))
    missing = [link for link in links if not link.startswith("http") and not (page.parent / link).is_file()]
    assert not missing, f"{page.name} links images the repository lacks there: {missing}"


@pytest.mark.parametrize("page", [ROOT / "README.md", *DOC_PAGES], ids=lambda p: p.name)
def test_no_page_uses_an_admonition_github_shows_raw(page: Path) -> None:
    raw = [line for line in page.read_text(encoding="utf-8").splitlines() if line.lstrip().startswith("!!!")]
    assert not raw, f"{page.name}: write a blockquote (> **Note.** ...), not {raw}"


def prose_words(markdown: str) -> int:
    """Words of running text: fenced code, HTML comments, tables and headings left out."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return sum(len(line.split()) for line in text.splitlines() if not line.lstrip().startswith(("|", "#")))


def test_prose_words_counts_text_not_code() -> None:
    page = ("# Title\n\nTwo words.\n\n```python\nx = 1 + 2\n```\n\n| a | b |\n|---|---|\n<!-- a comment -->\n"
            "and three more\n")
    assert prose_words(page) == 5


@pytest.mark.parametrize("name", TASK_PAGES)
def test_task_pages_open_with_an_example_and_keep_to_the_task(name: str) -> None:
    text = (ROOT / "docs" / name).read_text(encoding="utf-8")
    assert prose_words(text) <= PROSE_LIMIT, \
        f"docs/{name}: {prose_words(text)} words of prose; move the why and the evidence to docs/explanations.md"
    first_section = text.split("\n## ", 1)[0]
    assert "```" in first_section, f"docs/{name} does not open with an example"
    assert not re.search(r"tests/test_\w+\.py", text), f"docs/{name} cites a test file: say what it shows"


def test_the_reasoning_has_its_page_and_the_task_pages_link_it() -> None:
    for name in ["monitor.md", "truncate.md"]:
        assert "explanations.md" in (ROOT / "docs" / name).read_text(encoding="utf-8"), f"docs/{name}"


def test_the_fault_tables_are_a_reference_page() -> None:
    faults = (ROOT / "docs" / "faults.md").read_text(encoding="utf-8")
    assert faults.count("\n| fault |") == 2, "docs/faults.md holds both fault tables"
    monitor = (ROOT / "docs" / "monitor.md").read_text(encoding="utf-8")
    assert "| fault |" not in monitor and "(faults.md)" in monitor


def test_the_watch_options_table_is_the_codes() -> None:
    """Every field of WatchOptions, with its real default, in the committed table (``python docs/hooks.py``)."""
    from isiwatch.watch.config import WatchOptions

    sys.path.insert(0, str(ROOT / "docs"))
    import hooks

    page = (ROOT / "docs" / "monitor.md").read_text(encoding="utf-8")
    assert hooks.with_table(page) == page, "docs/monitor.md's options table is out of date: python docs/hooks.py"
    for field in dataclasses.fields(WatchOptions):
        default = "none" if field.default is None else f"`{field.default!r}`"
        assert re.search(rf"^\| `{field.name}` \| [^|]+ \| {re.escape(default)} \| \S", page, re.M), field.name


@pytest.mark.parametrize("name", API_OBJECTS)
def test_api_reference_shows_each_object_with_heading_signature_and_real_defaults(site: Path, name: str) -> None:
    api = _pages(site)["api/index.html"]
    entry = re.search(rf'<h3 id="isiwatch\.{name}".*?(?=<h[23] id="isiwatch\.[A-Za-z_]+"|\Z)', api, re.S)
    assert entry is not None, f"isiwatch.{name} has no heading of its own"
    signature = re.search(r'<div class="doc-signature.*?</div>', entry.group(), re.S)
    assert signature is not None, f"isiwatch.{name} shows no signature"
    text = html.unescape(re.sub(r"<[^>]+>", "", signature.group()))
    assert f"{name}(" in text
    constants = re.findall(r"= ([A-Z][A-Z0-9_]{2,})\b", text)
    assert not constants, f"isiwatch.{name}'s defaults show constant names, not values: {constants}"


def test_truncate_defaults_are_the_values_a_caller_gets(site: Path) -> None:
    import inspect

    import isiwatch

    api = html.unescape(re.sub(r"<[^>]+>", "", _pages(site)["api/index.html"]))
    defaults = inspect.signature(isiwatch.truncate).parameters
    for name in ["max_drop", "confidence", "budget"]:
        assert re.search(rf"{name}: \w+ = {re.escape(repr(defaults[name].default))}\b", api), name


def test_contributing_is_a_page_linked_from_the_nav_and_the_overview(site: Path) -> None:
    pages = _pages(site)
    page = pages.get("contributing/index.html")
    assert page is not None, "no contributing page"
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    for heading in re.findall(r"^## (.+)$", text, flags=re.M):
        assert f">{heading}<" in page, f"the contributing page lacks CONTRIBUTING.md's section {heading!r}"
    links = re.findall(r"<a\s[^>]*>", pages["index.html"])
    assert any('href="contributing/"' in a and "md-nav__link" not in a for a in links), \
        "the overview's text does not link it"
    nav = re.findall(r"<a\s[^>]*>", pages["api/index.html"])
    assert any('href="../contributing/"' in a and 'class="md-nav__link"' in a for a in nav), "the nav does not list it"


def test_long_code_lines_wrap_instead_of_overflowing(site: Path) -> None:
    """Snippets run as written, so some lines are long; the site wraps them rather than hiding their ends."""
    page = _pages(site)["truncate/index.html"]
    css = re.search(r'<link[^>]+href="([^"]*extra\.css)"', page)
    assert css is not None, "the pages load no stylesheet of ours"
    assert "white-space: pre-wrap" in (site / "truncate" / css[1]).resolve().read_text()
