"""Run under torchrun (2 gloo ranks) by tests/test_compression_runtime.py and
bench/compression.py's byte check: each communication knob of issue 17 on tiny-llama.

1. equivalence with single-process training (partita.runtime.equivalence.run_case);
2. bytes per step by collective, read from torch.profiler traces of steps 3-4 (PowerSGD
   compresses from step 2), and PowerSGD's state sizes;
3. PowerSGD resume: 8 steps uninterrupted with a checkpoint after step 4, then a fresh
   model that loads it and runs steps 5-7 (losses must match), and a control that drops
   the PowerSGD state after loading (losses must not).

usage: torchrun --nproc-per-node 2 tests/compression_worker.py OUT.json TMPDIR

tests/test_compression_runtime.py runs the same cases one at a time through
:func:`shared_case`, in the session's 2-rank equivalence processes (tests/conftest.py), so
they pay no torchrun start-up of their own.
"""
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from partita.plan import Plan
from partita.runtime.batches import dp_shard, synthetic_batch
from partita.runtime.checkpoint import load_checkpoint, save_checkpoint
from partita.profile.collective_counter import CollectiveCounter, route_builtin_ddp_reduction
from partita.runtime.compression import START_ITER, powersgd_state_numel, trace_collective_bytes
from partita.runtime.equivalence import OPTIMIZERS, make_model, run_case
from partita.runtime.modules import vocab_size
from partita.runtime.parallelize import parallelize

S = "gbs=4,mbs=1,seq_len=16"
EQUIVALENCE = [
    "tiny-llama:dp=2,zero=0,dtype=bf16," + S,  # the bf16 baseline (autocast), fp32 reduction
    "tiny-llama:dp=2,zero=0,dtype=bf16,grad_dtype=bf16," + S,  # DDP bf16 compression hook
    "tiny-llama:dp=2,zero=1,dtype=bf16,grad_dtype=bf16," + S,  # bucketed GradientSync in bf16
    "tiny-llama:dp=2,zero=3,dtype=bf16,grad_dtype=bf16," + S,  # FSDP2 reduce_dtype bf16
    "tiny-llama:dp=2,zero=3,fsdp_prefetch=2," + S,  # explicit prefetch, 2 blocks ahead
    "tiny-llama:dp=2,zero=0,ddp_bucket_mb=1," + S,
    "tiny-llama:dp=2,zero=0,grad_compression=powersgd,powersgd_rank=4," + S,
]
BYTES = {  # knob -> plan (dp=2, fp32 weights and grads unless the knob says otherwise)
    "none": "dp=2,zero=0,dtype=bf16," + S,
    "bf16": "dp=2,zero=0,dtype=bf16,grad_dtype=bf16," + S,
    "powersgd-r4": "dp=2,zero=0,dtype=bf16,grad_compression=powersgd,powersgd_rank=4," + S,
    "powersgd-r1": "dp=2,zero=0,dtype=bf16,grad_compression=powersgd,powersgd_rank=1," + S,
    "zero3": "dp=2,zero=3,dtype=bf16," + S,
    "zero3-bf16": "dp=2,zero=3,dtype=bf16,grad_dtype=bf16," + S,
}
RESUME = "dp=2,zero=0,dtype=fp32,grad_compression=powersgd,powersgd_rank=2," + S


def _train(pm, plan: Plan, steps, seed: int = 0) -> list[float]:
    losses = []
    for step in steps:
        x, y = synthetic_batch(step, plan.gbs, plan.seq_len, 256, seed)
        losses.append(pm.train_step(dp_shard(x, plan, dist.get_rank()), dp_shard(y, plan, dist.get_rank())))
    return losses


def _build(text: str):
    plan = Plan.parse(text, world_size=dist.get_world_size())
    return plan, parallelize(make_model("tiny-llama", 0), plan, make_optimizer=OPTIMIZERS["momentum"])


def _without_pq_all_reduces(events: list, state) -> list:
    """The trace's events less the all-reduces of PowerSGD's P and Q buffers (one per bucket
    each, in the hook's future callbacks: recorded by the profiler in some runs and not in
    others), recognised by their exact element count."""
    pq = {t.numel() for d in (state.p_memory_dict, state.q_memory_dict) for t in d.values()}

    def numel(e: dict) -> int:
        return sum(_numel(d) for d in (e.get("args") or {}).get("Input Dims") or [])

    return [e for e in events if not (str(e.get("name")) == "gloo:all_reduce" and numel(e) in pq)]


def _numel(dims) -> int:
    n = 1
    for d in dims if isinstance(dims, list) else []:
        n *= int(d)
    return n


def measure_bytes(text: str, tmp: Path) -> dict:
    """Collective bytes per step over steps 3 and 4 (after PowerSGD's start), this rank: from
    the profiler trace, and from ``partita profile``'s collective counter (steps 2-4)."""
    plan, pm = _build(text)
    route_builtin_ddp_reduction(pm.modules)  # as partita profile does: DDP's C++ reduction counted
    counter = CollectiveCounter().start()
    for step in range(3):
        counter.set_step(step)
        _train(pm, plan, [step])
    before = powersgd_state_numel(pm.compression_state)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for step in range(3, 5):
            counter.set_step(step)
            _train(pm, plan, [step])
    counter.stop()
    group = tuple(dist.get_process_group_ranks(pm.dp_group))
    wire = {"first_step": START_ITER, "group": list(group), "by_collective": counter.per_step(group, START_ITER)}
    path = tmp / f"trace_{abs(hash(text))}_{dist.get_rank()}.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    if pm.compression_state is not None:  # see below: P and Q are counted from the state alone
        trace["traceEvents"] = _without_pq_all_reduces(trace["traceEvents"], pm.compression_state.state)
    per = {k: {"bytes": v["bytes"] / 2, "calls": v["calls"] / 2}
           for k, v in trace_collective_bytes(trace).items()}
    state = powersgd_state_numel(pm.compression_state)
    if state:  # the P and Q all-reduces run in future callbacks on gloo's thread, which the
        # profiler records only sometimes (dropped above): add the P and Q buffers the hook
        # all-reduces once per step
        per["all_reduce"]["bytes"] += 4 * (state["p_memory_dict"] + state["q_memory_dict"])
        per["all_reduce"]["calls"] += 2
        state["numel_after_compression_per_step"] = (state["total_numel_after_compression"]
                                                     - before["total_numel_after_compression"]) / 2
    return {"plan": plan.to_dict(), "per_step": per, "powersgd_state_numel": state, "dp_wire": wire}


def resume_case(tmp: Path) -> dict:
    plan, pm = _build(RESUME)
    full = _train(pm, plan, range(5))
    root = tmp / "ckpt"
    save_checkpoint(pm, root, 4, {"step": 4})
    full += _train(pm, plan, range(5, 8))
    out = {"uninterrupted": full}
    for name, keep_state in (("resumed", True), ("resumed_without_powersgd_state", False)):
        plan, pm = _build(RESUME)
        load_checkpoint(pm, root / "step_00000004")
        if not keep_state:  # control: a fresh PowerSGD state (iteration 0, no error feedback)
            keeper = pm.compression_state
            keeper.state.__init__(process_group=None, matrix_approximation_rank=plan.powersgd_rank,
                                  start_powerSGD_iter=2)
            keeper.pieces, keeper.layouts = {}, {}
        out[name] = _train(pm, plan, range(5, 8))
        out[name + "_iter"] = int(pm.compression_state.state.iter)
    return out


def shared_case(case: str) -> dict:
    """One case of :func:`main` in a process group that is already up (the test suite's
    shared equivalence processes, ``partita.runtime.equivalence --worker``): ``equivalence|PLAN``
    (an EQUIVALENCE entry, 5 steps), ``bytes|KNOB`` (a BYTES key) or ``resume``. Files go
    under ``$PARTITA_WORKER_DIR/compression_worker``."""
    tmp = Path(os.environ["PARTITA_WORKER_DIR"]) / "compression_worker"
    tmp.mkdir(parents=True, exist_ok=True)
    kind, _, name = case.partition("|")
    if kind == "equivalence":
        return run_case(name, steps=5)
    if kind == "bytes":
        return measure_bytes(BYTES[name], tmp)
    if kind == "resume":
        return resume_case(tmp)
    raise ValueError(f"unknown compression case {case!r}")


def main() -> None:
    out_path, tmp = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    results: dict = {"equivalence": {}, "bytes": {}}
    for case in EQUIVALENCE:
        results["equivalence"][case] = run_case(case, steps=5)
        dist.barrier()
    for knob, text in BYTES.items():
        results["bytes"][knob] = measure_bytes(text, tmp)
        dist.barrier()
    results["resume"] = resume_case(tmp)
    if dist.get_rank() == 0:
        Path(out_path).write_text(json.dumps(results, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
