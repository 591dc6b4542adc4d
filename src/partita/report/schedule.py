"""The predicted schedule of one training step, as blocks on a timeline (one row per
pipeline rank), built from the cost model's own terms.

The cost model gives each pipeline rank a per-micro-batch time split into parts
(compute, recompute, exposed communication per axis, :class:`partita.cost.step.StageTime`)
and a forward/backward split; the pipeline itself is a closed form
(:func:`partita.cost.pipeline.pipeline_time`). A closed form has no picture, so this
module *simulates* the schedule with those per-rank times: each rank runs Megatron-LM's
op order (:func:`rank_order`: warm-up forwards, one-forward-one-backward, drain;
interleaved over ``v`` chunks, virtual stage ``j`` on rank ``j mod p``), and an op starts
when its rank is free and the op it depends on is done (the previous virtual stage's
forward, the next one's backward). For uniform stages the simulated pipeline takes
``(m + (p - 1)/v) t``, the closed form [Narayanan et al. SC'21 eq. 1-2]; uneven stages
come out close to it, and the page states both lengths.
A zero-bubble schedule is drawn as 1F1B (the cost model charges a third of its bubble).

After the pipeline every rank runs what the step adds once (the exposed data-parallel
gradient sync, the optimizer step, the tied-embedding sync), in the cost model's order.
Gaps are the bubbles.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..cost.pipeline import pipeline_time
from ..estimate import Estimate

#: the step parts that follow the pipeline (partita.cost.step.estimate_step_time adds them after it)
AFTER_PIPELINE = ("dp gradient sync", "optimizer step", "tied embedding sync")
#: parts of a micro-batch block drawn as work (the rest is exposed communication, by axis)
WORK_PARTS = ("compute", "recompute")
#: beyond this many forward/backward ops, back-to-back ops are drawn as one run
MAX_DRAWN_OPS = 3000
RUNS_PER_RANK = 64


@dataclass(frozen=True)
class Block:
    """One bar of the timeline: ``kind`` is a stage part (compute, tp communication, ...),
    an after-pipeline part, or "bubble"; times in seconds from the step's start."""

    rank: int
    kind: str
    start: float
    length: float
    label: str


@dataclass
class Schedule:
    blocks: list[Block]
    pipeline_s: float  # simulated length of the pipeline
    closed_form_s: float  # the cost model's pipeline_time
    step_s: float  # simulated pipeline + after-pipeline parts
    schedule: str
    ranks: int
    microbatches: int
    chunks: int
    coalesced: bool = False  # ops drawn as runs (:func:`_spans`)


def rank_order(p: int, v: int, m: int, rank: int, schedule: str) -> list[tuple[str, int, int]]:
    """The ops one rank runs, in order: ``("F"|"B", micro-batch, chunk)``.

    Megatron-LM's schedules (schedules.py, forward_backward_pipelining_*): GPipe runs every
    forward, then every backward; 1F1B runs ``p - rank - 1`` warm-up forwards, then
    alternates one forward and one backward, then drains the backwards; interleaved 1F1B
    warms up with ``2 (p - rank - 1) + (v - 1) p`` chunk forwards and takes micro-batches in
    groups of ``p`` through the chunks (forward: chunk 0 first; backward: the last chunk
    first) [Narayanan et al. SC'21 sec. 2.2]."""
    def op(kind: str, k: int) -> tuple[str, int, int]:
        group, within = divmod(k, p * v)
        chunk = within // p
        return (kind, group * p + within % p, chunk if kind == "F" else v - 1 - chunk)

    n = m * v
    if v > 1 and m % p:
        raise ValueError(f"interleaving needs the micro-batch count ({m}) to be a multiple of pp ({p})")
    if schedule == "gpipe":
        return [op("F", k) for k in range(n)] + [op("B", k) for k in range(n)]
    warmup = min(p - rank - 1 if v == 1 else 2 * (p - rank - 1) + (v - 1) * p, n)
    order = [op("F", k) for k in range(warmup)]
    for k in range(n - warmup):
        order += [op("F", warmup + k), op("B", k)]
    return order + [op("B", k) for k in range(n - warmup, n)]


def simulate(forward: list[float], backward: list[float], m: int, v: int, schedule: str,
             latency: float = 0.0) -> list[tuple]:
    """Run ``m`` micro-batches through ``p = len(forward)`` ranks with ``v`` chunks each (chunk
    times ``forward[r] / v``, ``backward[r] / v``), each rank in :func:`rank_order`; an op
    starts when its rank is free and its dependency is done (forward: the previous virtual
    stage's forward of the micro-batch; backward: the next one's backward, or at the last
    virtual stage its own forward), plus ``latency`` when the dependency ran on another rank (a
    transfer that delays its receiver only, the sender goes on: cost/pipeline.py
    ``async_p2p_period`` is checked against this). Returns ops ``(rank, "F"|"B", microbatch, chunk, start, end)``."""
    p = len(forward)
    last = p * v - 1
    orders = [rank_order(p, v, m, r, schedule) for r in range(p)]
    pos = [0] * p
    free = [0.0] * p
    done: dict[tuple[str, int, int], float] = {}  # (kind, virtual stage, micro-batch) -> end
    ops = []
    progress = True
    while progress:
        progress = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                kind, i, c = orders[r][pos[r]]
                j = c * p + r
                dep = (("F", j - 1, i) if j else None) if kind == "F" else (("B", j + 1, i) if j < last else ("F", j, i))
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done[dep] + (latency if dep[1] % p != r else 0.0) if dep else 0.0)
                end = start + (forward[r] if kind == "F" else backward[r]) / v
                done[(kind, j, i)] = free[r] = end
                ops.append((r, kind, i, c, start, end))
                pos[r] += 1
                progress = True
    if any(pos[r] < len(orders[r]) for r in range(p)):
        raise RuntimeError("pipeline schedule deadlocked")  # not reachable with Megatron's orders
    return ops


def _spans(ops: list[tuple], v: int) -> list[tuple[int, float, float, float, str]]:
    """Per op ``(rank, start, busy, idle inside, label)``; beyond :data:`MAX_DRAWN_OPS` ops, each
    rank's ops are drawn in :data:`RUNS_PER_RANK` runs of consecutive ops (a browser cannot
    draw 100k bars): a run's parts keep their totals, its gaps are drawn as one bubble at its end."""
    def label(kind: str, i: int, c: int) -> str:
        return f"{'forward' if kind == 'F' else 'backward'} micro-batch {i + 1}" + (f", chunk {c + 1}" if v > 1 else "")
    if len(ops) <= MAX_DRAWN_OPS:
        return [(r, start, end - start, 0.0, label(kind, i, c)) for r, kind, i, c, start, end in ops]
    spans = []
    for rank in sorted({op[0] for op in ops}):
        mine = sorted((op for op in ops if op[0] == rank), key=lambda op: op[4])
        size = -(-len(mine) // RUNS_PER_RANK)
        for k in range(0, len(mine), size):
            run = mine[k:k + size]
            start, end = run[0][4], run[-1][5]
            busy = sum(op[5] - op[4] for op in run)
            first, last = min(op[2] for op in run), max(op[2] for op in run)
            spans.append((rank, start, busy, end - start - busy,
                          f"{len(run)} forward/backward passes of micro-batches {first + 1}-{last + 1}"))
    return spans


def _async_send(est: Estimate) -> float:
    """One pipeline transfer where the estimate priced the sends as delaying their receiver only
    (cost/step.py ``async_send``; 0 for every other framework and for traced models, whose
    pipeline keeps both sends)."""
    from ..cost.step import async_send
    from ..spec.model import ModelSpec
    return async_send(est.model, est.cluster, est.plan) if isinstance(est.model, ModelSpec) else 0.0


def step_schedule(est: Estimate) -> Schedule:
    """The predicted timeline of one step of ``est``'s plan (see the module docstring)."""
    plan, stages = est.plan, est.time.stages
    m, v = plan.grad_accum, plan.vpp
    totals = [s.total for s in stages]
    send = _async_send(est)
    # a rank runs its work and posts its sends; a transfer delays its receiver (cost/pipeline.py
    # async_p2p_period) - with send 0, every stage total as before
    own = [t - 2 * send for t in totals]
    fwd = [o * s.forward / (s.forward + s.backward) if s.forward + s.backward else 0.0 for o, s in zip(own, stages)]
    bwd = [o - f for o, f in zip(own, fwd)]
    ops = simulate(fwd, bwd, m, v, "gpipe" if plan.schedule == "gpipe" else "interleaved-1f1b" if v > 1 else "1f1b",
                   latency=send)
    pipe = max((op[5] for op in ops), default=0.0)
    spans = _spans(ops, v)
    blocks: list[Block] = []
    bubble = "idle (pipeline bubble)"
    for r, start, busy, idle, text in spans:
        parts = stages[r].parts
        if send:  # the transfers are latencies in the timeline, not the rank's own work
            parts = {**parts, "pp send/recv": parts.get("pp send/recv", 0.0) - 2 * send}
        _split(blocks, parts, r, start, busy, text)
        if idle > 0:
            blocks.append(Block(r, "bubble", start + busy, idle, bubble + ", the gaps of this run"))
    for r in range(len(stages)):  # bubbles: the gaps of each rank inside the pipeline
        t = 0.0
        for start, end in sorted((sp[1], sp[1] + sp[2] + sp[3]) for sp in spans if sp[0] == r):
            if start - t > pipe * 1e-6:
                blocks.append(Block(r, "bubble", t, start - t, bubble))
            t = max(t, end)
        if pipe - t > pipe * 1e-6:
            blocks.append(Block(r, "bubble", t, pipe - t, bubble))
    t = pipe
    for part in AFTER_PIPELINE:
        length = est.time.parts.get(part, 0.0)
        if length > 0:
            blocks.extend(Block(r, part, t, length, part) for r in range(len(stages)))
            t += length
    return Schedule(blocks=blocks, pipeline_s=pipe, closed_form_s=pipeline_time(totals, m, v, plan.schedule, send),
                    step_s=t, schedule=plan.schedule, ranks=len(stages), microbatches=m, chunks=v,
                    coalesced=len(spans) < len(ops))


def _split(blocks: list[Block], parts: dict[str, float], rank: int, start: float, length: float, label: str) -> None:
    """One micro-batch chunk as its work, then its exposed communication per axis, in the
    proportions of the rank's per-micro-batch parts."""
    total = sum(parts.values())
    work = sum(parts.get(k, 0.0) for k in WORK_PARTS)
    pieces = [("compute", work)] + [(k, val) for k, val in parts.items() if k not in WORK_PARTS and val > 0]
    t = start
    for kind, val in pieces:
        share = length * val / total if total else 0.0
        if share > 0:
            blocks.append(Block(rank, kind, t, share, label))
            t += share
