"""The numbers of the plan report, as plain data (no plotly): what each chart shows, taken
from the same :class:`partita.estimate.Estimate` and :class:`partita.search.engine.SearchResult`
objects that ``partita plan --json`` / ``partita estimate --json`` print, so the page and
the JSON cannot disagree. Every value here is in the page's embedded data and in its charts."""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

from ..cost.memory import GIB
from ..errors import PartitaError
from ..estimate import Estimate

#: run length the scaling chart uses when no --tokens is given (days per this many tokens)
REFERENCE_TOKENS = 1e12
#: node counts of the scaling chart, as multiples of the cluster's
SCALE_FACTORS = (0.25, 0.5, 1, 2, 4)
#: "why not" lines of partita.search.explain.why_not: "<knob>=<value>[ (crosses nodes)] (<layout>): ..."
WHY_NOT_LINE = re.compile(r"^(?P<label>[a-z_]+=\S+)(?: \(crosses nodes\))? \((?P<layout>[^)]*)\): (?P<rest>.*)$")
#: the step-time change a gradient-knob line of partita.search.comm_knobs states ("-0.2% step time; ...");
#: its plan (the best layout with the knob) is not among the search's attempts
KNOB_CHANGE = re.compile(r"^(?P<pct>[+-]\d+(?:\.\d+)?)% step time")


def plan_row(label: str, est: Estimate, tokens: float) -> dict[str, Any]:
    """One plan as the comparison chart and table show it."""
    days = est.run_days(tokens)
    from ..search.recompute_modules import modules_shown
    shown = modules_shown(est.plan)
    return {"label": label, "layout": est.plan.summary() + (f":{shown}" if shown else ""), "step_time_s": est.step_time_s,
            "peak_memory_gib": est.peak_memory_gib, "memory_limit_gib": est.memory_limit_gib,
            "fits": est.fits, "p_fit": est.p_fit, "verdict": est.verdict, "interval": est.interval,
            "memory_verdict": est.memory_verdict,
            "tokens_per_s_per_device": est.tokens_per_s_per_device, "mfu": est.mfu,
            "run_days": days, "device_hours": days * 24 * est.cluster.world_size,
            "memory_per_stage_gib": [m.total / GIB for m in est.memory],
            "memory_parts_per_stage_gib": [{k: v / GIB for k, v in m.parts.items()} for m in est.memory],
            "time": dict(est.time.parts), "plan": est.plan.to_dict()}


def why_not_rows(lines: list[str], result) -> list[dict[str, Any]]:
    """The "why not" alternatives with their numbers: the layout each line names is looked up
    among the search's attempts (its estimate, or its peak memory when nothing fits)."""
    best = result.best
    by_layout: dict[str, Any] = {}
    for a in result.attempts:
        key = a.plan.summary()
        old = by_layout.get(key)
        if old is None or (a.estimate is not None and (old.estimate is None
                                                         or a.estimate.step_time_s < old.estimate.step_time_s)):
            by_layout[key] = a
    rows = []
    for line in lines:
        m = WHY_NOT_LINE.match(line)
        row: dict[str, Any] = {"text": line, "knob": None, "layout": None, "step_time_s": None,
                               "slower": None, "peak_memory_gib": None, "fits": None}
        attempt = by_layout.get(m["layout"]) if m else None
        if m:
            row.update(knob=m["label"], layout=m["layout"])
        if attempt is not None:
            row.update(peak_memory_gib=attempt.peak_gib, fits=attempt.estimate is not None)
            if attempt.estimate is not None and best is not None:
                row.update(step_time_s=attempt.estimate.step_time_s,
                           slower=attempt.estimate.step_time_s / best.step_time_s - 1)
        elif m and best is not None and (change := KNOB_CHANGE.match(m["rest"])):
            slower = float(change["pct"]) / 100
            row.update(step_time_s=best.step_time_s * (1 + slower), slower=slower, fits=True)
        rows.append(row)
    return rows


def scale_node_counts(nodes: int) -> list[int]:
    """A handful of node counts around ``nodes`` (a quarter to four times)."""
    return sorted({max(1, round(nodes * f)) for f in SCALE_FACTORS})


def scaling_points(cluster, tokens: float, search: Callable[[Any], Any]) -> list[dict[str, Any]]:
    """Days of the run and device-hours against the number of devices: one search per point
    (``search(cluster)`` returns a SearchResult), the same model, batch and hardware."""
    points = []
    for nodes in scale_node_counts(cluster.nodes):
        c = dataclasses.replace(cluster, nodes=nodes)
        try:
            result = search(c)
        except PartitaError as e:  # a point without a valid layout says why; the page goes on
            points.append({"devices": c.world_size, "layout": None, "note": str(e).splitlines()[0][:200]})
            continue
        best = result.best
        if best is None:
            points.append({"devices": c.world_size, "layout": None, "note": "no plan fits in memory"})
            continue
        days = best.run_days(tokens)
        points.append({"devices": c.world_size, "layout": best.plan.summary(), "step_time_s": best.step_time_s,
                       "run_days": days, "device_hours": days * 24 * c.world_size,
                       "peak_memory_gib": best.peak_memory_gib, "mfu": best.mfu, "note": None})
    return points
