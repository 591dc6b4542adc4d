"""``partita analyze --report analyze.html``: one self-contained page (plotly.js inline, so
it opens offline), in the style of ``partita profile``'s page
(:mod:`partita.profile.report`: the same timeline figure, :mod:`partita.analyze.figures`,
and the same page shell, :mod:`partita.report.html_page`):

* the temporal breakdown per rank (compute / non-compute / idle, % of the window) with the
  overlap of communication and computation;
* communication per collective and per parallel axis, per rank;
* the per-rank timeline of compute, each collective and memory copies;
* the memory timeline (allocated and reserved) per rank and device, when recorded.
"""
from __future__ import annotations

from pathlib import Path

from ..report.html_page import figure_divs, html_page, require_plotly, write_page
from .breakdown import Interval
from .figures import breakdown_figure, communication_figure, memory_figure, timeline_figure


def write_analyze_report(report: dict, timelines: dict[int, dict[str, list[Interval]]], path: str | Path) -> Path:
    """Write the page (the shell of :mod:`partita.report.html_page`; plotly.js once, inline)."""
    require_plotly()
    figures = [breakdown_figure(report),
               communication_figure(report, "by_collective_us", "Communication by collective"),
               communication_figure(report, "by_axis_us", "Communication by parallel axis (from process groups)"),
               timeline_figure(timelines), memory_figure(report)]
    body = figure_divs([f for f in figures if f is not None])
    s = report["stragglers"]
    note = ""
    if len(report["ranks"]) > 1 and s:
        note = (f"<p>Slowest rank by compute: {s['compute']['rank']} "
                f"({s['compute']['ratio_to_median']}x the median).</p>")
    title = f"partita analyze: {len(report['ranks'])} rank(s), {report['conventions']} conventions"
    return write_page(path, html_page(title, f"{note}\n{body}"))
