"""Step time of one training iteration, broken down by where the time goes.

Per pipeline rank and micro-batch: forward + backward (2x the forward's GEMMs and
element-wise work [Narayanan et al. SC'21 appendix], 2.5x the fused attention's, which
recomputes its scores [Dao 2023 sec. 4.1]) + recomputation
(full: one more forward; selective: the element-wise part of one) + the exposed part
of the communication that sits on the critical path. With ``plan.recompute_layers`` N
(full recompute of the first N layers of each stage/chunk only, Megatron-LM's
``--recompute-method block``) a rank's recomputed layers cost what full-recompute layers
do and its other layers what layers without recompute do (:func:`_partial_terms`):

* tensor parallel: per layer 2 all-reduces forward and 2 backward of ``b s h`` elements
  (with SP each becomes all-gather + reduce-scatter, same bytes) [Korthikanti et al.
  2022 sec. 4.2.2]; full recompute repeats the forward two. A MoE layer keeps the
  attention pair only - its MLP exchange is the expert all-to-all. Exposed unless the
  plan overlaps it (``tp_comm_overlap``), then ``1 - tp_overlap`` of it. Plus the
  device's ``tp_framework_us_per_layer``: host-side DTensor work that is on the critical
  path where the host does not run ahead of the device (CPU; `partita calibrate`
  measures it, accelerators default to 0).
* context parallel (ring attention): ``cp - 1`` K/V hops per layer forward, twice in
  backward, the device's ``comm_overlap`` share of them overlapped with the attention
  kernel (only the excess exposed), the rest serial (all of it hides on accelerators).
* expert parallel: dispatch + combine all-to-all forward, the same backward, of
  ``top_k b s h / tp`` elements per rank [Megatron-Core MoE; hardware.md sec. 3.4].
  With expert tensor parallel (etp > 1) Megatron's alltoall dispatcher also all-gathers
  the received tokens over the etp group before the experts and reduce-scatters the
  outputs after them (megatron/core/transformer/moe/token_dispatcher.py,
  ``MoEAlltoAllTokenDispatcher``; MoE parallel folding, Liu et al. 2025,
  arXiv:2504.14960, sec. 3): forward all-gather + reduce-scatter, backward the reverse
  pair, full recompute one more pair, each of the gathered ``etp top_k b s h / tp``
  elements over the etp group's span (:func:`etp_dispatch_time`); counted with the
  all-to-all in the ``ep all-to-all`` part (the expert token exchange).
* pipeline: one activation send per direction per micro-batch on the critical path
  (with interleaving the other vpp - 1 are overlapped, Megatron's overlap_p2p_comm).
* ZeRO-3: per micro-batch all-gather (forward and backward) and reduce-scatter of the
  rank's parameters, the device's ``comm_overlap`` share of it overlapped with that
  micro-batch's compute (all of it on accelerators, :func:`_zero3_exposed`); plus the device's
  ``zero3_framework_us_per_layer`` (FSDP hooks and launches, as for tp above).
* Gradient accumulation under ZeRO-2/3 (``plan.grad_accum_mode``): ``sharded`` (the
  default) reduce-scatters every micro-batch - ZeRO-3 inside the per-micro-batch traffic,
  ZeRO-2 ``m`` reduce-scatters per step, the first ``m - 1`` exposed only beyond their
  own backward plus the next forward (all of them when not overlapped);
  ``unsharded`` reduces once after the last micro-batch (and holds the full gradient,
  :func:`.states.full_gradients`).

The pipeline combines the stages (:func:`.pipeline.pipeline_time`). After it, the
data-parallel gradient reduction (all-reduce for zero 0; reduce-scatter + all-gather
of the updated weights for zero 1/2; HSDP (``dp_shard``): reduce-scatter and gathers
inside the shard group, all-reduce of the shard across the replica groups,
:func:`grad_reduce`) overlaps the last micro-batch's backward (and the
gather the next step's first forward) when the plan overlaps them; the rest, the
optimizer step (Adam: ~34 bytes moved per local parameter, HBM-bound) and the tied
embedding all-reduce between first and last stage are added.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ..plan import Plan, group_span
from ..spec.hardware import Cluster, Device
from ..spec.model import ModelSpec
from . import comm, compression
from .activations import norm_outputs_freed
from .compute import (BYTES, LayerCost, embedding_forward, fp8_tp_gathered, last_gemm, layer_forward,
                      module_recompute_forward, output_forward, selective_gemm_fraction)
from .finetune import lora_shape, lora_stage_terms, rank_adapter_params, trained_shape_params
from .frameworks import FRAMEWORKS
from .memo import memoised
from .overheads import add_framework
from .pipeline import (async_p2p_period, fb_overlap_share, hidden_send_bound, hide_all_to_all, pipeline_time,
                       pipeline_time_of)
from .placement import RankShape, distinct_shapes, rank_shapes
from .shape import LayerShape, StageShape, Zero3Shape, expert_dp_span, replica_span, shard_span, stage_shape, zero3_shape
from .states import (_grad_bytes, _shape_params, expert_state_shard, full_gradients, grad_bytes, shape_params,
                     state_shard)


#: The backward pass runs two GEMMs (input and weight gradients) per forward GEMM, so
#: forward + backward = 3 forwards [Narayanan et al. SC'21 appendix]; the forward is a
#: third of the work a layer does per micro-batch.
BACKWARD_PER_FORWARD = 2
FORWARD_SHARE = 1 / (1 + BACKWARD_PER_FORWARD)
#: Fused (flash) attention's backward does 2.5x the forward's FLOPs, not 2x: the forward
#: runs two matmuls per tile (``Q K^T``, ``P V``), the backward five (it recomputes
#: ``Q K^T`` from the saved log-sum-exp instead of storing the scores, then ``dV = P^T dO``,
#: ``dP = dO V^T``, ``dQ = dS K``, ``dK = dS^T Q``) [Dao 2023, FlashAttention-2, sec. 4.1:
#: "backward ... 2.5x the forward FLOPs"; the same count in FlashAttention-3, Shah et al.
#: 2024]. This is what makes long sequences slower than a 3x-forward count predicts.
FLASH_BACKWARD_PER_FORWARD = 2.5
#: Share of a block's tp traffic left when its all-gathers carry fp8 (:func:`.compute.fp8_tp_gathered`):
#: with SP a block's ``tp_coll`` is one all-gather and one reduce-scatter of the same activation,
#: half each; the all-gather at 1 byte instead of 2 leaves ``0.5 / 2 + 0.5``.
FP8_GATHERED_TP_SHARE = 0.75
#: Bytes of HBM traffic per local parameter in the Adam step (fused multi-tensor Adam,
#: e.g. apex FusedAdam / Megatron's distributed optimizer, HBM-bound): read the fp32 main
#: gradient, master weight and both moments (4 x 4), write the master weight and both
#: moments (3 x 4) and the 16-bit working copy (2), and zero the gradient buffer (4).
ADAM_STEP_BYTES_PER_PARAM = 4 * 4 + 3 * 4 + 2 + 4


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


class StageTerms(NamedTuple):
    """Per-micro-batch terms of one layer, one end (embedding / output layer) or a whole
    pipeline rank (seconds; ``flops`` in FLOPs). The first six are the stage's time parts
    (:data:`STAGE_PARTS` labels them); ``forward`` and ``backward`` (incl. recompute) are
    the windows the data-parallel sync overlaps."""

    compute: float = 0.0
    recompute: float = 0.0
    tp_comm: float = 0.0
    cp_comm: float = 0.0
    ep_all_to_all: float = 0.0
    pp_send_recv: float = 0.0
    forward: float = 0.0
    backward: float = 0.0
    flops: float = 0.0

    @property
    def time(self) -> float:
        """The stage time these terms add: the sum of the time parts."""
        return self.compute + self.recompute + self.tp_comm + self.cp_comm + self.ep_all_to_all + self.pp_send_recv


#: Label of each time part of :class:`StageTerms`, as the breakdown prints it.
STAGE_PARTS = {"compute": "compute", "recompute": "recompute", "tp_comm": "tp communication",
               "cp_comm": "cp communication", "ep_all_to_all": "ep all-to-all", "pp_send_recv": "pp send/recv"}


class TermsByKind(NamedTuple):
    """Per-micro-batch terms of each kind of thing a stage holds: a dense layer, a MoE
    layer, the embedding, the output layer, and the per-stage constant (pipeline
    send/recv). A stage's terms are linear in them (:func:`_shape_terms`)."""

    dense: StageTerms
    moe: StageTerms
    embedding: StageTerms
    output: StageTerms
    per_stage: StageTerms


class TimesByKind(NamedTuple):
    """The time (:attr:`StageTerms.time`) each kind of :class:`TermsByKind` adds."""

    dense: float
    moe: float
    embedding: float
    output: float
    per_stage: float


_ZERO = StageTerms()


def _layer_terms(layer: LayerCost, recompute: str, selective: float, tp_coll: float, n_tp: float, tp_framework: float,
                 cp_pass: float, a2a: float, skipped: tuple[float, float] = (0.0, 0.0),
                 modules_rc: LayerCost | None = None) -> StageTerms:
    """One layer's contribution: forward + 2x backward, recompute (full: the forward again,
    less the ``skipped`` (FLOPs, seconds) of a checkpoint that stops early,
    :func:`.compute.last_gemm`; selective: element-wise ops and the ``selective`` share of
    the GEMMs, or with Megatron's module-level selective ``modules_rc``, the recomputed
    modules' forward, :func:`.compute.module_recompute_forward`), and its communication."""
    if recompute == "full":
        rc, rc_flops = layer.time - skipped[1], layer.flops - skipped[0]
    elif recompute == "selective" and modules_rc is not None:
        rc, rc_flops = modules_rc.time, modules_rc.flops
    elif recompute == "selective":
        # op-level SAC recomputes every other GEMM (about a third of the layer's GEMM FLOPs,
        # :func:`.compute.selective_gemm_fraction`) and the element-wise ops
        rc = layer.elementwise_time + selective * layer.gemm_time
        rc_flops = selective * layer.gemm_flops
    else:
        rc, rc_flops = 0.0, 0.0
    t = layer.time
    # the attention kernel's backward recomputes its scores (FLASH_BACKWARD_PER_FORWARD)
    bwd = BACKWARD_PER_FORWARD * t + (FLASH_BACKWARD_PER_FORWARD - BACKWARD_PER_FORWARD) * layer.attn_time
    bwd_flops = BACKWARD_PER_FORWARD * layer.flops + (FLASH_BACKWARD_PER_FORWARD - BACKWARD_PER_FORWARD) * layer.attn_flops
    return StageTerms(compute=t + bwd, recompute=rc, tp_comm=n_tp * tp_coll + tp_framework,
                      cp_comm=cp_pass, ep_all_to_all=a2a, forward=t, backward=bwd + rc,
                      flops=layer.flops + bwd_flops + rc_flops)


def _end_terms(cost: LayerCost, tp_coll: float, n_tp: int) -> StageTerms:
    """The embedding or the output layer: forward + 2x backward, never recomputed."""
    t = cost.time
    return StageTerms(compute=(1 + BACKWARD_PER_FORWARD) * t, tp_comm=n_tp * tp_coll, forward=t,
                      backward=BACKWARD_PER_FORWARD * t, flops=(1 + BACKWARD_PER_FORWARD) * cost.flops)


def stage_terms(model: ModelSpec, cluster: Cluster, plan: Plan) -> tuple[TermsByKind, TimesByKind]:
    """Per-micro-batch terms of one dense layer, one MoE layer, the embedding, the output
    layer and the per-stage constant (pipeline send/recv), and the time each adds. A
    stage's time is linear in them, so every rank shape, virtual-stage count and ZeRO
    stage of a layout shares them (memoised on the plan's :class:`.StageShape`)."""
    shape = stage_shape(plan, cluster.devices_per_node)
    terms = _terms_of_shape(model, cluster.device, shape)
    if plan.finetune == "lora":  # frozen weights: input gradients only; adapter GEMMs (cost/finetune.py)
        terms = lora_stage_terms(model, cluster.device, shape, lora_shape(plan), terms, FLASH_BACKWARD_PER_FORWARD)
    if plan.schedule == "dualpipev":  # overlapped forward+backward pairs hide the all-to-all (cost/pipeline.py)
        terms = hide_all_to_all(*terms, fb_overlap_share(plan.schedule, plan.pp, plan.grad_accum, plan.framework))
    return terms


@memoised
def _terms_of_shape(model: ModelSpec, device: Device, shape: StageShape) -> tuple[TermsByKind, TimesByKind]:
    terms = _compute_stage_terms(model, device, shape)
    return terms, TimesByKind(*(t.time for t in terms))


def _compute_stage_terms(model: ModelSpec, dev: Device, shape: StageShape) -> TermsByKind:
    layer, spans = shape.layer, shape.spans
    tg, tk = spans.tp
    eg, ek = spans.ep
    e = BYTES[layer.dtype]
    tokens = layer.tokens
    rc_full = 1 if shape.recompute == "full" else 0
    dense = layer_forward(model, dev, layer, False) if model.dense_layers else None
    moe = layer_forward(model, dev, layer, True) if model.moe else None
    # tensor parallel: 2 collectives forward and 2 backward per attention block and per
    # dense MLP (a MoE MLP exchanges through the all-to-all instead); full recompute
    # repeats the forward ones
    tp_coll = tp_framework = 0.0
    if layer.tp > 1:
        tp_coll = comm.all_reduce(dev, tokens * model.hidden * e, tg, tk)
        if shape.tp_comm_overlap:
            tp_coll *= 1 - dev.efficiency.tp_overlap
        # host-side DTensor work per layer (forward + backward; full recompute repeats the
        # forward, a third of it)
        tp_framework = dev.efficiency.tp_framework_us_per_layer * 1e-6 * (1 + rc_full * FORWARD_SHARE)
    cp_pass = _cp_exchange_time(model, dev, shape, dense or moe, e, rc_full)  # type: ignore[arg-type]
    # expert parallel all-to-all: dispatch + combine, forward and backward (+ recompute)
    a2a = 0.0
    rc_moe = 1 if rc_full or "moe" in shape.modules else 0  # module "moe" reruns dispatch and combine too
    if layer.ep > 1 and model.moe:
        size = tokens / layer.tp * model.moe.top_k * model.hidden * e
        a2a = 2 * (2 + rc_moe) * comm.all_to_all(dev, size, eg, ek)
    if layer.etp > 1 and model.moe:
        a2a += etp_dispatch_time(model, dev, layer, spans.etp, rc_moe)
    # Interleaving multiplies pipeline traffic by vpp [Narayanan et al. SC'21 sec. 2.2],
    # but Megatron overlaps those transfers with the other chunks' compute
    # (overlap_p2p_comm, on by default with vpp); one send per direction and
    # micro-batch stays on the critical path, as in plain (blocking) 1F1B.
    per_stage = _ZERO
    if shape.pipelined:
        size = tokens * model.hidden * e / (layer.tp if layer.sp else 1)
        per_stage = StageTerms(pp_send_recv=2 * comm.send_recv(dev, size, spans.pp_crosses))
    # per layer: 2 tp collectives per block forward and 2 backward (+2 with full recompute);
    # a MoE layer only its attention block's. A checkpoint that stops early (framework)
    # skips the last GEMM and so the MLP's closing collective: its all-reduce without SP,
    # its reduce-scatter (half the all-reduce-equivalent tp_coll) with SP.
    early = rc_full and FRAMEWORKS[layer.framework].checkpoint_early_stop
    skip_dense = last_gemm(model, dev, layer, False) if early and dense else (0.0, 0.0)
    skip_moe = last_gemm(model, dev, layer, True) if early and moe else (0.0, 0.0)
    n_dense_tp = 2 * (2 + rc_full) - ((0.5 if layer.sp else 1.0) if early else 0.0)
    # Megatron's "mlp" module: the checkpointed MLP (transformer_layer.py _forward_mlp,
    # tensor_parallel.checkpoint of self.mlp) reruns its forward tp collective too
    n_dense_tp += 1 if "mlp" in shape.modules else 0
    # fp8 tensorwise tp under torchao's float8 TP: each block's all-gather (forward, and the
    # gradient's before wo / w2 backward) moves 1-byte elements; its reduce-scatter stays 16-bit.
    # A MoE layer's tp collectives are its attention block's, and torchtitan's apply_non_moe_tp
    # (torchtitan/models/llama4/infra/parallelize.py, 05a6cb3895) gives the attention of *every*
    # block the float8 PrepareModuleInput / colwise / rowwise styles - only the dense MLP's are
    # conditional on ``not transformer_block.moe_enabled`` - so both kinds take the share
    dense_tp = tp_coll * FP8_GATHERED_TP_SHARE if fp8_tp_gathered(layer) else tp_coll
    # Megatron's module-level selective: the recomputed modules' forward (frameworks.selective_modules)
    mods = shape.modules if shape.recompute == "selective" else frozenset()
    rc_dense = (module_recompute_forward(model, dev, layer, False, mods, norm_outputs_freed(model, layer, mods, False),
                                         dense) if mods and dense else None)
    rc_moe_layer = (module_recompute_forward(model, dev, layer, True, mods, norm_outputs_freed(model, layer, mods, True),
                                             moe) if mods and moe else None)
    return add_framework(TermsByKind(
        dense=_layer_terms(dense, shape.recompute, selective_gemm_fraction(model, False), dense_tp, n_dense_tp,
                           tp_framework, cp_pass, 0.0, skip_dense, rc_dense) if dense else _ZERO,
        moe=_layer_terms(moe, shape.recompute, selective_gemm_fraction(model, True), dense_tp, 2 + rc_full,
                         tp_framework, cp_pass, a2a, skip_moe, rc_moe_layer) if moe else _ZERO,
        embedding=_end_terms(embedding_forward(model, dev, layer), tp_coll, 1),
        output=_end_terms(output_forward(model, dev, layer), tp_coll, 2),
        per_stage=per_stage), dev, shape, bool(model.moe))


def _cp_exchange_time(model: ModelSpec, dev: Device, shape: StageShape, layer_cost: LayerCost, e: float,
                      rc_full: int) -> float:
    """Seconds of one layer's context-parallel K/V exchange per micro-batch, forward, backward
    and recompute (0 without cp).

    Context parallel: ring K/V exchange, hidden behind the attention kernel (the same in
    dense and MoE layers). The exchange lives inside the core attention, so recomputing the
    attention reruns the forward exchange: under full recompute, and under Megatron's selective
    core_attn (attention.py ``_checkpointed_attention_forward`` checkpoints
    ``_run_core_attention``, NVIDIA/Megatron-LM d98e8a64dd l.446-497; with cp its
    TEDotProductAttention runs TransformerEngine's AttnFuncWithCPAndKVP2P, whose forward
    sends and receives the K/V chunks: NVIDIA/TransformerEngine d0067d0da6
    transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py l.1356,
    l.1707; the all-gather variant AttnFuncWithCPAndKVAllGather, l.3014, likewise)."""
    layer, spans = shape.layer, shape.spans
    if layer.cp <= 1:
        return 0.0
    rc_attn = 1 if rc_full or "core_attn" in shape.modules else 0
    if FRAMEWORKS[layer.framework].cp_kv_all_gather:
        return _cp_all_gather_time(model, dev, layer, spans.cp, rc_attn)
    kv_width = (model.q_dim + model.attn_out_dim) if model.mla else 2 * model.kv_dim
    hop = comm.send_recv(dev, layer.tokens * kv_width * e / layer.tp, spans.cp_crosses)
    # forward once, backward twice (dK and dV travel back), an attention recompute once
    # more; the device's comm_overlap share of the ring hides behind attention, the rest is serial
    ring, f = (layer.cp - 1) * hop, dev.efficiency.comm_overlap
    return (1 + BACKWARD_PER_FORWARD + rc_attn) * ((1.0 - f) * ring + max(0.0, f * ring - layer_cost.attn_time))


def etp_dispatch_time(model: ModelSpec, dev: Device, layer: LayerShape, span: tuple[int, int], rc_full: int) -> float:
    """Seconds of one MoE layer's expert-tensor-parallel token exchange per micro-batch.

    Each rank's routed tokens (``top_k b s / (cp tp)`` after the ep all-to-all, balanced
    routing) are all-gathered over its etp group before the experts, so every etp rank
    runs its FFN slice on the group's ``etp`` times as many; the outputs are
    reduce-scattered back after them (the partial sums of w2's row-split are summed).
    Backward runs the reverse pair on the gradients; full recompute repeats the forward
    pair. Buffer = the gathered ``etp top_k b s h / (cp tp)`` elements (:mod:`.comm`'s
    all-gather convention), over the etp group's ``span`` (members per node, nodes)
    [Megatron-Core ``MoEAlltoAllTokenDispatcher``: ``gather_from_sequence_parallel_region``
    / ``reduce_scatter_to_sequence_parallel_region`` over the expert tp group]."""
    size = layer.etp * layer.tokens / layer.tp * model.moe.top_k * model.hidden * BYTES[layer.dtype]  # type: ignore[union-attr]
    g, k = span
    return (2 + rc_full) * (comm.all_gather(dev, size, g, k) + comm.reduce_scatter(dev, size, g, k))


def _cp_all_gather_time(model: ModelSpec, dev: Device, layer: LayerShape, span: tuple[int, int],
                        rc_attn: int) -> float:
    """Seconds of one layer's K/V exchange per micro-batch where the framework all-gathers K
    and V over the cp group (:attr:`.frameworks.Framework.cp_kv_all_gather`): one all-gather
    each of K and V forward (again when the attention is recomputed, ``rc_attn``) and one
    reduce-scatter each of their gradients backward, each buffer the gathered ``b s kv_dim / tp`` elements (the whole
    sequence; :mod:`.comm`'s convention), synchronous: nothing overlaps attention [Llama 3
    paper, Dubey et al. 2024, sec. 3.3.2; partita.runtime.context_parallel]."""
    kv_width = (model.q_dim + model.attn_out_dim) if model.mla else 2 * model.kv_dim
    each = layer.tokens * layer.cp * kv_width / 2 * BYTES[layer.dtype] / layer.tp
    g, k = span
    return 2 * ((1 + rc_attn) * comm.all_gather(dev, each, g, k) + comm.reduce_scatter(dev, each, g, k))


def _shape_terms(model: ModelSpec, cluster: Cluster, plan: Plan, shape: RankShape) -> StageTerms:
    """A rank's per-micro-batch terms: its layers, its ends and the per-stage constant."""
    kinds, _ = stage_terms(model, cluster, plan)
    n_moe = shape.n_moe
    n_dense = shape.n_layers - n_moe
    first, last = shape.first, shape.last
    if plan.recompute == "full" and plan.recompute_layers:
        return _partial_terms(model, cluster, plan, shape, kinds)
    return StageTerms(*(n_dense * d + n_moe * m + first * f + last * o + c for d, m, f, o, c in zip(*kinds)))


def _partial_terms(model: ModelSpec, cluster: Cluster, plan: Plan, shape: RankShape, full: TermsByKind) -> StageTerms:
    """A rank's terms when only ``plan.recompute_layers`` layers of each chunk are
    recomputed (Megatron-LM ``--recompute-method block``): those layers (``shape.rc_dense``
    / ``rc_moe``, :func:`.placement.recomputed_layers`) cost what a full-recompute layer does
    (one more forward, its tp/cp/ep exchanges again, the framework's recompute time), the
    others what a layer without recompute does. Every term is per layer, so the rank's
    total is ``rc * full + (n - rc) * none`` per kind of layer; the ends and the per-stage
    constant do not depend on recompute."""
    none, _ = stage_terms(model, cluster, plan.with_(recompute="none", recompute_layers=0))
    n_moe, rc_d, rc_m = shape.n_moe, shape.rc_dense, shape.rc_moe
    n_dense = shape.n_layers - n_moe
    first, last = shape.first, shape.last
    return StageTerms(*(rc_d * d + (n_dense - rc_d) * dn + rc_m * m + (n_moe - rc_m) * mn + first * f + last * o + c
                        for d, m, f, o, c, dn, mn in zip(*full, none.dense, none.moe)))


def _stage_time(model: ModelSpec, cluster: Cluster, plan: Plan, rank: int, shape: RankShape) -> StageTime:
    terms = _shape_terms(model, cluster, plan, shape)
    st = StageTime(rank=rank, parts={STAGE_PARTS["compute"]: terms.compute, STAGE_PARTS["recompute"]: terms.recompute},
                   forward=terms.forward, backward=terms.backward, flops=terms.flops)
    if plan.tp > 1:
        st.parts[STAGE_PARTS["tp_comm"]] = terms.tp_comm
    if plan.cp > 1:
        st.parts[STAGE_PARTS["cp_comm"]] = terms.cp_comm
    if (plan.ep > 1 or plan.etp > 1) and shape.n_moe:
        st.parts[STAGE_PARTS["ep_all_to_all"]] = terms.ep_all_to_all
    if plan.pp > 1:
        st.parts[STAGE_PARTS["pp_send_recv"]] = terms.pp_send_recv
    if plan.zero >= 3:
        st.parts["zero3 gather/scatter"] = _zero3_exposed(model, cluster, plan, shape, terms.compute + terms.recompute)
    return st


def _zero3_exposed(model: ModelSpec, cluster: Cluster, plan: Plan, shape: RankShape, compute: float) -> float:
    """ZeRO-3 per micro-batch: all-gather of the rank's parameters forward and backward
    and reduce-scatter of its gradients (``t``), the overlappable share ``f`` of it
    (``efficiency.comm_overlap``) hidden behind the micro-batch's compute ``C`` (incl.
    recompute) except for the first layer's, plus the host-side framework time per layer.

    Derivation: FSDP prefetches unit ``i + 1``'s gather while unit ``i`` computes (Zhao et
    al. 2023, PyTorch FSDP, sec. 3.4), so of the ``f t`` that can run beside compute only
    the first unit's ``f t / n`` and whatever exceeds the compute, ``max(0, f t - C)``,
    are exposed; the other ``(1 - f) t`` runs on the compute's own cores (gloo on a CPU)
    and adds in full, with FSDP's own copies around the collectives (:func:`_zero3_copy_time`,
    ``k``): ``(1 - f) (t + k) + max(0, f t - C) + f t / n``. ``f = 1`` (accelerators) is the
    fully overlapped form, ``f = 0`` the serial sum ``t + k``. Where ZeRO-3 is torch FSDP2
    (:attr:`.frameworks.Framework.fsdp2_stream_copies`) the share of the copies FSDP2 issues
    on the compute stream itself, ``k_s`` (the all-gather's copy-out forward and backward, the
    reduce-scatter's copy-in: :func:`_zero3_copy_time` with ``stream_only``), is serial on an
    accelerator too: ``+ f k_s`` (at ``f = 0`` it is already in ``t + k``). For Llama-3-8B on
    8 H100 (fp32 reduce) that is 128 GB of HBM traffic, ~55 ms of a ~0.6 s micro-batch."""
    z3 = zero3_shape(plan, cluster.devices_per_node)
    reduce = not full_gradients(plan)
    lora = plan.finetune == "lora"  # every weight gathered, the adapters' gradients reduced (cost/finetune.py)
    t = _zero3_traffic(model, cluster.device, shape, z3, reduce and not lora)
    copies = _zero3_copy_time(model, cluster.device, shape, z3, reduce and not lora)
    if lora and reduce:
        dense, expert = rank_adapter_params(model, plan, shape)
        gb = grad_bytes(z3.dtype, z3.grad_dtype)
        t += grad_reduce(cluster.device, dense * gb, z3.dp_span, z3.replica_span) + (
            grad_reduce(cluster.device, expert * gb, z3.expert_dp_span, z3.replica_span) if expert else 0.0)
    eff = cluster.device.efficiency
    f = eff.comm_overlap
    serial = (1.0 - f) * (t + copies) if f < 1.0 else 0.0
    if FRAMEWORKS[plan.framework].fsdp2_stream_copies:
        serial += f * _zero3_copy_time(model, cluster.device, shape, z3, reduce and not lora, True)
    # plus the host-side FSDP work per layer (hooks, gather/scatter launches), not overlapped
    framework = shape.n_layers * eff.zero3_framework_us_per_layer * 1e-6
    return serial + max(0.0, f * t - compute) + f * t / max(shape.n_layers, 1) + framework


@memoised
def _zero3_copy_time(model: ModelSpec, device: Device, rank: RankShape, shape: Zero3Shape,
                     reduce: bool = True, stream_only: bool = False) -> float:
    """Seconds of FSDP2's copies around one micro-batch's gathers and reduce-scatters, at the
    device's element-wise bandwidth (what ``partita calibrate`` measures with a clone).

    Per shard group of ``n`` holding ``S`` bytes of working weights and ``G`` of gradients
    (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, torch 2.4+): each all-gather
    copies the local shard into the send buffer (``S / n`` read and written) and splits the
    gathered buffer into the parameters (``S`` read and written), forward and again backward;
    the reduce-scatter packs the gradients into its input (``G`` read and written) and
    accumulates the received shard (``G / n``): ``2 (2 S / n + 2 S) + 2 G + 2 G / n`` bytes.
    ``stream_only``: the part FSDP2 runs on the compute stream, ``2 (2 S) + 2 G`` (copy-out and
    reduce-scatter copy-in; :data:`.frameworks._FSDP2_COPIES`)."""
    dense, expert = shape_params(model, rank, shape.params)
    w = _working_weight_bytes(shape.dtype)
    gb = grad_bytes(shape.dtype, shape.grad_dtype) if reduce else 0

    def moved(params: float, span: tuple[int, int]) -> float:
        n = span[0] * span[1]
        s, g = params * w, params * gb
        if stream_only:
            return 2 * (2 * s) + 2 * g
        return 2 * (2 * s / n + 2 * s) + 2 * g + 2 * g / n
    total = moved(dense, shape.dp_span) + (moved(expert, shape.expert_dp_span) if expert else 0.0)
    return total / (device.hbm_tbps * 1e12 * device.efficiency.memory_bandwidth)


@memoised
def _zero3_traffic(model: ModelSpec, device: Device, rank: RankShape, shape: Zero3Shape,
                   reduce: bool = True) -> float:
    """Seconds of one micro-batch's ZeRO-3 collectives: all-gather of the 16-bit weights
    forward and again backward, and (``reduce``: sharded gradient accumulation, the
    default) the reduce-scatter of its gradients. Unsharded accumulation reduces once per
    step instead (:func:`_grad_reduce_once`)."""
    dev = device
    dense, expert = shape_params(model, rank, shape.params)
    g, k = shape.dp_span
    w = _working_weight_bytes(shape.dtype)
    gb = grad_bytes(shape.dtype, shape.grad_dtype) if reduce else 0
    t = 2 * comm.all_gather(dev, dense * w, g, k) + grad_reduce(dev, dense * gb, shape.dp_span, shape.replica_span)
    if expert:
        eg, ek = shape.expert_dp_span
        t += 2 * comm.all_gather(dev, expert * w, eg, ek) + grad_reduce(dev, expert * gb, shape.expert_dp_span,
                                                                        shape.replica_span)
    return t


def grad_reduce(dev: Device, size: float, shard: tuple[int, int], replica: tuple[int, int]) -> float:
    """Seconds to reduce ``size`` gradient bytes into the shards: reduce-scatter within the
    shard group and, with HSDP, all-reduce of the ``size / shard`` result across the
    replica groups (FSDP2 on a 2-D mesh: ``foreach_reduce`` reduce-scatters over the shard
    dim, then all-reduces over the replicate dim; Zhao et al. 2023, PyTorch FSDP, sec.
    3.2.2 - the same bytes as one flat reduce-scatter inside the group plus a 1/shard
    all-reduce across, so the slow inter-group links carry only the shard)."""
    g, k = shard
    t = comm.reduce_scatter(dev, size, g, k)
    rg, rk = replica
    if rg * rk > 1:
        t += comm.all_reduce(dev, size / (g * k), rg, rk)
    return t


def param_broadcast_calls(plan: Plan, members: int) -> int:
    """Collective calls zero 1/2's parameter sync makes beyond one all-gather: ``members - 1``
    when the framework broadcasts each owner's shard on its own
    (:attr:`.frameworks.Framework.param_broadcast_per_owner`), else 0.

    Derivation: a ring broadcast of ``S / n`` bytes from each of the ``n`` owners moves, per
    rank, the ``(n - 1) / n * S`` bytes of one ring all-gather of ``S`` (Thakur et al. 2005
    sec. 4: all-gather = n pipelined broadcasts), so the bytes are the all-gather's and only
    the calls differ: ``n`` instead of one, each paying the device's fixed per-call cost
    (``efficiency.collective_call_us``: launch, ring set-up across the group, wait). The cost
    therefore grows linearly with the shard group - the InternLM rows' step grows ~2.8 ms per
    zero1 rank (7B, 8 -> 1024 A100: +0.2 -> +3.4 s over compute) while with zero1=8 it stays
    flat. Known gap: the per-call cost is one fitted constant per device (bench/fit.py), not a
    function of the group's span."""
    return members - 1 if members > 1 and FRAMEWORKS[plan.framework].param_broadcast_per_owner else 0


def _param_sync_time(model: ModelSpec, dev: Device, plan: Plan, shape, sizes: tuple[float, float],
                     span: tuple[int, int], expert_span: tuple[int, int]) -> float:
    """Zero 1/2's sync of the updated weights (``sizes``: dense and expert bytes): an
    all-gather over each shard group, plus the extra calls of a framework that broadcasts per
    owner (:func:`param_broadcast_calls`) or per parameter tensor (Partita's ZeRO-1: the same
    bytes, one broadcast call's latency per further tensor)."""
    g, k = span
    t = comm.all_gather(dev, sizes[0], g, k) + comm.all_gather(dev, sizes[1], *expert_span)
    t += param_broadcast_calls(plan, g * k) * dev.efficiency.collective_call_us * 1e-6
    if plan.zero == 1 and FRAMEWORKS[plan.framework].param_broadcast_per_tensor and g * k > 1:
        t += (param_tensors(model, plan, shape) - 1) * comm.broadcast_call_latency(dev, g, k)
    return t


def _exposed_behind(t: float, window: float, n_layers: int, overlap: float) -> float:
    """Exposed seconds of ``t`` of data-parallel traffic issued layer by layer behind a
    ``window`` of compute: the share ``1 - overlap`` the device cannot run beside compute
    (``efficiency.comm_overlap``; gloo on the compute's own cores hides none) is serial; of the
    rest, the last layer's share is always exposed and what outlasts the window too (PyTorch
    DDP / Megatron's bucketed overlap: Li et al. 2020, PyTorch Distributed, sec. 3.2.3)."""
    hidden = overlap * t
    return (t - hidden) + max(hidden / n_layers, hidden - window)


def _exposed_by_chunk(t: float, window: float, n_layers: int, overlap: float, vpp: int, group: int) -> float:
    """Exposed seconds of ``t`` of data-parallel traffic when the rank holds ``vpp`` model
    chunks of an interleaved pipeline, each chunk's share synchronised on its own
    (``window``: one chunk's backward - or forward - of one micro-batch; ``group``:
    micro-batches per chunk in a row). With ``vpp`` 1 it is :func:`_exposed_behind`.

    Megatron-Core's interleaved schedule (``forward_backward_pipelining_with_interleaving``,
    megatron/core/pipeline_parallel/schedules.py, NVIDIA/Megatron-LM 00611e6eeb) keeps grad
    sync disabled until a chunk's last micro-batch: ``backward_step_helper_preprocess`` calls
    ``enable_grad_sync()`` when ``is_last_microbatch_for_model_chunk`` (or, with
    ``align_grad_reduce``, ``grad_sync_func[chunk]`` right after it), so each chunk's buckets are
    reduced as soon as that chunk's own last backward is done, not after the whole rank's.
    The schedule table runs ``microbatch_group_size_per_vp_stage`` (default ``pp``) micro-batches
    of a chunk in a row and backward visits the chunks last to first, so after chunk ``j``'s
    last backward ``j * group`` chunk-backwards of the other chunks remain to hide it. The
    reductions share one communication stream, so chunk ``j`` (and the ``j`` chunks still to
    come: ``(j + 1) / vpp`` of the hidden traffic) must fit in ``(j group + 1)`` windows; the
    exposed part is the worst such overflow. The parameter all-gather mirrors it in forward
    (``param_sync_func`` of chunks 0 and 1 at the start, of chunk ``j + 1`` with chunk ``j``'s
    first micro-batch in ``forward_step_helper_preprocess``): chunk ``j``'s weights are due
    ``j group`` chunk-forwards in. The serial share ``1 - overlap`` stays exposed."""
    if vpp <= 1:
        return _exposed_behind(t, window, n_layers, overlap)
    hidden = overlap * t
    overflow = max((j + 1) * hidden / vpp - (j * group + 1) * window for j in range(vpp))
    return (t - hidden) + max(hidden / n_layers, overflow)


def _exposed_in_plan(t: float, window: float, n_layers: int, dev: Device, plan: Plan) -> float:
    """:func:`_exposed_by_chunk` with the plan's chunks and Megatron's default
    ``microbatch_group_size_per_vp_stage`` (``pp``, at most the micro-batch count). DualPipeV's
    two chunks per rank run in a V, not Megatron's table: pooled as one, the rule before."""
    chunks = plan.vpp if plan.schedule != "dualpipev" else 1
    group = max(1, min(plan.pp, plan.grad_accum))
    return _exposed_by_chunk(t, window, n_layers, dev.efficiency.comm_overlap, chunks, group)


def _ddp_wraps(plan: Plan) -> bool:
    """Whether Partita's runtime wraps the model in DDP (zero 0, no tp / pp / ep), the only
    case its gradient reduction overlaps the backward: the condition of
    ``partita.runtime.parallelize._apply_data_parallel`` (kept here, torch-free, for the planner)."""
    return plan.zero == 0 and plan.tp == 1 and plan.pp == 1 and plan.ep == 1


def param_tensors(model: ModelSpec, plan: Plan, shape) -> int:
    """Parameter tensors a pipeline stage holds as Partita's reference models define them
    (:mod:`partita.models.llama`): per layer two norms (LayerNorm: weight and bias), the
    four attention projections (+3 q/k/v biases, +2 q/k norms), the MLP's two or three
    projections (+ biases) or, in a MoE layer, the router, the stacked experts' two or
    three tensors and the shared expert's; the first stage adds the embedding (and learned
    positions), the last the final norm and (untied) output projection. Checked against
    ``named_parameters()`` of the reference models (tests/test_cost_formulas.py)."""
    norm = 2 if model.norm == "layernorm" else 1
    mats = 3 if model.gated else 2
    mlp = mats * (2 if model.mlp_bias else 1)
    attn = 4 + (3 if model.qkv_bias else 0) + (1 if model.out_bias else 0) + (2 * norm if model.qk_norm else 0)
    moe_layer = 0
    if model.moe:
        moe_layer = 1 + mats + (mlp if model.moe.shared_experts else 0)
    dense_layers = shape.n_layers - shape.n_moe
    n = dense_layers * (2 * norm + attn + mlp) + shape.n_moe * (2 * norm + attn + moe_layer)
    if shape.first:
        n += 1 + (1 if model.position == "learned" else 0) + (norm if model.embedding_norm else 0)
    if shape.last:
        n += norm + (0 if model.tied_embeddings and plan.pp == 1 else 1)
    return max(n, 1)


def _param_gather_overlaps(plan: Plan) -> bool:
    """Whether zero 1/2's all-gather of the updated weights overlaps the next forward: the
    plan asks for it and its framework can (DeepSpeed ZeRO-1/2 gathers at the end of the
    optimizer step, :mod:`.frameworks`)."""
    return plan.overlap_param_gather and FRAMEWORKS[plan.framework].param_gather_overlap


def _working_weight_bytes(dtype: str) -> int:
    """Bytes per weight gathered / broadcast: the 16-bit working copy (fp32 training: fp32)."""
    return 4 if dtype == "fp32" else 2


def step_time_lower_bound(model: ModelSpec, cluster: Cluster, plan: Plan, after: float | None = None,
                          terms: tuple[TermsByKind, TimesByKind] | None = None) -> float:
    """A cheap lower bound of :func:`estimate_step_time` for ``plan``: every rank's
    per-micro-batch time through the pipeline, plus the floor of what follows it
    (:func:`_after_pipeline_bound`: the sharded optimizer step and the tied-embedding
    sync; the data-parallel gradient sync, >= 0, is left out). The pipeline time is
    monotone in every stage's time, and more recompute or ZeRO-3 only add terms, so the
    bound at ``recompute="none"`` and zero <= 2 holds for every setting of the layout.
    The search ranks layouts by it and skips the ones that cannot beat what it has
    already found. ``after``: :func:`after_pipeline_bound` of the plan when the caller
    has it (the same for every recompute and ZeRO setting of a layout); ``terms``:
    :func:`stage_terms` of the plan when the caller has it."""
    kinds, (dense, moe, emb, out, const) = stage_terms(model, cluster, plan) if terms is None else terms
    total = slowest = 0.0
    # zero 3: only the rank's compute + recompute of _shape_terms is needed (the same sums)
    whole = plan.zero >= 3 and not (plan.recompute == "full" and plan.recompute_layers)
    for _, shape, count in distinct_shapes(model, plan):
        t = (shape.n_layers - shape.n_moe) * dense + shape.n_moe * moe + shape.first * emb + shape.last * out + const
        if plan.zero >= 3:
            if whole:
                compute = _rank_sum(kinds, shape, 0) + _rank_sum(kinds, shape, 1)
            else:
                terms = _shape_terms(model, cluster, plan, shape)
                compute = terms.compute + terms.recompute
            t += _zero3_exposed(model, cluster, plan, shape, compute)
        total += count * t
        slowest = max(slowest, t)
    if after is None:
        after = _after_pipeline_bound(model, cluster, plan)
    hidden = plan.grad_accum * hidden_send_bound(plan.framework, plan.schedule, plan.pp,
                                                 _one_send(kinds.per_stage, cluster.device))
    return pipeline_time_of(total, slowest, plan.grad_accum, plan.vpp, plan.schedule) - hidden + after


def _rank_sum(kinds: TermsByKind, shape: RankShape, index: int) -> float:
    """One field (by index) of :func:`_shape_terms` (no partial recompute), alone: the same sum in
    the same order, so the same float."""
    n_moe = shape.n_moe
    return ((shape.n_layers - n_moe) * kinds.dense[index] + n_moe * kinds.moe[index]
            + shape.first * kinds.embedding[index] + shape.last * kinds.output[index] + kinds.per_stage[index])


def async_send(model: ModelSpec, cluster: Cluster, plan: Plan) -> float:
    """One pipeline send's time per micro-batch (half the per-stage ``pp_send_recv``) where the
    framework's sends only delay their receiver (:data:`.pipeline.ASYNC_P2P_FRAMEWORKS` under
    1F1B / interleaved 1F1B, :func:`.pipeline.async_p2p_period`); 0 where they block."""
    if not hidden_send_bound(plan.framework, plan.schedule, plan.pp, 1.0):
        return 0.0
    return _one_send(stage_terms(model, cluster, plan)[0].per_stage, cluster.device)


def _one_send(per_stage: StageTerms, dev: Device) -> float:
    """One send of the per-stage constant: its ``pp_send_recv`` holds two sends and the
    runtime's host time per micro-batch (``pp_framework_us_per_microbatch``, cost/overheads.py
    ``add_framework``), which is the stage's own work and never hidden."""
    return max(0.0, per_stage.pp_send_recv - dev.efficiency.pp_framework_us_per_microbatch * 1e-6) / 2


def after_pipeline_bound(model: ModelSpec, cluster: Cluster, plan: Plan) -> float:
    """:func:`_after_pipeline_bound`: it reads neither ``plan.recompute`` nor ``plan.zero``
    (the optimizer step is bounded on the sharded states, the tied-embedding sync does
    not shard), so the search computes it once per layout."""
    return _after_pipeline_bound(model, cluster, plan)


def _after_pipeline_bound(model: ModelSpec, cluster: Cluster, plan: Plan) -> float:
    """What every setting of the layout adds after the pipeline, at least: the optimizer
    step on the sharded states (zero 0 holds more, so this is a floor for every stage)
    on the rank holding the most parameters, and the tied-embedding sync. The gradient
    sync is left out (its exposed part depends on recompute and the ZeRO stage)."""
    dev = cluster.device
    worst = 0.0
    dense_shard, expert_shard = state_shard(plan), expert_state_shard(plan)
    for _, shape, _ in distinct_shapes(model, plan):
        dense, expert = trained_shape_params(model, plan, shape)
        worst = max(worst, ADAM_STEP_BYTES_PER_PARAM * (dense / dense_shard + expert / expert_shard))
    t = worst / dev.optimizer_bytes_per_s()
    if model.tied_embeddings and plan.pp > 1:
        size = model.vocab * model.hidden / plan.tp * _grad_bytes(plan)
        same_node = group_span(plan, "pp", cluster.devices_per_node)[1] == 1
        t += comm.all_reduce(dev, size, *((2, 1) if same_node else (1, 2)))
    return t


def zero2_accumulation_floor(model: ModelSpec, cluster: Cluster, plan: Plan) -> float:
    """What ZeRO-2's per-micro-batch reduce-scatters (sharded accumulation) add to the
    step at least, whatever the recompute setting: ``(m - 1) max(0, t_rs - window)`` with
    the widest window (full recompute: forward, recomputed forward and backward), on the
    worst rank shape; 0 unless the plan is ZeRO-2 with sharded accumulation. The search
    adds it to a ZeRO-2 setting's lower bound."""
    if plan.zero != 2 or full_gradients(plan) or plan.grad_accum <= 1 or not plan.overlap_grad_reduce:
        return 0.0
    dev, dpn = cluster.device, cluster.devices_per_node
    span, espan, rspan = shard_span(plan, dpn), expert_dp_span(plan, dpn), replica_span(plan, dpn)
    widest = plan.with_(recompute="full", recompute_layers=0)
    worst = 0.0
    for _, shape, _ in distinct_shapes(model, plan):
        dense, expert = trained_shape_params(model, plan, shape)
        t_rs = grad_reduce(dev, dense * _grad_bytes(plan), span, rspan) + grad_reduce(dev, expert * _grad_bytes(plan), espan, rspan)
        terms = _shape_terms(model, cluster, widest, shape)
        worst = max(worst, (plan.grad_accum - 1) * max(0.0, t_rs - (terms.forward + terms.backward) / plan.vpp))
    return worst


def _pipeline_parts(stages: list[StageTime], m: int, plan: Plan, send: float) -> tuple[float, StageTime, dict]:
    """The pipeline's time, its slowest stage and the step parts it accounts for: the slowest
    stage's parts times ``m`` and the bubble; with sends that only delay their receiver
    (``send`` > 0, :func:`.pipeline.async_p2p_period`) the exposed send time is what the
    steady-state period adds to the slowest stage's own work."""
    per_mb = [s.total for s in stages]
    pipe = pipeline_time(per_mb, m, plan.vpp, plan.schedule, send)
    slowest = max(stages, key=lambda s: s.total)
    parts = {k: v * m for k, v in slowest.parts.items()}
    if plan.pp > 1:
        steady = m * slowest.total
        if send:
            period = async_p2p_period(per_mb, send)
            # the transfer the period exposes, plus the runtime's host time the stage's part holds
            # (pp_framework_us_per_microbatch, never hidden: _one_send takes it out of ``send``)
            held = slowest.parts.get(STAGE_PARTS["pp_send_recv"], 0.0)
            parts[STAGE_PARTS["pp_send_recv"]] = m * (period - slowest.total + held)
            steady = m * period
        parts["pipeline bubble"] = pipe - steady
    return pipe, slowest, parts


def estimate_step_time(model: ModelSpec, cluster: Cluster, plan: Plan) -> StepTime:
    dev, dpn = cluster.device, cluster.devices_per_node
    stages = []
    seen: dict[tuple, StageTime] = {}
    shapes = rank_shapes(model, plan)
    for r, shape in enumerate(shapes):
        key = (shape.n_layers, shape.n_moe, shape.first, shape.last, shape.rc_dense, shape.rc_moe)
        if key not in seen:
            seen[key] = _stage_time(model, cluster, plan, r, shape)
        st = seen[key]
        stages.append(st if st.rank == r else StageTime(rank=r, parts=st.parts, flops=st.flops,
                                                        forward=st.forward, backward=st.backward))
    m = plan.grad_accum
    pipe, slowest, parts = _pipeline_parts(stages, m, plan, async_send(model, cluster, plan))

    # data-parallel gradient sync and optimizer, on the rank holding the most parameters
    worst_dp, worst_opt = 0.0, 0.0
    fw = FRAMEWORKS[plan.framework]
    g, k = shard_span(plan, dpn)  # HSDP: the shard group (zero 0/1 never run HSDP)
    eg, ek = expert_dp_span(plan, dpn)
    rspan = replica_span(plan, dpn)
    w_bytes = _working_weight_bytes(plan.dtype)
    done: set[tuple] = set()
    for st in stages:
        shape = shapes[st.rank]
        key = (shape.n_layers, shape.n_moe, shape.first, shape.last, shape.rc_dense, shape.rc_moe)
        if key in done:
            continue
        done.add(key)
        dense, expert = trained_shape_params(model, plan, shape)  # LoRA: the adapters only
        t_rs = t_ag = t_psgd = 0.0
        rs = grad_reduce(dev, dense * _grad_bytes(plan), (g, k), rspan) + grad_reduce(dev, expert * _grad_bytes(plan), (eg, ek), rspan)
        if plan.zero == 0 or (plan.zero == 1 and fw.zero1_grad_all_reduce):
            # grad_compression (PowerSGD, zero 0 only) shrinks the bytes and adds its own work
            f, t_psgd = compression.reduce_terms(model, dev, plan, dense + expert, shape) if plan.zero == 0 else (1.0, 0.0)
            t_rs = comm.all_reduce(dev, f * dense * _grad_bytes(plan), g, k) + comm.all_reduce(
                dev, f * expert * _grad_bytes(plan), eg, ek)
        elif plan.zero in (1, 2):
            t_rs = rs
        elif full_gradients(plan):
            t_rs = rs  # zero 3, unsharded accumulation: one reduce-scatter per step
        if plan.zero in (1, 2):
            t_ag = _param_sync_time(model, dev, plan, shape, (dense * w_bytes, expert * w_bytes), (g, k), (eg, ek))
        n_layers = max(shape.n_layers, 1)
        bwd_window = st.backward / plan.vpp
        fwd_window = st.forward / plan.vpp
        overlaps = plan.overlap_grad_reduce and not (fw.grad_overlap_needs_ddp and not _ddp_wraps(plan))
        exp_rs = _exposed_in_plan(t_rs, bwd_window, n_layers, dev, plan) if overlaps else t_rs
        if plan.zero == 2 and not full_gradients(plan) and plan.overlap_grad_reduce:
            # sharded accumulation: every micro-batch reduce-scatters into the shard (m times
            # the traffic); each of the first m - 1 runs behind its own backward and the next
            # micro-batch's forward (another stream), so only what exceeds both is exposed;
            # the last one is exposed as above
            exp_rs += (plan.grad_accum - 1) * max(0.0, t_rs - bwd_window - fwd_window)
        elif plan.zero == 2 and not full_gradients(plan):
            exp_rs *= plan.grad_accum  # not overlapped: every micro-batch's reduce-scatter waits
        exp_ag = _exposed_in_plan(t_ag, fwd_window, n_layers, dev, plan) if _param_gather_overlaps(plan) else t_ag
        worst_dp = max(worst_dp, exp_rs + exp_ag + t_psgd)  # PowerSGD's GEMMs share the compute stream
        shard_dense = dense / state_shard(plan) if plan.zero >= 1 else dense
        shard_expert = expert / expert_state_shard(plan) if plan.zero >= 1 else expert
        opt_bytes = ADAM_STEP_BYTES_PER_PARAM * (shard_dense + shard_expert)
        worst_opt = max(worst_opt, opt_bytes / dev.optimizer_bytes_per_s())
    parts["dp gradient sync"] = worst_dp
    parts["optimizer step"] = worst_opt
    if model.tied_embeddings and plan.pp > 1:
        # the first and the last stage all-reduce the tied weight's gradient: a 2-member
        # group, on one node only when the whole pipeline group is (row-major mesh, pp outermost)
        size = model.vocab * model.hidden / plan.tp * _grad_bytes(plan)
        same_node = group_span(plan, "pp", dpn)[1] == 1
        parts["tied embedding sync"] = comm.all_reduce(dev, size, *((2, 1) if same_node else (1, 2)))
    step = pipe + sum(v for key, v in parts.items() if key in ("dp gradient sync", "optimizer step", "tied embedding sync"))
    return StepTime(step=step, parts={k: v for k, v in parts.items() if v > 0}, stages=stages)
