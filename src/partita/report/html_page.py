"""The one HTML page shell every report of Partita is written in: ``partita plan`` /
``partita estimate --report`` (:mod:`partita.report.page`), ``partita profile --report``
(:mod:`partita.profile.report`) and ``partita analyze --report``
(:mod:`partita.analyze.report`).

A page is one self-contained file: plotly.js goes in once, inline, with the first figure,
so it opens offline. plotly is the optional ``report`` extra (``pip install
'partita[report]'``), imported only when a page is drawn; this module itself needs none.
"""
from __future__ import annotations

import html
from pathlib import Path

from ..errors import PartitaError
from ..outputs import write_output


def require_plotly() -> None:
    """The one-line error for the missing optional dependency, before any work is done."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        raise PartitaError("--report needs plotly: pip install 'partita[report]'") from None


def figure_div(fig, div_id: str, with_plotlyjs: bool) -> str:
    """One plotly figure as a ``<div id=div_id>``; plotly.js inline when ``with_plotlyjs``
    (the page's first figure only)."""
    return fig.to_html(full_html=False, include_plotlyjs=with_plotlyjs, div_id=div_id)


def figure_divs(figures: list, prefix: str = "partita-fig") -> str:
    """The figures in order as ``<div id="{prefix}-0">``, ``-1``, ...; plotly.js in the first."""
    return "\n".join(figure_div(fig, f"{prefix}-{i}", i == 0) for i, fig in enumerate(figures))


def html_page(title: str, body: str, heading: str = "h2", style: str = "font-family:sans-serif") -> str:
    """The document around ``body`` (HTML): the escaped ``title`` as the page title and as
    its first heading (``<h1>`` or ``<h2>``), ``style`` on ``<body>``."""
    text = html.escape(title)
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{text}</title></head>\n"
            f"<body style='{style}'>\n<{heading}>{text}</{heading}>\n{body}\n</body></html>\n")


def write_page(path: str | Path, page: str) -> Path:
    """Write the page (UTF-8), whole or not at all; any failure to write is one line naming
    the path (:func:`partita.outputs.write_output`)."""
    return write_output(path, page, "--report")
