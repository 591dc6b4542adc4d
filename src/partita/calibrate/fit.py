"""The fits behind ``partita calibrate``: pure functions of measurements (no torch, no
timing), so tests feed them synthetic measurements and check exact recovery.

Every measured term becomes a record ``{"value", "spread", "repeats", "samples", "unit",
"method"}``: the median of the repeats, half their inter-quartile range (a robust spread
that one preempted repeat on a loaded machine does not blow up), how many repeats, and
how the number was obtained. No record is clamped: a mechanism that measured faster than
the cost model predicts keeps its negative value, so the user sees it (where a later fit
holds it at 0, its record says so).
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from ..cost.comm import ALGORITHM_FACTORS


def summarize(samples: Sequence[float], unit: str, method: str) -> dict:
    """A term record: median, half the inter-quartile range (0 for fewer than 2 samples),
    the repeat count, the samples themselves, the unit and the method."""
    xs = [float(x) for x in samples]
    if not xs:
        raise ValueError("a term needs at least one sample")
    spread = 0.0
    if len(xs) >= 2:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
        spread = (q3 - q1) / 2
    return {"value": statistics.median(xs), "spread": spread, "repeats": len(xs), "samples": xs,
            "unit": unit, "method": method}


def _fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares y = a + b x."""
    mx, my = statistics.mean(xs), statistics.mean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / max(sum((x - mx) ** 2 for x in xs), 1e-30)
    return my - b * mx, b


def fit_gemm(gemm: list[dict], peak: float) -> tuple[float, float, float]:
    """(peak FLOP/s, efficiency, half-saturation size in GFLOP) from GEMM timings
    (``{"gflop", "seconds"}`` each, any shape class).

    The cost model's curve ``rate(G) = peak * eff * G / (G + G_half)``
    (:mod:`partita.cost.compute`) is linear in ``1/G``: ``1/rate = 1/(peak eff) +
    (G_half/(peak eff)) / G``, so the least-squares line ``1/rate = a + b/G`` gives ``eff =
    1/(a peak)`` and ``G_half = b/a`` exactly for measurements on the curve. A measured
    rate above ``peak`` raises the peak to it (the base file's peak is too low)."""
    xs = [1 / g["gflop"] for g in gemm]
    ys = [g["seconds"] / (g["gflop"] * 1e9) for g in gemm]  # 1/rate
    a, b = _fit_line(xs, ys)
    a = max(a, 1e-30)
    best = max(g["gflop"] * 1e9 / g["seconds"] for g in gemm)
    if best > peak:
        peak = best
    return peak, min(1.0, 1 / (a * peak)), max(b / a, 0.0)


def gemm_classes(gemm: list[dict]) -> dict[str, dict]:
    """Per shape class (``square``, ``wide`` = the MLP's ``tokens x h x 4h``, ``skinny`` =
    few tokens): the achieved rate (GFLOP/s) of every repeat, as a term record."""
    out: dict[str, dict] = {}
    for cls in sorted({g.get("class", "square") for g in gemm}):
        rates = [g["gflop"] / s for g in gemm if g.get("class", "square") == cls
                 for s in g.get("samples", [g["seconds"]])]
        out[cls] = summarize(rates, "GFLOP/s", f"torch.matmul of {cls} shapes, median rate over sizes and repeats")
    return out


#: ``t = lat(g) alpha + bw(g) S / B`` per collective inside one switch-topology node: the
#: factors :mod:`partita.cost.comm` uses (ring all-reduce 2(g-1) steps moving 2(g-1)/g S
#: [Thakur et al. 2005]; all-gather / reduce-scatter half of it; all-to-all one latency and
#: (g-1)/g S; send/recv one latency and S). ``S`` follows nccl-tests.
COLLECTIVE_COEFFICIENTS: dict[str, Callable[[int], tuple[float, float]]] = ALGORITHM_FACTORS


def _weighted_fit(rows: list[dict]) -> tuple[float, float]:
    """(alpha s, bandwidth B/s) minimising the *relative* squared error of ``t = c_lat
    alpha + c_bw S / B`` over ``rows`` (``{"kind", "bytes", "group", "seconds"}``): each
    row weighs 1/t^2, so 4 KiB messages (latency) count as much as 16 MiB ones
    (bandwidth). Two unknowns, no intercept: the 2x2 normal equations, exact for rows
    on the model."""
    saa = sab = sbb = say = sby = 0.0
    for r in rows:
        c_lat, c_bw = COLLECTIVE_COEFFICIENTS[r["kind"]](r["group"])
        w = 1 / r["seconds"] ** 2
        a, b, y = c_lat, c_bw * r["bytes"], r["seconds"]
        saa, sab, sbb, say, sby = saa + w * a * a, sab + w * a * b, sbb + w * b * b, say + w * a * y, sby + w * b * y
    det = saa * sbb - sab * sab
    if abs(det) < 1e-300:
        raise ValueError("collective timings need at least two message sizes")
    alpha = (say * sbb - sby * sab) / det
    inv_bw = (saa * sby - sab * say) / det
    return alpha, 1 / inv_bw if inv_bw > 0 else float("inf")


def fit_collectives(rows: list[dict]) -> tuple[float, float, dict[str, dict]]:
    """One (alpha, bandwidth) pair fitted jointly over every collective and group size
    measured - the pair the cost model reads (``intra_node.latency_us``,
    ``gbps_per_direction``) - and each collective's own fit beside it (kept in the
    hardware file, so a collective the joint pair mispredicts is visible)."""
    alpha, bw = _weighted_fit(rows)
    per_kind = {}
    for kind in sorted({r["kind"] for r in rows}):
        mine = [r for r in rows if r["kind"] == kind]
        a_k, b_k = _weighted_fit(mine)
        worst = max(abs(_coll_time(r, alpha, bw) - r["seconds"]) / r["seconds"] for r in mine)
        per_kind[kind] = {"latency_us": a_k * 1e6, "gbps": b_k / 1e9 if b_k < float("inf") else None, "groups": sorted({r["group"] for r in mine}),
                          "joint_fit_worst_rel_error": worst,
                          "spread_rel": max((r.get("spread", 0.0) / r["seconds"] for r in mine), default=0.0)}
    return alpha, bw, per_kind


def fit_per_collective(rows: list[dict]) -> tuple[dict[str, list[dict]], list[dict]]:
    """Each collective's own (latency, bandwidth) per group size measured at two or more
    message sizes: the ``collectives`` object of the device file, which
    :mod:`partita.cost.comm` reads instead of the joint pair. A noisy fit can give a
    negative latency (kept signed as ``latency_us_fitted``, written as 0) or no positive
    bandwidth (that group is left out and returned second: the joint pair stands for it)."""
    out: dict[str, list[dict]] = {}
    skipped: list[dict] = []
    for kind, group in sorted({(r["kind"], r["group"]) for r in rows}):
        mine = [r for r in rows if r["kind"] == kind and r["group"] == group]
        if len({r["bytes"] for r in mine}) < 2:
            continue
        alpha, bw = _weighted_fit(mine)
        worst = max(abs(_coll_time(r, max(alpha, 0.0), bw) - r["seconds"]) / r["seconds"] for r in mine)
        rel = max((r.get("spread", 0.0) / r["seconds"] for r in mine), default=0.0)
        entry = {"group": group, "latency_us": max(alpha, 0.0) * 1e6, "latency_us_fitted": alpha * 1e6,
                 "gbps": bw / 1e9 if bw < float("inf") else None, "sizes": sorted({r["bytes"] for r in mine}),
                 "worst_rel_error": worst, "spread_rel": rel,
                 "source": f"measured: partita calibrate, {len(mine)} sizes, fitted t = c_lat alpha + c_bw S / B "
                           f"(worst size off by {worst:.0%}, repeats spread {rel:.0%})"}
        if entry["gbps"] is None:
            skipped.append(entry | {"kind": kind})
            continue
        out.setdefault(kind, []).append(entry)
    return out, skipped


def _coll_time(row: dict, alpha: float, bw: float) -> float:
    c_lat, c_bw = COLLECTIVE_COEFFICIENTS[row["kind"]](row["group"])
    return c_lat * alpha + c_bw * row["bytes"] / bw


def fit_all_reduce(coll: list[dict], world: int) -> tuple[float, float]:
    """(per-hop latency alpha in s, bandwidth in bytes/s) from all-reduce timings alone
    (``{"bytes", "seconds"}``), the ring model ``t = 2(n-1) alpha + 2(n-1)/n S / B``."""
    alpha, bw = _weighted_fit([{"kind": "all_reduce", "group": world, **c} for c in coll])
    return alpha, bw


#: The micro-runs (and a profiled run dir) are Partita's own runtime, so their predictions use
#: its framework entry (cost/frameworks.py: what it saves and recomputes, how its cp exchanges K/V).
RUNTIME_FRAMEWORK = "partita"
#: The pipeline micro-run's model: LLaMA blocks with negligible compute (hidden 16, 2
#: layers, 32-token vocabulary), so the per-micro-batch increment of its step time is
#: the pipeline schedule's own host time (stage bookkeeping, p2p posting, autograd
#: entry) and the per-layer launch overhead - not a GEMM or attention estimate, which is
#: what made the residual on tiny-llama come out negative.
PP_PROBE_MODEL = {"name": "pp-probe", "hidden": 16, "layers": 2, "heads": 2, "kv_heads": 2, "ffn_hidden": 32,
                  "vocab": 32}


#: The ZeRO-3 overlap micro-run's model: wide enough that FSDP's gathers and
#: reduce-scatters (12 MB of fp32 weights) are a large share of the step, with more compute
#: than traffic per micro-batch (so the step is linear in ``comm_overlap``,
#: :mod:`.overlap`); not a preset, so the plans it predicts are not its own shape.
ZERO3_PROBE_MODEL = {"name": "zero3-probe", "hidden": 288, "layers": 3, "heads": 4, "kv_heads": 4,
                     "ffn_hidden": 768, "vocab": 512}
#: Calibrate's own probe models by name.
PROBE_MODELS = {m["name"]: m for m in (PP_PROBE_MODEL, ZERO3_PROBE_MODEL)}


def run_model(name: str):
    """The model spec of a micro-run: one of calibrate's probes or a preset/file."""
    from ..spec.load import load_model
    from ..spec.model import ModelSpec
    if name in PROBE_MODELS:
        return ModelSpec.from_dict(dict(PROBE_MODELS[name]), f"calibrate's {name} model")
    return load_model(name)


#: Each runtime mechanism: the efficiency field its micro-run measures.
MECHANISMS: dict[str, str] = {
    "base": "kernel_overhead_us_per_layer",  # plain data parallel: the per-layer launch/framework time
    "tp": "tp_framework_us_per_layer",  # with sequence parallelism (the default with tp)
    "tp_nosp": "tp_nosp_framework_us_per_layer",
    "zero3": "zero3_framework_us_per_layer",
    "pp": "pp_framework_us_per_microbatch",
    # a local MoE layer's expert dispatch (tiny-moe, dp only), before ep: the ep run's
    # prediction then holds it, so the ep field is what ep adds on top of a local MoE layer
    "moe": "moe_framework_us_per_layer",
    "ep": "ep_framework_us_per_layer",
    "recompute": "recompute_framework_us_per_layer",
    "cp": "cp_framework_us_per_layer",
}
#: A field measured on top of another (fitted first and held in its run's prediction).
ON_TOP = {"ep_framework_us_per_layer": "moe_framework_us_per_layer"}
#: The probe value (us) whose effect on the predicted step gives a field's weight.
_PROBE_US = 1000.0


def fit_overheads(runs: dict[str, dict], predict: Callable[[dict, dict[str, float]], float],
                  known: dict[str, float] | None = None) -> dict[str, dict]:
    """Each mechanism's own time, measured directly on a micro-run of Partita's runtime.

    The cost model is linear in each overhead field, so its weight in a run is ``k =
    (P(field = 1 ms) - P(field = 0)) / 1 ms`` (how many times the step counts it: layers x
    micro-batches x passes, the pipeline's schedule included). Per repeat the field's
    value is ``(measured step - P(field = 0)) / k``, ``P`` predicted from the measured GEMM
    and collective terms: the median and spread are the repeats', and a negative median
    is reported, not clamped. A field the cost model does not read (``k = 0``) keeps the
    per-step difference and says so.

    A run with a ``long`` run beside it (the same plan with more micro-batches,
    :func:`partita.calibrate.measure.increment_plans`) is measured by its
    increment instead: ``((T_long - T) - (P_long - P)) / (k_long - k)`` per repeat, the
    time each further micro-batch adds beyond what the model already predicts for it. Per-step
    costs (optimizer, gradient sync, the pipeline's fill and drain) cancel, so the base
    per-layer overhead is not inflated by them and the pipeline field is the schedule's own
    per-micro-batch time.

    ``runs[mech]``: ``{"samples": [step seconds...], "plan", "model", ...}``;
    ``predict(run, fields)`` is the cost model's step time of that run with the
    efficiency ``fields`` set. ``base`` (plain data parallel) goes first: its per-layer
    kernel overhead is then part of every other prediction. ``known`` gives the fields a
    run's prediction holds that are not measured here (default 0).

    Order matters where one mechanism's run also pays another's field: ``moe`` (the expert
    dispatch of a local MoE layer) goes before ``ep``, so the ep run's prediction holds the
    moe field and ``ep_framework_us_per_layer`` is what expert parallelism adds on top
    (:func:`partita.cost.overheads.moe_framework_us`). A later prediction holds a field
    fitted negative as 0 (a device field cannot be negative): its record then says so
    (``clamped_to``, ``note``), so calibrate prints it, never silently."""
    fields: dict[str, float] = {f: 0.0 for f in MECHANISMS.values()} | dict(known or {})
    terms: dict[str, dict] = {}
    for mech in [m for m in MECHANISMS if m in runs]:
        field, run = MECHANISMS[mech], runs[mech]
        p0, weight = _prediction_and_weight(run, field, fields, predict)
        how = f"micro-run `{run.get('plan', mech)}` of {run.get('model', '?')} through partita.parallelize: "
        long = run.get("long")
        if long and len(long["samples"]) == len(run["samples"]):
            p0_long, weight_long = _prediction_and_weight(long, field, fields, predict)
            weight, read = weight_long - weight, weight_long - weight > 1e-9
            per = [((tl - ts) - (p0_long - p0)) / weight * 1e6 if read else (tl - ts) * 1e6
                   for ts, tl in zip(run["samples"], long["samples"])]
            how += (f"per-micro-batch increment against `{long.get('plan', long.get('plan_text'))}`: ((measured step "
                    f"difference) - (predicted step difference)) / {weight:.4g} (the field's weight in the difference)")
        else:
            read = weight > 1e-9
            per = [(s - p0) / (weight if read else 1.0) * 1e6 for s in run["samples"]]
            how += ("(measured step - step predicted from the measured GEMM and collective terms) / "
                    + (f"{weight:.4g} (the field's weight in that step)" if read else "1 (the cost model does not read it)"))
        terms[field] = summarize(per, "us" if read else "us/step (not read by the cost model)", how)
        terms[field].update(predicted_step_s=p0, weight=weight, read_by_cost_model=read)
        _note_held(terms, field, fields)
        fields[field] = max(terms[field]["value"], 0.0) if read else 0.0
        if terms[field]["value"] < 0:
            terms[field].update(clamped_to=0.0, note=f"negative ({terms[field]['value']:.4g} us): written as 0 and "
                                                     f"held at 0 in the later micro-runs' predictions")
    return terms


def _note_held(terms: dict[str, dict], field: str, fields: dict[str, float]) -> None:
    """Say in ``field``'s method which earlier-fitted field its prediction held, and at what
    value (:data:`ON_TOP`: the ep term is measured on top of the moe term)."""
    under = ON_TOP.get(field)
    if under in terms and terms[under]["read_by_cost_model"]:
        terms[field]["method"] += f"; on top of {under} = {fields[under]:.4g} us (fitted first, held in the prediction)"


def _prediction_and_weight(run: dict, field: str, fields: dict[str, float],
                           predict: Callable[[dict, dict[str, float]], float]) -> tuple[float, float]:
    """The run's predicted step with ``field`` at 0, and the field's weight in it (s per s of field)."""
    p0 = predict(run, dict(fields, **{field: 0.0}))
    return p0, (predict(run, dict(fields, **{field: _PROBE_US})) - p0) / (_PROBE_US * 1e-6)
