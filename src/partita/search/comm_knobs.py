"""The gradient communication knobs in the search (issue 17): after the layout search,
each of its best plans is re-estimated with every knob the space allows
(:attr:`partita.search.space.SearchSpace.grad_knobs`):

* ``bf16`` - ``grad_dtype=bf16``: the data-parallel reduction in bf16 (half the bytes);
* ``powersgd`` - ``grad_compression=powersgd`` at ``powersgd_rank`` with ``zero=0``
  (PowerSGD all-reduces low-rank factors, so the optimizer states are replicated: the
  variant must still fit).

Variants that fit join the ranking; the "why not" lines say, per knob, what the best plan
with (or without) it would change. A layout search over knobs would multiply the walk by
their count, while they only change the data-parallel sync and the PowerSGD state - so
they are tried on the layouts that are already best (the top ``--top`` plans), which is
where a cheaper sync can reorder the ranking. The post-pass costs ``top x knobs`` estimates
(10 for the default ``--top 5``), a few milliseconds beside the layout search.

What ``partita plan`` tries by default (:data:`PRESETS`, ``--grad-knobs``):

* ``default``: bf16 reduction only. It halves the gradient bytes and changes only the
  rounding of each reduced element (2^-8 relative, once per step; the bench measured +0.08 %
  final loss over 200 steps); Megatron-LM (``--grad-reduce-in-bf16``) and torchtitan
  (``mixed_precision_reduce``) offer it but default to fp32 reduction because the sum over
  many data-parallel ranks loses precision in bf16. So it is proposed only where the cost
  model says it saves at least :data:`MIN_GAIN` of the step, and the why-not line says what
  it saves or that it was not proposed - the user sees the trade and can pass ``none``.
* ``lossy``: bf16 and PowerSGD. PowerSGD changes convergence (a rank-r approximation with
  error feedback; +2.6 % final loss at rank 4 in the bench), which no framework enables by
  default, so the search ranks it only when the user allows lossy compression.
* ``none``: the layout search alone; or an explicit list, e.g. ``bf16,powersgd``.
"""
from __future__ import annotations

from .. import uncertainty as unc
from ..estimate import Estimate, estimate
from ..plan import validate
from .engine import SearchResult
from .layouts import EXPLAINED_KNOBS
from .why_not import nearest_values

KNOBS = ("bf16", "powersgd")
#: a knob changes the numerics (bf16 rounding of the reduced gradients; PowerSGD's low-rank
#: approximation, with error feedback): a variant joins the ranking only when it saves at
#: least this share of its plan's step time
MIN_GAIN = 0.01
#: --grad-knobs presets (module docstring: why bf16 is default and PowerSGD is opt-in)
PRESETS = {"default": ("bf16",), "lossy": ("bf16", "powersgd"), "none": ()}


def parse_grad_knobs(text: str | None) -> tuple[str, ...]:
    """``--grad-knobs``: a preset (default, lossy, none) or a comma list of :data:`KNOBS`;
    empty means none. A wrong name is one line."""
    from ..errors import PartitaError
    value = (text or "").strip().lower()
    if value in PRESETS:
        return PRESETS[value]
    knobs = tuple(dict.fromkeys(k.strip() for k in value.split(",") if k.strip()))
    if set(knobs) - set(KNOBS):
        raise PartitaError(f"--grad-knobs {text!r}: use one of {', '.join(PRESETS)} or a list of "
                           f"{', '.join(KNOBS)} (e.g. bf16,powersgd)")
    return knobs


def variants(plan, knobs: tuple[str, ...], rank: int = 4) -> list:
    """The plan with each allowed knob (valid ones only)."""
    out = []
    if "bf16" in knobs and plan.dtype != "fp32" and plan.grad_dtype != "bf16" and plan.grad_compression == "none":
        out.append(plan.with_(grad_dtype="bf16"))
    if "powersgd" in knobs and plan.grad_compression == "none" and plan.zero <= 1 and plan.dp * plan.cp > 1:
        out.append(plan.with_(zero=0, grad_compression="powersgd", powersgd_rank=rank, grad_dtype="fp32"))
    return [p for p in out if not validate(p)]


def knob_name(plan) -> str:
    if plan.grad_compression == "powersgd":
        return f"grad_compression=powersgd (rank {plan.powersgd_rank})"
    return "grad_dtype=bf16" if plan.grad_dtype == "bf16" and plan.dtype != "fp32" else "none"


#: How many of the search's best plans the knob pass tries, whatever ``--top`` shows: a knob
#: variant of plan 3 can become plan 1, so with fewer tried plan 1 would depend on ``--top``.
KNOB_POOL = 5


def try_comm_knobs(result: SearchResult, knobs: tuple[str, ...], rank: int = 4, keep: int | None = None) -> list[str]:
    """Add the knob variants of ``result.plans`` that fit, re-rank (keeping ``keep`` plans,
    default as many as given), and return one "why not" line per knob. Give it the best
    :data:`KNOB_POOL` plans at least, whatever ``keep`` is."""
    if not knobs or not result.plans:
        result.plans = result.plans[:keep]
        return []
    top = keep or len(result.plans)
    base = list(result.plans)
    found: list[Estimate] = []
    skipped: list[Estimate] = []  # fit, but save less than MIN_GAIN
    origin: dict[int, Estimate] = {}  # variant -> the plan it is a variant of
    for e in base:
        for plan in variants(e.plan, knobs, rank):
            est = estimate(result.model, result.cluster, plan)
            est.memory_limit = result.memory_limit_gib
            if not est.fits:  # PowerSGD's state is in the memory model's buffers
                continue
            origin[id(est)] = e
            if est.step_time_s <= (1 - MIN_GAIN) * e.step_time_s:
                found.append(est)
            else:
                skipped.append(est)
    ranked = sorted(base + found, key=lambda e: unc.risk_adjusted(e.step_time_s, e.p_fit))  # the search's own key
    result.plans = ranked[:top]
    best = result.best
    if origin.get(id(best), best) is not base[0]:  # a lower plan's variant won: explain around its layout
        result.alternatives = {k: nearest_values(k, getattr(best.plan, k), {getattr(a.plan, k) for a in result.attempts})
                               for k in EXPLAINED_KNOBS}
    _same_knob_for_alternatives(result, best.plan)
    return _knob_lines(result, knobs, ranked, skipped, origin)


def _same_knob_for_alternatives(result: SearchResult, best) -> None:
    """Give the "why not" alternatives the best plan's knob where it is valid, fits and is
    faster, so that their lines compare layouts like for like (the layout's own cost, not
    the knob's saving). Only the fastest fitting attempt per explained value is re-estimated
    (about 20 estimates), the one :func:`partita.search.explain.why_not` shows."""
    knob = "powersgd" if best.grad_compression == "powersgd" else "bf16" if _has(best, "bf16") else None
    if knob is None:
        return
    for name, values in result.alternatives.items():
        for value in values:
            group = [a for a in result.attempts if a.estimate is not None and getattr(a.plan, name) == value]
            if not group:
                continue
            attempt = min(group, key=lambda a: a.estimate.step_time_s)
            for plan in variants(attempt.plan, (knob,), best.powersgd_rank):
                est = estimate(result.model, result.cluster, plan)
                est.memory_limit = result.memory_limit_gib
                if est.fits and est.step_time_s < attempt.estimate.step_time_s:
                    attempt.plan, attempt.estimate = plan, est


def _knob_lines(result: SearchResult, knobs: tuple[str, ...], ranked: list, skipped: list,
               origin: dict[int, Estimate]) -> list[str]:
    """One "why not" line per knob (module docstring); the best plan without its knob is
    the plan it is a variant of (the same layout), so the line is the knob's own effect."""
    best = result.best
    lines = []
    for knob in knobs:
        with_knob = sorted([e for e in ranked + skipped if _has(e.plan, knob)], key=lambda e: e.step_time_s)
        without = [e for e in ranked if not _has(e.plan, knob)]
        if _has(best.plan, knob):
            plain = [e for e in without if knob_name(e.plan) == "none"]
            if id(best) in origin:
                plain = [origin[id(best)]]
            if plain or without:
                alt = (plain or without)[0]
                lines.append(f"{knob_name(alt.plan) if knob_name(alt.plan) != 'none' else _off(knob)} "
                             f"({alt.plan.summary()}): {alt.step_time_s / best.step_time_s - 1:+.0%} step time; "
                             f"{knob_name(best.plan)} cuts dp gradient sync {_sync(alt):.2f} s -> {_sync(best):.2f} s")
        elif with_knob:
            alt = with_knob[0]
            gain = "" if alt in ranked else f" (saves < {MIN_GAIN:.0%} of its plan's step: not proposed)"
            lines.append(f"{knob_name(alt.plan)} ({alt.plan.summary()}): {alt.step_time_s / best.step_time_s - 1:+.1%} "
                         f"step time; dp gradient sync {_sync(alt):.2f} s vs {_sync(best):.2f} s{gain}")
        else:
            lines.append(f"{_on(knob)}: no variant of the best plans fits in {result.memory_limit_gib:.1f} GiB")
    return lines


def _has(plan, knob: str) -> bool:
    if knob == "powersgd":
        return plan.grad_compression == "powersgd"
    return plan.grad_dtype == "bf16" and plan.dtype != "fp32" and plan.grad_compression == "none"


def _on(knob: str) -> str:
    return "grad_compression=powersgd" if knob == "powersgd" else "grad_dtype=bf16"


def _off(knob: str) -> str:
    return "grad_compression=none" if knob == "powersgd" else "grad_dtype=fp32"


def _sync(e: Estimate) -> float:
    return e.time.parts.get("dp gradient sync", 0.0)
