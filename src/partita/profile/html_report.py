"""``partita profile --report profile.html``: one self-contained page (plotly.js embedded,
so it opens offline) with

* a per-rank timeline of compute, each collective and memory copies over the profiled
  steps (the merged intervals :func:`partita.profile.trace.analyze_trace` measured);
* measured beside predicted per step - step time, compute, exposed communication, idle
  or bubble - with the ratio, as a table and as grouped bars.

plotly is an optional dependency (``pip install 'partita[report]'``).
"""
from __future__ import annotations

import html
from pathlib import Path

from ..errors import PartitaError
from .trace import Interval

#: one colour per category, stable across reports
COLOURS = {"compute": "#4C78A8", "memory": "#9D755D", "comm:all_reduce": "#F58518", "comm:all_gather": "#E45756",
           "comm:reduce_scatter": "#72B7B2", "comm:all_to_all": "#54A24B", "comm:send_recv": "#EECA3B",
           "comm:broadcast": "#B279A2", "comm:barrier": "#BAB0AC", "comm:other": "#FF9DA6"}
ROWS = (("step_time_s", "step time"), ("compute_s", "compute"), ("exposed_communication_s", "exposed communication"),
        ("idle_s", "idle / bubble"))


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


def comparison_figures(report: dict):
    """Measured vs predicted per step: a table with the ratio, and grouped bars."""
    import plotly.graph_objects as go
    o, p, ratio = report["overall"], report["predicted"], report["ratio_measured_over_predicted"]
    labels = [label for _, label in ROWS]
    measured = [o[key] * 1e3 for key, _ in ROWS]
    predicted = [p.get(key, 0.0) * 1e3 for key, _ in ROWS]
    ratios = [f"{ratio[key]:.2f}" if key in ratio else "-" for key, _ in ROWS]
    table = go.Figure(go.Table(
        header={"values": ["per step", "measured (ms)", "predicted (ms)", "measured / predicted"]},
        cells={"values": [labels, [f"{v:.1f}" for v in measured], [f"{v:.1f}" for v in predicted], ratios]}))
    table.update_layout(title=f"Measured vs predicted: {report['plan']} (prediction on '{report['hardware']}')",
                        height=300)
    bars = go.Figure([go.Bar(name="measured", x=labels, y=measured), go.Bar(name="predicted", x=labels, y=predicted)])
    bars.update_layout(barmode="group", yaxis_title="ms per step", height=380)
    return table, bars


def require_plotly() -> None:
    """The one-line error for a missing optional dependency, before any work is done."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        raise PartitaError("--report needs plotly: pip install 'partita[report]'") from None


def write_html_report(report: dict, timelines: dict[int, dict[str, list[Interval]]], path: str | Path) -> Path:
    """Write the page; plotly.js goes in once, inline."""
    require_plotly()
    figures = [timeline_figure(timelines), *comparison_figures(report)]
    body = "\n".join(fig.to_html(full_html=False, include_plotlyjs=(i == 0), div_id=f"partita-fig-{i}")
                     for i, fig in enumerate(figures))
    title = html.escape(f"partita profile: {report['plan']}")
    page = (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{title}</title></head>\n"
            f"<body style='font-family:sans-serif'>\n<h2>{title}</h2>\n{body}\n</body></html>\n")
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path
