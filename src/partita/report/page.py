"""The plan report page: the figures of :mod:`partita.report.figures` in one HTML file with
plotly.js inline (it opens offline), the notes the terminal prints, and every number of
the charts as JSON in ``<script type="application/json" id="partita-report-data">``, in the
page shell every report shares (:mod:`partita.report.html_page`)."""
from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any, Callable

from ..errors import PartitaError
from ..outputs import cannot_write
from . import figures
from .data import REFERENCE_TOKENS, plan_row, scaling_points, why_not_rows
from .html_page import figure_div, html_page, require_plotly, write_page
from .schedule import step_schedule

#: the id prefix of every chart's <div> (tests and bench/report_in_browser.py look for them)
FIGURE_IDS = ("plans", "plans-table", "memory", "time", "timeline", "scaling", "why-not")


def check_report_path(path: str) -> Path:
    """Refuse, before any work, a report path that cannot be written (one line), and a
    missing plotly."""
    p = Path(path)
    if not path or not path.strip():
        raise PartitaError("--report needs a file name, e.g. --report plan.html")
    try:  # a name the OS refuses (too long, a loop of links): one line, not an OSError
        is_dir, parent = p.is_dir(), (p.parent if str(p.parent) else Path("."))
        parent_ok = parent.is_dir()
    except (OSError, ValueError) as e:
        raise cannot_write("--report", path, e) from None
    if is_dir:
        raise PartitaError(f"--report {path} is a directory; give a file name such as {p / 'plan.html'}")
    if not parent_ok:
        raise PartitaError(f"--report {path}: directory {parent} does not exist; create it or choose another path")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise PartitaError(f"--report {path}: cannot write there (permission denied); choose a writable path")
    require_plotly()
    return p


def _timelines(plans: list, labels: list[str]) -> list[tuple[str, Any]]:
    """Plan 1's schedule; when plan 1 has no pipeline, also the best pipelined plan shown."""
    out = [(labels[0], plans[0])]
    if plans[0].plan.pp == 1:
        piped = [(lab, e) for lab, e in zip(labels, plans) if e.plan.pp > 1]
        out += piped[:1]
    return out


def build_report(title: str, plans: list, labels: list[str], notes: list[str], tokens: float | None,
                 result=None, reasons: list[str] | None = None,
                 search: Callable[[Any], Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The page and its data. ``plans``: estimates to compare (the first gets the schedule);
    ``result``/``reasons``: the search and its "why not" lines; ``search(cluster)``: one
    search per scaling point."""
    run_tokens = tokens or REFERENCE_TOKENS
    rows = [plan_row(label, e, run_tokens) for label, e in zip(labels, plans)]
    limit = plans[0].memory_limit_gib
    data: dict[str, Any] = {"title": title, "tokens": run_tokens, "memory_limit_gib": limit, "plans": rows,
                            "notes": notes, "timelines": [], "scaling": [], "why_not": []}
    sections = [("Top plans side by side", [figures.plans_table_figure(rows), figures.plans_figure(rows, limit)], ""),
                ("Memory per rank", [figures.memory_figure(rows, limit)],
                 "Every pipeline rank of every plan, stacked by part; the dashed line is the memory limit."),
                ("Where the step time goes", [figures.time_figure(rows)],
                 "The cost model's parts of one step; they add up to the step time.")]
    for label, est in _timelines(plans, labels):
        sched = step_schedule(est)
        data["timelines"].append({"label": label, "layout": est.plan.summary(), "pipeline_s": sched.pipeline_s,
                                  "closed_form_s": sched.closed_form_s, "step_s": sched.step_s,
                                  "model_step_s": est.step_time_s, "schedule": sched.schedule,
                                  "ranks": sched.ranks, "microbatches": sched.microbatches, "chunks": sched.chunks,
                                  "coalesced": sched.coalesced})
        text = (f"{sched.microbatches} micro-batch(es) x {sched.chunks} chunk(s) per rank, {sched.schedule}; "
                f"pipeline simulated from the cost model's per-rank times: {sched.pipeline_s:.3f} s "
                f"(the cost model's closed form: {sched.closed_form_s:.3f} s); step {sched.step_s:.3f} s "
                f"(estimate: {est.step_time_s:.3f} s)."
                + (" Too many passes to draw one by one: back-to-back passes of a rank are drawn as one run."
                   if sched.coalesced else ""))
        sections.append((f"Predicted schedule of one step: {label} ({est.plan.summary()})",
                         [figures.timeline_figure(sched, f"One step of {label}: {est.plan.summary()}")], text))
    if search is not None:
        data["scaling"] = scaling_points(plans[0].cluster, run_tokens, search)
        missing = [f"{p['devices']} devices: {p['note']}" for p in data["scaling"] if not p["layout"]]
        sections.append(("Scaling: days and device-hours vs devices", [figures.scaling_figure(data["scaling"], run_tokens)],
                         "Each point is a search with the same model, hardware and batch."
                         + (f" Not shown: {'; '.join(missing)}." if missing else "")
                         + ("" if tokens else f" (No --tokens: a run of {REFERENCE_TOKENS:.0e} tokens.)")))
    if result is not None and reasons:
        data["why_not"] = why_not_rows(reasons, result)
        sections.append(("Why not the alternatives", [figures.why_not_figure(data["why_not"], result.memory_limit_gib)],
                         "<br>".join(html.escape(r) for r in reasons)))
    return _page(title, notes, sections, data), data


def _page(title: str, notes: list[str], sections: list, data: dict[str, Any]) -> str:
    body, first = [], True
    counts: dict[str, int] = {}
    for heading, figs, text in sections:
        body.append(f"<h2>{html.escape(heading)}</h2>")
        if text:
            body.append(f"<p>{text if '<br>' in text else html.escape(text)}</p>")
        for fig in figs:
            name = _figure_name(heading, fig)
            counts[name] = counts.get(name, 0) + 1
            div = f"partita-{name}" + (f"-{counts[name]}" if counts[name] > 1 else "")
            body.append(figure_div(fig, div, first))
            first = False
    blob = json.dumps(data, sort_keys=True).replace("</", "<\\/")
    head = "".join(f"<p>{html.escape(n)}</p>" for n in notes)
    content = (f"{head}\n" + "\n".join(body)
               + f"\n<script type=\"application/json\" id=\"partita-report-data\">{blob}</script>")
    return html_page(title, content, heading="h1", style="font-family:sans-serif;max-width:1400px")


def _figure_name(heading: str, fig) -> str:
    kind = fig.data[0].type if fig.data else ""
    if heading.startswith("Top plans"):
        return "plans-table" if kind == "table" else "plans"
    for prefix, name in (("Memory", "memory"), ("Where", "time"), ("Predicted", "timeline"), ("Scaling", "scaling"),
                         ("Why not", "why-not")):
        if heading.startswith(prefix):
            return name
    return "figure"


def write_report(path: str | Path, page: str) -> Path:
    """Write the page (one line on failure)."""
    return write_page(path, page)
