"""The plotly figures of the plan report, one function per chart, each from the plain data
of :mod:`partita.report.data` / :mod:`partita.report.schedule` (plotly is imported here
only; it is the optional ``report`` extra)."""
from __future__ import annotations

from typing import Any

from .schedule import Schedule

#: one colour per step-time / memory part, stable across charts and reports
PALETTE = ["#4C78A8", "#F58518", "#E45756", "#72B7B2", "#54A24B", "#EECA3B", "#B279A2", "#FF9DA6", "#9D755D",
           "#BAB0AC", "#1F77B4", "#8C564B", "#17BECF", "#BCBD22"]
FIXED = {"compute": "#4C78A8", "recompute": "#9ECAE9", "bubble": "#DDDDDD", "pipeline bubble": "#BBBBBB",
         "tp communication": "#F58518", "cp communication": "#E45756", "ep all-to-all": "#54A24B",
         "pp send/recv": "#EECA3B", "zero3 gather/scatter": "#B279A2", "dp gradient sync": "#72B7B2",
         "optimizer step": "#9D755D", "tied embedding sync": "#FF9DA6"}


def colour(name: str, seen: dict[str, str]) -> str:
    if name in FIXED:
        return FIXED[name]
    if name not in seen:
        seen[name] = PALETTE[len(seen) % len(PALETTE)]
    return seen[name]


def plans_figure(rows: list[dict[str, Any]], limit_gib: float):
    """Step time against peak memory, one marker per plan, the memory limit as a line."""
    import plotly.graph_objects as go
    fig = go.Figure()
    for row in rows:  # with the 80 % intervals of both numbers as error bars (partita.uncertainty)
        iv = row.get("interval") or {}
        (m_lo, m_hi), (t_lo, t_hi) = iv.get("peak_memory_gib", [row["peak_memory_gib"]] * 2), \
            iv.get("step_time_s", [row["step_time_s"]] * 2)
        fig.add_trace(go.Scatter(x=[row["peak_memory_gib"]], y=[row["step_time_s"]], mode="markers+text",
                                 name=f"{row['label']}: {row['layout']}", text=[row["label"]],
                                 textposition="top center", marker={"size": 14},
                                 error_x={"type": "data", "symmetric": False, "array": [m_hi - row["peak_memory_gib"]],
                                          "arrayminus": [row["peak_memory_gib"] - m_lo]},
                                 error_y={"type": "data", "symmetric": False, "array": [t_hi - row["step_time_s"]],
                                          "arrayminus": [row["step_time_s"] - t_lo]}))
    fig.add_vline(x=limit_gib, line_dash="dash", line_color="#C00000",
                  annotation_text=f"memory limit {limit_gib:.1f} GiB", annotation_position="top left")
    top = max([r["peak_memory_gib"] for r in rows] + [limit_gib])
    fig.update_layout(title="Top plans: step time vs peak memory per device (most loaded rank)",
                      xaxis_title="peak memory per device (GiB)", yaxis_title="step time (s)", height=480,
                      xaxis={"range": [0, top * 1.08]}, legend={"orientation": "h", "y": -0.2})
    return fig


def plans_table_figure(rows: list[dict[str, Any]]):
    """The plans with their full layouts and numbers, side by side."""
    import plotly.graph_objects as go
    header = ["plan", "layout", "step (s) [80 %]", "peak GiB [80 %]", "P(fit)", "tok/s/device", "MFU", "days",
              "device-hours"]
    cells = [[r["label"] for r in rows], [r["layout"] for r in rows], [_with_interval(r, "step_time_s", 2) for r in rows],
             [_with_interval(r, "peak_memory_gib", 1) for r in rows],
             [f"{r['p_fit']:.2f}" + (f" ({r['verdict']})" if r.get("verdict", "fits") != "fits" else "")
              if r.get("p_fit") is not None else "" for r in rows],
             [f"{r['tokens_per_s_per_device']:,.0f}" for r in rows],
             [f"{r['mfu']:.1%}" for r in rows], [f"{r['run_days']:.1f}" for r in rows],
             [f"{r['device_hours']:,.0f}" for r in rows]]
    fig = go.Figure(go.Table(header={"values": header}, cells={"values": cells},
                             columnwidth=[50, 240, 90, 90, 70, 80, 50, 50, 80]))
    fig.update_layout(height=120 + 32 * len(rows), margin={"t": 20, "b": 10})
    return fig


def _with_interval(row: dict[str, Any], key: str, digits: int) -> str:
    """"4.21 [3.6-5.0]": a number and its 80 % interval (when the row has one)."""
    value = f"{row[key]:.{digits}f}"
    lo_hi = (row.get("interval") or {}).get(key)
    return value + (f" [{lo_hi[0]:.{digits}f}-{lo_hi[1]:.{digits}f}]" if lo_hi else "")


def memory_figure(rows: list[dict[str, Any]], limit_gib: float):
    """Memory per rank, stacked by part, for every pipeline stage of every plan."""
    import plotly.graph_objects as go
    x = [f"{r['label']} rank {i}" for r in rows for i in range(len(r["memory_parts_per_stage_gib"]))]
    parts = list(dict.fromkeys(k for r in rows for stage in r["memory_parts_per_stage_gib"] for k in stage))
    seen: dict[str, str] = {}
    fig = go.Figure()
    for part in parts:
        y = [stage.get(part, 0.0) for r in rows for stage in r["memory_parts_per_stage_gib"]]
        fig.add_trace(go.Bar(name=part, x=x, y=y, marker_color=colour(part, seen),
                             hovertemplate=f"{part}: %{{y:.2f}} GiB<extra>%{{x}}</extra>"))
    fig.add_hline(y=limit_gib, line_dash="dash", line_color="#C00000",
                  annotation_text=f"memory limit {limit_gib:.1f} GiB")
    fig.update_layout(barmode="stack", title="Memory per device, every pipeline rank, by part",
                      yaxis_title="GiB", height=520, legend={"orientation": "h", "y": -0.35})
    return fig


def time_figure(rows: list[dict[str, Any]]):
    """Where each plan's step time goes (the cost model's parts; they add up to the step)."""
    import plotly.graph_objects as go
    labels = [f"{r['label']}: {r['layout']}" for r in rows]
    parts = list(dict.fromkeys(k for r in rows for k in r["time"]))
    seen: dict[str, str] = {}
    fig = go.Figure()
    for part in parts:
        fig.add_trace(go.Bar(name=part, y=labels, x=[r["time"].get(part, 0.0) for r in rows], orientation="h",
                             marker_color=colour(part, seen), hovertemplate=f"{part}: %{{x:.3f}} s<extra></extra>"))
    fig.update_layout(barmode="stack", title="Where the step time goes, per plan", xaxis_title="seconds per step",
                      yaxis={"autorange": "reversed"}, height=160 + 50 * len(rows),
                      legend={"orientation": "h", "y": -0.3})
    return fig


def timeline_figure(sched: Schedule, title: str):
    """The predicted schedule of one step: micro-batch chunks per rank, split into work and
    exposed communication per axis, bubbles, then what follows the pipeline."""
    import plotly.graph_objects as go
    kinds = list(dict.fromkeys(b.kind for b in sched.blocks))
    seen: dict[str, str] = {}
    fig = go.Figure()
    for kind in kinds:
        blocks = [b for b in sched.blocks if b.kind == kind]
        fig.add_trace(go.Bar(name=kind if kind != "bubble" else "bubble (idle)", orientation="h",
                             y=[f"rank {b.rank}" for b in blocks], x=[b.length for b in blocks],
                             base=[b.start for b in blocks], text=[b.label for b in blocks],
                             textposition="none", marker_color=colour(kind, seen),
                             hovertemplate="%{text}<br>" + kind + ": %{base:.4f} s + %{x:.4f} s<extra></extra>"))
    fig.update_layout(barmode="overlay", title=title, xaxis_title="seconds from the start of the step",
                      yaxis={"autorange": "reversed"}, height=200 + 40 * sched.ranks,
                      legend={"orientation": "h", "y": -0.25})
    return fig


def scaling_figure(points: list[dict[str, Any]], tokens: float):
    """Days of the run and device-hours against the number of devices (one search each)."""
    import plotly.graph_objects as go
    ok = [p for p in points if p["layout"]]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[p["devices"] for p in ok], y=[p["run_days"] for p in ok], name="days of the run",
                             mode="lines+markers", text=[p["layout"] for p in ok],
                             hovertemplate="%{x} devices: %{y:.1f} days<br>%{text}<extra></extra>"))
    fig.add_trace(go.Scatter(x=[p["devices"] for p in ok], y=[p["device_hours"] for p in ok], yaxis="y2",
                             name="device-hours", mode="lines+markers", text=[p["layout"] for p in ok],
                             hovertemplate="%{x} devices: %{y:,.0f} device-hours<br>%{text}<extra></extra>"))
    fig.update_layout(title=f"Scaling: the best plan at each device count, {tokens:.3g} tokens",
                      xaxis={"title": "devices", "type": "log", "tickvals": [p["devices"] for p in points]},
                      yaxis={"title": "days (log)", "type": "log"},
                      yaxis2={"title": "device-hours", "overlaying": "y", "side": "right"},
                      height=450, legend={"orientation": "h", "y": -0.2})
    return fig


def why_not_figure(rows: list[dict[str, Any]], limit_gib: float):
    """Each "why not" alternative with its full layout: step time against the best plan's,
    or (nothing of it fits) the memory it needs against the limit."""
    import plotly.graph_objects as go
    timed = [r for r in rows if r["slower"] is not None]
    over = [r for r in rows if r["slower"] is None and r["peak_memory_gib"] is not None]
    fig = go.Figure()
    fig.add_trace(go.Bar(name="step time vs plan 1", orientation="h", x=[100 * r["slower"] for r in timed],
                         y=[f"{r['knob']} ({r['layout']})" for r in timed], text=[r["text"] for r in timed],
                         textposition="none", marker_color="#4C78A8",
                         hovertemplate="%{y}: %{x:+.1f}% step time<br>%{text}<extra></extra>"))
    fig.add_trace(go.Bar(name="does not fit: memory over the limit", orientation="h",
                         x=[100 * (r["peak_memory_gib"] / limit_gib - 1) for r in over],
                         y=[f"{r['knob']} ({r['layout']})" for r in over], text=[r["text"] for r in over],
                         textposition="none", marker_color="#C00000",
                         hovertemplate="%{y}: needs %{x:+.0f}% of the memory limit<br>%{text}<extra></extra>"))
    fig.update_layout(title="Why not: each alternative's full layout, % slower than plan 1 (or % over memory)",
                      xaxis_title="% more than plan 1's step time / than the memory limit",
                      yaxis={"autorange": "reversed", "automargin": True}, height=200 + 34 * len(rows),
                      legend={"orientation": "h", "y": -0.2})
    return fig
