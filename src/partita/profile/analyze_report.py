"""``partita analyze --report analyze.html``: one self-contained page (plotly.js inline, so
it opens offline), in the style of ``partita profile``'s page
(:mod:`partita.profile.html_report`, whose timeline figure it reuses):

* the temporal breakdown per rank (compute / non-compute / idle, % of the window) with the
  overlap of communication and computation;
* communication per collective and per parallel axis, per rank;
* the per-rank timeline of compute, each collective and memory copies;
* the memory timeline (allocated and reserved) per rank and device, when recorded.
"""
from __future__ import annotations

import html
from pathlib import Path

from .html_report import COLOURS, require_plotly, timeline_figure
from .trace import Interval


def breakdown_figure(report: dict):
    """Stacked bars: compute, non-compute and idle share of each rank's window."""
    import plotly.graph_objects as go
    ranks = [f"rank {r['rank']}" for r in report["ranks"]]
    fig = go.Figure()
    for key, label, colour in (("compute_pct", "compute", COLOURS["compute"]),
                               ("non_compute_pct", "non-compute", COLOURS["comm:all_reduce"]),
                               ("idle_pct", "idle", "#BAB0AC")):
        fig.add_trace(go.Bar(x=ranks, y=[r[key] for r in report["ranks"]], name=label, marker_color=colour))
    fig.add_trace(go.Scatter(x=ranks, y=[r["overlap_pct"] for r in report["ranks"]], name="comm overlapped (%)",
                             mode="markers", marker={"size": 12, "symbol": "diamond", "color": "black"}))
    fig.update_layout(barmode="stack", yaxis_title="% of the window", height=420,
                      title=f"Temporal breakdown ({report['conventions']} conventions)")
    return fig


def communication_figure(report: dict, field: str, title: str):
    """Grouped bars: milliseconds per collective (or axis), per rank."""
    import plotly.graph_objects as go
    keys = sorted({k for r in report["ranks"] for k in r[field]})
    fig = go.Figure([go.Bar(name=k, x=[f"rank {r['rank']}" for r in report["ranks"]],
                            y=[r[field].get(k, 0.0) / 1e3 for r in report["ranks"]],
                            marker_color=COLOURS.get(f"comm:{k}")) for k in keys])
    fig.update_layout(barmode="group", yaxis_title="ms", title=title, height=380)
    return fig


def memory_figure(report: dict):
    """Allocated and reserved GiB over time, per rank and device; None when not recorded."""
    import plotly.graph_objects as go
    fig = go.Figure()
    for r in report["ranks"]:
        for device, m in r["memory"].items():
            t = [p[0] / 1e3 for p in m["timeline"]]
            for i, what in ((1, "allocated"), (2, "reserved")):
                fig.add_trace(go.Scatter(x=t, y=[p[i] / 2**30 for p in m["timeline"]], mode="lines",
                                         name=f"rank {r['rank']} {device} {what}"))
    if not fig.data:
        return None
    fig.update_layout(title="Memory", xaxis_title="ms", yaxis_title="GiB", height=420)
    return fig


def write_analyze_report(report: dict, timelines: dict[int, dict[str, list[Interval]]], path: str | Path) -> Path:
    """Write the page; plotly.js goes in once, inline."""
    require_plotly()
    figures = [breakdown_figure(report),
               communication_figure(report, "by_collective_us", "Communication by collective"),
               communication_figure(report, "by_axis_us", "Communication by parallel axis (from process groups)"),
               timeline_figure(timelines), memory_figure(report)]
    figures = [f for f in figures if f is not None]
    body = "\n".join(fig.to_html(full_html=False, include_plotlyjs=(i == 0), div_id=f"partita-fig-{i}")
                     for i, fig in enumerate(figures))
    s = report["stragglers"]
    note = ""
    if len(report["ranks"]) > 1 and s:
        note = (f"<p>Slowest rank by compute: {s['compute']['rank']} "
                f"({s['compute']['ratio_to_median']}x the median).</p>")
    title = html.escape(f"partita analyze: {len(report['ranks'])} rank(s), {report['conventions']} conventions")
    page = (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{title}</title></head>\n"
            f"<body style='font-family:sans-serif'>\n<h2>{title}</h2>\n{note}\n{body}\n</body></html>\n")
    path = Path(path)
    try:
        path.write_text(page, encoding="utf-8")
    except FileNotFoundError:
        from ..errors import PartitaError
        raise PartitaError(f"cannot write {path}: its directory does not exist") from None
    return path
