""""Why not" explanations: for each knob, the nearest other choice and what binds it."""
from __future__ import annotations

from .. import uncertainty as unc
from ..estimate import Estimate, estimate
from .layouts import EXPLAINED_KNOBS as KNOBS
from .result import Attempt, SearchResult
from .why_not import nearest_values


def _biggest_increase(alt: Estimate, best: Estimate) -> str:
    # parts in a fixed order (the alternative's, then the best plan's others), so that ties
    # resolve the same way in every process (a set's order depends on the string hash seed)
    keys = list(dict.fromkeys([*alt.time.parts, *best.time.parts]))
    diffs = {k: alt.time.parts.get(k, 0.0) - best.time.parts.get(k, 0.0) for k in keys}
    key = max(diffs, key=lambda k: diffs[k])
    share = alt.time.parts.get(key, 0.0) / alt.step_time_s
    return f"the largest increase is {key} ({share:.0%} of its step)"


def _rank_key(est: Estimate) -> float:
    """The search's ranking key (:func:`partita.uncertainty.risk_adjusted`: step time / P(fit))."""
    return unc.risk_adjusted(est.step_time_s, est.p_fit)


def _compared(alt: Estimate, best: Estimate) -> str:
    """Why ``alt`` ranks below ``best``, in the ranking's own terms: slower, or - when it is
    faster - riskier (its P(fit) costs more than its time saves: step time / P(fit), the
    expected time per step counting the retries of a run that runs out of memory)."""
    step = (f"{alt.step_time_s / best.step_time_s - 1:+.0%} step time "
            f"({alt.step_time_s:.2f} s vs {best.step_time_s:.2f} s)")
    if alt.step_time_s >= best.step_time_s:
        return f"{step}; {_biggest_increase(alt, best)}"
    return (f"{step} but P(fit) {alt.p_fit:.2f} vs {best.p_fit:.2f} (peak {alt.peak_memory_gib:.1f} GiB vs "
            f"{best.peak_memory_gib:.1f} GiB): step time / P(fit) {_rank_key(alt):.2f} s vs {_rank_key(best):.2f} s")


def grad_knobs(plan) -> str:
    """The plan's gradient-communication settings that are not the defaults, as plan
    fields (``grad_dtype=bf16, grad_compression=powersgd (rank 4)``), or "none"."""
    parts = []
    if getattr(plan, "grad_compression", "none") == "powersgd":
        parts.append(f"grad_compression=powersgd (rank {plan.powersgd_rank})")
    elif plan.grad_dtype == "bf16" and plan.dtype != "fp32":
        parts.append("grad_dtype=bf16")
    if getattr(plan, "ddp_bucket_mb", 0):
        parts.append(f"ddp_bucket_mb={plan.ddp_bucket_mb}")
    if getattr(plan, "fsdp_prefetch", 1) != 1:
        parts.append(f"fsdp_prefetch={plan.fsdp_prefetch}")
    return ", ".join(parts) or "none"


def _knob_note(alt, best) -> str:
    """Where the alternative and the best plan differ in gradient-communication knobs
    (the knob search, :mod:`.comm_knobs`, re-ranks the best plans with them), the line
    says so: part of the difference is the knob, not the knob the line is about."""
    mine, theirs = grad_knobs(alt), grad_knobs(best)
    return "" if mine == theirs else f"; gradient knobs: {mine} vs the best plan's {theirs}"


def _partial_lines(result: SearchResult, best: Estimate) -> list[str]:
    """When the best plan recomputes only its first N layers per chunk (partial full
    recompute, ``recompute_layers``), why that N: one layer fewer does not fit (its
    memory) and every layer (N = 0) is slower (its time). Both plans are among the
    attempts (:func:`.why_not.partial_neighbours`); matched on the layout, not on the
    gradient knobs the knob search may have added to the best plan."""
    n = best.plan.recompute_layers
    if not n:
        return []

    def layout(plan) -> tuple:
        return (plan.dp, plan.tp, plan.pp, plan.vpp, plan.cp, plan.ep, plan.etp, plan.mbs, plan.zero, plan.sp,
                plan.recompute, plan.stage_layers(result.model.layers))

    mine = layout(best.plan)
    lines = []
    for k in (n - 1, 0) if n > 1 else (0,):
        found = [a for a in result.attempts if a.plan.recompute_layers == k and layout(a.plan) == mine]
        if not found:
            continue
        a = found[0]
        limit = result.confident_limit_gib or result.memory_limit_gib  # partial N: solved at P(fit) = 1
        alt = a.estimate
        if alt is None and k == 0:  # pruned by the search's time bound before its full estimate: price it here
            alt = estimate(result.model, result.cluster, a.plan)
            alt.memory_limit = result.memory_limit_gib
        if alt is not None and (k == 0 or a.peak_gib <= limit):
            lines.append(f"recompute_layers={k} ({alt.plan.summary()}): {_compared(alt, best)}")
        elif a.peak_gib > limit:
            lines.append(f"recompute_layers={k} ({a.plan.summary()}): rank {a.peak_rank} needs {a.peak_gib:.1f} GiB, "
                         f"over the {limit:.1f} GiB that fit with P(fit) 1 under the {result.memory_limit_gib:.1f} GiB "
                         f"memory limit; recompute_layers={n} is the fewest that do")
    return lines


def why_not(result: SearchResult) -> list[str]:
    """One line per knob: the nearest rejected or slower value, the alternative's full layout
    (the changed knob alone does not say which plan was compared), and its binding reason."""
    best = result.best
    if best is None:
        return []
    lines = []
    per_node = result.cluster.devices_per_node
    for knob in KNOBS:
        values = result.alternatives.get(knob)
        if values is None:  # a result built without the search's alternatives
            values = nearest_values(knob, getattr(best.plan, knob), {getattr(a.plan, knob) for a in result.attempts})
        for value in values:
            # plans whose tp group crosses nodes explain tp only (the ranking leaves them out),
            # unless the best plan itself crosses (the user fixed tp)
            group = [a for a in result.attempts if getattr(a.plan, knob) == value
                     and (knob == "tp" or a.plan.tp <= per_node or best.plan.tp > per_node)]
            if not group:
                continue  # every layout with this value is dominated by one that does not fit
            fitting = [a.estimate for a in group if a.estimate is not None]
            if not fitting and any(a.bounded for a in group):
                continue  # fits, but never closer than the plans already explained
            label = f"{knob}={value}"
            if fitting:
                alt = min(fitting, key=_rank_key)  # the alternative the ranking itself would pick
                cross = (knob == "tp" and value > result.cluster.devices_per_node)
                where = " (crosses nodes)" if cross else ""
                lines.append(f"{label}{where} ({alt.plan.summary()}): {_compared(alt, best)}"
                             f"{_knob_note(alt.plan, best.plan)}")
            else:
                smallest: Attempt = min(group, key=lambda a: a.peak_gib)
                lines.append(f"{label} ({smallest.plan.summary()}): rank {smallest.peak_rank} needs "
                             f"{smallest.peak_gib:.1f} GiB > {result.memory_limit_gib:.1f} GiB memory limit "
                             "even at its smallest")
    return lines + _partial_lines(result, best)

