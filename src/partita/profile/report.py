"""``partita profile --report profile.html``: one self-contained page (plotly.js embedded,
so it opens offline) with

* a per-rank timeline of compute, each collective and memory copies over the profiled
  steps (the merged intervals :func:`partita.analyze.breakdown.analyze_trace` measured);
* measured beside predicted per step - step time, compute, exposed communication, idle
  or bubble - with the ratio, as a table and as grouped bars.

The timeline is :func:`partita.analyze.figures.timeline_figure`, the page shell
:mod:`partita.report.html_page`; plotly is an optional dependency (``pip install 'partita[report]'``).
"""
from __future__ import annotations

from pathlib import Path

from ..analyze.breakdown import Interval
from ..analyze.figures import timeline_figure
from ..report.html_page import figure_divs, html_page, require_plotly, write_page

ROWS = (("step_time_s", "step time"), ("compute_s", "compute"), ("exposed_communication_s", "exposed communication"),
        ("idle_s", "idle / bubble"))


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


def write_html_report(report: dict, timelines: dict[int, dict[str, list[Interval]]], path: str | Path) -> Path:
    """Write the page (the shell of :mod:`partita.report.html_page`; plotly.js once, inline)."""
    require_plotly()
    body = figure_divs([timeline_figure(timelines), *comparison_figures(report)])
    return write_page(path, html_page(f"partita profile: {report['plan']}", body))
