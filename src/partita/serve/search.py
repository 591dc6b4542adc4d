"""Search the serving layouts of a model on a device budget, rank them, explain the losers.

The space (:func:`candidate_layouts`): per replica ``tp`` in 1, 2, 4, ... up to a node, with
the heads divisible; ``pp`` in powers of two up to the layers; for MoE models attention data
parallel ``dp_attn`` and expert parallel ``ep`` in {1, tp x dp_attn}; replicas filling the
devices; the KV-cache dtype and the weight dtype (fp8 only where the device has fp8 GEMMs:
fp8 weights and GEMMs as vLLM's and SGLang's ``--quantization fp8`` run them - weights cast
to fp8 at load with a per-tensor scale, activations quantized per step; vLLM docs,
"FP8 W8A8", online dynamic quantization); and prefill-decode disaggregation with every split
of the replicas into prefill and decode pools.

Each layout is scored (:func:`evaluate`) by the steady state at the workload's rate
(:mod:`.queueing`) and by its *capacity*: the largest rate at which it still meets the latency
targets (without targets: before it saturates). Ranking: fits memory, then meets the targets
at the rate, then the highest capacity, then the lowest TTFT. ``goodput per device`` is the
capacity in output tokens per second per device (DistServe's "goodput", Zhong et al. 2024).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..spec.hardware import Device
from ..spec.model import ModelSpec
from . import latency
from .intervals import serve_interval
from .memory import GIB, ServeMemory, serve_memory, stage_layers
from .queueing import (
    Operating,
    colocated,
    colocated_rate,
    decode_only,
    md1_max_load,
    md1_wait,
)
from .workload import Layout, Workload

SHOWN_LOAD = 0.9  # an overloaded layout's latencies are shown at this fraction of its capacity
GRID = 24  # points of the decode-time curve over the batch
KNOBS = ("tp", "pp", "dp_attn", "ep", "kv_dtype", "dtype", "disaggregated")


def _powers(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def prefill_splits(replicas: int) -> list[int]:
    """Prefill replicas to try: 0 (together) and every split up to 8 replicas; beyond, eighths
    of the replicas (the capacity is flat near its optimum, so a finer split changes little)."""
    if replicas <= 8:
        return list(range(replicas))
    return [0] + sorted({max(1, min(replicas - 1, round(replicas * i / 8))) for i in range(1, 8)})


def candidate_layouts(model: ModelSpec, device: Device, devices: int, per_node: int) -> list[Layout]:
    """Every layout of the space (module docstring) that uses all ``devices``."""
    out = []
    kv_dtypes = [d for d in ("bf16", "fp8") if d != "fp8" or device.supports("fp8")]
    weight_dtypes = kv_dtypes  # the same rule: fp8 where the device multiplies fp8
    attn_dp = _powers(per_node) if model.moe else [1]
    for tp in _powers(min(per_node, devices)):
        if model.heads % tp or (not model.mla and tp < model.kv_heads and model.kv_heads % tp):
            continue
        for pp in _powers(min(model.layers, devices)):
            for dp_attn in attn_dp:
                size = tp * pp * dp_attn
                if size > devices or devices % size or (dp_attn > 1 and tp * dp_attn > per_node):
                    continue
                eps = sorted({1, tp * dp_attn}) if model.moe else [1]
                for ep in eps:
                    if model.moe and ep > 1 and model.moe.num_experts % ep:
                        continue
                    replicas = devices // size
                    for kv in kv_dtypes:
                        for dtype in weight_dtypes:
                            for pre in prefill_splits(replicas):
                                out.append(Layout(tp, pp, replicas, kv, ep, dp_attn, pre, dtype))
    return out


class DecodeCurve:
    """TPOT of a replica against the sequences it decodes, tabulated on a geometric grid and
    interpolated in ``log N`` (it is smooth and increasing): the search asks it thousands of
    times per layout, each a bisection step."""

    def __init__(self, fn: Callable[[float], float], max_seqs: float) -> None:
        self.max_seqs = max(max_seqs, 1.0)
        n = GRID if self.max_seqs > 1 else 1
        self.xs = [self.max_seqs ** (i / max(n - 1, 1)) for i in range(n)]
        self.ys = [fn(x) for x in self.xs]

    def __call__(self, seqs: float) -> float:
        seqs = min(max(seqs, 1.0), self.max_seqs)
        xs, ys = self.xs, self.ys
        if len(xs) == 1:
            return ys[0]
        pos = math.log(seqs) / math.log(self.max_seqs) * (len(xs) - 1)
        i = min(int(pos), len(xs) - 2)
        return ys[i] + (ys[i + 1] - ys[i]) * (pos - i)


@dataclass
class ServeResult:
    """One layout's prediction (seconds, bytes, requests/s) and, when it cannot serve, why."""

    layout: Layout
    memory: ServeMemory
    prefill: float = math.inf
    share: float = math.inf  # a prompt's share of a chunked prefill forward (latency.prefill_share)
    ttft: float = math.inf
    tpot: float = math.inf
    seqs: float = math.inf
    stable: bool = False
    meets: bool = False
    capacity: float = 0.0
    goodput_per_device: float = 0.0
    rejected: str = ""
    shown_rate: float = 0.0  # the rate TTFT/TPOT/seqs are for (the workload's, or 90 % of capacity)
    notes: list[str] = field(default_factory=list)

    def key(self) -> tuple:
        return (not self.memory.fits, not self.stable, not self.meets, -self.capacity, self.ttft)

    def to_dict(self) -> dict[str, Any]:
        out = {"layout": self.layout.to_dict(), "memory_bytes": self.memory.to_dict()}
        for name in ("prefill", "ttft", "tpot"):
            out[f"{name}_ms"] = _finite(getattr(self, name) * 1e3)
        out.update(decoding_seqs=_finite(self.seqs), latencies_at_rps=self.shown_rate, stable=self.stable,
                   meets_targets=self.meets,
                   capacity_rps=self.capacity, goodput_tokens_per_s_per_device=self.goodput_per_device,
                   rejected=self.rejected or None, interval=self.interval())
        return out

    def interval(self) -> dict[str, Any] | None:
        """The 80 % interval of TTFT, TPOT, capacity and goodput (:mod:`.intervals`); None
        for a layout that does not fit."""
        if not self.memory.fits:
            return None
        return serve_interval(self.ttft, self.tpot, self.capacity, self.goodput_per_device, self.stable)


def _finite(x: float) -> float | None:
    return None if math.isinf(x) or math.isnan(x) else x


_CURVES: dict[tuple, DecodeCurve] = {}


def _curve(model: ModelSpec, device: Device, core: Layout, context: float, per_node: int,
           max_seqs: int, framework: str = "megatron", window: int = 1) -> DecodeCurve:
    """The decode curve of a replica layout (independent of replicas and the P/D split),
    memoised on the model's and device's content keys."""
    key = (model.cache_key, device.cache_key, core, context, per_node, max_seqs, framework, window)
    if key not in _CURVES:
        if len(_CURVES) > 4096:
            _CURVES.clear()
        _CURVES[key] = DecodeCurve(lambda n: latency.tpot(model, device, core, n, context, per_node, framework,
                                                          window), max_seqs)
    return _CURVES[key]


def prefill_occupancy(model: ModelSpec, device: Device, layout: Layout, prompt_len: int, per_node: int,
                      framework: str = "megatron") -> float:
    """Seconds of a replica one prompt occupies: its share of a chunked-prefill forward
    (:func:`partita.serve.latency.prefill_share`), of which a pipeline holds it only for the
    slowest stage's layers - with ``pp`` stages the engine keeps ``pp`` micro-batches in
    flight (vLLM's virtual engines; the decode side's ``TPOT = pp x max_stage``), so while one
    stage works on this prompt the others work on other micro-batches. The prompt's own
    latency (TTFT) still passes every stage (:func:`partita.serve.latency.prefill_time`)."""
    share = latency.prefill_share(model, device, layout, prompt_len, per_node, framework=framework)
    if layout.pp == 1:
        return share
    return share * max(sum(stage) for stage in stage_layers(model, layout.pp)) / model.layers


def evaluate(model: ModelSpec, device: Device, layout: Layout, work: Workload, per_node: int,
             window: int = 1, framework: str = "megatron") -> ServeResult:
    """Memory, TTFT and TPOT at the workload's rate, and the capacity under its targets
    (``window``: decode steps per scheduler call, :func:`partita.serve.queueing.colocated`;
    ``framework``: the engine, :mod:`partita.serve.latency` - the search keeps the default)."""
    mem = serve_memory(model, device, layout, work.max_len)
    res = ServeResult(layout, mem)
    if not mem.fits:
        need = mem.weights + mem.activations + mem.workspace + mem.kv_per_token * work.max_len
        res.rejected = (f"does not fit: weights {mem.weights / GIB:.1f} GiB + one sequence's KV "
                        f"{mem.kv_per_token * work.max_len / GIB:.2f} GiB + activations and workspace = "
                        f"{need / GIB:.1f} GiB > {mem.limit / GIB:.1f} GiB per device")
        return res
    core = Layout(layout.tp, layout.pp, 1, layout.kv_dtype, layout.ep, layout.dp_attn, dtype=layout.dtype)
    t_dec = _curve(model, device, core, work.mean_context, per_node, mem.max_seqs, framework, window)
    res.prefill = latency.prefill_time(model, device, layout, work.prompt_len, per_node, framework)
    res.share = prefill_occupancy(model, device, layout, work.prompt_len, per_node, framework)
    ttft_t = work.ttft_ms / 1e3 if work.ttft_ms else None
    tpot_t = work.tpot_ms / 1e3 if work.tpot_ms else None
    if layout.disaggregated:
        _disaggregated(model, device, layout, work, per_node, res, t_dec, ttft_t, tpot_t)
    else:
        _colocated(layout, work, res, t_dec, ttft_t, tpot_t, window)
    res.goodput_per_device = res.capacity * work.output_len / layout.devices
    res.shown_rate = work.rate
    if not res.stable and res.capacity > 0:  # show the latencies just below saturation instead
        _show_below_capacity(model, device, layout, work, per_node, res, t_dec)
    if not res.stable:
        res.rejected = (f"overloaded at {work.rate:g} req/s: it sustains {res.capacity:.2f} req/s"
                        + (" within the targets" if ttft_t or tpot_t else ""))
    elif not res.meets:
        res.rejected = _missed(res, ttft_t, tpot_t)
    return res


def _show_below_capacity(model: ModelSpec, device: Device, layout: Layout, work: Workload, per_node: int,
                         res: ServeResult, t_dec: DecodeCurve) -> None:
    """An overloaded layout's TTFT and TPOT at 90 % of its capacity (``shown_rate``); it stays
    marked unstable at the workload's rate."""
    rate = SHOWN_LOAD * res.capacity
    probe = ServeResult(layout, res.memory, prefill=res.prefill, share=res.share)
    if layout.disaggregated:
        _disaggregated_at(layout, work, probe, t_dec, latency.kv_transfer_time(model, device, layout, work.prompt_len),
                          rate)
    else:
        _colocated_at(layout, work, probe, t_dec, rate)
    if probe.stable:
        res.ttft, res.tpot, res.seqs, res.shown_rate = probe.ttft, probe.tpot, probe.seqs, rate


def _missed(res: ServeResult, ttft_t: float | None, tpot_t: float | None) -> str:
    parts = []
    if ttft_t and res.ttft > ttft_t:
        parts.append(f"TTFT {res.ttft * 1e3:.0f} ms > {ttft_t * 1e3:g} ms")
    if tpot_t and res.tpot > tpot_t:
        parts.append(f"TPOT {res.tpot * 1e3:.1f} ms > {tpot_t * 1e3:g} ms")
    return "misses the targets: " + ", ".join(parts)


def _colocated_at(layout: Layout, work: Workload, res: ServeResult, t_dec: DecodeCurve, rate: float,
                  window: int = 1) -> None:
    op = colocated(rate / layout.replicas, work.output_len, res.prefill, t_dec, t_dec.max_seqs, res.share, window)
    res.ttft, res.tpot, res.seqs, res.stable = op.ttft, op.tpot, op.seqs * layout.replicas, op.stable


def _colocated(layout: Layout, work: Workload, res: ServeResult, t_dec: DecodeCurve,
               ttft_t: float | None, tpot_t: float | None, window: int = 1) -> None:
    S, Sc, O, R = res.prefill, res.share, work.output_len, layout.replicas
    _colocated_at(layout, work, res, t_dec, work.rate, window)
    res.meets = Operating(res.seqs, res.ttft, res.tpot, res.stable).meets(ttft_t, tpot_t)
    best = 0.0
    for n in t_dec.xs:
        step = t_dec(n)
        rate = colocated_rate(n, O, step, Sc)
        rho = rate * Sc
        at = Operating(n, S + md1_wait(rho, S) + window * step / 2, step / (1 - rho) if rho < 1 else math.inf, rho < 1)
        if at.meets(ttft_t, tpot_t):
            best = max(best, rate)
    res.capacity = best * R


def _disaggregated(model: ModelSpec, device: Device, layout: Layout, work: Workload, per_node: int,
                   res: ServeResult, t_dec: DecodeCurve, ttft_t: float | None, tpot_t: float | None) -> None:
    S, O = res.prefill, work.output_len
    xfer = latency.kv_transfer_time(model, device, layout, work.prompt_len)
    _disaggregated_at(layout, work, res, t_dec, xfer, work.rate)
    res.meets = Operating(res.seqs, res.ttft, res.tpot, res.stable).meets(ttft_t, tpot_t)
    load = md1_max_load(ttft_t - S - xfer, S) if ttft_t else 1.0
    prefill_cap = load / res.share * layout.prefill_replicas
    decode_cap = max((n / (O * t_dec(n)) for n in t_dec.xs if tpot_t is None or t_dec(n) <= tpot_t), default=0.0)
    res.capacity = min(prefill_cap, decode_cap * layout.decode_replicas)
    res.notes.append(f"KV transfer {xfer * 1e3:.1f} ms per prompt")


def _disaggregated_at(layout: Layout, work: Workload, res: ServeResult, t_dec: DecodeCurve, xfer: float,
                      rate: float) -> None:
    S = res.prefill
    rho = rate / layout.prefill_replicas * res.share
    seqs, tpot = decode_only(rate / layout.decode_replicas, work.output_len, t_dec, t_dec.max_seqs)
    res.ttft = S + md1_wait(rho, S) + xfer
    res.tpot, res.seqs = tpot, seqs * layout.decode_replicas
    res.stable = rho < 1 and not math.isinf(tpot)


@dataclass
class ServeSearch:
    """Every evaluated layout, ranked (best first), and the "why not" lines."""

    results: list[ServeResult]
    why_not: list[str]
    considered: int

    @property
    def best(self) -> ServeResult | None:
        return self.results[0] if self.results and self.results[0].memory.fits else None


def search_serve(model: ModelSpec, device: Device, devices: int, per_node: int, work: Workload) -> ServeSearch:
    """Evaluate every candidate layout and rank them (module docstring)."""
    layouts = candidate_layouts(model, device, devices, per_node)
    results = sorted((evaluate(model, device, lay, work, per_node) for lay in layouts), key=ServeResult.key)
    return ServeSearch(results, why_not_lines(results), len(layouts))


def knob_value(layout: Layout, knob: str) -> Any:
    return layout.disaggregated if knob == "disaggregated" else getattr(layout, knob)


def why_not_lines(results: list[ServeResult]) -> list[str]:
    """For each knob, the best layout with each other value and why it loses to the best."""
    if not results:
        return []
    best, lines = results[0], []
    for knob in KNOBS:
        mine = knob_value(best.layout, knob)
        seen: dict[Any, ServeResult] = {}
        for r in results:  # ranked: the first with a value is its best
            seen.setdefault(knob_value(r.layout, knob), r)
        for value, r in seen.items():
            if value == mine:
                continue
            shown = ("P/D disaggregated" if value else "prefill+decode together") if knob == "disaggregated" \
                else f"{knob}={value}"
            lines.append(f"why not {shown} ({r.layout.describe()}): {_loses(r, best)}")
    return lines


def _loses(r: ServeResult, best: ServeResult) -> str:
    if r.rejected:
        return r.rejected
    if r.capacity < best.capacity:
        return f"sustains {r.capacity:.2f} req/s within the targets, the best {best.capacity:.2f}"
    return f"TTFT {r.ttft * 1e3:.0f} ms vs {best.ttft * 1e3:.0f} ms at the same capacity"
