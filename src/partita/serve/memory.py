"""Bytes per device of a serving replica: weights, KV cache, activations, workspace.

Weights follow the engines' sharding (vLLM ``model_executor/layers/linear.py`` and the
DeepSeek-V2 model file; SGLang the same): q/o projections and MLPs split ``tp`` ways
(Megatron column/row parallel, Shoeybi et al. 2019 sec. 3); K/V projections split by kv head,
replicated once ``tp`` exceeds the kv heads (each rank keeps ``max(1, kv_heads / tp)`` heads);
MLA's down-projections ``q_a_proj`` and ``kv_a_proj_with_mqa`` are replicated, its
up-projections and output split; the router is replicated; routed experts are split over the
stage's ``tp x dp_attn`` devices (tensor-split experts when ``ep = 1``, whole experts with
expert parallelism: the same bytes). Parameter counts are :class:`~partita.spec.model.ModelSpec`'s.

KV cache per token and layer (Kwon et al. 2023, PagedAttention, sec. 2; Pope et al. 2022,
"Efficiently Scaling Transformer Inference", sec. 2.1)::

    MHA / GQA:  2 x kv_heads_per_device x head_dim x bytes        (K and V)
    MLA:        (kv_lora_rank + qk_rope_head_dim) x bytes        (the compressed latent and the
                                                                   shared RoPE key; DeepSeek-V2
                                                                   tech. report sec. 2.1.2)

MLA's latent is not split by ``tp`` (every attention rank keeps all of it); attention data
parallelism (``dp_attn``) gives each copy its own sequences.

Activations: the forward's largest live set in one layer for a chunk of ``T`` tokens (no
saved activations in inference), plus the fp32 logits of the sampled rows. Workspace: the
device file's runtime reservation and communicator buffers (``comm_buffer_mib_per_group``
per parallel group). Known gaps: graph-capture pools (CUDA/ACL graphs), the sampler's
buffers and allocator fragmentation beyond the KV pool's block rounding are not modelled.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..spec.hardware import Device
from ..spec.model import ModelSpec
from .workload import Layout

GIB = 1024 ** 3
#: tokens of one prefill chunk (vLLM's ``max_num_batched_tokens`` and SGLang's
#: ``chunked_prefill_size`` default to 8192 on large-memory devices): the activation peak
PREFILL_CHUNK = 8192
#: the fraction of device memory the engine may use (vLLM ``--gpu-memory-utilization`` 0.9,
#: SGLang ``--mem-fraction-static`` ~0.88, MindIE ``NPU_MEMORY_FRACTION`` 0.8-0.9)
MEM_FRACTION = 0.9
LOGIT_BYTES = 4  # fp32 logits


_MEMO: dict[tuple, object] = {}


def _memo(fn):
    """Memoise ``fn(model, *hashable)`` on the model's content key (the search asks the same
    per-layer figures for every replica count and prefill split)."""
    def wrapper(model: ModelSpec, *args):
        key = (fn.__name__, model.cache_key, *args)
        if key not in _MEMO:
            if len(_MEMO) > 65536:
                _MEMO.clear()
            _MEMO[key] = fn(model, *args)
        return _MEMO[key]
    wrapper.__doc__, wrapper.__name__ = fn.__doc__, fn.__name__
    return wrapper


@_memo
def stage_layers(model: ModelSpec, pp: int) -> list[tuple[int, int]]:
    """(dense layers, MoE layers) of each pipeline stage: contiguous blocks, the first
    ``layers % pp`` stages one layer longer (vLLM ``get_pp_indices``)."""
    base, extra = divmod(model.layers, pp)
    out, start = [], 0
    for stage in range(pp):
        n = base + (1 if stage < extra else 0)
        moe = sum(model.moe_flags[start:start + n])
        out.append((n - moe, moe))
        start += n
    return out


def kv_heads_per_device(model: ModelSpec, tp: int) -> float:
    """KV heads each tensor-parallel rank keeps: split ``tp`` ways, replicated beyond
    ``kv_heads`` ranks (vLLM ``QKVParallelLinear``: ``max(1, kv_heads // tp)``)."""
    return max(1.0, model.kv_heads / tp)


@_memo
def attention_weights(model: ModelSpec, tp: int) -> float:
    """Attention parameters one tensor-parallel rank holds in one layer."""
    h = model.hidden
    if model.mla:  # q_a_proj, kv_a_proj_with_mqa and the latent norms replicated; the rest split
        split = mla_split_params(model)
        return model.attention_params() - split + split / tp
    q, kv = model.q_dim, model.kv_dim
    split = 2 * h * q + (q if model.qkv_bias else 0)
    kv_part = (2 * h * kv + (2 * kv if model.qkv_bias else 0)) * kv_heads_per_device(model, tp) / model.kv_heads
    replicated = model.attention_params() - (2 * h * q + (q if model.qkv_bias else 0)) - (2 * h * kv + (
        2 * kv if model.qkv_bias else 0))
    return split / tp + kv_part + replicated


def mla_split_params(model: ModelSpec) -> float:
    """MLA parameters split by ``tp``: q_b_proj (or q_proj), kv_b_proj, o_proj."""
    m, h = model.mla, model.hidden
    qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
    q = (m.q_lora_rank if m.q_lora_rank else h) * model.heads * qk_head
    return q + m.kv_lora_rank * model.heads * (m.qk_nope_head_dim + m.v_head_dim) + model.attn_out_dim * h


def mlp_weights(model: ModelSpec, moe: bool, tp_mlp: int) -> float:
    """MLP (or router + shared + routed experts) parameters one device holds in one layer."""
    if not moe:
        return model.mlp_params(model.ffn_hidden) / tp_mlp
    mo = model.moe
    router = model.hidden * mo.num_experts + (model.hidden if mo.shared_expert_gate else 0)
    shared = mo.shared_experts * model.mlp_params(mo.shared_ffn_hidden) if mo.shared_experts else 0
    return router + shared / tp_mlp + mo.num_experts * model.routed_expert_params() / tp_mlp


def layer_weights(model: ModelSpec, layout: Layout, moe: bool) -> float:
    """Parameters of one layer on one device (norms replicated)."""
    return _layer_weights(model, layout.tp, layout.dp_attn, moe)


@_memo
def _layer_weights(model: ModelSpec, tp: int, dp_attn: int, moe: bool) -> float:
    mlp_full = model.moe_block_params() if moe else model.mlp_params(model.ffn_hidden)
    norms = model.layer_kind_params(moe) - model.attention_params() - mlp_full
    return attention_weights(model, tp) + mlp_weights(model, moe, tp * dp_attn) + norms


def stage_weight_bytes(model: ModelSpec, layout: Layout) -> list[float]:
    """Weight bytes per device of each pipeline stage (embedding on the first, the final norm
    and output projection on the last; the vocabulary split ``tp`` ways)."""
    dense_w, moe_w = layer_weights(model, layout, False), (layer_weights(model, layout, True) if model.moe else 0)
    out = []
    for i, (dense, moe) in enumerate(stage_layers(model, layout.pp)):
        params = dense * dense_w + moe * moe_w
        if i == 0:
            params += model.embedding_params() / layout.tp
        if i == layout.pp - 1:
            params += model.output_params() / layout.tp
        out.append(params * layout.weight_bytes)
    return out


def kv_bytes_per_token_layer(model: ModelSpec, layout: Layout) -> float:
    """KV-cache bytes one device stores per cached token and layer (module docstring)."""
    if model.mla:
        return (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) * layout.kv_bytes
    return 2 * kv_heads_per_device(model, layout.tp) * model.head_size * layout.kv_bytes


def kv_bytes_per_token(model: ModelSpec, layout: Layout) -> float:
    """KV bytes per cached token on the device of the longest stage."""
    layers = max(d + m for d, m in stage_layers(model, layout.pp))
    return layers * kv_bytes_per_token_layer(model, layout)


def activation_bytes(model: ModelSpec, layout: Layout, tokens: int, sampled: int) -> float:
    """Peak forward working set of one layer for ``tokens`` tokens on one device, plus the
    fp32 logits of ``sampled`` rows. Live at once: the residual stream and its normed copy
    (``2h``), then the larger of attention's (q, k, v and the attention output) and the MLP's
    (gate and up outputs and the activation: ``3 f``; a MoE layer's ``top_k`` routed copies
    of each token and their expert intermediates)."""
    h, tp, tp_mlp = model.hidden, layout.tp, layout.tp * layout.dp_attn
    attn = (2 * model.q_dim + 2 * model.kv_dim) / tp
    if model.moe:
        mo = model.moe
        mlp = mo.top_k * (h + 3 * mo.expert_ffn_hidden * layout.dp_attn / tp_mlp) + 3 * max(
            model.ffn_hidden, mo.shared_ffn_hidden * max(mo.shared_experts, 1)) / tp_mlp
    else:
        mlp = 3 * model.ffn_hidden / tp_mlp
    per_token = (2 * h + max(attn, mlp)) * layout.weight_bytes
    return tokens * per_token + sampled * model.vocab / tp * LOGIT_BYTES


def parallel_groups(layout: Layout) -> int:
    """Communicators a device joins (tp, pp neighbours, the MoE stage group)."""
    return (layout.tp > 1) + (layout.pp > 1) + (layout.dp_attn > 1 or layout.ep > 1)


def workspace_bytes(device: Device, layout: Layout) -> float:
    """The runtime's reservation plus one communicator buffer per parallel group."""
    return device.runtime_reserved_gib * GIB + parallel_groups(layout) * device.comm_buffer_mib_per_group * 2 ** 20


@dataclass(frozen=True)
class ServeMemory:
    """Memory of one device of a replica (the most loaded stage), in bytes, and the KV budget."""

    weights: float
    kv: float  # the KV pool the engine allocates (everything left)
    activations: float
    workspace: float
    limit: float
    kv_per_token: float  # per device, per cached token
    max_tokens: int  # tokens the KV pool of one attention group holds (min over stages)
    max_seqs: int  # sequences of prompt + output length the replica holds at once

    @property
    def fits(self) -> bool:
        return self.max_seqs >= 1

    def to_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def serve_memory(model: ModelSpec, device: Device, layout: Layout, max_len: int,
                 mem_fraction: float = MEM_FRACTION) -> ServeMemory:
    """The memory of a replica's device and how many sequences of ``max_len`` tokens its KV
    pool holds: ``budget = usable x mem_fraction - weights - activations - workspace`` per
    stage, ``tokens = budget / kv_per_token``; each of the ``dp_attn`` attention copies holds
    its own ``floor(tokens / max_len)`` sequences (the engines reserve a sequence's blocks as
    it grows; planning for the full length keeps it from being preempted)."""
    limit = device.usable_gib * GIB * mem_fraction
    act = activation_bytes(model, layout, min(PREFILL_CHUNK, max(max_len, 1)), sampled=256)
    work = workspace_bytes(device, layout)
    per_layer = kv_bytes_per_token_layer(model, layout)
    tokens, worst_w = math.inf, 0.0
    for weights, (dense, moe) in zip(stage_weight_bytes(model, layout), stage_layers(model, layout.pp)):
        budget = limit - weights - act - work
        tokens = min(tokens, max(budget, 0.0) / (per_layer * (dense + moe)))
        worst_w = max(worst_w, weights)
    tokens = int(tokens)
    seqs = (tokens // max_len) * layout.dp_attn
    kv = max(limit - worst_w - act - work, 0.0)
    return ServeMemory(worst_w, kv, act, work, limit, kv_bytes_per_token(model, layout), tokens, seqs)
