"""``partita calibrate``: measure this machine and write a hardware file the planner reads.

Run under torchrun with the process count a plan will use. Each term the cost model
uses is measured directly, in several repeats (:mod:`.measure`), and fitted
by pure functions (:mod:`.fit`):

* GEMM time by shape class (square, the MLP's wide ``tokens x h -> 4h``, few-token
  skinny) -> the curve ``rate(G) = peak eff G / (G + G_half)``: ``efficiency.gemm``,
  ``gemm_half_gflop``;
* element-wise bandwidth (a large copy) -> ``memory.hbm_tbps`` at efficiency 1;
* the optimizer step (an AdamW step over 4 M parameters, in place) -> ``memory.optimizer_tbps``;
* every collective (all-reduce, all-gather, reduce-scatter, all-to-all, send/recv) at
  4 KiB ... 8 MiB over the world (and pairs for a world of 4+), fitted jointly to the
  cost model's formulas -> ``intra_node.latency_us``, ``gbps_per_direction``; each
  collective's own fit is kept beside it;
* the runtime's own time per mechanism: a micro-run of ``partita.parallelize`` per
  mechanism (plain data parallel, tp with and without sp, FSDP zero 3, pp, ep, full
  recompute, cp), the step time predicted from the terms above subtracted, divided by the
  field's weight in that step -> ``kernel_overhead_us_per_layer`` and the
  ``*_framework_*`` fields. With 2+ processes every field is measured by the
  per-micro-batch increment of two runs (1 -> 4 micro-batches; pp 2 -> 6), so per-step
  costs (optimizer step over DTensor/FSDP parameters, gradient sync) do not inflate
  them; the pipeline runs a compute-free probe model (:data:`.fit.PP_PROBE_MODEL`),
  so its schedule time is not the remainder of a compute estimate. Never clamped silently: a negative measured value is written as 0 and
  reported with its spread;
* the share of FSDP's gathers and reduce-scatters that hides behind compute: a zero-3
  micro-run of a wider probe (:data:`.fit.ZERO3_PROBE_MODEL`), fitted in turn
  with the FSDP framework term (:mod:`.overlap`) -> ``efficiency.comm_overlap``.

Each term lands in the file with its value, spread, repeats and method
(``calibration.terms``) and a provenance line (``efficiency_provenance``). The file
``extends`` the base device file, so every field not measured keeps its documented value.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
from datetime import timedelta

from .fit import (RUNTIME_FRAMEWORK, fit_all_reduce, fit_collectives, fit_gemm, fit_overheads,
                            fit_per_collective, gemm_classes, run_model, summarize)
from .overlap import fit_with_overlap

__all__ = ["fit_all_reduce", "fit_collectives", "fit_gemm", "fit_overheads", "hardware_file", "measure", "summarize"]

#: Repeats of every timed term (the spread is over these).
REPEATS = 5


def measure(device_type: str, dtype_name: str = "fp32", repeats: int = REPEATS, model: str = "tiny-llama") -> dict:
    """Every raw measurement of this rank's device (collectives and micro-runs: the smallest
    rank's busy time), with the clock they were read on (``clock``: :data:`.busy_clock.SOURCE`)."""
    import torch
    import torch.distributed as dist
    from ..runtime.device import local_device
    from .busy_clock import SOURCE, seconds_per_call
    from .measure import measure_collectives, measure_gemm, measure_optimizer, measure_runtime, measure_wakeup
    device = local_device(device_type)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    sync = (lambda: getattr(torch, device.type).synchronize()) if device.type != "cpu" else (lambda: None)
    out: dict = {"device": device.type, "dtype": dtype_name, "world": dist.get_world_size(), "repeats": repeats,
                 "clock": SOURCE}
    out["gemm"] = measure_gemm(device, dtype, sync, repeats)
    x = torch.randn(16_000_000 // (1 if dtype_name == "fp32" else 2), device=device, dtype=dtype)
    copy = seconds_per_call(lambda: (x.clone(), sync()), repeats, min_time=0.1)
    out["copy"] = [2 * x.numel() * x.element_size() / t for t in copy]
    from .read_rate import measure_read_rate  # the streaming read rate beside the clone (read_rate.py)
    out["read"] = measure_read_rate(device, dtype, sync, repeats)
    from .decode_rates import measure_eager_decode  # an eager decode step's kernels (decode_rates.py)
    out["eager_decode"] = measure_eager_decode(device, dtype, sync, repeats)
    out["optimizer"] = measure_optimizer(device, sync, repeats)
    if out["world"] > 1:
        out["collectives"] = measure_collectives(device, sync, repeats)
        out["wakeup"] = measure_wakeup(device, sync, repeats)
    out["runtime"] = measure_runtime(device_type, dtype_name, repeats, model)
    # the GEMM rate again after the micro-runs, pooled with the first: a shared machine's
    # speed drifts by 10-20 % over a minute (2-core VM: 74 vs 94 GFLOP/s in two calibrations
    # ten minutes apart), and every prediction scales with this one figure
    for row, again in zip(out["gemm"], measure_gemm(device, dtype, sync, repeats)):
        row["samples"] += again["samples"]
        row["seconds"] = statistics.median(row["samples"])
    return out


def _base_fields(m: dict, base: str) -> tuple[dict, dict]:
    """The GEMM, bandwidth and collective fields of the file, and their term records."""
    import statistics
    from ..spec.hardware import load_device
    dev = load_device(base)
    dtype = m["dtype"]
    peak = dev.peak_flops(dtype) if dev.supports(dtype) else max(g["gflop"] * 1e9 / g["seconds"] for g in m["gemm"])
    peak, eff, g_half = fit_gemm(m["gemm"], peak)
    terms = {f"gemm.{k}": v for k, v in gemm_classes(m["gemm"]).items()}
    terms["memory.hbm_tbps"] = summarize([b / 1e12 for b in m["copy"]], "TB/s", "clone of a 64 MB tensor (read + write)")
    if m.get("collectives"):
        alpha, bw, per_kind = fit_collectives(m["collectives"])
        for kind, fit in per_kind.items():
            rows = [r for r in m["collectives"] if r["kind"] == kind]
            # the spread of a collective: the relative spread of its repeats, worst size
            rel = [(statistics.quantiles(r["samples"], n=4, method="inclusive")[2]
                    - statistics.quantiles(r["samples"], n=4, method="inclusive")[0]) / 2 / r["seconds"]
                   if len(r["samples"]) >= 2 else 0.0 for r in rows]
            terms[f"collective.{kind}"] = {**fit, "repeats": m["repeats"], "spread_rel": max(rel),
                                           "method": f"{len(rows)} sizes x {m['repeats']} repeats, fitted to "
                                                     f"t = c_lat alpha + c_bw S / B (cost/comm.py)"}
        # a noisy fit can give a negative latency or bandwidth: kept signed in the terms,
        # the file gets the nearest physical value
        terms["intra_node.fit"] = {"latency_us": alpha * 1e6, "gbps": bw / 1e9 if bw < float("inf") else None,
                                   "method": "one (latency, bandwidth) pair fitted to every collective at once"}
        if m.get("wakeup"):
            terms["collective.wakeup"] = wakeup_term(m["wakeup"])
        alpha, bw = max(alpha, 0.0), bw if 0 < bw < float("inf") else dev.intra_gbps * 1e9
        collectives, skipped = fit_per_collective(m["collectives"])
        if skipped:
            terms["collectives.skipped"] = {"fits": skipped, "method": "no positive bandwidth: the joint pair stands"}
    else:
        collectives = {}
        alpha, bw = dev.intra_latency_us * 1e-6, dev.intra_gbps * 1e9
    memory = {"hbm_tbps": terms["memory.hbm_tbps"]["value"]}
    if m.get("read"):
        from .read_rate import read_rate_fields
        memory["read_tbps"], terms["memory.read_tbps"] = read_rate_fields(m["read"])
    if m.get("optimizer"):
        terms["memory.optimizer_tbps"] = summarize([b / 1e12 for b in m["optimizer"]], "TB/s",
                                                   "torch.optim.AdamW step over 4 M fp32 parameters in 40 tensors, "
                                                   "in the cost model's bytes (34 per parameter)")
        memory["optimizer_tbps"] = terms["memory.optimizer_tbps"]["value"]
    fields = {"peak_tflops": {dtype: peak / 1e12}, "memory": memory,
              "intra_node": {"gbps_per_direction": bw / 1e9, "peer_gbps_per_direction": bw / 1e9,
                             "latency_us": alpha * 1e6},
              "efficiency": {"gemm": eff, "gemm_half_gflop": g_half, "memory_bandwidth": 1.0, "intra_node_comm": 1.0}}
    if collectives:  # per collective and group size: what cost/comm.py reads instead of the joint pair
        fields["collectives"] = collectives
    return fields, terms


def wakeup_term(w: dict) -> dict:
    """The wake-up latency per latency step of a collective, as a term record: per repeat,
    (smallest all-reduce after compute - the same back to back) / its ring steps ``2(n-1)``
    (:data:`partita.cost.comm.ALGORITHM_FACTORS`). Not a separate field the cost model adds:
    every collective above but the broadcast and the all-to-all (timed as the runtime issues
    them: back to back, after the count exchange) is timed after compute
    (:data:`.measure.COLLECTIVE_GAP_S`), so the
    fitted per-step latencies (``collectives``) already hold it; this record says how much of
    each ``latency_us`` it is (the back-to-back figures are what calibrate fitted before)."""
    from ..cost.comm import ALGORITHM_FACTORS
    steps = ALGORITHM_FACTORS["all_reduce"](w["group"])[0]
    per = [(c - h) / steps * 1e6 for c, h in zip(w["after_compute"], w["back_to_back"])]
    record = summarize(per, "us per latency step",
                       f"{w['bytes']} B all-reduce on {w['group']} ranks, {len(w['after_compute'])} repeats of 20 calls: "
                       f"time after the last rank arrived, each call after compute minus back to back, / {steps} steps")
    record.update(back_to_back_us=statistics.median(w["back_to_back"]) * 1e6,
                  after_compute_us=statistics.median(w["after_compute"]) * 1e6)
    return record


def predictor(base: str, fields: dict):
    """``predict(run, efficiency)``: the cost model's step time of a micro-run on ``base``
    with the measured ``fields`` and the given efficiency fields."""
    from ..estimate import estimate
    from ..plan import Plan
    from ..spec.hardware import Cluster, load_device

    def predict(run: dict, efficiency: dict[str, float]) -> float:
        over = {**fields, "efficiency": {**fields["efficiency"], **efficiency}}
        device = load_device(base, overrides=over)
        cluster = Cluster(device=device, nodes=1, devices_per_node=run["world"])
        plan = Plan.parse(run["plan_text"], world_size=run["world"],
                          defaults={"mbs": 1, "seq_len": run["seq_len"], "dtype": run["dtype"],
                                    "framework": RUNTIME_FRAMEWORK})
        return estimate(run_model(run["model"]), cluster, plan).step_time_s
    return predict


def hardware_file(m: dict, base: str, name: str) -> dict:
    """Turn measurements into a device file that extends ``base`` (no measuring here:
    tests feed synthetic measurements to it)."""
    fields, terms = _base_fields(m, base)
    if m.get("eager_decode"):  # the eager_decode section (decode_rates.py)
        from .decode_rates import eager_decode_fields
        fields["eager_decode"], eager_terms = eager_decode_fields(m["eager_decode"])
        terms.update(eager_terms)
    overheads = fit_with_overlap(m.get("runtime", {}), predictor(base, fields))
    for field, term in overheads.items():  # a value outside its range is written clamped (the record says so)
        fields["efficiency"][field] = term.get("clamped_to", term["value"]) if term["read_by_cost_model"] else 0.0
    terms.update({f"efficiency.{k}": v for k, v in overheads.items()})
    n = m["world"]
    provenance = {k: _provenance(terms.get(f"efficiency.{k}"), m) for k in fields["efficiency"]}
    provenance["gemm"] = provenance["gemm_half_gflop"] = (
        f"measured: partita calibrate, {len(m['gemm'])} GEMM shapes in 3 classes x {m['repeats']} repeats, "
        f"fitted to rate = peak eff G/(G+G_half)")
    provenance["memory_bandwidth"] = "measured: partita calibrate, 1 - memory.hbm_tbps is the measured copy bandwidth itself"
    provenance["intra_node_comm"] = "measured: partita calibrate, 1 - intra_node bandwidth is the fitted collective bandwidth itself"
    return {"name": name, "extends": base,
            "description": f"{base} calibrated by `partita calibrate` on this machine ({n} process(es), {m['device']})",
            **fields, "efficiency_provenance": provenance,
            "calibration": {"terms": terms, "raw": m}}


def _provenance(term: dict | None, m: dict) -> str:
    if term is None:
        return f"measured: partita calibrate ({m['world']} processes)"
    note = (" (negative: written as 0)" if term["value"] < 0 and term.get("clamped_to", 0.0) == 0.0
            else f" ({term['note']})" if "note" in term else "")
    return (f"measured: partita calibrate, {term['value']:.4g} +- {term['spread']:.2g} {term['unit']}{note} "
            f"over {term['repeats']} repeats; {term['method']}")


def main() -> None:
    """``torchrun ... -m partita.calibrate.hardware_file OUT.json BASE NAME DEVICE DTYPE [REPEATS [MODEL]]``"""
    import faulthandler

    import torch.distributed as dist
    from ..runtime.device import backend_for, detect_device_type
    faulthandler.enable()  # a native crash (SIGSEGV in a collective) prints where each thread was
    out_path, base, name, device, dtype = sys.argv[1:6]
    repeats = int(sys.argv[6]) if len(sys.argv) > 6 else REPEATS
    model = sys.argv[7] if len(sys.argv) > 7 else "tiny-llama"
    device_type = detect_device_type(device if device != "auto" else None)
    from .binding import bind_cores
    bind_cores(device_type)  # partita calibrate --bind-cores, as partita train binds its ranks
    dist.init_process_group(backend_for(device_type), timeout=timedelta(seconds=300))
    m = measure(device_type, dtype, repeats, model)
    if dist.get_rank() == 0:
        from ..outputs import write_output  # whole or not at all: an old file of that name survives a crash
        write_output(out_path, json.dumps(hardware_file(m, base, name), indent=2), "-o")
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
