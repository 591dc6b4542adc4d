"""Step time of one training iteration, broken down by where the time goes.

Per pipeline rank and micro-batch: forward + backward (2x the forward's GEMMs,
attention and element-wise work [Narayanan et al. SC'21 appendix]) + recomputation
(full: one more forward; selective: the element-wise part of one) + the exposed part
of the communication that sits on the critical path:

* tensor parallel: per layer 2 all-reduces forward and 2 backward of ``b s h`` elements
  (with SP each becomes all-gather + reduce-scatter, same bytes) [Korthikanti et al.
  2022 sec. 4.2.2]; full recompute repeats the forward two. A MoE layer keeps the
  attention pair only - its MLP exchange is the expert all-to-all. Exposed unless the
  plan overlaps it (``tp_comm_overlap``), then ``1 - tp_overlap`` of it.
* context parallel (ring attention): ``cp - 1`` K/V hops per layer forward, twice in
  backward, overlapped with the attention kernel; only the excess is exposed.
* expert parallel: dispatch + combine all-to-all forward, the same backward, of
  ``top_k b s h / tp`` elements per rank [Megatron-Core MoE; hardware.md sec. 3.4].
* pipeline: one activation send per direction per micro-batch on the critical path
  (with interleaving the other vpp - 1 are overlapped, Megatron's overlap_p2p_comm).
* ZeRO-3: per micro-batch all-gather (forward and backward) and reduce-scatter of the
  rank's parameters, overlapped with that micro-batch's compute.

The pipeline combines the stages (:func:`.pipeline.pipeline_time`). After it, the
data-parallel gradient reduction (all-reduce for zero 0; reduce-scatter + all-gather
of the updated weights for zero 1/2) overlaps the last micro-batch's backward (and the
gather the next step's first forward) when the plan overlaps them; the rest, the
optimizer step (Adam: ~34 bytes moved per local parameter, HBM-bound) and the tied
embedding all-reduce between first and last stage are added.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..plan import Plan, group_span
from ..spec.hardware import Cluster
from ..spec.model import ModelSpec
from . import comm
from .compute import BYTES, LayerCost, embedding_forward, layer_forward, output_forward
from .memory import RankShape, _grad_bytes, _shape_params, rank_shapes
from .pipeline import pipeline_time


#: Fraction of a layer's GEMM FLOPs op-level selective checkpointing recomputes: with
#: the policy "save every other matmul", a LLaMA layer recomputes wk, wo and w3, i.e.
#: (kv + h + f) / (2h + 2kv + 3f) of its GEMM FLOPs - 0.37 for Llama-3-8B, 0.36 for 70B.
SELECTIVE_GEMM_FRACTION = 0.36


@dataclass
class StageTime:
    """Per-micro-batch time of one pipeline rank, by component (seconds)."""

    rank: int
    parts: dict[str, float] = field(default_factory=dict)
    flops: float = 0.0  # hardware FLOPs per micro-batch, incl. recompute
    forward: float = 0.0
    backward: float = 0.0

    @property
    def total(self) -> float:
        return sum(self.parts.values())


@dataclass
class StepTime:
    step: float
    parts: dict[str, float]
    stages: list[StageTime]


def _stage_time(model: ModelSpec, cluster: Cluster, plan: Plan, rank: int, shape: RankShape) -> StageTime:
    dev, dpn = cluster.device, cluster.devices_per_node
    first, last = shape.first, shape.last
    n_moe = shape.n_moe
    n_dense = shape.n_layers - n_moe
    cache: dict[bool, LayerCost] = {}
    fwd = LayerCost()
    if n_dense:
        cache[False] = layer_forward(model, dev, plan, False)
        fwd = fwd + cache[False].scaled(n_dense)
    if n_moe:
        cache[True] = layer_forward(model, dev, plan, True)
        fwd = fwd + cache[True].scaled(n_moe)
    layers_fwd = fwd
    if first:
        fwd = fwd + embedding_forward(model, dev, plan)
    if last:
        fwd = fwd + output_forward(model, dev, plan)
    bwd = fwd.scaled(2.0)
    if plan.recompute == "full":
        rc = layers_fwd.time
        rc_flops = layers_fwd.flops
    elif plan.recompute == "selective":
        # op-level SAC recomputes every other GEMM (about a third of the layer's GEMM FLOPs:
        # k/o projections and one MLP projection) and the element-wise ops
        rc = layers_fwd.elementwise_time + SELECTIVE_GEMM_FRACTION * layers_fwd.gemm_time
        rc_flops = SELECTIVE_GEMM_FRACTION * layers_fwd.gemm_flops
    else:
        rc, rc_flops = 0.0, 0.0

    st = StageTime(rank=rank)
    st.parts["compute"] = fwd.time + bwd.time
    st.parts["recompute"] = rc
    st.flops = 3 * fwd.flops + rc_flops
    st.forward, st.backward = fwd.time, bwd.time + rc

    e = BYTES[plan.dtype]
    tokens = plan.mbs * plan.seq_len / plan.cp
    n_layers = shape.n_layers
    # tensor parallel
    if plan.tp > 1:
        g, k = group_span(plan, "tp", dpn)
        size = tokens * model.hidden * e
        n_coll = (2 * n_dense + n_moe) * (2 + (1 if plan.recompute == "full" else 0)) + first + 2 * last
        t_tp = n_coll * comm.all_reduce(dev, size, g, k)
        if plan.tp_comm_overlap:
            t_tp *= 1 - dev.efficiency["tp_overlap"]
        st.parts["tp communication"] = t_tp
    # context parallel: ring K/V exchange, hidden behind the attention kernel
    if plan.cp > 1:
        g, k = group_span(plan, "cp", dpn)
        kv_width = (model.q_dim + model.attn_out_dim) if model.mla else 2 * model.kv_dim
        hop = comm.send_recv(dev, tokens * kv_width * e / plan.tp, k > 1)
        attn = cache.get(False, cache.get(True, LayerCost())).attn_time
        passes = 3 + (1 if plan.recompute == "full" else 0)
        st.parts["cp communication"] = n_layers * passes * max(0.0, (plan.cp - 1) * hop - attn)
    # expert parallel all-to-all
    if plan.ep > 1 and n_moe:
        g, k = group_span(plan, "ep", dpn)
        size = tokens / plan.tp * model.moe.top_k * model.hidden * e  # type: ignore[union-attr]
        n_a2a = 2 * (2 + (1 if plan.recompute == "full" else 0))
        st.parts["ep all-to-all"] = n_moe * n_a2a * comm.all_to_all(dev, size, g, k)
    # pipeline send/recv
    if plan.pp > 1:
        g, k = group_span(plan, "pp", dpn)
        size = tokens * model.hidden * e / (plan.tp if plan.sp else 1)
        # Interleaving multiplies pipeline traffic by vpp [Narayanan et al. SC'21 sec. 2.2],
        # but Megatron overlaps those transfers with the other chunks' compute
        # (overlap_p2p_comm, on by default with vpp); one send per direction and
        # micro-batch stays on the critical path, as in plain (blocking) 1F1B.
        st.parts["pp send/recv"] = 2 * comm.send_recv(dev, size, k > 1)
    # ZeRO-3 gathers per micro-batch
    if plan.zero >= 3:
        dense, expert = _shape_params(model, plan, shape)
        g, k = group_span(plan, "dp_cp", dpn)
        w = 4 if plan.dtype == "fp32" else 2
        t = 2 * comm.all_gather(dev, dense * w, g, k) + comm.reduce_scatter(dev, dense * _grad_bytes(plan), g, k)
        if expert:
            eg, ek = _expert_dp_span(plan, dpn)
            t += 2 * comm.all_gather(dev, expert * w, eg, ek) + comm.reduce_scatter(dev, expert * _grad_bytes(plan), eg, ek)
        compute = st.parts["compute"] + rc
        st.parts["zero3 gather/scatter"] = max(0.0, t - compute) + t / max(n_layers, 1)
    return st


def step_time_lower_bound(model: ModelSpec, cluster: Cluster, plan: Plan) -> float:
    """A cheap lower bound of :func:`estimate_step_time`: the slowest rank's layer compute
    (forward + 2x backward + recompute) times the micro-batch count, with no communication,
    bubble or optimizer. The search skips the full estimate of a plan whose bound cannot
    beat what it has already found."""
    dev = cluster.device
    dense = layer_forward(model, dev, plan, False) if model.dense_layers else None
    moe = layer_forward(model, dev, plan, True) if model.moe else None
    worst = 0.0
    for shape in rank_shapes(model, plan):
        t = 0.0
        if dense is not None:
            n = shape.n_layers - shape.n_moe
            t += n * (3 * dense.time + (dense.time if plan.recompute == "full" else 0.0))
        if moe is not None:
            t += shape.n_moe * (3 * moe.time + (moe.time if plan.recompute == "full" else 0.0))
        worst = max(worst, t)
    return plan.grad_accum * worst


def _expert_dp_span(plan: Plan, dpn: int) -> tuple[int, int]:
    """Span of the expert data-parallel group (dp*cp*tp/ep ranks, stride tp*ep inside dp x cp)."""
    size = plan.dp * plan.cp * plan.tp // plan.ep
    if size <= 1:
        return 1, 1
    stride = plan.ep * plan.tp if plan.ep > 1 else 1
    nodes = len({(i * stride) // dpn for i in range(size)})
    return max(1, size // nodes), nodes


def estimate_step_time(model: ModelSpec, cluster: Cluster, plan: Plan) -> StepTime:
    dev, dpn = cluster.device, cluster.devices_per_node
    stages = []
    seen: dict[tuple, StageTime] = {}
    shapes = rank_shapes(model, plan)
    for r, shape in enumerate(shapes):
        key = (shape.n_layers, shape.n_moe, shape.first, shape.last)
        if key not in seen:
            seen[key] = _stage_time(model, cluster, plan, r, shape)
        st = seen[key]
        stages.append(st if st.rank == r else StageTime(rank=r, parts=st.parts, flops=st.flops,
                                                        forward=st.forward, backward=st.backward))
    m = plan.grad_accum
    per_mb = [s.total for s in stages]
    pipe = pipeline_time(per_mb, m, plan.vpp, plan.schedule)
    slowest = max(stages, key=lambda s: s.total)
    parts = {k: v * m for k, v in slowest.parts.items()}
    if plan.pp > 1:
        parts["pipeline bubble"] = pipe - m * slowest.total

    # data-parallel gradient sync and optimizer, on the rank holding the most parameters
    worst_dp, worst_opt = 0.0, 0.0
    g, k = group_span(plan, "dp_cp", dpn)
    eg, ek = _expert_dp_span(plan, dpn)
    w_bytes = 4 if plan.dtype == "fp32" else 2
    done: set[tuple] = set()
    for st in stages:
        shape = shapes[st.rank]
        key = (shape.n_layers, shape.n_moe, shape.first, shape.last)
        if key in done:
            continue
        done.add(key)
        dense, expert = _shape_params(model, plan, shape)
        t_rs = t_ag = 0.0
        if plan.zero == 0:
            t_rs = comm.all_reduce(dev, dense * _grad_bytes(plan), g, k) + comm.all_reduce(dev, expert * _grad_bytes(plan), eg, ek)
        elif plan.zero in (1, 2):
            t_rs = comm.reduce_scatter(dev, dense * _grad_bytes(plan), g, k) + comm.reduce_scatter(dev, expert * _grad_bytes(plan), eg, ek)
            t_ag = comm.all_gather(dev, dense * w_bytes, g, k) + comm.all_gather(dev, expert * w_bytes, eg, ek)
        n_layers = max(shape.n_layers, 1)
        bwd_window = st.backward / plan.vpp
        fwd_window = st.forward / plan.vpp
        exp_rs = max(t_rs / n_layers, t_rs - bwd_window) if plan.overlap_grad_reduce else t_rs
        exp_ag = max(t_ag / n_layers, t_ag - fwd_window) if plan.overlap_param_gather else t_ag
        worst_dp = max(worst_dp, exp_rs + exp_ag)
        shard_dense = dense / (plan.dp * plan.cp) if plan.zero >= 1 else dense
        shard_expert = expert / max(1, plan.dp * plan.cp * plan.tp // plan.ep) if plan.zero >= 1 else expert
        opt_bytes = 34 * (shard_dense + shard_expert)
        worst_opt = max(worst_opt, opt_bytes / (dev.hbm_tbps * 1e12 * dev.efficiency["memory_bandwidth"]))
    parts["dp gradient sync"] = worst_dp
    parts["optimizer step"] = worst_opt
    if model.tied_embeddings and plan.pp > 1:
        size = model.vocab * model.hidden / plan.tp * _grad_bytes(plan)
        parts["tied embedding sync"] = comm.all_reduce(dev, size, 1, 2)
    step = pipe + sum(v for key, v in parts.items() if key in ("dp gradient sync", "optimizer step", "tied embedding sync"))
    return StepTime(step=step, parts={k: v for k, v in parts.items() if v > 0}, stages=stages)
