"""Per-rank memory: weights, gradients, optimizer states, activations, buffers, overhead.

Model states (Rajbhandari et al. 2020, ZeRO sec. 3; Megatron-LM distributed optimizer),
bytes per parameter with mixed precision and Adam:

==========  =========================  ======================================
component   bytes                      sharded over the data-parallel group at
==========  =========================  ======================================
weights     2 (bf16/fp16; fp32: 4)     zero 3
gradients   4 (fp32 main grads) or 2   zero 2 and 3
optimizer   12 (fp32 master + m + v);  zero 1, 2 and 3
            fp32 training: 8 (m + v)
==========  =========================  ======================================

fp8 training keeps bf16 weights and adds an fp8 copy and its transpose (2 bytes).
Dense weights are sharded over dp x cp ranks; routed-expert weights over the expert
data-parallel group ``dp*cp*tp/ep`` (expert tensor parallel = 1).

Activations per layer and micro-batch follow Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", sec. 4.1, which gives
``sbh(34 + 5as/h)`` bytes for GPT with 16-bit activations), generalised term by term:
with flash attention the ``5as/h`` score terms are never stored (the kernel keeps the
output and a log-sum-exp); GQA shrinks K and V to ``kv_dim``; a gated MLP stores its
two input projections and the product (``3f``), a plain one the pre- and
post-activation (``2f``); dropout masks (1 byte) only where the model has dropout.
Terms inside the tensor-parallel region are divided by ``tp``; the rest (norm inputs,
residual-stream tensors) only with sequence parallel.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from ..plan import Plan
from ..spec.hardware import Device
from ..spec.model import ModelSpec
from .compute import BYTES
from .pipeline import in_flight_chunks

GIB = 1024 ** 3


def _grad_bytes(plan: Plan) -> int:
    return 4 if plan.grad_dtype == "fp32" or plan.dtype == "fp32" else 2


def model_state_bytes(plan: Plan, params: float, shard: int) -> dict[str, float]:
    """Weights, gradients and optimizer bytes for ``params`` parameters sharded ``shard`` ways."""
    weight_b = 4 if plan.dtype == "fp32" else 2
    opt_b = 8 if plan.dtype == "fp32" else 12
    grad_b = _grad_bytes(plan)
    z = plan.zero
    weights = params * weight_b / (shard if z >= 3 else 1)
    if plan.dtype == "fp8":
        weights += params * 2 / (shard if z >= 3 else 1)
    grads = params * grad_b / (shard if z >= 2 else 1)
    optimizer = params * opt_b / (shard if z >= 1 else 1)
    return {"weights": weights, "gradients": grads, "optimizer": optimizer}


_ACT_CACHE: dict[tuple, float] = {}


def activation_bytes_per_layer(model: ModelSpec, plan: Plan, moe: bool) -> float:
    """Bytes one layer keeps for backward, per micro-batch, on one rank (memoised)."""
    key = (id(model), plan.tp, plan.cp, plan.mbs, plan.seq_len, plan.sp, plan.dtype, plan.recompute, moe)
    value = _ACT_CACHE.get(key)
    if value is None:
        if len(_ACT_CACHE) > 100_000:
            _ACT_CACHE.clear()
        value = _ACT_CACHE[key] = _activation_bytes_per_layer(model, plan, moe)
    return value


def _activation_bytes_per_layer(model: ModelSpec, plan: Plan, moe: bool) -> float:
    """Bytes one layer keeps for backward, per micro-batch, on one rank."""
    tp, e = plan.tp, BYTES[plan.dtype]
    tokens = plan.mbs * plan.seq_len / plan.cp
    h = model.hidden
    d = 1 if model.dropout else 0
    out_div = tp if plan.sp else 1
    # outside the TP region: 2 norm inputs, QKV input, MLP input, 2 dropout masks
    outside = e * 4 * h + 2 * d * h
    # inside: Q, K, V (for the attention backward), attention output (input of the out-projection)
    inside = e * (model.q_dim + 2 * model.kv_dim + model.attn_out_dim) / tp
    inside += 4 * model.heads / tp  # fp32 log-sum-exp per head (flash attention)
    mats = 3 if model.gated else 2
    if moe and model.moe:
        mo = model.moe
        routed = mo.top_k * (e * h + e * mats * mo.expert_ffn_hidden) / tp  # permuted inputs + expert intermediates
        shared = mo.shared_experts * e * mats * mo.shared_ffn_hidden / tp
        inside += routed + shared + 4 * mo.num_experts / tp  # router probabilities (fp32)
    else:
        inside += e * mats * model.ffn_hidden / tp
    full = tokens * (outside / out_div + inside)
    if plan.recompute == "full":
        return tokens * e * h / out_div  # only the layer input
    if plan.recompute == "selective":
        # op-level selective checkpointing (torchtitan's "op" SAC, which partita's runtime
        # applies too): keep the layer input, every other GEMM output (q, v, the MLP's first
        # projection) and the attention output; recompute norms, activations and the others.
        ffn = (mo.top_k * mo.expert_ffn_hidden + mo.shared_experts * mo.shared_ffn_hidden) if (moe and model.moe) else model.ffn_hidden
        kept_inside = e * (model.q_dim + model.kv_dim + model.attn_out_dim + ffn) / tp + 4 * model.heads / tp
        return tokens * (e * 2 * h / out_div + kept_inside)
    return full


def layer_working_bytes(model: ModelSpec, plan: Plan, moe: bool) -> float:
    """Transient memory while one layer runs backward (its full activations plus gradients)."""
    if plan.recompute != "none":
        plan = replace(plan, recompute="none")
    return 2 * activation_bytes_per_layer(model, plan, moe)


@dataclass
class RankMemory:
    """Memory of one pipeline rank, bytes by component."""

    rank: int
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def rank_params(model: ModelSpec, plan: Plan, layer_ids: list[int], first: bool, last: bool) -> tuple[float, float]:
    """(dense, expert) parameters held by one rank of the ``tp`` x ``ep`` group."""
    flags = model.moe_flags
    n_moe = sum(flags[i] for i in layer_ids)
    n_dense = len(layer_ids) - n_moe
    dense = n_dense * model.layer_kind_params(False) / plan.tp
    expert = 0.0
    if n_moe:
        routed = model.moe.num_experts * model.routed_expert_params()  # type: ignore[union-attr]
        expert = n_moe * routed / plan.ep
        dense += n_moe * (model.layer_kind_params(True) - routed) / plan.tp
    if first:
        dense += model.embedding_params() / plan.tp
    if last:
        out = model.output_params()
        if model.tied_embeddings and plan.pp > 1:
            out += model.vocab * model.hidden  # the last stage keeps its own copy of the tied weight
        dense += out / plan.tp
    return dense, expert


def layers_of_rank(model: ModelSpec, plan: Plan, rank: int) -> list[int]:
    """Layer indices on pipeline rank ``rank`` (virtual stage j on rank j % pp)."""
    return all_rank_layers(model.layers, plan.pp, plan.stage_layers(model.layers))[rank]


@lru_cache(maxsize=4096)
def all_rank_layers(layers: int, pp: int, split: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Layer indices of every pipeline rank for a given virtual-stage split."""
    out: list[list[int]] = [[] for _ in range(pp)]
    start = 0
    for j, n in enumerate(split):
        out[j % pp].extend(range(start, start + n))
        start += n
    return tuple(tuple(ids) for ids in out)


def estimate_rank_memory(model: ModelSpec, device: Device, plan: Plan, rank: int) -> RankMemory:
    """Peak memory of pipeline rank ``rank`` (bytes per component)."""
    first, last = rank == 0, rank == plan.pp - 1
    ids = layers_of_rank(model, plan, rank)
    dense, expert = rank_params(model, plan, ids, first, last)
    dp_shard = plan.dp * plan.cp
    ep_shard = max(1, plan.dp * plan.cp * plan.tp // plan.ep)
    states = model_state_bytes(plan, dense, dp_shard)
    for k, v in model_state_bytes(plan, expert, ep_shard).items():
        states[k] += v
    mem = RankMemory(rank=rank, parts=dict(states))

    # activations: in-flight chunks x layers per chunk
    m, v = plan.grad_accum, plan.vpp
    chunks = in_flight_chunks(plan.schedule, plan.pp, v, m, rank)
    n_layers = max(len(ids), 1)
    n_moe = sum(model.moe_flags[i] for i in ids)
    per_layer = ((len(ids) - n_moe) * activation_bytes_per_layer(model, plan, False)
                 + (n_moe * activation_bytes_per_layer(model, plan, True) if n_moe else 0.0)) / n_layers
    layers_per_chunk = len(ids) / v
    e = BYTES[plan.dtype]
    tokens = plan.mbs * plan.seq_len / plan.cp
    act = chunks * layers_per_chunk * per_layer
    if first:
        act += chunks / v * tokens * e * model.hidden / (plan.tp if plan.sp else 1)  # embedding output
    mem.parts["activations"] = act
    working = max((layer_working_bytes(model, plan, model.moe_flags[i]) for i in {ids[0], ids[-1]}), default=0.0) if ids else 0.0
    if last:
        # logits plus the fp32 softmax that vocab-parallel cross-entropy keeps for backward
        # (computed in place, Megatron's fused_vocab_parallel_cross_entropy), one micro-batch
        working = max(working, tokens * model.vocab / plan.tp * (e + 4))
    mem.parts["transient"] = working
    if plan.zero >= 3:
        # FSDP keeps the current and the prefetched layer unsharded (weights + grads)
        per_layer_params = (dense + expert) / max(len(ids), 1)
        mem.parts["zero3 gathered layers"] = 2 * per_layer_params * (2 + _grad_bytes(plan))
    groups = sum(1 for size in (plan.tp, plan.dp * plan.cp, plan.pp, plan.cp, plan.ep) if size > 1) + 1
    mem.parts["communication buffers"] = groups * device.comm_buffer_mib_per_group * 2 ** 20
    allocated = mem.total
    mem.parts["allocator fragmentation"] = allocated * device.allocator_fragmentation
    mem.parts["runtime (context, workspaces)"] = device.runtime_reserved_gib * GIB
    return mem


def estimate_memory(model: ModelSpec, device: Device, plan: Plan) -> list[RankMemory]:
    """Memory of every pipeline rank (index = pipeline rank).

    Ranks with the same layer mix, ends and in-flight count have the same memory, so
    each distinct one is computed once (this keeps the search fast)."""
    out = []
    seen: dict[tuple, RankMemory] = {}
    rank_ids = all_rank_layers(model.layers, plan.pp, plan.stage_layers(model.layers))
    for r, ids in enumerate(rank_ids):
        n_moe = sum(model.moe_flags[i] for i in ids)
        key = (len(ids), n_moe, ids[:1] and model.moe_flags[ids[0]], ids[-1:] and model.moe_flags[ids[-1]],
               r == 0, r == plan.pp - 1, in_flight_chunks(plan.schedule, plan.pp, plan.vpp, plan.grad_accum, r))
        if key not in seen:
            seen[key] = estimate_rank_memory(model, device, plan, r)
        mem = seen[key]
        out.append(mem if mem.rank == r else RankMemory(rank=r, parts=mem.parts))
    return out
