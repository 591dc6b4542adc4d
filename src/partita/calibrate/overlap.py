"""The fit of ``efficiency.comm_overlap``: how much of FSDP's traffic hides behind compute.

A pure function of measurements (no torch, no timing), like :mod:`.fit`.

Why a micro-run of its own: the cost model charges a ZeRO-3 micro-batch
``(1 - f) t + max(0, f t - C) + f t / n`` for its gathers and reduce-scatters ``t`` beside
compute ``C`` (:func:`partita.cost.step._zero3_exposed`). On the tiny model that measures
``zero3_framework_us_per_layer`` the traffic is a few percent of the step, so ``f`` cannot
be read there; the probe (:data:`.fit.ZERO3_PROBE_MODEL`) moves 12 MB of weights
per micro-batch, about a fifth of its step on a 2-core CPU. With ``t <= C`` on the probe the predicted step is
linear in ``f`` (slope ``-(1 - 1/n) t`` per micro-batch), so per repeat

    f = (P(f = 0) - T) / (P(f = 0) - P(f = 1))

recovers it exactly, as :func:`.fit.fit_overheads` does for the time fields.
The framework term and ``f`` each appear in the other's run, so the two are fitted in
turn until ``f`` moves by less than 1e-9 (:func:`fit_with_overlap`).
"""
from __future__ import annotations

from collections.abc import Callable

from .fit import MECHANISMS, fit_overheads, summarize

#: The runtime micro-run that measures the overlap, and the field it writes.
OVERLAP_RUN, OVERLAP_FIELD = "comm_overlap", "comm_overlap"
#: Rounds of the alternating fit at most, and the change in ``f`` that ends it.
_ROUNDS, _TOLERANCE = 50, 1e-9


def fit_comm_overlap(run: dict, predict: Callable[[dict, dict[str, float]], float],
                      fields: dict[str, float]) -> dict:
    """``f`` per repeat from the probe run's measured steps, ``fields`` (the fitted time
    terms) held in the prediction. The record keeps the signed median (below 0: the
    traffic cost more than running it serially; above 1: less than hiding all of it) and
    says what the file gets, the nearest value in [0, 1]."""
    p0, slope = _serial_and_slope(run, predict, fields)
    how = f"micro-run `{run.get('plan', OVERLAP_RUN)}` of {run.get('model', '?')} through partita.parallelize: "
    long = run.get("long")
    if long and len(long["samples"]) == len(run["samples"]):
        # by the increment to the longer run: per-step costs the model does not hold cancel
        p0_long, slope_long = _serial_and_slope(long, predict, fields)
        p0, slope = p0_long - p0, slope_long - slope
        per = [(p0 - (tl - ts)) / slope for ts, tl in zip(run["samples"], long["samples"])]
        how += (f"per-micro-batch increment against `{long.get('plan', long.get('plan_text'))}`: "
                f"(P(f=0) - measured) / (P(f=0) - P(f=1)) of the step differences, {p0 * 1e3:.4g} and "
                f"{(p0 - slope) * 1e3:.4g} ms")
    else:
        per = [(p0 - s) / slope for s in run["samples"]]
        how += (f"(P(f=0) - measured step) / (P(f=0) - P(f=1)), P(0) = {p0 * 1e3:.4g} ms, "
                f"P(1) = {(p0 - slope) * 1e3:.4g} ms")
    record = summarize(per, "fraction", how)
    record.update(predicted_step_s=p0, weight=slope, read_by_cost_model=True)
    written = min(max(record["value"], 0.0), 1.0)
    if written != record["value"]:
        record.update(clamped_to=written, note=f"outside [0, 1] ({record['value']:.4g}): written as {written:g}")
    return record


def _serial_and_slope(run: dict, predict: Callable[[dict, dict[str, float]], float],
                      fields: dict[str, float]) -> tuple[float, float]:
    """The run's predicted step with no overlap, and how much full overlap takes off it."""
    p0 = predict(run, dict(fields, **{OVERLAP_FIELD: 0.0}))
    slope = p0 - predict(run, dict(fields, **{OVERLAP_FIELD: 1.0}))
    if slope <= 1e-12:
        raise ValueError(f"the {OVERLAP_RUN} micro-run's prediction does not fall with the overlap "
                         f"(P(0) = {p0:.6g} s, slope {slope:.3g} s): it moves no ZeRO-3 traffic")
    return p0, slope


def fit_with_overlap(runs: dict[str, dict], predict: Callable[[dict, dict[str, float]], float]
                     ) -> dict[str, dict]:
    """Every runtime term (:func:`.fit.fit_overheads`) and, when the probe ran,
    ``comm_overlap``: the two fitted in turn (the framework fields with the latest ``f``
    held, then ``f`` with those fields held) until ``f`` settles. Without the probe run the
    overheads are fitted once with the device's own overlap."""
    timed = {k: v for k, v in runs.items() if k != OVERLAP_RUN}
    known: dict[str, float] = {}
    terms = fit_overheads(timed, predict, known)
    if OVERLAP_RUN not in runs:
        return terms
    previous, overlap = None, {}
    for rounds in range(1, _ROUNDS + 1):
        held = {f: (max(t["value"], 0.0) if t["read_by_cost_model"] else 0.0) for f, t in terms.items()
                if f in MECHANISMS.values()}
        overlap = fit_comm_overlap(runs[OVERLAP_RUN], predict, held)
        f = overlap.get("clamped_to", overlap["value"])
        if previous is not None and abs(f - previous) < _TOLERANCE:
            break
        previous, known = f, {OVERLAP_FIELD: f}
        terms = fit_overheads(timed, predict, known)
    overlap["method"] += f"; fitted in turn with the framework terms ({rounds} rounds)"
    return {**terms, OVERLAP_FIELD: overlap}
