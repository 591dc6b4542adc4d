"""The figures of a trace analysis, shared by ``partita analyze --report``
(:mod:`partita.analyze.report`) and ``partita profile --report`` (:mod:`partita.profile.report`):
the per-rank timeline of the merged intervals :func:`partita.analyze.breakdown.analyze_trace`
measured, the temporal breakdown per rank, communication per collective or axis, and the
memory timeline. plotly is imported inside each function (the optional ``report`` extra).
"""
from __future__ import annotations

from .breakdown import Interval

#: one colour per category, stable across reports
COLOURS = {"compute": "#4C78A8", "memory": "#9D755D", "comm:all_reduce": "#F58518", "comm:all_gather": "#E45756",
           "comm:reduce_scatter": "#72B7B2", "comm:all_to_all": "#54A24B", "comm:send_recv": "#EECA3B",
           "comm:broadcast": "#B279A2", "comm:barrier": "#BAB0AC", "comm:other": "#FF9DA6"}


def _coarsen(intervals: list[Interval], min_gap: float) -> list[Interval]:
    """Merge intervals closer than ``min_gap``: a CPU trace has thousands of op-sized
    gaps that no screen can show, and the page stays small."""
    out: list[list[float]] = []
    for a, b in intervals:
        if out and a - out[-1][1] < min_gap:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def timeline_figure(timelines: dict[int, dict[str, list[Interval]]]):
    """Horizontal bars, one row per rank, one colour per category (milliseconds from the
    first event of any rank)."""
    import plotly.graph_objects as go
    starts = [iv[0] for tl in timelines.values() for ivs in tl.values() for iv in ivs]
    ends = [iv[1] for tl in timelines.values() for ivs in tl.values() for iv in ivs]
    t0 = min(starts) if starts else 0.0
    min_gap = (max(ends) - t0) / 3000 if ends else 0.0
    fig = go.Figure()
    categories = sorted({c for tl in timelines.values() for c in tl}, key=lambda c: (c != "compute", c))
    for category in categories:
        ys, bases, widths = [], [], []
        for rank in sorted(timelines):
            for a, b in _coarsen(timelines[rank].get(category, []), min_gap):
                ys.append(f"rank {rank}")
                bases.append((a - t0) / 1e3)
                widths.append((b - a) / 1e3)
        label = category.removeprefix("comm:")
        fig.add_trace(go.Bar(y=ys, x=widths, base=bases, orientation="h", name=label,
                             marker_color=COLOURS.get(category, "#888888"),
                             hovertemplate=f"{label}<br>%{{base:.2f}} ms + %{{x:.3f}} ms<extra></extra>"))
    fig.update_layout(barmode="overlay", title="Per-rank timeline of the profiled steps", xaxis_title="ms",
                      yaxis={"autorange": "reversed"}, height=160 + 60 * max(len(timelines), 1),
                      legend={"orientation": "h"})
    return fig


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
