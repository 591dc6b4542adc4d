"""The measurements behind ``partita calibrate`` (torch, timing; run under torchrun).

Every term is timed in ``repeats`` separate repeats so the fits (:mod:`.fit`)
get a spread, not just a number. Anything that communicates runs a fixed number of
iterations on every rank (a time-based loop around a collective deadlocks when ranks
disagree on when to stop). Every time is read on the busy clock (:mod:`.busy_clock`), as the
training worker's ``step_busy_s`` is, so a neighbour's load does not enter the fitted rates: a
single thread's rate is its wall time less its run-queue wait; a collective interval's is
:func:`.busy_clock.critical_busy_s` of every rank's ``[wall, run, wait]`` (each rank's time on a
CPU plus its blocked time shrunk by the share of their runnable time the other ranks ran).
"""
from __future__ import annotations

import statistics

from .busy_clock import critical_busy_s, mark, seconds_per_call, since
from .fit import PP_PROBE_MODEL, PROBE_MODELS, ZERO3_PROBE_MODEL, run_model

#: GEMM shape classes (m, k, n): square; the MLP's wide ``tokens x h -> 4h``; few tokens.
GEMM_SHAPES = {
    "square": [(n, n, n) for n in (64, 128, 256, 512, 1024)],
    "wide": [(128, h, 4 * h) for h in (64, 128, 256, 512)],
    "skinny": [(8, h, h) for h in (256, 512, 1024)],
}
COLLECTIVE_BYTES = (4096, 65536, 1 << 20, 8 << 20)
#: Seconds of compute every rank runs before each timed collective, as a training step runs
#: its layers between two collectives. Timed back to back, a collective finds gloo's helper
#: threads (the caller's gloo run loop, the TCP loop, the peer's) still awake; after compute
#: they have gone to sleep and each hop of the path waits for one of them to be woken and
#: scheduled. Measured on this 2-core VM (load 7, 4 KiB all-reduce on 2 ranks, time after the
#: last rank arrived less the caller's own run-queue wait): 0.67 ms back to back, 1.3-2.6 ms with
#: 1 to 256 256^3 GEMMs (1 to 250 ms) between calls - the latency a step sees is the second.
#: 2 ms: past the point where the latency stops growing with the gap (1 GEMM, ~1 ms, already
#: pays most of it), short enough that the 1380 calls of a calibration add about 3 s.
COLLECTIVE_GAP_S = 2e-3
#: Micro-run model, tokens per sequence and the steps each repeat times.
#: A repeat's figure is the median of its steps, each timed on its own: one step that a
#: scheduler hiccup doubles (two processes on two shared cores) moves a mean of 2 steps by
#: half, a median of 3 not at all.
RUNTIME_MODEL, RUNTIME_MOE_MODEL, RUNTIME_SEQ, RUNTIME_STEPS = "tiny-llama", "tiny-moe", 128, 3
#: Mechanisms timed over more steps per repeat: the ZeRO-3 pair is fitted in turn
#: (:mod:`.overlap`), where the overlap's weight is ~15 % of the probe's step, so a
#: repeat's noise on a 2-core machine (~6 %) would move it by ~0.4. The ep term is a
#: difference of two increments (ep's less the moe run's) and the tp terms carry most of
#: their step (tiny-llama's tp step is ~70 % framework term): with 3 steps their repeats
#: spread 0.4-9.8 ms per layer (ep, one calibration at load 8-12) and 15 % (tp); 5 steps
#: add ~25 s to a calibration.
RUNTIME_STEPS_OF = {"zero3": 5, "comm_overlap": 5, "moe": 5, "ep": 5, "tp": 5, "tp_nosp": 5}


def busy_in_windows(per_rank: list[list[list[float]]], per: int | None = None) -> list[float]:
    """Each interval's :func:`.busy_clock.critical_busy_s` from every rank's ``[wall, run, wait]``
    of it (``per_rank[rank][interval]``), the ranks' run share read over a window of intervals:
    every ``per`` consecutive intervals (one repeat's steps of a micro-run, back to back in
    time), or all of them (``per`` None: the repeats of one collective and size).

    Why a repeat's steps and not all of a micro-run's: the repeats are interleaved across the
    mechanisms over the 2-4 minutes of the runtime phase, and the load moves within them
    (1-minute load 5-25 in one calibration here); one run share over all of them corrects each
    repeat by the average load, not its own. The training worker reads each step's clock over
    the step itself (``train/worker.py``), the clock the loop compares with; a repeat's 3-5
    steps (0.05-4 s) are as close to that as stays above a scheduler slice or two."""
    n = len(per_rank[0])
    size = per or n
    out = []
    for lo in range(0, n, size):
        window = [[sum(col) for col in zip(*rank[lo:lo + size])] for rank in per_rank]
        out += [critical_busy_s([rank[i] for rank in per_rank], window) for i in range(lo, min(lo + size, n))]
    return out


def _across_ranks(samples: list[list[float]], device, per: int | None = None) -> list[float]:
    """Each interval's time across the ranks from every rank's ``[wall, run, wait]`` of it
    (:func:`.busy_clock.since`): :func:`.busy_clock.critical_busy_s`, the interval without the
    neighbours' load (a collective interval ends on every rank together; under load a rank's
    wall holds its own queueing and the others' that it slept through), with the ranks' run
    share read over a window of ``per`` consecutive intervals or all of them
    (:func:`busy_in_windows`: one interval of a small collective is too short for it)."""
    import torch
    import torch.distributed as dist
    t = torch.tensor(samples, dtype=torch.float64, device=device).reshape(-1)  # nccl/hccl gather device tensors
    out = torch.zeros(t.numel() * dist.get_world_size(), dtype=torch.float64, device=device)
    dist.all_gather_into_tensor(out, t)
    return busy_in_windows(out.reshape(dist.get_world_size(), len(samples), 3).tolist(), per)


def measure_gemm(device, dtype, sync, repeats: int) -> list[dict]:
    """Each GEMM shape's seconds per call in every repeat, with its class and GFLOP."""
    import torch
    rows = []
    for cls, shapes in GEMM_SHAPES.items():
        for m, k, n in shapes:
            a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
            samples = seconds_per_call(lambda: (a @ b, sync()), repeats)
            rows.append({"class": cls, "shape": [m, k, n], "gflop": 2 * m * k * n / 1e9,
                         "seconds": statistics.median(samples), "samples": samples})
    return rows


def measure_optimizer(device, sync, repeats: int) -> list[float]:
    """The AdamW step's rate, per repeat, in the cost model's bytes
    (:data:`partita.cost.step.ADAM_STEP_BYTES_PER_PARAM` per parameter): 4 M fp32 parameters in
    40 tensors (small-llama's size), the optimizer's state created by a first step."""
    import torch
    from ..cost.step import ADAM_STEP_BYTES_PER_PARAM
    params = [torch.zeros(100_000, device=device, requires_grad=True) for _ in range(40)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3)
    seconds = seconds_per_call(lambda: (opt.step(), sync()), repeats, min_time=0.1)
    count = sum(p.numel() for p in params)
    return [ADAM_STEP_BYTES_PER_PARAM * count / t for t in seconds]


def _collective_ops(group, size: int, device):
    """``kind -> (callable, bytes in the cost model's convention)`` for one group."""
    import torch
    import torch.distributed as dist
    g, rank = dist.get_world_size(group), dist.get_rank(group)
    full = torch.zeros(size // 4, device=device)
    shard = torch.zeros(size // 4 // g, device=device)
    out = torch.zeros_like(full)
    peer = dist.get_global_rank(group, rank ^ 1) if (rank ^ 1) < g else None

    def send_recv():
        if peer is None:
            return
        ops = [dist.P2POp(dist.isend, full, peer, group), dist.P2POp(dist.irecv, out, peer, group)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
    return {"all_reduce": lambda: dist.all_reduce(full, group=group),
            "all_gather": lambda: dist.all_gather_into_tensor(out[:shard.numel() * g], shard, group=group),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full[:shard.numel() * g], group=group),
            "all_to_all": lambda: dist.all_to_all_single(out, full, group=group),
            "send_recv": send_recv,
            # ZeRO-1's per-tensor parameter sync (runtime/data_parallel.py ShardedOptimizer)
            "broadcast": lambda: dist.broadcast(full, src=dist.get_global_rank(group, 0), group=group)}


def _gap(device, sync):
    """A callable that computes (GEMMs on ``device``) for :data:`COLLECTIVE_GAP_S` seconds of
    wall time, then waits for the device: what a step does between two collectives."""
    import time

    import torch
    a = torch.randn(256, 256, device=device)

    def gap() -> None:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < COLLECTIVE_GAP_S:
            a @ a
            sync()
    return gap


def trim_to_last_arrival(per_rank: list[list[list[float]]]) -> list[list[list[float]]]:
    """Every rank's ``[enter, wall, run, wait]`` of each call (``per_rank[rank][call]``) as its
    ``[wall, run, wait]`` from the moment the *last* rank entered the call: rank r's wall less
    ``last enter - enter_r`` (the time it waited for the late rank to arrive), its run and wait
    held within what is left. ``enter`` is ``time.perf_counter()``, a system-wide monotonic
    clock on one machine, so the ranks' readings compare."""
    out: list[list[list[float]]] = [[] for _ in per_rank]
    for i in range(len(per_rank[0])):
        last = max(rank[i][0] for rank in per_rank)
        for r, rank in enumerate(per_rank):
            enter, wall, run, wait = rank[i]
            wall = max(wall - (last - enter), 0.0)
            run = min(run, wall)
            out[r].append([wall, run, min(wait, wall - run)])
    return out


def _after_last_arrival(calls: list[list[float]], device) -> list[float]:
    """Each call's time from the moment the last rank entered it (:func:`trim_to_last_arrival`),
    from every rank's ``[enter, wall, run, wait]``: the alpha-beta model's collective time. With
    compute before every call the ranks arrive apart (one rank's GEMMs run while the other's
    wait for a CPU); the early rank's wait for the late one is not the collective's. Read by
    :func:`.busy_clock.critical_busy_s` with the ranks' run share over all the calls (its
    ``window``), as every interval calibrate times."""
    import torch
    import torch.distributed as dist
    n = dist.get_world_size()
    t = torch.tensor(calls, dtype=torch.float64, device=device).reshape(-1)  # float64: enter is a clock reading
    out = torch.zeros(t.numel() * n, dtype=torch.float64, device=device)
    dist.all_gather_into_tensor(out, t)
    per_rank = out.reshape(n, len(calls), 4).tolist()
    window = [[sum(c[k] for c in rank) for k in (1, 2, 3)] for rank in per_rank]
    trimmed = trim_to_last_arrival(per_rank)
    return [critical_busy_s([rank[i] for rank in trimmed], window) for i in range(len(calls))]


def _timed_calls(op, gap, sync, iters: int) -> list[list[float]]:
    """``[enter, wall, run, wait]`` of ``iters`` calls of ``op``, each after ``gap()`` (None: back to back)."""
    calls = []
    for _ in range(iters):
        if gap is not None:
            gap()
        t0 = mark()
        op()
        sync()
        calls.append([t0[0], *since(t0)])
    return calls


def measure_collective(op, device, sync, repeats: int, iters: int, gap) -> list[float]:
    """Seconds per call of the collective ``op`` in each of ``repeats`` repeats of ``iters``
    calls, each call timed after the last rank arrived (:func:`_after_last_arrival`); with
    ``gap`` (:func:`_gap`) every call follows a step-like stretch of compute, as in training."""
    import torch.distributed as dist
    op()
    dist.barrier()
    calls = [_timed_calls(op, gap, sync, iters) for _ in range(repeats)]
    times = _after_last_arrival([c for rep in calls for c in rep], device)
    return [statistics.mean(times[i * iters:(i + 1) * iters]) for i in range(repeats)]


def _after_count_exchange(group, device, gap):
    """What precedes an expert-parallel all-to-all in a step: compute (``gap``), then the
    exchange of the per-expert token counts, a tiny all-to-all of ``int64`` that
    :func:`partita.runtime.expert_parallel.exchange` runs right before the tokens' all-to-all
    (its split sizes come from it). The tokens' all-to-all so finds gloo's helper threads
    awake: measured on this 2-core VM (load 1.4-1.7, 2 ranks, 4 KiB-1 MiB) 0.35-0.40 ms per call
    after the count exchange, 0.24-0.40 ms back to back, 0.95-1.22 ms after compute alone."""
    import torch
    import torch.distributed as dist
    g = dist.get_world_size(group)
    send = torch.ones(2 * g, dtype=torch.int64, device=device)
    recv = torch.empty_like(send)

    def before() -> None:
        gap()
        dist.all_to_all_single(recv, send, group=group)
    return before


def measure_collectives(device, sync, repeats: int) -> list[dict]:
    """Every collective at every size over the whole world and (for a world of 4+) pairs, each
    call after :data:`COLLECTIVE_GAP_S` of compute (:func:`measure_collective`) as a step
    issues it, but the broadcast, which the runtime issues back to back, and the all-to-all,
    which follows its count exchange (:func:`_after_count_exchange`)."""
    import torch.distributed as dist
    world = dist.get_world_size()
    groups = [(world, dist.group.WORLD)]
    if world >= 4:
        pairs = [dist.new_group([2 * i, 2 * i + 1]) for i in range(world // 2)]
        groups.append((2, pairs[dist.get_rank() // 2]))
    rows, gap = [], _gap(device, sync)
    for g, group in groups:
        before = {"broadcast": None, "all_to_all": _after_count_exchange(group, device, gap)}
        for size in COLLECTIVE_BYTES:
            iters = max(2, min(20, (2 << 20) // size * 2))
            for kind, op in _collective_ops(group, size, device).items():
                if kind == "send_recv" and g % 2:
                    continue
                # a broadcast is priced only as ZeRO-1's per-tensor sync, a loop of calls back
                # to back (runtime/data_parallel.py ShardedOptimizer): timed so, its helper
                # threads awake; an all-to-all is expert parallelism's, right after the count
                # exchange; every other collective follows compute in a step
                samples = measure_collective(op, device, sync, repeats, iters, before.get(kind, gap))
                # send/recv moves one message each way at once: the cost model's one transfer
                rows.append({"kind": kind, "group": g, "bytes": size, "seconds": statistics.median(samples),
                             "samples": samples, "spread": (max(samples) - min(samples)) / 2,
                             "gap_s": COLLECTIVE_GAP_S,
                             "after": {"broadcast": "the previous call", "all_to_all": "compute, then the count exchange"}
                             .get(kind, "compute")})
    return rows


def measure_wakeup(device, sync, repeats: int) -> dict:
    """The smallest all-reduce over the world timed both ways, per repeat: back to back (the
    helper threads stay awake) and after :data:`COLLECTIVE_GAP_S` of compute (they sleep between
    calls): ``{"bytes", "back_to_back": [s...], "after_compute": [s...]}``. The difference per
    latency step is the wake-up latency a step pays on every hop (``collective.wakeup`` in
    the file's terms)."""
    import torch.distributed as dist
    size = COLLECTIVE_BYTES[0]
    op = _collective_ops(dist.group.WORLD, size, device)["all_reduce"]
    hot = measure_collective(op, device, sync, repeats, 20, None)
    cold = measure_collective(op, device, sync, repeats, 20, _gap(device, sync))
    return {"bytes": size, "group": dist.get_world_size(), "back_to_back": hot, "after_compute": cold}


def runtime_plans(world: int, model: str = RUNTIME_MODEL) -> dict[str, tuple[str, str]]:
    """Each mechanism's micro-run: ``(model, plan text)``, its degree 2 where the world allows
    (``model``: the dense model of the micro-runs, ``partita calibrate --model``)."""
    # the expert dispatch of a local MoE layer: tiny-moe with data parallelism only
    plans = {"base": (model, f"dp={world},gbs={world}"), "moe": (RUNTIME_MOE_MODEL, f"dp={world},gbs={world}")}
    if world % 2 == 0:
        half = world // 2
        plans.update({"tp": (model, f"dp={half},tp=2,gbs={half}"),
                      "tp_nosp": (model, f"dp={half},tp=2,sp=false,gbs={half}"),
                      "zero3": (model, f"dp={world},zero=3,gbs={world}"),
                      # how much of FSDP's traffic hides behind compute (calibrate/overlap.py)
                      "comm_overlap": (ZERO3_PROBE_MODEL["name"], f"dp={world},zero=3,gbs={world}"),
                      "pp": (PP_PROBE_MODEL["name"], f"dp={half},pp=2,gbs={2 * half}"),
                      "ep": (RUNTIME_MOE_MODEL, f"dp={world},ep=2,gbs={world}"),
                      "recompute": (model, f"dp={world},recompute=full,gbs={world}"),
                      "cp": (model, f"dp={half},cp=2,gbs={half}")})
    return plans


def increment_plans(world: int) -> dict[str, str]:
    """The second micro-run of the mechanisms measured by their per-micro-batch increment:
    the same plan with more micro-batches (1 -> 4 per step; pp 2 -> 6, the ZeRO-3 overlap probe 1 -> 3). The step-time
    difference holds no per-step cost (optimizer, gradient sync, the pipeline's fill and
    drain), only what every further micro-batch adds."""
    out = {"base": f"dp={world},gbs={4 * world}", "moe": f"dp={world},gbs={4 * world}"}
    if world % 2 == 0:
        half = world // 2
        out.update({"pp": f"dp={half},pp=2,gbs={6 * half}", "ep": f"dp={world},ep=2,gbs={4 * world}",
                    # per-step host work (DTensor / FSDP optimizer step over sharded parameters, the
                    # vocab-parallel loss) must not be read as per-layer, per-micro-batch time
                    "tp": f"dp={half},tp=2,gbs={4 * half}", "tp_nosp": f"dp={half},tp=2,sp=false,gbs={4 * half}",
                    "zero3": f"dp={world},zero=3,gbs={4 * world}", "comm_overlap": f"dp={world},zero=3,gbs={3 * world}",
                    "recompute": f"dp={world},recompute=full,gbs={4 * world}", "cp": f"dp={half},cp=2,gbs={4 * half}"})
    return out


def measurement_order(world: int, model: str = RUNTIME_MODEL) -> dict[str, tuple[str, str]]:
    """Every micro-run of :func:`measure_runtime` in the order one repeat times them: each
    mechanism's run (:func:`runtime_plans`) with its longer run (``<mech>@long``,
    :func:`increment_plans`) right after it."""
    plans, longer = runtime_plans(world, model), increment_plans(world)
    ordered: dict[str, tuple[str, str]] = {}
    for mech, run in plans.items():
        ordered[mech] = run
        if mech in longer:
            ordered[f"{mech}@long"] = (run[0], longer[mech])
    return ordered


def measure_runtime(device_type: str, dtype: str, repeats: int, model: str = RUNTIME_MODEL) -> dict[str, dict]:
    """Each mechanism's micro-run through :func:`partita.parallelize` (SGD, synthetic
    tokens), the repeats interleaved across mechanisms so a load change on the machine
    hits all of them alike: busy seconds per training step, smallest rank, per repeat.

    A mechanism's run and its longer run go back to back in every repeat: a term is read from
    their difference, so the two must see the same state of the machine - a few hundred
    milliseconds apart, not a sweep over every other mechanism (tens of seconds, across which a
    neighbour's burst moved the base per-layer term of one calibration 5x: docs/calibrate.md)."""
    import torch
    import torch.distributed as dist
    from ..models.llama import TransformerConfig, build_model
    from ..plan import Plan
    from ..runtime.batches import dp_shard, synthetic_batch
    from ..runtime.parallelize import parallelize
    world, rank = dist.get_world_size(), dist.get_rank()
    runs, steps = {}, {}
    for mech, (model_name, text) in measurement_order(world, model).items():
        plan = Plan.parse(text, world_size=world, defaults={"mbs": 1, "seq_len": RUNTIME_SEQ, "dtype": dtype})
        probe = model_name in PROBE_MODELS
        model = build_model(TransformerConfig.from_spec(run_model(model_name)) if probe else model_name)
        pm = parallelize(model, plan, lambda p: torch.optim.SGD(p, lr=0.01), device_type=device_type)
        device = pm.device  # the rank's device: where the timings are gathered
        x, y = synthetic_batch(0, plan.gbs, plan.seq_len, model.cfg.vocab, 0)
        x, y = dp_shard(x, plan, rank), dp_shard(y, plan, rank)
        steps[mech] = (lambda pm=pm, x=x, y=y: pm.train_step(x, y))
        for _ in range(2):  # warm-up: first-call dispatch caches, allocator
            steps[mech]()
        runs[mech] = {"model": model_name, "plan": plan.summary(), "plan_text": text, "seq_len": RUNTIME_SEQ,
                      "dtype": dtype, "world": world, "samples": [], "sched": []}
    for _ in range(repeats):
        for mech, step in steps.items():
            n = RUNTIME_STEPS_OF.get(mech.split("@")[0], RUNTIME_STEPS)
            dist.barrier()
            for _ in range(n):
                t0 = mark()
                step()
                runs[mech]["sched"].append(since(t0))
    for mech, run in runs.items():  # each step across the ranks, then a repeat's median of its steps
        n = RUNTIME_STEPS_OF.get(mech.split("@")[0], RUNTIME_STEPS)
        steps_busy = _across_ranks(run.pop("sched"), device, per=n)  # run share over each repeat's steps
        run["samples"] = [statistics.median(steps_busy[i:i + n]) for i in range(0, len(steps_busy), n)]
    for name in [n for n in runs if n.endswith("@long")]:  # the longer run travels with its mechanism's run
        runs[name.split("@")[0]]["long"] = runs.pop(name)
    return runs
