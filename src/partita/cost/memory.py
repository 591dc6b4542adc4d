"""Per-rank memory: weights, gradients, optimizer states, activations, buffers, overhead.

Model states (Rajbhandari et al. 2020, ZeRO sec. 3; Megatron-LM distributed optimizer),
bytes per parameter with mixed precision and Adam:

==========  =========================  ======================================
component   bytes                      sharded over the data-parallel group at
==========  =========================  ======================================
weights     2 (bf16/fp16; fp32: 4)     zero 3
gradients   4 (fp32 main grads) or 2   zero 2 and 3 (unless accumulated unsharded)
optimizer   12 (fp32 master + m + v);  zero 1, 2 and 3
            fp32 training: 8 (m + v)
==========  =========================  ======================================

fp8 training keeps bf16 weights and adds an fp8 copy and its transpose (2 bytes).
Dense weights are sharded over dp x cp ranks; routed-expert weights over the expert
data-parallel group ``edp = dp*cp*tp/(ep*etp)``. A rank holds ``E / ep`` routed experts,
each ``1 / etp`` of it (Megatron-Core expert tensor parallel: w1/w3 split by columns, w2
by rows), so its expert parameters are ``E p_e / (ep*etp)``; the ``ep*etp*edp = tp*cp*dp``
ranks of a stage hold every expert shard ``edp`` times [MoE parallel folding, Liu et al.
2025, arXiv:2504.14960, sec. 3].

Activations per layer and micro-batch follow Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", sec. 4.1, which gives
``sbh(34 + 5as/h)`` bytes for GPT with 16-bit activations), generalised term by term:
with flash attention the ``5as/h`` score terms are never stored (the kernel keeps the
output and a log-sum-exp); GQA shrinks K and V to ``kv_dim``; a gated MLP stores its
two input projections and the product (``3f``), a plain one the pre- and
post-activation (``2f``); dropout masks (1 byte) only where the model has dropout.
Terms inside the tensor-parallel region are divided by ``tp``; the rest (norm inputs,
residual-stream tensors) only with sequence parallel. Full recompute keeps each layer's
input only; with ``plan.recompute_layers`` N only the first N layers of each stage/chunk
do, the others keep everything (:func:`_partial_layers`, linear in N:
:func:`least_recompute_layers` solves it for a memory limit).

The last rank's loss phase holds the logits and what the framework's loss makes of them
(:func:`loss_bytes_per_logit`: 6 bytes per logit for Megatron's fused cross-entropy, 4 for
torchtitan's compiled loss, 12 for an eager ``F.cross_entropy(logits.float())``, measured
with torch's allocator events). Under FSDP2 the caching allocator also keeps the largest
flat all-gather buffer reserved on its own stream (:func:`fsdp_stream_pool`), which
``max_memory_reserved`` counts and ``max_memory_allocated`` does not.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import math
from functools import lru_cache
from typing import NamedTuple

from ..plan import Plan
from ..spec.hardware import Device
from ..spec.model import ModelSpec
from .compression import state_bytes, wire_count
from .compute import BYTES, FP32_BYTES
from .frameworks import FRAMEWORKS
from .memo import memoised
from .pipeline import in_flight_chunks
from .shape import LayerShape, ParamShape, layer_shape, param_shape

GIB = 1024 ** 3


def memory_limit_gib(device: Device, headroom: float, cap_gib: float | None = None) -> float:
    """The memory a plan may use per device (GiB): the device's usable memory less the
    ``headroom`` fraction kept free for spikes the model does not see, and at most
    ``cap_gib`` when given. The search keeps ``SearchSpace.memory_headroom`` (5 %) free;
    ``partita estimate`` reports against the whole usable memory (headroom 0)."""
    limit = device.usable_gib * (1 - headroom)
    if cap_gib:
        limit = min(limit, cap_gib)
    return limit


def fits(peak_bytes: float, limit_gib: float) -> bool:
    """The one meaning of "fits": the peak of the most loaded rank, allocator slack and
    runtime reservation included (:func:`peak_memory`), is within ``limit_gib``
    (:func:`memory_limit_gib`)."""
    return peak_bytes / GIB <= limit_gib


def grad_bytes(dtype: str, grad_dtype: str) -> int:
    """Bytes per main-gradient element: fp32 unless both training and gradients are 16-bit."""
    return FP32_BYTES if grad_dtype == "fp32" or dtype == "fp32" else 2


def _grad_bytes(plan: Plan) -> int:
    return grad_bytes(plan.dtype, plan.grad_dtype)


def state_shard(plan: Plan) -> int:
    """Ranks one copy of the sharded model states is spread over (ZeRO / FSDP): the
    data-parallel x context-parallel group, or with HSDP (``0 < dp_shard < dp``) only the
    ``dp_shard x cp`` ranks of one shard group - each of the ``dp / dp_shard`` groups
    holds a full copy [FSDP2 on a 2-D (replicate, shard) mesh; Zhao et al. 2023, PyTorch
    FSDP, sec. 3.2.2 "hybrid sharding"; torchtitan ``dp_shard`` x ``dp_replicate``]."""
    shard = plan.dp_shard if 0 < plan.dp_shard < plan.dp else plan.dp
    return shard * plan.cp


def expert_state_shard(plan: Plan) -> int:
    """Ranks one copy of a rank's routed-expert shard's states is spread over: the expert
    data-parallel group ``shard x tp / (ep*etp)`` - the ranks holding the same experts and
    the same etp slice of them (Megatron-Core's expert data parallel, ``edp = world /
    (etp*ep*pp)``, megatron/core/parallel_state.py; torchtitan's ``efsdp = dp_shard * cp *
    tp / ep``). With etp = 1 the group of the layout before expert tensor parallel."""
    return max(1, state_shard(plan) * plan.tp // (plan.ep * plan.etp))


def model_state_bytes(plan: Plan, params: float, shard: int) -> dict[str, float]:
    """Weights, gradients and optimizer bytes for ``params`` parameters sharded ``shard`` ways.

    zero 0-2 (Megatron-style): bf16 working weights (2), main gradients (4 fp32, or 2),
    fp32 master + Adam m, v (12), the last sharded from zero 1 and the gradients from
    zero 2. zero 3 (FSDP2 mixed precision / ZeRO-3): the sharded fp32 parameter *is* the
    master copy, so 4 (weights) + 4 (fp32 gradients, or 2) + 8 (m, v), all sharded; the
    bf16 copy exists only for gathered layers (counted in ``zero3 gathered layers``).
    fp8 (Transformer Engine style) caches an fp8 copy of each weight (1 byte) across
    micro-batches; the transpose is made per GEMM. Frameworks that cast per GEMM keep no
    copy (:func:`fp8_weight_cache`).
    """
    weights, grads, optimizer = _state_bytes(plan.dtype, _grad_bytes(plan), plan.zero, params, shard,
                                             full_gradients(plan), _autocast(plan), fp8_weight_cache(plan))
    return {"weights": weights, "gradients": grads, "optimizer": optimizer}


def full_gradients(plan: Plan) -> bool:
    """Whether a ZeRO-2/3 rank holds the whole (unsharded) gradient: with
    ``grad_accum_mode="unsharded"`` and more than one micro-batch the gradients accumulate
    unreduced until the last micro-batch (FSDP2 ``set_requires_gradient_sync(False)``
    on the others; DeepSpeed ZeRO-2 without ``reduce_scatter`` per micro-batch), so the
    full gradient is held; the default ``sharded`` mode reduce-scatters every micro-batch
    into the shard (plan.py, ``grad_accum_mode``)."""
    return plan.grad_accum_mode == "unsharded" and plan.grad_accum > 1


def _autocast(plan: Plan) -> bool:
    """Whether the plan's framework trains zero 0 under autocast over fp32 parameters
    (:attr:`.frameworks.Framework.zero0_autocast`)."""
    return plan.zero == 0 and FRAMEWORKS[plan.framework].zero0_autocast


#: Frameworks whose fp8 training keeps an fp8 copy of every weight between micro-batches
#: (:func:`fp8_weight_cache`).
FP8_WEIGHT_CACHE = frozenset({"megatron", "mindspeed", "deepspeed"})


def fp8_weight_cache(plan: Plan) -> bool:
    """Whether an fp8 plan keeps a 1-byte fp8 copy of each weight in memory.

    Transformer Engine (Megatron-LM, MindSpeed's fp8 path, Megatron-DeepSpeed) casts each
    weight to fp8 on the first micro-batch and reuses the cached copy on the others
    (``is_first_microbatch``, transformer_engine/pytorch/module/linear.py; ``fp8_model_params``
    off): 1 byte per parameter held. torchao's ``Float8Linear`` (torchtitan's float8 / mxfp8
    converters, and partita's runtime) scales and casts the weight inside every forward and
    backward GEMM (torchao/float8/float8_linear.py; with FSDP2 float8 all-gather the cast
    shard is the all-gather input, freed with it), so nothing persists. The published
    torchtitan pairs agree: the same run in bf16 and with float8 linears peaks within
    0.5 GiB (47.65 / 47.77 / 47.79 GiB on H100, 39.09 / 39.07 / 39.32 on MI300X, 33.71 /
    33.38 / 33.88 on B200, 28.07 / 28.07 under full AC: published_runs.csv, torchao rows),
    where a cached copy of Llama-3-8B sharded 8 ways would add 0.93 GiB."""
    return plan.framework in FP8_WEIGHT_CACHE


def _state_bytes(dtype: str, grad_b: int, z: int, params: float, shard: int,
                 full_grads: bool = False, autocast: bool = False,
                 fp8_cache: bool = True) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes of :func:`model_state_bytes` (the search's hot
    path); ``full_grads``: the gradients are held unsharded (:func:`full_gradients`);
    ``autocast`` (zero 0 only): fp32 parameters cast per op by torch.autocast, so fp32
    weights (4), fp32 gradients (4, the parameters' own ``.grad``) and AdamW m, v (8)."""
    if autocast and z == 0:
        return params * 4, params * 4, params * 8
    if dtype == "fp32" or z >= 3:
        weight_b, opt_b = 4, 8
    else:
        weight_b, opt_b = 2, 12
    weights = params * weight_b / (shard if z >= 3 else 1)
    if z == 2 and dtype == "fp32":
        # FSDP2 zero 2 (reshard_after_forward=False) keeps the gathered fp32 parameters
        # from forward to backward besides the fp32 shard the optimizer updates;
        # DeepSpeed ZeRO-2 likewise keeps the full fp32 parameters and an fp32 copy of its
        # partition (``single_partition_of_fp32_groups``). (16-bit: that shard is the
        # master copy already counted in the 12 optimizer bytes.)
        weights += params * 4 / shard
    if dtype == "fp8" and fp8_cache:
        weights += params * 1 / (shard if z >= 3 else 1)
    grads = params * grad_b / (shard if z >= 2 and not full_grads else 1)
    optimizer = params * opt_b / (shard if z >= 1 else 1)
    return weights, grads, optimizer


def activation_bytes_per_layer(model: ModelSpec, plan: Plan, moe: bool, recompute: str | None = None) -> float:
    """Bytes one layer keeps for backward, per micro-batch, on one rank; ``recompute``
    overrides the plan's mode (:func:`activation_bytes` for the plan's layer shape)."""
    return activation_bytes(model, layer_shape(plan), recompute or plan.recompute, moe)


@memoised
def activation_bytes(model: ModelSpec, shape: LayerShape, recompute: str, moe: bool) -> float:
    """Bytes one layer keeps for backward, per micro-batch, on one rank."""
    tp, e = shape.tp, BYTES[shape.dtype]
    tokens = shape.tokens
    h = model.hidden
    d = 1 if model.dropout else 0
    out_div = tp if shape.sp else 1
    # outside the TP region: 2 norm inputs, QKV input, MLP input, 2 dropout masks
    outside = e * 4 * h + 2 * d * h
    # inside: Q, K, V (for the attention backward), attention output (input of the out-projection)
    inside = e * (model.q_dim + 2 * model.kv_dim + model.attn_out_dim) / tp
    inside += FP32_BYTES * model.heads / tp  # fp32 log-sum-exp per head (flash attention)
    mats = 3 if model.gated else 2
    if moe and model.moe:
        mo = model.moe
        # permuted inputs + expert intermediates; with etp > 1 each rank saves the inputs its
        # etp group all-gathered (etp x its own, for w1/w3's weight gradient) and its 1/etp
        # of the intermediates of all of them (etp x 1/etp: unchanged) - Megatron's
        # alltoall dispatcher gathers the tokens over the expert tp group before the experts
        routed = mo.top_k * (e * h * shape.etp + e * mats * mo.expert_ffn_hidden) / tp
        shared = mo.shared_experts * e * mats * mo.shared_ffn_hidden / tp
        inside += routed + shared + FP32_BYTES * mo.num_experts / tp  # router probabilities (fp32)
    else:
        inside += e * mats * model.ffn_hidden / tp
    full = tokens * (outside / out_div + inside)
    if FRAMEWORKS[shape.framework].eager_activations:
        full += eager_extra_bytes(model, shape, moe)
    if recompute == "full":
        return tokens * e * h / out_div  # only the layer input
    if recompute == "selective":
        # op-level selective checkpointing (torchtitan's "op" SAC, which partita's runtime
        # applies too): keep the layer input, every other GEMM output (q, v, the MLP's first
        # projection) and the attention output; recompute norms, activations and the others.
        ffn = (mo.top_k * mo.expert_ffn_hidden + mo.shared_experts * mo.shared_ffn_hidden) if (moe and model.moe) else model.ffn_hidden
        kept_inside = e * (model.q_dim + model.kv_dim + model.attn_out_dim + ffn) / tp + FP32_BYTES * model.heads / tp
        return tokens * (e * 2 * h / out_div + kept_inside)
    return full


def eager_extra_bytes(model: ModelSpec, shape: LayerShape, moe: bool) -> float:
    """Bytes a layer run as eager PyTorch modules saves for backward (recompute none) beyond
    the fused kernels :func:`activation_bytes` assumes (:attr:`.frameworks.Framework.eager_activations`),
    per micro-batch on one rank, from the saved-tensor listing of partita's reference layers
    (tests/data/cost_oracles.json, ``saved_tensors_hooks``):

    * each of the two ``nn.RMSNorm`` computes in fp32 and saves ``x * rstd`` (4h B) and
      ``rstd`` (4 B) besides its input; in 16-bit it saves an fp32 copy of the input where
      the fused count has the ``e``-byte input: ``(8 - e) h + 4`` per token and norm
      (outside the tp region: divided by tp only with SP);
    * GQA's ``repeat_interleave`` before SDPA makes it save K and V at the query width:
      ``2 (q - kv) e / tp``;
    * SiLU saves its output besides w1's: ``f e / tp`` (dense), ``e (k f_e + n_s f_s) / tp``
      (the routed and shared experts);
    * MoE routing: int64 ``chosen`` and ``order`` (8k each), the fp32 top-k weights (4k)
      and their sum (4), the renormalised weights in the activation dtype (ek), the
      concatenated expert outputs and their gather (``2 e k h``); per layer, not per token,
      the fp32 expert load fractions of the balancing loss (4E).
    """
    tp, e = shape.tp, BYTES[shape.dtype]
    out_div = tp if shape.sp else 1
    per_token = 2 * ((8 - e) * model.hidden + 4) / out_div + 2 * (model.q_dim - model.kv_dim) * e / tp
    per_layer = 0.0
    if moe and model.moe:
        mo = model.moe
        per_token += (8 * mo.top_k * 2 + 4 * mo.top_k + 4 + e * mo.top_k) / out_div
        per_token += e * (mo.top_k * mo.expert_ffn_hidden + mo.shared_experts * mo.shared_ffn_hidden
                          + 2 * mo.top_k * model.hidden) / tp
        per_layer = FP32_BYTES * mo.num_experts
    elif model.gated:
        per_token += model.ffn_hidden * e / tp
    return shape.tokens * per_token + per_layer


def layer_working_bytes(model: ModelSpec, shape: LayerShape, moe: bool) -> float:
    """Transient memory while one layer runs backward: its full activations and their
    gradients (one of each)."""
    return 2 * activation_bytes(model, shape, "none", moe)


@dataclass
class RankMemory:
    """Memory of one pipeline rank, bytes by component."""

    rank: int
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.parts.values())


@lru_cache(maxsize=4096)
def all_rank_layers(layers: int, pp: int, split: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Layer indices of every pipeline rank for a given virtual-stage split."""
    out: list[list[int]] = [[] for _ in range(pp)]
    start = 0
    for j, n in enumerate(split):
        out[j % pp].extend(range(start, start + n))
        start += n
    return tuple(tuple(ids) for ids in out)


@dataclass(frozen=True)
class RankShape:
    """What a pipeline rank holds: its layers (and how many are MoE), and whether it
    carries the embedding (first) or the output layer (last)."""

    n_layers: int
    n_moe: int
    edge_moe: tuple[bool, ...]  # MoE flags of its first and last layer (for the transient)
    first: bool
    last: bool
    #: with ``plan.recompute_layers`` N > 0: how many of the rank's dense / MoE layers are
    #: the first N of one of its chunks (:func:`recomputed_layers`); 0 otherwise
    rc_dense: int = 0
    rc_moe: int = 0


def rank_shapes(model: ModelSpec, plan: Plan) -> tuple[RankShape, ...]:
    """The :class:`RankShape` of every pipeline rank (memoised per model and split)."""
    return _rank_shapes(model, plan.pp, plan.stage_layers(model.layers), plan.recompute_layers)


def recomputed_layers(layers: int, pp: int, split: tuple[int, ...], n: int) -> tuple[tuple[int, ...], ...]:
    """Layer indices each pipeline rank recomputes when only ``n`` layers per stage are
    (``plan.recompute_layers``): the first ``min(n, len)`` layers of every virtual chunk
    (``split`` entry) the rank runs. Megatron-LM's block method, TransformerBlock
    ``_checkpointed_forward``: ``for layer_idx in range(num_layers_per_pipeline_rank):
    if layer_idx < recompute_num_layers: checkpoint(layer) else: layer(...)``, where the
    block is one model chunk (with vpp, one virtual stage) - so the first N of each. With
    fp8 Megatron moves the window past leading layers whose input needs no gradient
    (``recompute_skip_num_layers``); the count, which is what memory and time depend on,
    stays N."""
    out: list[list[int]] = [[] for _ in range(pp)]
    start = 0
    for j, size in enumerate(split):
        out[j % pp].extend(range(start, start + min(n, size)))
        start += size
    return tuple(tuple(ids) for ids in out)


@memoised
def _rank_shapes(model: ModelSpec, pp: int, split: tuple[int, ...], rc_layers: int = 0) -> tuple[RankShape, ...]:
    flags = model.moe_flags
    out = []
    rc = recomputed_layers(model.layers, pp, split, rc_layers) if rc_layers else ((),) * pp
    for r, ids in enumerate(all_rank_layers(model.layers, pp, split)):
        edges = tuple(flags[i] for i in sorted({ids[0], ids[-1]})) if ids else ()
        rc_moe = sum(flags[i] for i in rc[r])
        out.append(RankShape(len(ids), sum(flags[i] for i in ids), edges, r == 0, r == pp - 1,
                             len(rc[r]) - rc_moe, rc_moe))
    return tuple(out)


def _shape_params(model: ModelSpec, plan: Plan, shape: RankShape) -> tuple[float, float]:
    return shape_params(model, shape, param_shape(plan))


def tp_replicated_params(model: ModelSpec, moe: bool) -> int:
    """Parameters of one layer that tensor parallelism replicates instead of splitting.

    Megatron-LM and PyTorch's tensor/sequence parallel split the projection and MLP
    GEMMs only: the two norms' weights are full on every tp rank (Megatron marks them
    ``sequence_parallel`` and all-reduces their gradients over tp; torch's
    ``SequenceParallel`` style replicates them), as are Qwen3's per-head q/k norms and the
    MoE router (Megatron-Core ``TopKRouter`` holds the whole ``[E, h]`` weight on every
    tp rank) and the shared-expert gate. Partita's runtime does the same (the oracle in
    tests/data/cost_oracles.json counts the tensors each tp rank holds)."""
    return _tp_replicated(model, moe)


@memoised
def _tp_replicated(model: ModelSpec, moe: bool) -> int:
    h = model.hidden
    norm = 2 if model.norm == "layernorm" else 1
    params = 2 * norm * h
    if model.qk_norm:
        params += 2 * model.head_size
    if moe and model.moe:
        params += h * model.moe.num_experts + (h if model.moe.shared_expert_gate else 0)
    return params


def _end_replicated(model: ModelSpec, first: bool) -> int:
    """Replicated parameters of the embedding (learned positions - Megatron keeps them in
    a plain ``nn.Embedding`` - and BLOOM's embedding norm) or the output layer (the final
    norm); the vocabulary-parallel matrices are split."""
    norm = (2 if model.norm == "layernorm" else 1) * model.hidden
    if first:
        return (model.max_positions * model.hidden if model.position == "learned" else 0) + \
            (norm if model.embedding_norm else 0)
    return norm


def _split_tp(total: float, replicated: float, tp: int) -> float:
    """Parameters one tp rank holds of ``total``, of which ``replicated`` are not split."""
    return (total - replicated) / tp + replicated


@memoised
def shape_params(model: ModelSpec, rank: RankShape, split: ParamShape) -> tuple[float, float]:
    """(dense, expert) parameters of a pipeline rank of this shape: tp divides the dense
    weights except the replicated ones (:func:`tp_replicated_params`: norms, router), ep x
    etp the routed experts (module docstring)."""
    n_dense = rank.n_layers - rank.n_moe
    tp = split.tp
    dense = n_dense * _split_tp(model.layer_kind_params(False), _tp_replicated(model, False), tp) if n_dense else 0.0
    expert = 0.0
    if rank.n_moe:
        routed = model.moe.num_experts * model.routed_expert_params()  # type: ignore[union-attr]
        expert = rank.n_moe * routed / (split.ep * split.etp)
        dense += rank.n_moe * _split_tp(model.layer_kind_params(True) - routed, _tp_replicated(model, True), tp)
    if rank.first:
        dense += _split_tp(model.embedding_params(), _end_replicated(model, True), tp)
    if rank.last:
        out = model.output_params()
        if model.tied_embeddings and split.pipelined:
            out += model.vocab * model.hidden  # the last stage keeps its own copy of the tied weight
        dense += _split_tp(out, _end_replicated(model, False), tp)
    return dense, expert


def _activations_per_chunk(model: ModelSpec, plan: Plan, shape: RankShape, recompute: str | None = None,
                           layer: LayerShape | None = None) -> float:
    """Activation bytes one in-flight model chunk of this rank keeps (``recompute``
    overrides the plan's mode; ``layer``: ``layer_shape(plan)`` when the caller has it)."""
    n_dense = shape.n_layers - shape.n_moe
    mode = recompute or plan.recompute
    if mode == "full" and plan.recompute_layers:
        per_chunk = _partial_layers(model, plan, shape) / plan.vpp
    else:
        layer = layer_shape(plan) if layer is None else layer
        per_chunk = (n_dense * activation_bytes(model, layer, mode, False)
                     + (shape.n_moe * activation_bytes(model, layer, mode, True) if shape.n_moe else 0.0)
                     ) / plan.vpp
    if plan.attention == "unfused":  # fused: unfused_attention_bytes is 0, adding 0.0 changes nothing
        per_chunk += _kept_attention_layers(plan, shape, mode) * unfused_attention_bytes(model, plan)
    if shape.first:
        tokens = plan.mbs * plan.seq_len / plan.cp
        per_chunk += tokens * BYTES[plan.dtype] * model.hidden / (plan.tp if plan.sp else 1) / plan.vpp  # embedding output
    return per_chunk


def unfused_attention_bytes(model: ModelSpec, plan: Plan) -> float:
    """Bytes of attention probabilities one layer keeps per micro-batch on one rank when
    attention runs unfused (``plan.attention == "unfused"``; 0 with a fused/flash kernel).

    Derivation (Megatron-Core ``DotProductAttention``, megatron/core/transformer/
    dot_product_attention.py, the ``--attention-backend unfused`` path): scores =
    ``baddbmm(Q, K^T)`` (its backward needs Q and K only, already counted), probs =
    ``FusedScaleMaskSoftmax(scores)`` (the scaled_(upper_triang_)masked_softmax CUDA kernels
    save their output only), dropout (p = 0 in the row that needs this: ``F.dropout`` with
    p = 0 returns its input, no mask), context = ``bmm(probs, V)`` saves probs - the same
    tensor the softmax saved. So one ``e``-byte tensor of ``b x a/tp x s_q x s_kv`` per
    layer: the ``5as/h`` term of Korthikanti et al. 2022 (arXiv:2205.05198) sec. 4.1
    (``2as^2b`` softmax output + ``as^2b`` dropout mask + ``2as^2b`` dropout output, per
    layer) without the dropout mask and output. With cp each rank's ``s/cp`` queries see
    all ``s`` keys. Megatron's selective recompute (``--recompute-granularity selective``)
    recomputes exactly this core attention, and full recompute keeps the layer input only:
    both store nothing here.

    Known gaps: attention dropout > 0 would add the 1-byte mask and the dropout output
    (``3 as^2b``); the sliding window of eager implementations is not modelled."""
    if plan.attention != "unfused":
        return 0.0
    return (plan.mbs * model.heads / plan.tp * (plan.seq_len / plan.cp) * plan.seq_len
            * BYTES[plan.dtype])


def _kept_attention_layers(plan: Plan, shape: RankShape, mode: str) -> float:
    """Layers of one in-flight chunk that keep :func:`unfused_attention_bytes`: all with
    recompute none, the not-recomputed ones of a partial full recompute, none otherwise."""
    if mode == "none":
        return shape.n_layers / plan.vpp
    if mode == "full" and plan.recompute_layers:
        return (shape.n_layers - shape.rc_dense - shape.rc_moe) / plan.vpp
    return 0.0


def _partial_layers(model: ModelSpec, plan: Plan, shape: RankShape) -> float:
    """Activation bytes all of a rank's layers keep per micro-batch when only
    ``plan.recompute_layers`` of each chunk are recomputed: those (``shape.rc_dense`` /
    ``rc_moe``, :func:`recomputed_layers`) keep their input only (the full-recompute
    count of :func:`activation_bytes`), the others everything (recompute none). Linear
    in N: each recomputed layer saves ``A_none - A_full`` [Korthikanti et al. 2022,
    sec. 4.1: ``sbh(34 + 5as/h)`` vs ``2sbh`` per layer]. With vpp the rank's in-flight
    chunks are counted as the average of its chunks (as for every mode)."""
    n_dense = shape.n_layers - shape.n_moe
    total = 0.0
    for moe, n, rc in ((False, n_dense, shape.rc_dense), (True, shape.n_moe, shape.rc_moe)):
        if n:
            total += rc * activation_bytes_per_layer(model, plan, moe, "full")
            total += (n - rc) * activation_bytes_per_layer(model, plan, moe, "none")
    return total


def _layer_working(model: ModelSpec, plan: Plan, shape: RankShape) -> float:
    """The largest working set of one of the rank's edge layers' backward (its full
    activations and their gradients; unfused attention: its probabilities and their
    gradient, :func:`unfused_attention_bytes` twice)."""
    working = 0.0
    layer = layer_shape(plan)
    for moe in shape.edge_moe:
        working = max(working, layer_working_bytes(model, layer, moe))
    return working + 2 * unfused_attention_bytes(model, plan)


#: How each framework (:mod:`.frameworks`) runs the loss over the logits, which decides the
#: bytes per logit element its loss phase holds at once (:func:`loss_bytes_per_logit`).
#: Keyed by the plan's framework name; a name missing here runs as Megatron (``fused``).
LOSS_MODE: dict[str, str] = {
    "megatron": "fused", "mindspeed": "fused", "deepspeed": "fused",
    "torchtitan": "compiled", "torchtitan-eager": "eager", "partita": "eager-kept",
    # torchtitan with compiled blocks and an eager loss: every run before torchtitan commit
    # bbb1b616e (2025-04-02; loss.py had "# compiled_cross_entropy_loss = torch.compile(...)"
    # commented out) and ``--compile.components model`` today. Not yet a plan framework.
    "torchtitan-eager-loss": "eager",
}


def loss_bytes_per_logit(mode: str, dtype: str) -> float:
    """Peak bytes per logit element (token x vocabulary entry of the rank's shard) while the
    loss and its backward run, the 16-bit (``e`` = 2) or fp32 (``e`` = 4) logits included.

    * ``fused`` (Megatron-LM / MindSpeed / Megatron-DeepSpeed ``VocabParallelCrossEntropy``,
      megatron/core/tensor_parallel/cross_entropy.py): the logits are cast to fp32 once and
      max-subtraction, exp and normalisation run in place on that copy, which is the softmax
      kept for backward; the backward writes the gradient into it in place. Peak: the
      ``e``-byte logits and the fp32 softmax, ``e + 4``.
    * ``eager`` (torchtitan without compile, torchtitan before it compiled the loss:
      ``F.cross_entropy(pred.float(), labels)``, torchtitan/components/loss.py, and ``del
      pred`` before backward): forward holds the logits, their fp32 copy and log_softmax's
      fp32 output (``e + 4 + 4``; the copy is not saved, log_softmax's backward needs its
      output only); backward holds the saved output, nll_loss's fp32 gradient and
      log_softmax's fp32 input gradient: ``12``. Peak ``max(e + 8, 12)`` = 12 (fp32: the cast
      is a no-op, forward 8).
    * ``eager-kept`` (partita's train step keeps ``out`` referenced through backward): the
      eager backward plus the logits, ``12 + e``.
    * ``compiled`` (torchtitan with compile on compiles the loss, ``build_cross_entropy_loss``
      since torchtitan commit bbb1b616e, 2025-04-02): AOTAutograd's min-cut partitioner saves
      the ``e``-byte logits (not the fp32 log-softmax) and the backward writes an ``e``-byte
      gradient: ``2 e``.

    The last three are measured: torch.profiler's allocator events during forward + backward
    of an output layer and that loss (tests/measure_memory_physics.py, recorded in
    tests/data/memory_physics_oracles.json: 12.0, 12.0 (fp32), 14.0, 4.0 and 8.0 (fp32) bytes)."""
    e = BYTES[dtype]
    if mode == "eager":
        return max(e + 8.0, 12.0)
    if mode == "eager-kept":
        return 12.0 + e
    if mode == "compiled":
        return 2.0 * e
    return e + 4.0


def _logits_bytes(model: ModelSpec, plan: Plan) -> float:
    """What the loss phase of one micro-batch holds: the rank's ``tokens x vocab / tp`` logit
    elements times :func:`loss_bytes_per_logit` of the plan's framework."""
    tokens = plan.mbs * plan.seq_len / plan.cp
    return tokens * model.vocab / plan.tp * loss_bytes_per_logit(LOSS_MODE.get(plan.framework, "fused"), plan.dtype)


def _transient(model: ModelSpec, plan: Plan, shape: RankShape) -> float:
    """One layer's backward working set or, on the last rank, the logits and softmax,
    whichever is larger (they are never held at once)."""
    working = _layer_working(model, plan, shape)
    if shape.last:
        working = max(working, _logits_bytes(model, plan))
    return working


def _zero3_gathered(model: ModelSpec, plan: Plan, shape: RankShape, zero: int | None = None) -> float:
    """What fully-sharded data parallelism (FSDP2 / ZeRO-3) holds unsharded at the peak,
    on top of the sharded states (``zero`` overrides the plan's stage).

    The peak is the start of backward, when every layer's activations are held. At that
    moment, for the unit ``U`` being differentiated (the largest FSDP unit the rank has:
    a layer, or the embedding / output layer, which are their own units in torchtitan's
    ``apply_fsdp``) and a layer ``L`` next to it:

    * ``U`` gathered in the working dtype (``w`` = 2 bytes, fp32 training 4) and the next
      unit's all-gather output already allocated by the prefetch: ``w (U + L)``. PyTorch's
      FSDP notes (docs.pytorch.org/docs/stable/notes/fsdp.html, "FSDP Prefetch Nuances"):
      prefetching means "the next all-gather's output tensor must be allocated while the
      current one is still in use"; backward prefetch is on by default in FSDP2.
    * ``U``'s unsharded gradients in the reduce dtype (``g U``; fp32 with torchtitan's
      default ``mixed_precision_reduce = "float32"``): FSDP2's ``foreach_reduce`` copies
      the gradients into one flat reduce-scatter input (unsharded numel x reduce dtype).
    * the previous unit's reduce-scatter input is not added: FSDP2 keeps it until the
      next unit's post-backward (so the CPU cannot run ahead of the reduce-scatter
      stream) and frees it there, before allocating the next input
      (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, ``post_backward`` /
      ``reduce_scatter_state``).

    Total ``U (w + g) + w L``. The unit is the largest one, not the average layer: for
    Llama-3-8B the output layer (525 M parameters) against a layer (218 M), so 3.4 GiB
    instead of the 1.9 GiB the average-layer count gave.

    The last rank's output layer is differentiated while the logits are alive, and its
    reduce-scatter input is allocated only after they are freed (autograd frees a node's
    saved tensors and its incoming gradient once the node has run; FSDP2 allocates the
    reduce-scatter input in the unit's post-backward hook, after its backward). So the
    logits (:func:`_logits_bytes`) and the output layer's ``g U_out`` never coexist; the
    last rank's peak is the largest of three phases, each over the activations:

    * loss and output-layer backward: the logits, the gathered output weight and its
      working-dtype gradient, the last layer prefetched: ``T_logits + 2 w U_out + w L``;
    * the last layer's backward: its working set, the output layer's reduce-scatter input
      (held until this layer's post-backward) and the layer gathered plus the next one
      prefetched: ``T_layer + g U_out + 2 w L``;
    * the other units as above: ``T_layer + U (w + g) + w L``.

    This part is that peak less the transient part (:func:`_transient`), so the parts
    still add up to it. Known gaps: the momentary working-dtype gradients of a layer
    while they are copied into the reduce-scatter input (``w U`` for a few kernels);
    ``reshard_after_forward=False`` units (torchtitan's last block under pp) stay
    gathered through forward and backward.
    """
    if (plan.zero if zero is None else zero) < 3:
        return 0.0
    layer, unit, out = _fsdp_units(model, param_shape(plan), shape)
    w, g = (4 if plan.dtype == "fp32" else 2), _grad_bytes(plan)
    if not shape.last:
        return unit * (w + g) + layer * w
    t_layer, t_logits = _layer_working(model, plan, shape), _logits_bytes(model, plan)
    loss_phase = t_logits + 2 * w * out + w * layer
    after_output = t_layer + g * out + 2 * w * layer
    other_units = t_layer + unit * (w + g) + layer * w
    return max(loss_phase, after_output, other_units) - max(t_layer, t_logits)


#: Frameworks whose zero 3 is PyTorch FSDP2 ``fully_shard`` (:func:`fsdp_stream_pool`).
FSDP2_FRAMEWORKS = frozenset({"torchtitan", "torchtitan-eager", "torchtitan-eager-loss", "partita"})


def fsdp_stream_pool(model: ModelSpec, plan: Plan, shape: RankShape, zero: int | None = None) -> float:
    """Bytes FSDP2 keeps reserved in the all-gather stream's pool of the caching allocator,
    beyond what is allocated at the peak: ``w U_max``, the working-dtype flat all-gather
    output of the rank's largest unit (a layer, the embedding or the output layer).

    Derivation: FSDP2 allocates each unit's flat all-gather output on its
    ``all_gather_copy_in_stream`` (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py,
    ``foreach_all_gather``: ``all_gather_comm.allocate`` under ``device_handle.stream(
    all_gather_copy_in_stream)``), copies it out into the parameters' own unsharded storage
    on the default stream (``foreach_all_gather_copy_out``: ``torch.empty_like``) and frees
    it before the next unit's all-gather (``FSDPParamGroup.unshard``: "free the all-gather
    result"). The CUDA caching allocator hands a freed block only to later allocations on
    the stream it was allocated on (c10/cuda/CUDACachingAllocator.cpp, blocks and expandable
    segments are per stream), so the largest flat buffer stays reserved for that stream
    while the default stream reaches its peak: ``torch.cuda.max_memory_reserved`` (what
    torchtitan logs) counts it, ``max_memory_allocated`` does not. ``w`` = 2 (bf16
    all-gather; fp32 training 4). Known gaps: float8 all-gather (torchao tensorwise) sends 1
    byte; two flat buffers may coexist when a prefetched all-gather is allocated before the
    previous result is freed; the reduce-scatter stream's pool (the sharded fp32 gradients)
    is counted as the gradients already."""
    if (plan.zero if zero is None else zero) < 3 or plan.framework not in FSDP2_FRAMEWORKS:
        return 0.0
    layer, unit, out = _fsdp_units(model, param_shape(plan), shape)
    return (4 if plan.dtype == "fp32" else 2) * max(layer, unit, out)


@memoised
def _fsdp_units(model: ModelSpec, split: ParamShape, shape: RankShape) -> tuple[float, float, float]:
    """(largest layer, largest unit but the output layer, output layer) parameters of a
    rank's FSDP units (memoised: the search asks once per layout and ZeRO setting)."""
    layer = _unit_params(model, split, shape)
    unit = layer
    if shape.first:
        unit = max(unit, _split_tp(model.embedding_params(), _end_replicated(model, True), split.tp))
    out = 0.0
    if shape.last:
        out = model.output_params()
        if model.tied_embeddings and split.pipelined:
            out += model.vocab * model.hidden  # the last stage's own copy of the tied weight
        out = _split_tp(out, _end_replicated(model, False), split.tp)
    return layer, unit, out


def _unit_params(model: ModelSpec, split: ParamShape, shape: RankShape) -> float:
    """Parameters of the rank's largest layer (its dense part / tp, its experts / (ep*etp))."""
    tp = split.tp
    params = (_split_tp(model.layer_kind_params(False), _tp_replicated(model, False), tp)
              if shape.n_layers > shape.n_moe else 0.0)
    if shape.n_moe:
        routed = model.moe.num_experts * model.routed_expert_params()  # type: ignore[union-attr]
        params = max(params, _split_tp(model.layer_kind_params(True) - routed, _tp_replicated(model, True), tp)
                     + routed / (split.ep * split.etp))
    return params


def _buffers(device: Device, plan: Plan) -> float:
    """Per-communicator buffers (HCCL: 2 x HCCL_BUFFSIZE each) for every group the rank is in."""
    groups = sum(1 for size in (plan.tp, plan.dp * plan.cp, plan.pp, plan.cp, plan.ep, plan.etp) if size > 1) + 1
    return groups * device.comm_buffer_mib_per_group * 2 ** 20


def _knob_state(model: ModelSpec, plan: Plan, shape: RankShape) -> float:
    """What a gradient-communication knob keeps between steps on this rank, counted with the
    communication buffers: PowerSGD's error feedback (a copy of every gradient it reduces)
    and its warm-start P, Q factors (:func:`.compression.state_bytes`, equal to what torch's
    ``PowerSGDState`` allocates: tests/test_compression.py); 0 for every other plan."""
    if plan.grad_compression != "powersgd" or plan.dp * plan.cp <= 1:
        return 0.0
    dense, expert = _shape_params(model, plan, shape)
    return state_bytes(plan, wire_count(model, plan, dense + expert, shape.n_layers, shape.n_moe,
                                        shape.first, shape.last))


def distinct_shapes(model: ModelSpec, plan: Plan) -> tuple[tuple[int, RankShape, int], ...]:
    """(first rank, shape, number of ranks) for each distinct rank shape (memoised). Ranks
    of one shape differ only in their in-flight micro-batches, which never grow with the
    rank (see :func:`.pipeline.in_flight_chunks`), so the first is the most loaded."""
    return _distinct_shapes(model, plan.pp, plan.stage_layers(model.layers), plan.recompute_layers)


@memoised
def _distinct_shapes(model: ModelSpec, pp: int, split: tuple[int, ...],
                     rc_layers: int = 0) -> tuple[tuple[int, RankShape, int], ...]:
    first: dict[RankShape, int] = {}
    count: dict[RankShape, int] = {}
    for r, shape in enumerate(_rank_shapes(model, pp, split, rc_layers)):
        first.setdefault(shape, r)
        count[shape] = count.get(shape, 0) + 1
    return tuple((r, shape, count[shape]) for shape, r in first.items())



class MemoryParts(NamedTuple):
    """Bytes one pipeline rank holds at its peak, by part (:func:`memory_parts`). Every
    memory figure - the breakdown `partita estimate` prints, the peak, the search's
    ladder - is this record summed by :meth:`allocated` / :meth:`peak`."""

    weights: float
    gradients: float
    optimizer: float
    activations: float  # in-flight micro-batches x activation bytes per model chunk
    transient: float  # one layer's backward working set, or the logits and softmax
    zero3_gathered: float  # ZeRO-3: unsharded layers being used / prefetched
    buffers: float  # communicator buffers
    #: reserved but not allocated at the peak: FSDP2's all-gather pool (:func:`fsdp_stream_pool`)
    stream_pool: float = 0.0

    def allocated(self) -> float:
        """What the rank allocates: the sum of the parts."""
        return (self.weights + self.gradients + self.optimizer + self.activations + self.transient
                + self.zero3_gathered + self.buffers)

    def peak(self, device: Device) -> float:
        """Peak device memory: allocated, plus the allocator's fragmentation slack on it and
        the blocks it keeps for other streams (:attr:`stream_pool`), plus the runtime's own
        reservation (context, workspaces)."""
        allocated = self.allocated()
        return (allocated + allocated * device.allocator_fragmentation + self.stream_pool
                + device.runtime_reserved_gib * GIB)

    def breakdown(self, device: Device) -> dict[str, float]:
        """The parts by label, as `partita estimate` prints them (their sum is :meth:`peak`)."""
        out = {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
               "activations": self.activations, "transient": self.transient}
        if self.zero3_gathered:
            out["zero3 gathered layers"] = self.zero3_gathered
        out["communication buffers"] = self.buffers
        allocated = self.allocated()
        # reserved, not allocated: read as such by Estimate.peak_memory_gib_as("allocated")
        out["allocator fragmentation"] = allocated * device.allocator_fragmentation + self.stream_pool
        out["runtime (context, workspaces)"] = device.runtime_reserved_gib * GIB
        return out


def _plan_terms(device: Device, plan: Plan) -> tuple:
    """What :func:`memory_parts` takes from the plan alone (the same for every rank shape):
    gradient bytes, the dense and expert state shards, the communicator buffers, full
    gradients, the fp8 weight cache, the layer shape and the framework's zero-0 autocast."""
    return (_grad_bytes(plan), state_shard(plan), expert_state_shard(plan), _buffers(device, plan),
            full_gradients(plan), fp8_weight_cache(plan), layer_shape(plan), FRAMEWORKS[plan.framework].zero0_autocast)


def memory_parts(model: ModelSpec, device: Device, plan: Plan, rank: int, shape: RankShape,
                 settings: list[tuple[str, int]], common: tuple | None = None) -> dict[tuple[str, int], MemoryParts]:
    """The memory parts of pipeline rank ``rank`` (of shape ``shape``) under each
    (recompute, zero) setting of ``plan``'s layout - the one place the parts are made.
    The ZeRO stage only changes the model states and the recompute mode only the
    activations, so each is computed once and combined. ``common``: :func:`_plan_terms`
    of the plan, when the caller walks several rank shapes."""
    dense, expert = _shape_params(model, plan, shape)
    # dense_shard: HSDP's shard group only; expert_shard: the expert data-parallel group
    grad_b, dense_shard, expert_shard, plan_buffers, full, fp8_cache, layer, zero0_autocast = \
        _plan_terms(device, plan) if common is None else common
    chunks = in_flight_chunks(plan.schedule, plan.pp, plan.vpp, plan.grad_accum, rank)
    transient, buffers = _transient(model, plan, shape), plan_buffers + _knob_state(model, plan, shape)
    states: dict[int, tuple[float, float, float, float, float]] = {}
    activations: dict[str, float] = {}
    out = {}
    for recompute, zero in settings:
        if zero not in states:
            autocast = zero == 0 and zero0_autocast
            weights, grads, optimizer = _state_bytes(plan.dtype, grad_b, zero, dense, dense_shard, full, autocast,
                                                     fp8_cache)
            if expert:
                we, ge, oe = _state_bytes(plan.dtype, grad_b, zero, expert, expert_shard, full, autocast, fp8_cache)
                weights, grads, optimizer = weights + we, grads + ge, optimizer + oe
            states[zero] = (weights, grads, optimizer, _zero3_gathered(model, plan, shape, zero),
                            fsdp_stream_pool(model, plan, shape, zero)) if zero >= 3 else \
                (weights, grads, optimizer, 0.0, 0.0)  # both are 0 below zero 3
        if recompute not in activations:
            activations[recompute] = chunks * _activations_per_chunk(model, plan, shape, recompute, layer)
        weights, grads, optimizer, gathered, pool = states[zero]
        out[(recompute, zero)] = MemoryParts(weights, grads, optimizer, activations[recompute], transient, gathered,
                                             buffers, pool)
    return out


def peak_memory_ladder(model: ModelSpec, device: Device, plan: Plan,
                       steps: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[float, int]]:
    """:func:`peak_memory` for several (recompute, zero) settings of one layout at once
    (the search's memory ladder): (bytes, pipeline rank) of the most loaded rank of each."""
    out: dict[tuple[str, int], tuple[float, int]] = {step: (-1.0, 0) for step in steps}
    fragmentation, reserved = device.allocator_fragmentation, device.runtime_reserved_gib * GIB
    common = _plan_terms(device, plan)
    for r, shape, _ in distinct_shapes(model, plan):
        for step, parts in memory_parts(model, device, plan, r, shape, steps, common).items():
            # MemoryParts.peak, unrolled (same terms, same order: the same float)
            weights, grads, optimizer, activations, transient, gathered, buffers, pool = parts
            allocated = weights + grads + optimizer + activations + transient + gathered + buffers
            total = allocated + allocated * fragmentation + pool + reserved
            if total > out[step][0]:
                out[step] = (total, r)
    return out


def estimate_rank_memory(model: ModelSpec, device: Device, plan: Plan, rank: int) -> RankMemory:
    """Peak memory of pipeline rank ``rank`` (bytes per component)."""
    setting = (plan.recompute, plan.zero)
    parts = memory_parts(model, device, plan, rank, rank_shapes(model, plan)[rank], [setting])[setting]
    return RankMemory(rank=rank, parts=parts.breakdown(device))


def estimate_memory(model: ModelSpec, device: Device, plan: Plan) -> list[RankMemory]:
    """Memory of every pipeline rank (index = pipeline rank)."""
    return [estimate_rank_memory(model, device, plan, r) for r in range(plan.pp)]


def peak_memory(model: ModelSpec, device: Device, plan: Plan) -> tuple[float, int]:
    """(bytes, pipeline rank) of the most loaded rank - the same numbers as
    :func:`estimate_memory`'s totals, without building the breakdowns."""
    setting = (plan.recompute, plan.zero)
    return peak_memory_ladder(model, device, plan, [setting])[setting]


def dp_gradient_bytes(model: ModelSpec, plan: Plan) -> dict[str, float]:
    """Per-step data-parallel gradient bytes of the rank holding the most parameters:
    ``held`` (the gradient buffer as the reduction would send it uncompressed, fp32),
    ``wire`` (what the plan's knobs send: grad_dtype, PowerSGD), ``ratio`` = wire/held,
    plus PowerSGD's ``state`` bytes (error feedback + factors). Bytes are the all-reduce
    buffer size (nccl-tests convention, :mod:`.comm`), per reduction; 0 when dp x cp = 1."""
    best = {"held": 0.0, "wire": 0.0, "ratio": 1.0, "state": 0.0, "elements": 0.0}
    if plan.dp * plan.cp <= 1:
        return best
    for _, shape, _ in distinct_shapes(model, plan):
        dense, expert = _shape_params(model, plan, shape)
        elements = dense + expert
        c = wire_count(model, plan, elements, shape.n_layers, shape.n_moe, shape.first, shape.last)
        held = elements * 4
        wire = c.wire_elements * _grad_bytes(plan)
        if held > best["held"]:
            best = {"held": held, "wire": wire, "ratio": wire / held if held else 1.0,
                    "state": state_bytes(plan, c), "elements": elements}
    return best


def least_recompute_layers(model: ModelSpec, device: Device, plan: Plan, limit_gib: float) -> int:
    """The smallest ``recompute_layers`` N with which ``plan``'s layout fits ``limit_gib``
    under full recompute; 0 when full recompute of every layer is needed or nothing fits.

    Solved, not enumerated: a rank's peak falls linearly with the layers it recomputes
    (:func:`_partial_layers`: each saves ``A_none - A_full``), from its peak without
    recompute ``P_none`` to ``P_full`` when all its ``c`` layers per chunk are; fitting
    needs ``N >= c (P_none - limit) / (P_none - P_full)`` on every rank (the allocator
    slack scales the allocation, so the peak stays linear). One check of the answer
    (and at most two steps up) covers what the line does not: uneven chunks (a chunk
    shorter than N recomputes all its layers) and MoE layers placed unevenly."""
    largest = max(plan.stage_layers(model.layers))
    base = plan.with_(recompute="full", recompute_layers=0)
    steps = [("none", plan.zero), ("full", plan.zero)]
    limit = limit_gib * GIB
    n = 1
    for r, shape, _ in distinct_shapes(model, base):
        parts = memory_parts(model, device, base, r, shape, steps)
        hi, lo = parts[steps[0]].peak(device), parts[steps[1]].peak(device)
        if lo > limit:
            return 0
        if hi > limit:
            n = max(n, math.ceil((hi - limit) / (hi - lo) * shape.n_layers / plan.vpp - 1e-9))
    for _ in range(3):
        if n >= largest:
            return 0
        if fits(peak_memory(model, device, base.with_(recompute_layers=n))[0], limit_gib):
            return n
        n += 1
    return 0

