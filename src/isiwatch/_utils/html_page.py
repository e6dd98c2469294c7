"""The frame and the table every isiwatch HTML page is built from (``isiwatch report``'s page, ``truncate``'s
``--report PAGE.html``): one style, one table, one document shell.

Every text goes through ``html.escape``, so a run's names and messages cannot break a page.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

__all__ = ["STYLE", "document", "table"]

STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}
.table-box{overflow-x:auto}
.warning{background:#fff4dc;border-left:4px solid #d08a00;padding:4px 8px}
th{background:#f4f4f4}img{max-width:100%;border:1px solid #eee}figure{margin:.8em 0}
dl.glossary{display:grid;grid-template-columns:max-content auto;gap:2px 12px}dl.glossary dt{font-weight:600}
dl.glossary dd{margin:0}"""


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A table of ``rows`` under ``header``; floats with three decimals, a non-finite one as "–". It sits in its own
    box, which scrolls sideways if the table is ever wider than the page's column: the page itself never does."""
    def cell(v: object) -> str:
        if isinstance(v, float):
            return "–" if not math.isfinite(v) else f"{v:.3f}"
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f'<div class="table-box"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def document(title: str, body: str) -> str:
    """A whole self-contained page: ``body`` (HTML) under ``title`` (text), with `STYLE`."""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body>{body}</body></html>")
