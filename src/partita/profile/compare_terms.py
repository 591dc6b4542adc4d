"""``partita profile``'s term-by-term comparison: each term of the prediction beside what
the traces measured, the source of the number behind it, and the term most off.

Terms: compute (+ recompute + optimizer step), the host framework time of each parallel
mechanism (booked by the cost model under its mechanism's part; on CPU a trace counts it
as compute ops on the training thread, so it is compared together with compute), each
mesh axis's communication (tp, cp, ep, pp, dp - ZeRO-3 gathers included), and idle time
(the pipeline bubble and waits). The term most off is the one with the largest absolute
difference in seconds per step: the one that moves the step-time error most.
"""
from __future__ import annotations

import statistics

#: Each predicted part of the step (``Estimate.time.parts``) -> the measured term it is compared with.
PART_TERM = {"compute": "compute", "recompute": "compute", "optimizer step": "compute",
             "tp communication": "tp", "cp communication": "cp", "ep all-to-all": "ep", "pp send/recv": "pp",
             "zero3 gather/scatter": "dp", "dp gradient sync": "dp", "pipeline bubble": "idle"}
#: The framework field and the part the cost model books it under.
FRAMEWORK_PART = {"kernel_overhead_us_per_layer": "compute", "tp_framework_us_per_layer": "tp",
                  "tp_nosp_framework_us_per_layer": "tp",
                  "zero3_framework_us_per_layer": "dp", "pp_framework_us_per_microbatch": "pp",
                  "moe_framework_us_per_layer": "compute", "ep_framework_us_per_layer": "ep", "recompute_framework_us_per_layer": "compute",
                  "cp_framework_us_per_layer": "cp"}
#: Provenance kind -> the word the comparison prints.
SOURCE_WORD = {"measured": "calibrated", "vendor": "datasheet", "fitted": "fitted", "scaled": "scaled",
               "assumed": "assumed", "default": "default", "override": "override"}
#: The device field whose provenance a term's number rests on.
TERM_FIELD = {"compute": "gemm", "tp": "intra_node_comm", "cp": "intra_node_comm", "ep": "intra_node_comm",
              "pp": "intra_node_comm", "dp": "intra_node_comm"}


def source_word(provenance: str) -> str:
    return SOURCE_WORD.get(provenance.split(":", 1)[0].strip(), "assumed")


def term_table(measured: dict[str, float], parts: dict[str, float], framework: dict[str, tuple[float, str]],
               sources: dict[str, str]) -> dict:
    """Rows ``{term, predicted_s, measured_s, diff_s, source}`` and the term most off.

    ``measured``: seconds per step of ``compute`` (framework included), ``idle`` and each
    axis; ``parts``: the estimate's parts; ``framework``: each framework field's predicted
    seconds per step and its provenance (already inside ``parts``: split out here so it is
    shown, and moved from its communication part to compute, where a CPU trace books it)."""
    pred: dict[str, float] = {}
    for part, seconds in parts.items():
        term = PART_TERM.get(part)
        if term:
            pred[term] = pred.get(term, 0.0) + seconds
    for field, (seconds, _) in framework.items():
        part = FRAMEWORK_PART[field]
        if part != "compute" and seconds:
            pred[part] = pred.get(part, 0.0) - seconds
            pred["compute"] = pred.get("compute", 0.0) + seconds
    rows = []
    for term in ["compute"] + sorted(t for t in set(pred) | set(measured) if t not in ("compute", "idle")) + ["idle"]:
        p, m = pred.get(term, 0.0), measured.get(term, 0.0)
        rows.append({"term": term if term in ("compute", "idle") else f"{term} communication", "predicted_s": p,
                     "measured_s": m, "diff_s": m - p, "source": sources.get(term, "derived")})
    for field, (seconds, provenance) in framework.items():
        if seconds:
            rows.append({"term": f"  of which framework: {field}", "predicted_s": seconds, "measured_s": None,
                         "diff_s": None, "source": source_word(provenance)})
    compared = [r for r in rows if r["diff_s"] is not None]
    worst = max(compared, key=lambda r: abs(r["diff_s"]))
    return {"rows": rows, "most_off": worst["term"], "most_off_diff_s": worst["diff_s"]}


def compare_run(report: dict, plan, model_name: str, hardware: str) -> dict:
    """:func:`term_table` for a ``partita profile`` report (:func:`partita.train.profile_report.analyze_run`)."""
    from ..estimate import estimate
    from ..spec.hardware import make_cluster
    from ..spec.load import load_model
    model = load_model(model_name)
    cluster = make_cluster(hardware, plan.world_size)
    est = estimate(model, cluster, plan)
    eff = cluster.device.efficiency
    framework = {}
    for field in FRAMEWORK_PART:
        if getattr(eff, field):
            without = estimate(model, make_cluster(hardware, plan.world_size, overrides={"efficiency": {field: 0.0}}),
                               plan).step_time_s
            framework[field] = (est.step_time_s - without, eff.source(field))
    ranks = report["ranks"]
    measured = {"compute": statistics.mean(r["compute_s"] for r in ranks),
                "idle": statistics.mean(r["idle_s"] for r in ranks)}
    for axis in sorted({a for r in ranks for a in r.get("by_axis_s", {})}):
        measured[axis] = statistics.mean(r.get("by_axis_s", {}).get(axis, 0.0) for r in ranks)
    sources = {term: source_word(eff.source(field)) for term, field in TERM_FIELD.items()}
    sources["idle"] = "derived (pipeline schedule)"
    return term_table(measured, dict(est.time.parts), framework, sources)


def print_terms(table: dict) -> None:
    """The comparison as a table, then the term most off."""
    def ms(v):
        return "-" if v is None else f"{v * 1e3:9.1f}"
    print(f"\n{'term':52s} {'predicted ms':>12s} {'measured ms':>12s} {'diff ms':>9s}  source")
    for r in table["rows"]:
        print(f"{r['term']:52s} {ms(r['predicted_s']):>12s} {ms(r['measured_s']):>12s} {ms(r['diff_s']):>9s}  "
              f"{r['source']}")
    print(f"most off: {table['most_off']} ({table['most_off_diff_s'] * 1e3:+.1f} ms per step measured - predicted)")
