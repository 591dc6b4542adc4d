"""Predict published serving benchmarks with ``partita serve``'s model; report the error per
source; write the 80 % interval table ``partita serve`` reads.

Every row of ``data/published_serving.csv`` (one measured figure with its source, URL and the
quoted table line) is predicted with the serving model as a user would ask it: the model, the
device file from the catalog, the replica's tp / pp, the workload's mean prompt and output
lengths, and the scenario the source ran:

* ``single_prefill`` - batch 1, one output token: TTFT = :func:`latency.prefill_time`;
* ``batch_prefill`` / ``batch_decode`` - one prefill forward of ``B`` prompts (``B S``: a
  prefill is compute-bound, so ``B`` prompts cost ``B`` times one) and one decode step of
  ``B`` sequences at the mean context (:func:`latency.tpot`);
* ``static_batch`` - TensorRT-LLM's ``gptSessionBenchmark``: ``B`` prompts prefill, then ``O``
  decode steps at batch ``B``: ``out_tok_s = B O / (B S + O t_dec(B))``;
* ``poisson`` - requests at a rate: :func:`partita.serve.search.evaluate` (the M/D/1 prefill
  queue and the shared replica of :mod:`partita.serve.queueing`) gives TTFT and TPOT, with the
  row's ``scheduler_steps`` (vLLM 0.6's ``--num-scheduler-steps``: a prompt waits for the
  window of decode steps in flight);
* ``saturated`` - every request at once (rate ``inf``, offline): ``N`` = the KV pool's
  sequences, capped by the engine's batch limit and the number of prompts; the replica
  sustains ``lambda = N / (O t_dec(N) + N S)`` (queueing approximation 3) and
  ``TPOT = t_dec(N) / (1 - lambda S)``. The published output rate is a finite burst's -
  the row's ``prompts`` divided by the time the last one finishes - so ``out_tok_s`` is
  :func:`partita.serve.queueing.burst_rate` times ``O``: the steady state while prompts wait,
  then the drain, when the batch shrinks and every step still reads the weights (``lengths``:
  ``fixed`` for the benchmarks' random datasets, ``exponential`` for ShareGPT's spread); the
  mean TPOT of a burst the batch holds is :func:`partita.serve.queueing.burst_tpot` (the
  backlog's prefill chunks ride beside the first decode steps);
* ``concurrency`` - a closed loop with ``N`` requests in flight: the same formulas with ``N``
  fixed, and ``TTFT = S + t_dec(N) / 2`` (no queue; the decode step in flight finishes first),
  ``S + t_dec(N) / 2 + D`` where the engine holds a waiting prompt back ``D`` seconds before it
  runs its prefill (MindIE's ``maxQueueDelayMicroseconds``: :data:`QUEUE_DELAY_S`,
  :func:`partita.serve.queueing.held_prefill_wait`);

Mean lengths stand for each run's distribution in the step times; the spread enters only
the burst's drain. ``--steady`` predicts the saturated rows as the steady state instead (the
model before the drain term), for comparison; the report prints the saturated output rate
under both and under fixed lengths for every row (the sensitivity to the length law, which
was chosen knowing this table: it is an assumption, not a fit).

**Nothing is fitted on these rows**: every prediction uses the catalog's device files as
they are (fitted on training runs, not on these). All errors are out of sample. The
intervals are split conformal (Vovk et al. 2005; Lei et al. 2018, sec. 2.2) on the absolute
log residuals ``|r|``, ``r = ln(measured / predicted)``, per class, counted in effective rows
as :mod:`partita.uncertainty` does for training (:mod:`partita.serve.intervals` says why the
score is absolute, not equal-tailed); their coverage is measured leave-one-source-out: each
source's rows are checked against bounds built from the other sources' residuals only.

Run ``python bench/serve_published.py`` (prints the report; about a second);
``--write`` also rewrites ``src/partita/catalog/serve_intervals.json``; ``--json`` prints
the per-row predictions as JSON. Rerun with ``--write`` whenever the serving model changes.
``--memory`` prints data/published_serving_memory.csv - engines' own memory-profiling log
lines (weights, non-torch buffers, activation peak, KV pool), each with its source - against
:func:`partita.serve.memory.serve_memory` (no interval is built from them yet: too few rows).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from partita.models.registry import resolve_model
from partita.serve import latency
from partita.serve.intervals import (
    CLASSES,
    INTERVALS_FILE,
    LEVEL,
    METRICS,
    SATURATED,
    bounds_from,
    interval_class,
)
from partita.serve.memory import serve_memory
from partita.serve.queueing import (backlog_tpot, burst_rate, burst_tpot, colocated_rate, held_prefill_wait,
                                    refill_prefill_share)
from partita.serve.search import evaluate, prefill_occupancy
from partita.serve.workload import Layout, Workload
from partita.spec.hardware import load_device
from partita.uncertainty import effective_rows

CSV = ROOT / "data" / "published_serving.csv"
#: engines' own memory accounting lines (vLLM's memory-profiling log: weights, non-torch,
#: activation peak, KV pool), one component a row, with sources: the oracle of serve_memory
MEMORY_CSV = ROOT / "data" / "published_serving_memory.csv"
#: serve_memory's field for each logged component (``non_torch``: CUDA context, NCCL and
#: other allocator-external buffers = Partita's runtime workspace)
MEMORY_FIELDS = {"weights": "weights", "non_torch": "workspace", "activations": "activations", "kv_pool": "kv"}
#: True: predict a saturated burst as the steady state (the model before the drain term; `--steady`)
STEADY_BURST = False


@dataclass
class Row:
    """One published figure and its prediction."""

    source: str
    engine: str
    model: str
    hardware: str
    metric: str
    scenario: str
    measured: float
    predicted: float

    @property
    def cls(self) -> str | None:
        """The interval class (:func:`partita.serve.intervals.interval_class`)."""
        return interval_class(self.metric, self.scenario)

    @property
    def residual(self) -> float:
        """ln(measured / predicted): the conformal score (positive: the model is optimistic)."""
        return math.log(self.measured / self.predicted)

    @property
    def error(self) -> float:
        """Signed relative error of the prediction: predicted / measured - 1."""
        return self.predicted / self.measured - 1


def load_rows(path: Path = CSV) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


#: engines whose scheduler loop waits on the host for each step's tokens, by the release the
#: row names (:data:`partita.serve.latency.ENGINE_HOST_SECONDS` / ``ENGINE_HOST_FRACTION``;
#: regular expressions on the lower-cased engine): vLLM's V0 engine - every release before
#: 0.8, and 0.8+ where the row's log shows the V0 fallback ("(V0 engine)"); V1 became the
#: default in 0.8 and no source gives its bubble, and a row that names no release is not
#: assumed to be V0 - and SGLang before v0.4's overlap scheduler
SYNC_ENGINES = {r"vllm v0\.[0-7]\.": "vllm-v0", r"vllm .*\(v0 engine\)": "vllm-v0", r"sglang v0\.[0-3]\.": "sglang-sync"}


T = TypeVar("T")


#: seconds a waiting prompt is held back before the scheduler runs its prefill, by engine
#: (regular expressions on the lower-cased engine; :func:`partita.serve.queueing.held_prefill_wait`):
#: MindIE's ``maxQueueDelayMicroseconds`` - GPUStack's MindIE backend (the GPUStack 910B page's
#: engine) writes 5000 into ``ScheduleConfig`` (gpustack/worker/backends/ascend_mindie.py at
#: 7b50d506: ``max_queue_delay_microseconds: int = 5000`` and its config template's
#: ``"maxQueueDelayMicroseconds" : 5000``), MindIE's own default (Ascend/MindIE-LLM
#: docs/zh/user_guide/user_manual/service_parameter_configuration.md; ``scheduler.h``
#: ``defaultMaxQueueDelayMicroseconds = 5000``)
QUEUE_DELAY_S = {r"mindie": 5000e-6}


#: engines that run each prefill as a forward of its own (no chunk beside the decodes), with
#: the most prompts and tokens one such forward takes: MindIE's "Standard" template (GPUStack's
#: ``"templateType" : "Standard"``) with GPUStack's ``maxPrefillBatchSize`` 50 and
#: ``maxPrefillTokens`` = ``maxSeqLen`` (the model's, capped at 8192; a run with longer prompts
#: had it raised - one prompt a forward either way) - gpustack/worker/backends/ascend_mindie.py
#: at 7b50d506; :func:`partita.serve.queueing.refill_prefill_share`
SEPARATE_PREFILL = {r"mindie": (50, 8192)}


def engine_entry(table: dict[str, T], engine: str, default: T) -> T:
    """The value of the first pattern of ``table`` (regular expressions matched at the start
    of the lower-cased engine, in the table's order) that the row's engine matches, else
    ``default``: the one lookup :data:`SYNC_ENGINES`, :data:`QUEUE_DELAY_S` and
    :data:`SEPARATE_PREFILL` are read with."""
    low = engine.lower()
    return next((value for pattern, value in table.items() if re.match(pattern, low)), default)


def separate_prefill(engine: str) -> tuple[int, int] | None:
    """``(maxPrefillBatchSize, maxPrefillTokens)`` of an engine in :data:`SEPARATE_PREFILL`, else None."""
    return engine_entry(SEPARATE_PREFILL, engine, None)


def separate_prefill_share(model, device, layout, rec: dict[str, str], seqs: int, per_node: int, fw: str,
                           caps: tuple[int, int]) -> float:
    """Replica seconds per prompt on an engine that prefills in forwards of its own. In a
    burst every prompt waits from the start and the engine prefills whatever its KV cache holds
    before it decodes (MindIE: ``PREFILL_FIRST`` while a prompt waits, ``maxBatchSize`` capping
    only the decode batch - the GPUStack page's P99 TTFT, 11.3 s of an 89 s ShareGPT burst, is
    that prefill phase), so its forwards are full: ``min(batch cap, token cap // P)`` prompts
    each. In a closed loop a prompt arrives alone and takes a forward of its own when a slot
    frees (:func:`partita.serve.queueing.refill_prefill_share`: one prompt, rarely two)."""
    P, O = int(rec["prompt_len"]), int(rec["output_len"])
    most = max(1, min(caps[0], caps[1] // P))
    forward = lambda k: latency.batch_prefill_time(model, device, layout, P, k, per_node, fw)
    if rec["scenario"] == "saturated":
        return forward(most) / most
    return refill_prefill_share(forward, seqs, O, most)


def prefilled_burst_tpot(model, device, layout, rec: dict[str, str], seqs: int, t_dec: float, per_node: int,
                         fw: str, caps: tuple[int, int]) -> float:
    """Mean TPOT of a burst that an engine prefilling in forwards of its own takes in whole
    before it decodes (its KV cache holds every prompt: MindIE's ``PREFILL_FIRST`` while a prompt
    waits, ``maxBatchSize`` the decode batch): :func:`partita.serve.queueing.backlog_tpot` with
    full forwards of ``min(batch cap, token cap // P)`` prompts."""
    P, O = int(rec["prompt_len"]), int(rec["output_len"])
    most = max(1, min(caps[0], caps[1] // P))
    forward = latency.batch_prefill_time(model, device, layout, P, most, per_node, fw)
    return backlog_tpot(int(rec["prompts"]), seqs, O, t_dec, forward, most, rec["lengths"])


def queue_delay(engine: str) -> float:
    """The row's engine's hold on a waiting prompt (:data:`QUEUE_DELAY_S`; 0 for the others)."""
    return engine_entry(QUEUE_DELAY_S, engine, 0.0)


def engine_framework(engine: str) -> str:
    """The serve model's runtime name for a row's engine: ``tensorrt-llm`` (its all-reduce is
    NCCL's: :data:`partita.serve.latency.NCCL_ALL_REDUCE`), a synchronous engine's release
    (:data:`SYNC_ENGINES`: its host bubble per step, :func:`partita.serve.latency.engine_host`),
    else the engines' default (vLLM's custom all-reduce on NVLink switch nodes; HCCL's Mesh on
    the 910B; no host bubble)."""
    if engine.lower().startswith("tensorrt-llm"):
        return "tensorrt-llm"
    return engine_entry(SYNC_ENGINES, engine, "megatron")


def predict(rec: dict[str, str]) -> float:
    """The serving model's figure for one CSV row (module docstring)."""
    model = resolve_model(rec["model"]).spec()
    device = load_device(rec["hardware"])
    tp, pp, per_node = int(rec["tp"]), int(rec["pp"]), int(rec["devices_per_node"])
    layout = Layout(tp, pp, 1, rec["kv_dtype"], int(rec["ep"]), dtype=rec["dtype"])
    per_device = tp * pp if rec["statistic"] == "per_device" else 1  # a table in tokens/s per GPU
    P, O, metric = int(rec["prompt_len"]), int(rec["output_len"]), rec["metric"]
    scenario, fw = rec["scenario"], engine_framework(rec["engine"])
    k = int(rec["scheduler_steps"] or 1)  # decode steps per scheduler call
    prefill = latency.prefill_time(model, device, layout, P, per_node, fw)
    if scenario == "single_prefill":
        return prefill
    if scenario == "batch_prefill":  # one forward over the batch's prompts (the weights read once)
        return latency.batch_prefill_time(model, device, layout, P, int(rec["batch"]), per_node, fw)
    if scenario == "batch_decode":  # one decode step of the batch at the mean context
        return latency.tpot(model, device, layout, int(rec["batch"]), P + O / 2, per_node, fw)
    if scenario == "static_batch":
        B = int(rec["batch"])
        t_dec = latency.tpot(model, device, layout, B, P + O / 2, per_node, fw)
        return B * O / (latency.batch_prefill_time(model, device, layout, P, B, per_node, fw) + O * t_dec) / per_device
    if scenario == "poisson":
        res = evaluate(model, device, layout, Workload(P, O, float(rec["rate_rps"])), per_node, k, fw)
        return {"ttft_s": res.ttft, "tpot_s": res.tpot}[metric]
    if scenario in ("saturated", "concurrency"):
        held = n = serve_memory(model, device, layout, P + O).max_seqs  # sequences the KV cache holds
        if rec["batch"]:
            n = min(n, int(rec["batch"]))
        t_dec = latency.tpot(model, device, layout, n, P + O / 2, per_node, fw, k)
        share = prefill_occupancy(model, device, layout, P, per_node, fw)  # prompts packed per chunk, per stage
        caps = separate_prefill(rec["engine"])
        if caps is not None and layout.pp == 1:  # prefill forwards of their own (MindIE's Standard template)
            share = separate_prefill_share(model, device, layout, rec, n, per_node, fw, caps)
        lam = colocated_rate(n, O, t_dec, share)
        if metric in ("out_tok_s", "tpot_s") and rec["prompts"] and not STEADY_BURST:  # a finite burst
            curve = lambda b: latency.tpot(model, device, layout, b, P + O / 2, per_node, fw, k)
            if metric == "tpot_s" and caps is not None and layout.pp == 1 and held >= int(rec["prompts"]):
                return prefilled_burst_tpot(model, device, layout, rec, n, t_dec, per_node, fw, caps)
            if metric == "tpot_s":
                return burst_tpot(int(rec["prompts"]), n, O, curve, share, P, latency.CHUNK_TOKENS, rec["lengths"])
            return burst_rate(int(rec["prompts"]), n, O, curve, share, rec["lengths"]) * O
        return {"out_tok_s": lam * O, "tpot_s": t_dec / (1 - lam * share),
                "ttft_s": prefill + held_prefill_wait(t_dec, queue_delay(rec["engine"]))}[metric]
    raise ValueError(f"unknown scenario {scenario!r}")


def predict_all(path: Path = CSV) -> list[Row]:
    return [Row(r["source"], r["engine"], r["model"], r["hardware"], r["metric"], r["scenario"],
                float(r["value"]), predict(r)) for r in load_rows(path)]


def memory_rows(path: Path = MEMORY_CSV) -> list[dict]:
    """Each published memory figure with :func:`partita.serve.memory.serve_memory`'s for the
    same model, device, tp, dtypes, utilization and max model length (GiB; error = predicted /
    published - 1)."""
    out = []
    for rec in load_rows(path):
        model = resolve_model(rec["model"]).spec()
        device = load_device(rec["hardware"])
        layout = Layout(int(rec["tp"]), 1, 1, rec["kv_dtype"], dtype=rec["dtype"])
        mem = serve_memory(model, device, layout, int(rec["max_model_len"]), float(rec["gpu_memory_utilization"]))
        predicted = getattr(mem, MEMORY_FIELDS[rec["component"]]) / 2 ** 30
        measured = float(rec["value_gib"])
        out.append({"source": rec["source"], "model": rec["model"], "tp": int(rec["tp"]),
                    "component": rec["component"], "measured_gib": measured, "predicted_gib": predicted,
                    "error": predicted / measured - 1})
    return out


def memory_report(rows: list[dict]) -> str:
    """The memory rows as a table (``--memory``)."""
    lines = ["Published serving memory (engine logs) vs partita serve's memory model, GiB per device",
             f"{'model':12s} {'tp':>3s} {'component':12s} {'published':>9s} {'predicted':>9s} {'error':>7s}"]
    for r in rows:
        lines.append(f"{r['model']:12s} {r['tp']:3d} {r['component']:12s} {r['measured_gib']:9.2f} "
                     f"{r['predicted_gib']:9.2f} {r['error']:+7.1%}")
    return "\n".join(lines)


def summary(rows: list[Row]) -> dict[str, float]:
    """Median and p90 of |error|, and the median signed error (predicted / measured - 1)."""
    errs = sorted(abs(r.error) for r in rows)
    p90 = errs[min(len(errs) - 1, math.ceil(0.9 * len(errs)) - 1)]
    return {"rows": len(rows), "median": statistics.median(errs), "p90": p90,
            "signed": statistics.median(r.error for r in rows)}


def per_source(rows: list[Row]) -> dict[str, dict[str, dict[str, float]]]:
    """{source: {metric: summary}} and the same over all sources under "all"."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for src in sorted({r.source for r in rows}) + ["all"]:
        mine = [r for r in rows if src in ("all", r.source)]
        out[src] = {m: summary([r for r in mine if r.metric == m]) for m in METRICS
                    if any(r.metric == m for r in mine)}
    return out


def by_source(rows: list[Row]) -> dict[str, list[float]]:
    """Residuals grouped by source (the clusters Kish's n_eff counts)."""
    out: dict[str, list[float]] = {}
    for r in rows:
        out.setdefault(r.source, []).append(r.residual)
    return out


def loso_coverage(rows: list[Row]) -> dict[str, tuple[int, int]]:
    """Per interval class (and "all"): rows inside the 80 % interval built from the *other*
    sources' residuals of that class, and rows checked (leave-one-source-out split conformal)."""
    out: dict[str, tuple[int, int]] = {}
    total_in = total = 0
    for metric in CLASSES:
        mine = [r for r in rows if r.cls == metric]
        inside = checked = 0
        for src in {r.source for r in mine}:
            others = by_source([r for r in mine if r.source != src])
            if sum(len(v) for v in others.values()) < 2:
                continue
            lo, hi = bounds_from(others, LEVEL)
            for r in mine:
                if r.source == src:
                    checked += 1
                    inside += lo <= r.residual <= hi
        out[metric] = (inside, checked)
        total_in, total = total_in + inside, total + checked
    out["all"] = (total_in, total)
    return out


BURST_VARIANTS = (("steady state (no drain; the model before)", "steady"),
                  ("burst, fixed lengths for every row", "fixed"),
                  ("burst, the row's length law (shipped)", "row"))


def variant_rows(variant: str, path: Path = CSV) -> list[Row]:
    """The saturated output-rate rows predicted as the steady state (``steady``), as a burst
    with fixed lengths everywhere (``fixed``), or as shipped (``row``)."""
    global STEADY_BURST
    recs = [r for r in load_rows(path) if r["scenario"] == "saturated" and r["metric"] == "out_tok_s"]
    if variant == "fixed":
        recs = [r | {"lengths": "fixed"} for r in recs]
    saved, STEADY_BURST = STEADY_BURST, variant == "steady"
    try:
        return [Row(r["source"], r["engine"], r["model"], r["hardware"], r["metric"], r["scenario"],
                    float(r["value"]), predict(r)) for r in recs]
    finally:
        STEADY_BURST = saved


def table_json(rows: list[Row]) -> dict:
    """The interval table ``partita serve`` reads (:mod:`partita.serve.intervals`)."""
    cov = loso_coverage(rows)
    metrics = {}
    for m in CLASSES:
        mine = [r for r in rows if r.cls == m]
        metrics[m] = {"residuals": sorted(round(r.residual, 5) for r in mine), "rows": len(mine),
                      "sources": len({r.source for r in mine}),
                      "effective": round(effective_rows(by_source(mine)), 3)}
    return {"level": LEVEL,
            "method": "split conformal on |ln(measured / predicted)| of data/published_serving.csv (the interval "
                      "[pred / exp(d), pred x exp(d)]), nothing fitted on those rows (bench/serve_published.py)",
            "metrics": metrics,
            "loso_coverage": {k: {"inside": a, "rows": b} for k, (a, b) in cov.items()}}


def report(rows: list[Row]) -> str:
    lines = ["Published serving benchmarks vs partita serve - all out of sample (nothing is fitted on these rows)",
             "error = predicted / measured - 1; median and p90 of |error|, signed = median signed error", ""]
    for src, by_metric in per_source(rows).items():
        lines.append(src if src != "all" else "ALL SOURCES")
        for m, s in by_metric.items():
            lines.append(f"  {m:10s} rows {s['rows']:3d}  median {s['median']:6.1%}  p90 {s['p90']:6.1%}  "
                         f"signed {s['signed']:+6.1%}")
    lines.append("")
    lines.append("Saturated output rate (out_tok_s, scenario saturated) under three burst models:")
    for label, variant in BURST_VARIANTS:
        s = summary(variant_rows(variant))
        lines.append(f"  {label:44s} rows {s['rows']:3d}  median {s['median']:6.1%}  p90 {s['p90']:6.1%}  "
                     f"signed {s['signed']:+6.1%}")
    cov = loso_coverage(rows)
    lines.append("")
    lines.append("80 % intervals, coverage leave-one-source-out: " + ", ".join(
        f"{k} {a}/{b}" + (f" ({a / b:.0%})" if b else "") for k, (a, b) in cov.items()))
    return "\n".join(lines)


SHORT = {"NVIDIA TensorRT-LLM docs/source/performance.md (v0.6.1 peak throughput; low latency from v0.5), H100":
             "TensorRT-LLM perf tables (H100 FP8)",
         "NVIDIA TensorRT-LLM": "TensorRT-LLM perf tables (A100 FP16)",
         "SGLang benchmark": "SGLang vs vLLM (SGLang repo)",
         "surajssd/llm-k8s": "vLLM nightly suite on ND96asr_v4 (tp 8; tp 4 x pp 2)",
         "Ascend torchair": "Ascend torchair Llama 70B, 800I A2 (910B4 x 8)",
         "GPUStack performance lab: Optimizing Qwen3-30B-A3B Throughput on ASCEND 910B NPUs (MindIE":
             "GPUStack: Qwen3-30B-A3B, MindIE 2.1RC1, 910B",
         "GPUStack performance lab: Optimizing Qwen3-30B": "GPUStack: Qwen3-30B-A3B, vLLM-Ascend, 910B",
         "GPUStack performance lab: Optimizing Qwen3-235B-A22B Throughput on NVIDIA H100":
             "GPUStack: Qwen3-235B-A22B, vLLM/SGLang, 8 x H100",
         "GPUStack performance lab: Optimizing Qwen3-235B-A22B Throughput on NVIDIA A100":
             "GPUStack: Qwen3-235B-A22B, vLLM/SGLang, 8 x A100"}


def short(source: str) -> str:
    """A source's short name in the docs table (the CSV keeps the full one)."""
    return next((v for k, v in SHORT.items() if source.startswith(k)), source)


def markdown_table(rows: list[Row]) -> str:
    """The per-source table docs/serve.md quotes (tests/test_serve_published.py compares them)."""
    out = ["| source | metric | rows | median \\|error\\| | p90 | median signed |", "|---|---|---|---|---|---|"]
    for src, by_metric in per_source(rows).items():
        for m, s in by_metric.items():
            out.append(f"| {short(src) if src != 'all' else '**all**'} | {m} | {s['rows']} | {s['median']:.0%} | "
                       f"{s['p90']:.0%} | {s['signed']:+.0%} |")
    for label, saturated in (("not saturated: a rate, a fixed batch or concurrency", False), ("saturated", True)):
        for m in METRICS:
            mine = [r for r in rows if r.metric == m and (r.scenario in SATURATED) == saturated]
            if mine:
                s = summary(mine)
                out.append(f"| **all, {label}** | {m} | {s['rows']} | {s['median']:.0%} | {s['p90']:.0%} | "
                           f"{s['signed']:+.0%} |")
    cov = loso_coverage(rows)
    out.append("")
    out.append("Coverage of the 80 % intervals, leave-one-source-out (target 70-90 %): " + ", ".join(
        f"{k} {a}/{b}" + (f" ({a / b:.0%})" if b else "") for k, (a, b) in cov.items()) + ".")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--write", action="store_true", help=f"rewrite {INTERVALS_FILE.relative_to(ROOT)}")
    p.add_argument("--json", action="store_true", help="print the per-row predictions as JSON")
    p.add_argument("--markdown", action="store_true", help="print the per-source table docs/serve.md quotes")
    p.add_argument("--memory", action="store_true", help=f"print {MEMORY_CSV.relative_to(ROOT)} against the "
                   "memory model instead")
    p.add_argument("--steady", action="store_true", help="predict saturated output rates as the steady state "
                   "(no burst drain), for comparison; not with --write")
    args = p.parse_args(argv)
    if args.steady and args.write:
        p.error("--steady is a comparison: the interval table is written from the shipped model only")
    global STEADY_BURST
    STEADY_BURST = args.steady
    if args.memory:
        print(memory_report(memory_rows()))
        return 0
    rows = predict_all()
    if args.markdown:
        print(markdown_table(rows))
    elif args.json:
        print(json.dumps([r.__dict__ | {"error": r.error} for r in rows], indent=1))
    else:
        print(report(rows))
    if args.write:
        INTERVALS_FILE.write_text(json.dumps(table_json(rows), indent=1) + "\n")
        print(f"wrote {INTERVALS_FILE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
