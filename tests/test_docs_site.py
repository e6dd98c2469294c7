"""The docs site as a reader gets it: built as CI builds it (``mkdocs build --strict``), then read as HTML.

``--strict`` catches broken links, but not a Sphinx role (``:class:`X```) in a docstring: mkdocstrings renders it
as the raw text ``:class:<code>X</code>``, not as a link. The figures the pages show live under
``benchmarks/results/`` (one copy, put into the site by ``docs/hooks.py``), and CONTRIBUTING.md is a page of the
site.
"""

from __future__ import annotations

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
]


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
    assert copy.read_bytes() == (ROOT / "benchmarks" / "results" / figure).read_bytes()


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
