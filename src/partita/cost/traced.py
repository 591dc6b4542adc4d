"""Memory and step time of a plan for a *traced* model (:class:`~partita.spec.traced.TracedSpec`).

The decoder cost model (:mod:`.memory`, :mod:`.step`) derives every term from a
transformer's shape; a traced model brings its terms measured instead (parameters,
FLOPs and saved bytes per block, :mod:`partita.tracing`). The formulas here combine them
with the same hardware model and the same conventions:

* a traced "sample" plays the part of a sequence: ``plan.mbs`` / ``plan.gbs`` count
  samples, ``plan.seq_len`` is 1 (a trace fixes the input shape);
* measured figures are for the traced batch ``B``; a micro-batch of ``b`` samples costs
  ``b / B`` of them (per-sample work of a fixed-shape model does not depend on the batch);
  saved bytes scale by the plan's activation width over the trace's (``2 / 4`` for a bf16
  plan of an fp32 trace: every saved floating tensor is an activation of the compute dtype);
* model states (weights, gradients, Adam) and their ZeRO sharding:
  :func:`.memory.model_state_bytes` [Rajbhandari et al. 2020]; FSDP2 (zero 3) also holds
  the gathered 16-bit copy of the unit it runs and the one it prefetches
  [Zhao et al. 2023, PyTorch FSDP, sec. 3.2; FSDP2 prefetches one unit];
* activations: each in-flight micro-batch keeps every block's saved bytes (and what is saved
  outside the blocks where the pipeline keeps it, :func:`_outside_saved`), or with
  recompute only the block inputs (non-reentrant checkpointing keeps the inputs), plus
  one block's full set while it is recomputed [Chen et al. 2016, "Training deep nets with
  sublinear memory cost"]; in-flight micro-batches per schedule from
  :func:`.pipeline.in_flight_chunks`;
* compute: FLOPs / (peak x the device's GEMM efficiency) - the FLOP counter counts
  matmul-like ops (GEMMs, convolutions, attention); element-wise work is inside that
  efficiency (known gap: a model dominated by element-wise ops, e.g. GroupNorm-heavy
  UNets at small widths, runs slower than this says);
* recompute full: one more forward of the blocks;
* tensor parallel (only where the trace has a TP plan): the plan's linear layers, the
  attention between them and the tensors they save are split ``tp`` ways; each row-wise
  layer's output is all-reduced forward and each column-wise input's gradient backward
  (same bytes) [Shoeybi et al. 2019, Megatron-LM sec. 3]; layers of the stem or head that
  the plan names (a classifier ``colwise_rep``) have their parameters split too (known gap:
  their FLOPs and the all-gather of a replicated output are not split/costed - a head is a
  small share of a block model's step);
* pipeline: blocks split over stages; the work outside the blocks where the traced pipeline
  runtime runs it (:func:`_outside_work`: the stem trains on the first stage and runs forward
  on every later one, the head - what forward runs after the blocks - trains on the last);
  the parameters outside the blocks where the runtime holds them (:func:`_outside_params`: the
  stem on every stage, the head on the last); one activation send each way per micro-batch
  (:func:`.comm.send_recv`), stages combined by :func:`.pipeline.pipeline_time`;
  a module called between two blocks (a norm between block groups) trains on the stage of the
  block before it and runs forward on later ones, and that stage holds it (``spec.between``);
  a trace whose blocks cannot be cut (called out of order, a tensor used across a block - a
  skip connection) has ``pipeline_blocker`` and :func:`traced_problems` refuses pp for it,
  naming it, as the runtime does (:mod:`partita.runtime.traced_pipeline`);
* data parallel: all-reduce (zero 0), reduce-scatter + all-gather (zero 1/2), per
  micro-batch gathers and reduce-scatter (zero 3), overlapped with the backward as the
  decoder model does (:mod:`.step`); Adam's HBM traffic
  (:data:`.step.ADAM_STEP_BYTES_PER_PARAM`).
"""
from __future__ import annotations

from ..errors import PartitaError
from ..plan import Plan, group_span, validate
from ..spec.hardware import Cluster, Device
from ..spec.traced import TracedSpec
from . import comm
from .compute import BYTES, gemm_time
from .memory import GIB, RankMemory, grad_bytes, model_state_bytes, state_shard
from .pipeline import in_flight_chunks, pipeline_time
from .step import ADAM_STEP_BYTES_PER_PARAM, FLASH_BACKWARD_PER_FORWARD, StageTime, StepTime

_TRACE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def traced_problems(spec: TracedSpec, plan: Plan, world_size: int | None = None) -> list[str]:
    """Every reason ``plan`` cannot run ``spec``, one line each (empty: it can)."""
    errs = validate(plan, None, world_size)
    if plan.cp > 1 or plan.ep > 1 or plan.sp:
        errs.append(f"{spec.name} is a traced model: context/expert/sequence parallel need a transformer spec; "
                    "use dp, zero, tp (with a TP plan) and pp")
    if plan.recompute == "selective":
        errs.append(f"recompute=selective needs the transformer layer's op structure; {spec.name} is traced: "
                    "use none or full (per block)")
    if plan.tp > 1 and not spec.tp_capable:
        errs.append(f"tp={plan.tp} needs a tensor-parallel plan: trace {spec.name} with tp_plan={{'<module>': "
                    "'colwise'|'rowwise', ...}")
    if plan.pp > 1:
        if not spec.pipeline and spec.pipeline_blocker:
            errs.append(f"pp={plan.pp} cannot cut {spec.name} between its blocks: {spec.pipeline_blocker}; "
                        "use pp=1 (dp, zero and tp still apply)")
        elif not spec.pipeline:
            errs.append(f"pp={plan.pp} needs a forward that is one sequence of repeated blocks; {spec.name}'s "
                        f"{spec.block_class or 'blocks'} are not one run in one container; use pp=1 (dp, zero "
                        "and tp still apply)")
        elif plan.pp * plan.vpp > spec.layers:
            errs.append(f"pp*vpp={plan.pp * plan.vpp} exceeds the {spec.layers} blocks of {spec.name}")
    if plan.vpp > 1:
        errs.append("vpp > 1 is not modelled for traced models; use vpp=1")
    elif plan.pp > 1 and plan.schedule not in ("1f1b", "gpipe"):
        errs.append(f"schedule={plan.schedule}: the traced pipeline runs 1f1b or gpipe")
    return errs


def stage_blocks(spec: TracedSpec, plan: Plan) -> list[range]:
    """Block indices of each pipeline stage (balanced split)."""
    n, p = spec.layers, plan.pp
    sizes = [n // p + (1 if i < n % p else 0) for i in range(p)]
    out, start = [], 0
    for s in sizes:
        out.append(range(start, start + s))
        start += s
    return out


def _scale(spec: TracedSpec, plan: Plan) -> tuple[float, float]:
    """(work per micro-batch over the traced batch, activation bytes per traced byte)."""
    return plan.mbs / spec.batch, BYTES[plan.dtype] / _TRACE_BYTES.get(spec.dtype, 4)


def _stage_params(spec: TracedSpec, plan: Plan, blocks: range, rank: int) -> tuple[float, float]:
    """(parameters on one rank of the stage, largest unit's parameters on it): its blocks
    (their TP plan's layers split ``tp`` ways) and what it holds outside them (:func:`_outside_params`)."""
    params = sum(b.params - b.tp_params + b.tp_params / plan.tp for b in (spec.blocks[i] for i in blocks))
    params += _outside_params(spec, plan, blocks, rank)
    # the unit FSDP all-gathers on this rank is its own tp shard of the block (gathered over dp)
    unit = max((b.params - b.tp_params + b.tp_params / plan.tp for b in (spec.blocks[i] for i in blocks)), default=0)
    return params, unit


def _outside_params(spec: TracedSpec, plan: Plan, blocks: range, rank: int) -> float:
    """Parameters pipeline rank ``rank`` holds outside its blocks, as the traced pipeline
    runtime keeps them (:mod:`partita.runtime.traced_pipeline`: a stage holds its blocks, the
    modules its forward calls and the owners of the parameters its output depends on; the
    tracer records which those are, :func:`partita.tracing.tracer._held_outside`): the stem on
    every stage, the head on the last, and a block's submodules that the stem (every stage) or
    the head (the last) calls from outside it, on stages that do not hold that block already.
    The TP plan's layers among them are split ``tp`` ways. Without pp, or for a spec written
    before the stem's parameters were traced, all of them on the first stage."""
    if plan.pp == 1 or spec.stem_params is None or spec.head_params is None:
        if rank:
            return 0.0
        return spec.other_params - spec.tp_other_params + spec.tp_other_params / plan.tp
    last = rank == plan.pp - 1
    head_tp = spec.tp_other_params - spec.stem_tp_params
    params = spec.stem_params - spec.stem_tp_params + spec.stem_tp_params / plan.tp
    params += spec.head_params - head_tp + head_tp / plan.tp if last else 0.0
    params += sum(n for _, n, _, _, calls in spec.between if calls and min(calls) <= blocks.stop)
    return params + sum(n for i, n, where in spec.shared_block_params if i not in blocks and (where == 0 or last))


def traced_memory(spec: TracedSpec, device: Device, plan: Plan) -> list[RankMemory]:
    """Per-pipeline-rank memory (bytes by component), see the module docstring."""
    work, act_scale = _scale(spec, plan)
    m = plan.grad_accum
    out = []
    for rank, blocks in enumerate(stage_blocks(spec, plan)):
        params, unit = _stage_params(spec, plan, blocks, rank)
        parts = model_state_bytes(plan, params, state_shard(plan))
        if plan.zero >= 3:
            parts["zero3 gathered units"] = 2 * unit * BYTES[plan.dtype]
        per_mb = 0.0
        working = 0.0
        for i in blocks:
            b = spec.blocks[i]
            saved = b.saved_bytes - b.tp_saved_bytes + b.tp_saved_bytes / plan.tp
            per_mb += b.recompute_bytes if plan.recompute == "full" else saved
            working = max(working, saved)
        per_mb += _outside_saved(spec, plan, blocks, rank)
        chunks = in_flight_chunks(plan.schedule, plan.pp, plan.vpp, m, rank)
        parts["activations"] = per_mb * work * act_scale * chunks
        if plan.recompute == "full":
            parts["recompute working set"] = working * work * act_scale
        allocated = sum(parts.values())
        parts["allocator fragmentation"] = allocated * device.allocator_fragmentation
        parts["runtime (context, workspaces)"] = device.runtime_reserved_gib * GIB
        out.append(RankMemory(rank, parts))
    return out


def _outside_saved(spec: TracedSpec, plan: Plan, blocks: range, rank: int) -> float:
    """Activation bytes saved outside the blocks that pipeline rank ``rank`` keeps per
    micro-batch, as the traced pipeline runs them: the stem's on the first stage, the head's on
    the last, what forward saves between blocks ``k - 1`` and ``k`` on the stage holding block
    ``k - 1`` (later stages run that forward on a pass-through and drop it). A spec without the
    placement (not pipeline-able, or written before it was traced): all on the first stage."""
    if spec.stem_saved_bytes is None or spec.head_saved_bytes is None:
        return spec.other_saved_bytes if rank == 0 else 0.0
    saved = spec.stem_saved_bytes if rank == 0 else 0.0
    saved += spec.head_saved_bytes if rank == plan.pp - 1 else 0.0
    return saved + sum(b for k, b in spec.between_saved if blocks.start < k <= blocks.stop)


def _compute_time(device: Device, flops: float, attention: float, matmuls: int, dtype: str) -> float:
    """GEMM/convolution FLOPs at the GEMM efficiency for their average size
    (:func:`.compute.gemm_time`, ``matmuls`` GEMMs), the fused attention's at the
    attention efficiency, as the decoder model times them."""
    t = gemm_time(device, max(0.0, flops - attention), dtype, max(1, matmuls))
    if attention > 0:
        t += attention / (device.peak_flops("bf16" if dtype == "fp8" else dtype) * device.efficiency.attention)
    return t


_BLOCK_TIMES: dict[tuple, tuple[float, float, float]] = {}


def _block_time(device: Device, b, work: float, act_scale: float, tp: int, dtype: str) -> tuple[float, float, float]:
    """:func:`_block_time_of`, memoised on the block's figures (a model's identical blocks
    and the search's many plans with the same micro-batch and tp share one entry)."""
    key = (device.cache_key, b.forward_flops, b.backward_flops, b.attention_forward_flops, b.matmuls,
           b.tp_forward_flops, b.saved_bytes, b.tp_saved_bytes, work, act_scale, tp, dtype)
    hit = _BLOCK_TIMES.get(key)
    if hit is None:
        if len(_BLOCK_TIMES) > 100_000:
            _BLOCK_TIMES.clear()
        hit = _BLOCK_TIMES[key] = _block_time_of(device, b, work, act_scale, tp, dtype)
    return hit


def _block_time_of(device: Device, b, work: float, act_scale: float, tp: int, dtype: str) -> tuple[float, float, float]:
    """(forward + backward, forward, recompute forward) seconds of one block per micro-batch:
    compute (:func:`_compute_time`, the tp-split share divided by ``tp``), element-wise HBM
    traffic approximated by the saved bytes - each saved tensor is written once forward,
    read once backward and its gradient written once (3 passes) - and the device's per-layer
    kernel launch overhead, once forward and twice backward."""
    split = b.tp_forward_flops / b.forward_flops if b.forward_flops else 0.0
    local = (1 - split + split / tp) * work
    attention = b.attention_forward_flops * local
    train = _compute_time(device, (b.forward_flops + b.backward_flops) * local,
                          attention * (1 + FLASH_BACKWARD_PER_FORWARD), 3 * b.matmuls, dtype)
    forward = _compute_time(device, b.forward_flops * local, attention, b.matmuls, dtype)
    saved = (b.saved_bytes - b.tp_saved_bytes + b.tp_saved_bytes / tp) * work * act_scale
    elementwise = 3 * saved / (device.hbm_tbps * 1e12 * device.efficiency.memory_bandwidth)
    overhead = device.efficiency.kernel_overhead_us_per_layer * 1e-6
    return train + elementwise + 3 * overhead, forward + elementwise / 3 + overhead, forward + elementwise / 3 + overhead


def _stage_time(spec: TracedSpec, cluster: Cluster, plan: Plan, rank: int, blocks: range) -> StageTime:
    """Per-micro-batch time of one pipeline rank."""
    device = cluster.device
    work, act_scale = _scale(spec, plan)
    compute = forward = recompute = flops = ar = 0.0
    for i in blocks:
        b = spec.blocks[i]
        train, fwd, refwd = _block_time(device, b, work, act_scale, plan.tp, plan.dtype)
        compute, forward = compute + train, forward + fwd
        recompute += refwd if plan.recompute == "full" else 0.0
        split = b.tp_forward_flops / b.forward_flops if b.forward_flops else 0.0
        flops += (b.forward_flops + b.backward_flops) * (1 - split + split / plan.tp) * work
        ar += b.tp_allreduce_bytes
        flops += b.forward_flops * (1 - split + split / plan.tp) * work if plan.recompute == "full" else 0.0
    outside = _outside_work(spec, rank, plan.pp, blocks)
    fwd_flops, bwd_flops = sum(f for f, _ in outside), sum(b for _, b in outside)
    if fwd_flops + bwd_flops:
        mm = max(1, _other_matmuls(spec))
        compute += _compute_time(device, (fwd_flops + bwd_flops) * work, 0.0, (3 if bwd_flops else 1) * mm, plan.dtype)
        forward += _compute_time(device, fwd_flops * work, 0.0, mm, plan.dtype)
        flops += (fwd_flops + bwd_flops) * work
    parts = {"compute": compute, "recompute": recompute}
    if plan.tp > 1:
        g, k = group_span(plan, "tp", cluster.devices_per_node)
        passes = 3 if plan.recompute == "full" else 2
        parts["tp all-reduce"] = passes * comm.all_reduce(device, ar * work * act_scale, g, k)
    if plan.pp > 1 and blocks:
        out_bytes = spec.blocks[blocks[-1]].output_bytes * work * act_scale
        crosses = group_span(plan, "pp", cluster.devices_per_node)[1] > 1
        parts["pp send/recv"] = 2 * comm.send_recv(device, out_bytes, crosses)
    return StageTime(rank, parts, flops, forward=forward, backward=compute - forward + recompute)


def _outside_work(spec: TracedSpec, rank: int, pp: int, blocks: range) -> list[tuple[float, float]]:
    """(forward, backward) FLOPs outside the blocks that pipeline rank ``rank`` (holding
    ``blocks``) runs, as the traced pipeline runtime (:mod:`partita.runtime.traced_pipeline`)
    places them: the stem (``stem_*_flops``: what forward runs before the blocks) trains on the
    first stage, and every later stage runs its forward too (it runs the model's own forward;
    the stem's output is replaced by the received activation, so no backward); a module called
    between blocks ``k - 1`` and ``k`` (``spec.between``) trains on the stage holding block
    ``k - 1`` (it runs before that stage stops at block ``k``) and runs forward only on every
    later stage; the head (the rest of ``other_*``) trains on the last stage. Without pp all on
    the one stage; a spec without the stem figures (written before they were traced) keeps
    everything on the first stage."""
    other = (spec.other_forward_flops, spec.other_backward_flops)
    if spec.stem_forward_flops is None or spec.stem_backward_flops is None:
        return [other] if rank == 0 else []
    stem = (min(other[0], spec.stem_forward_flops), min(other[1], spec.stem_backward_flops))
    out = [stem if rank == 0 else (stem[0], 0.0)]
    head = [other[0] - stem[0], other[1] - stem[1]]
    for _, _, fwd, bwd, calls in spec.between:
        for k in calls:
            head[0], head[1] = head[0] - fwd, head[1] - bwd
            if blocks.start < k <= blocks.stop:
                out.append((fwd, bwd))
            elif k <= blocks.start:
                out.append((fwd, 0.0))
    return out + [(max(0.0, head[0]), max(0.0, head[1]))] if rank == pp - 1 else out


def _other_matmuls(spec: TracedSpec) -> int:
    """GEMMs outside the blocks: one per top module holding parameters (a rough count)."""
    return sum(1 for path, params, _ in spec.modules if "." not in path and params)


def _dp_sync(spec: TracedSpec, cluster: Cluster, plan: Plan, params: float, unit_compute: float) -> dict[str, float]:
    """Exposed data-parallel traffic and the optimizer step, per step."""
    device = cluster.device
    g, k = group_span(plan, "dp", cluster.devices_per_node)
    gb = grad_bytes(plan.dtype, plan.grad_dtype)
    wb = BYTES[plan.dtype]
    m = plan.grad_accum
    if plan.zero == 0:
        sync = comm.all_reduce(device, params * gb, g, k)
    elif plan.zero in (1, 2):
        sync = comm.reduce_scatter(device, params * gb, g, k) + comm.all_gather(device, params * wb, g, k)
    else:
        per_mb = 2 * comm.all_gather(device, params * wb, g, k) + comm.reduce_scatter(device, params * gb, g, k)
        sync = m * per_mb
    overlap = unit_compute * (m if plan.zero >= 3 else 1) if plan.overlap_grad_reduce else 0.0
    local = params / (state_shard(plan) if plan.zero >= 1 else 1)
    optimizer = local * ADAM_STEP_BYTES_PER_PARAM / device.optimizer_bytes_per_s()
    return {"dp gradient sync (exposed)": max(0.0, sync - overlap), "optimizer step": optimizer}


def traced_step_time(spec: TracedSpec, cluster: Cluster, plan: Plan) -> StepTime:
    """Step time of ``plan`` for a traced model, by component (seconds)."""
    stages = [_stage_time(spec, cluster, plan, r, blocks) for r, blocks in enumerate(stage_blocks(spec, plan))]
    m = plan.grad_accum
    pipe = pipeline_time([s.total for s in stages], m, plan.vpp, plan.schedule)
    worst = max(range(len(stages)), key=lambda r: stages[r].total)
    params, _ = _stage_params(spec, plan, stage_blocks(spec, plan)[worst], worst)
    sync = _dp_sync(spec, cluster, plan, params, stages[worst].backward)
    parts: dict[str, float] = {}
    for name in stages[worst].parts:
        parts[name] = stages[worst].parts[name] * m
    parts["pipeline bubble"] = max(0.0, pipe - stages[worst].total * m)
    parts.update(sync)
    return StepTime(step=pipe + sum(sync.values()), parts=parts, stages=stages)


def check_traced(spec: TracedSpec, plan: Plan, world_size: int) -> Plan:
    errs = traced_problems(spec, plan, world_size)
    if errs:
        raise PartitaError("; ".join(errs))
    return plan


def peak_gib(memory: list[RankMemory]) -> float:
    return max(r.total for r in memory) / GIB
