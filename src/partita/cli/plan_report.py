"""``--report FILE`` of ``partita plan`` and ``partita estimate``: the HTML plan report
(:mod:`partita.report`), wired to the commands' flags. The page's notes are the lines the
terminal prints (memory limit with its headroom, confidence note)."""
from __future__ import annotations

import argparse

from ..errors import PartitaError

#: plans compared on the page besides the given one (estimate --report)
CONTEXT_PLANS = 3


def add_report_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--report", metavar="FILE.html",
                   help="also write an HTML report (plans side by side, memory per rank, step time, the "
                        "schedule of one step, scaling with devices, why not); needs plotly")


def _scaling_search(args: argparse.Namespace, model, search):
    """One search per scaling point (``search``: partita plan's, from the flags, and its
    gradient-knob pass), dp free (it follows the devices)."""
    scaled = argparse.Namespace(**vars(args))
    # as many plans as partita plan keeps: the gradient-knob pass may lift a lower one to plan 1
    scaled.dp, scaled.export = None, None

    def run(cluster):  # plan 1 as partita plan prints it: the gradient-knob pass included
        from ..search.capabilities import allowed_grad_knobs
        from ..search.comm_knobs import parse_grad_knobs, try_comm_knobs
        from .common import framework_arg
        result = search(scaled, model, cluster)[0]
        knobs, _ = allowed_grad_knobs(framework_arg(scaled), parse_grad_knobs(scaled.grad_knobs))
        # as partita plan's comm_knob_lines (cli/plan.py), which imports this module
        try_comm_knobs(result, knobs, scaled.powersgd_rank, keep=scaled.top)
        return result
    return run


def _notes(cluster, result) -> list[str]:
    from .render import confidence_note, memory_limit_line  # rich: only when a report is written
    note = confidence_note(cluster.device)
    return [memory_limit_line(result)] + ([note] if note else [])


def write_plan_report(args: argparse.Namespace, model, cluster, result, reasons: list[str],
                      tokens: float | None, search) -> None:
    """``partita plan --report``: the search's top plans, plan 1's schedule, scaling, why not
    (``search(args, model, cluster)``: the command's search, run again per scaling point)."""
    from ..report import build_report, write_report
    title = (f"partita plan: {model.name} on {cluster.world_size} x {cluster.device.name}, seq {args.seq_len}, "
             f"global batch {args.global_batch}")
    page, _ = build_report(title, result.plans, [f"plan {i}" for i in range(1, len(result.plans) + 1)],
                           _notes(cluster, result), tokens,
                           result=result, reasons=reasons, search=_scaling_search(args, model, search))
    write_report(args.report, page)


def write_estimate_report(args: argparse.Namespace, est, tokens: float | None) -> None:
    """``partita estimate --report``: the plan against the search's best at the same devices
    (same model, batch, sequence and dtype), its schedule, scaling, and the search's why not."""
    from ..report import build_report, write_report
    from ..search.engine import search_plans
    from ..search.explain import why_not
    from ..search.space import SearchSpace
    model, cluster, plan = est.model, est.cluster, est.plan
    space = SearchSpace(dtype=plan.dtype, memory_headroom=est.limit.headroom, max_memory_gib=est.limit.cap_gib)
    from ..search.space import CARRIED_CHOICES
    space.options.update({name: getattr(plan, name) for name in CARRIED_CHOICES})  # the plan's offload, moments, modules

    def search(c, top: int = 1):  # the same limit and risk rule as the estimate's verdict
        return search_plans(model, c, plan.gbs, plan.seq_len, space, top=top, min_p_fit=est.min_p_fit)
    try:
        result = search(cluster, CONTEXT_PLANS)
    except PartitaError:
        result = None
    found = result.plans if result is not None else []
    reasons = why_not(result) if found else []
    title = (f"partita estimate: {model.name} on {cluster.world_size} x {cluster.device.name}, "
             f"{plan.summary()}, seq {plan.seq_len}, global batch {plan.gbs}")
    from .render import confidence_note
    note = confidence_note(cluster.device)
    notes = [f"memory: {est.memory_verdict}"] + ([note] if note else [])
    if found:
        notes.append("The search's best plans at the same devices, batch and sequence are shown beside this plan; "
                     f"each has P(fit) >= {result.min_p_fit:g} against the same limit, {result.limit.describe()}.")
    page, _ = build_report(title, [est, *found], ["this plan"] + [f"search {i}" for i in range(1, len(found) + 1)],
                           notes, tokens, result=result if found else None, reasons=reasons, search=search)
    write_report(args.report, page)
