"""The HTML elements the report page is built from: a table, an embedded figure, a definition list of state words.

Every text goes through ``html.escape``, so a run's names and messages cannot break the page.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from pathlib import Path

from ..measure.vocabulary import VOCABULARY


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


def figure(path: Path, alt: str) -> str:
    """The PNG at ``path`` embedded as a data URI: the page needs no file beside it."""
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'


def definitions(words: Sequence[str]) -> str:
    """A definition list of the state words ``words`` (`isiwatch.measure.vocabulary`), under the table that uses
    them; a word the table does not know (an alert kind of another version) is left out."""
    items = "".join(f"<dt>{html.escape(w)}</dt><dd>{html.escape(VOCABULARY[w])}</dd>"
                    for w in dict.fromkeys(words) if w in VOCABULARY)
    return f'<dl class="glossary">{items}</dl>'
