"""Prefill and decode step times of one serving replica.

**Prefill** (one prompt of ``P`` tokens) is compute-bound: each layer is
:func:`partita.cost.compute.layer_forward` - the training cost model's forward of a
``P``-token causal sequence (GEMMs at the device's fitted, size-dependent efficiency, flash
attention at its own, element-wise kernels at the HBM rate, the per-layer launch overhead) -
but never faster than reading the layer's weights once (the roofline, Williams et al. 2009),
plus the layer's collectives. A prompt passes every pipeline stage in turn (``pp - 1`` hops).

**Decode** (one step of ``b`` sequences per attention group at context ``L``) is
memory-bound: per layer ``max(GEMM time, weight bytes / B)`` + ``max(KV bytes / B,
attention FLOPs / attention rate)`` + collectives + launch overhead, where ``B`` is the
achievable HBM bandwidth (``hbm_tbps x efficiency.memory_bandwidth``) [Pope et al. 2022,
"Efficiently Scaling Transformer Inference", sec. 2-3; Kwon et al. 2023 sec. 2]. A MoE layer
reads the experts the step's tokens route to: with ``n`` tokens each choosing ``k`` of ``E``
experts uniformly, an expert is touched with probability ``1 - (1 - k/E)^n``. MLA decode
attends over the latent with the absorbed up-projections (DeepSeek-V2 sec. 2.1.2, appendix
C): scores over ``kv_lora_rank + qk_rope_head_dim`` and values over ``kv_lora_rank`` per head.

Collectives per layer (:mod:`partita.cost.comm`): tensor parallel's two all-reduces of the
layer's output (Megatron, Shoeybi et al. 2019 sec. 3); with attention data parallel the MLP's
all-gather and reduce-scatter over the stage; with expert parallelism an all-to-all dispatch
and combine of the routed tokens (DeepSpeed-MoE, Rajbhandari et al. 2022 sec. 5); pipeline
hops send the hidden states of the micro-batch to the next stage.

With ``pp`` stages the engine keeps ``pp`` micro-batches in flight, so a sequence gets a token
every ``pp`` stage steps: ``TPOT = pp x max_stage t_stage(N / pp) + hops``.
"""
from __future__ import annotations

import math

from ..cost import comm
from ..cost.compute import gemm_time, layer_forward
from ..cost.shape import LayerShape
from ..spec.hardware import Device
from ..spec.model import ModelSpec
from .memory import (mla_split_params, kv_bytes_per_token, kv_bytes_per_token_layer,
                     kv_heads_per_device, layer_weights, stage_layers)
from .workload import Layout



def bandwidth(device: Device) -> float:
    """Achievable HBM bytes/s for streaming reads (weights, KV cache)."""
    return device.hbm_tbps * 1e12 * device.efficiency.memory_bandwidth


def span(members: int, per_node: int) -> tuple[int, int]:
    """(members per node, nodes) of a group of consecutive devices."""
    g = min(members, per_node)
    return g, math.ceil(members / g)


def layer_comm(model: ModelSpec, device: Device, layout: Layout, tokens: float, moe: bool, per_node: int) -> float:
    """Seconds of one layer's collectives for ``tokens`` tokens per attention group."""
    h, tp, stage = model.hidden, layout.tp, layout.tp * layout.dp_attn
    size = tokens * h * layout.weight_bytes
    t = comm.all_reduce(device, size, *span(tp, per_node)) if tp > 1 else 0.0  # attention output
    if moe and layout.ep > 1:  # dispatch + combine: each rank sends its 1/tp of the tokens x top_k
        sent = tokens / tp * model.moe.top_k * h * layout.weight_bytes
        return t + 2 * comm.all_to_all(device, sent, *span(stage, per_node))
    if layout.dp_attn > 1:  # gather every attention copy's tokens, scatter the MLP output back
        gathered = size * layout.dp_attn
        g, k = span(stage, per_node)
        return t + comm.all_gather(device, gathered, g, k) + comm.reduce_scatter(device, gathered, g, k)
    return t + (comm.all_reduce(device, size, *span(tp, per_node)) if tp > 1 else 0.0)


def _hop(model: ModelSpec, device: Device, layout: Layout, tokens: float, per_node: int) -> float:
    """One pipeline hop of ``tokens`` hidden states (crosses nodes when a replica does)."""
    if layout.pp == 1:
        return 0.0
    return comm.send_recv(device, tokens * model.hidden * layout.weight_bytes, layout.replica_devices > per_node)


def prefill_time(model: ModelSpec, device: Device, layout: Layout, prompt_len: int, per_node: int,
                 framework: str = "megatron") -> float:
    """Seconds to prefill one prompt on an idle replica (module docstring)."""
    bw = bandwidth(device)
    shape = LayerShape(layout.tp, 1, max(layout.ep, 1), 1, prompt_len, False, layout.dtype, framework, 1)
    total = 0.0
    for moe in (False, True):
        if moe and not model.moe:
            continue
        n = sum(stage[moe] for stage in stage_layers(model, layout.pp))
        if not n:
            continue
        compute = layer_forward(model, device, shape, moe).time
        weights = layer_weights(model, layout, moe) * layout.weight_bytes / bw
        total += n * (max(compute, weights) + layer_comm(model, device, layout, prompt_len, moe, per_node))
    total += _logits_time(model, device, layout, 1)
    return total + (layout.pp - 1) * _hop(model, device, layout, prompt_len, per_node)


def _logits_time(model: ModelSpec, device: Device, layout: Layout, rows: float) -> float:
    """The output projection for ``rows`` sampled tokens (weights read once)."""
    flops = 2 * rows * model.hidden * model.vocab / layout.tp
    weights = model.vocab * model.hidden / layout.tp * layout.weight_bytes
    return max(gemm_time(device, flops, layout.dtype), weights / bandwidth(device))


def decode_attention_dims(model: ModelSpec) -> tuple[int, int]:
    """(score dim, value dim) per head of a decode step (MLA: the absorbed latent form)."""
    if model.mla:
        return model.mla.kv_lora_rank + model.mla.qk_rope_head_dim, model.mla.kv_lora_rank
    return model.q_dim // model.heads, model.attn_out_dim // model.heads


def layer_gemm_flops(model: ModelSpec, layout: Layout, tokens: float, moe: bool) -> float:
    """GEMM FLOPs of one layer on one device for ``tokens`` tokens per attention group:
    ``2 x tokens x`` the matmul weights each token meets on the device (the routed experts'
    ``top_k`` of them; norms are not GEMMs)."""
    h, tp = model.hidden, layout.tp
    attn = attention_matmul_weights(model, tp)
    if moe:
        mo = model.moe
        shared = mo.shared_experts * model.mlp_params(mo.shared_ffn_hidden) if mo.shared_experts else 0
        mlp = h * mo.num_experts + (shared + mo.top_k * model.routed_expert_params()) / tp
    else:
        mlp = model.mlp_params(model.ffn_hidden) / tp
    return 2 * tokens * (attn + mlp)


def attention_matmul_weights(model: ModelSpec, tp: int) -> float:
    """The attention weights one rank multiplies with per token (no biases or norms): q and o
    split ``tp`` ways, k and v by kv head (replicated beyond ``kv_heads``); MLA's replicated
    down-projections and its split up- and output projections (:mod:`.memory`)."""
    h = model.hidden
    if model.mla:
        m = model.mla
        down = h * (m.kv_lora_rank + m.qk_rope_head_dim) + h * m.q_lora_rank
        return down + mla_split_params(model) / tp
    return 2 * h * model.q_dim / tp + 2 * h * model.kv_dim * kv_heads_per_device(model, tp) / model.kv_heads


def decode_layer(model: ModelSpec, device: Device, layout: Layout, batch: float, context: float, moe: bool,
                 per_node: int) -> float:
    """Seconds of one layer of a decode step: ``batch`` sequences per attention group."""
    bw, tp = bandwidth(device), layout.tp
    weights = layer_weights(model, layout, moe)
    if moe:  # only the experts some token routes to are read
        mo = model.moe
        routed = mo.num_experts * model.routed_expert_params() / (tp * layout.dp_attn)
        touched = 1 - (1 - mo.top_k / mo.num_experts) ** max(batch * layout.dp_attn, 1e-9)
        weights -= routed * (1 - touched)
    flops = layer_gemm_flops(model, layout, batch, moe)
    gemms = 6 if model.mla else 4
    gemm = max(gemm_time(device, flops, layout.dtype, gemms + 3), weights * layout.weight_bytes / bw)
    d_qk, d_v = decode_attention_dims(model)
    attn_flops = 2 * batch * context * model.heads / tp * (d_qk + d_v)
    kv_read = batch * context * kv_bytes_per_token_layer(model, layout)
    attn = max(kv_read / bw, attn_flops / (device.peak_flops(layout.dtype) * device.efficiency.attention))
    overhead = device.efficiency.kernel_overhead_us_per_layer * 1e-6
    return gemm + attn + overhead + layer_comm(model, device, layout, batch, moe, per_node)


def decode_stage_time(model: ModelSpec, device: Device, layout: Layout, batch: float, context: float,
                      per_node: int) -> float:
    """Seconds of the slowest stage's step for ``batch`` sequences per attention group."""
    dense_t = decode_layer(model, device, layout, batch, context, False, per_node)
    moe_t = decode_layer(model, device, layout, batch, context, True, per_node) if model.moe else 0.0
    logits = _logits_time(model, device, layout, batch)
    stages = stage_layers(model, layout.pp)
    return max(dense * dense_t + moe * moe_t + (logits if i == len(stages) - 1 else 0.0)
               for i, (dense, moe) in enumerate(stages))


def tpot(model: ModelSpec, device: Device, layout: Layout, seqs: float, context: float, per_node: int) -> float:
    """Seconds between two tokens of a sequence when the replica decodes ``seqs`` sequences
    (``pp`` micro-batches of ``seqs / pp``, each split over the ``dp_attn`` attention copies)."""
    micro = max(seqs / layout.pp, 1.0) / layout.dp_attn
    step = decode_stage_time(model, device, layout, micro, context, per_node)
    return layout.pp * step + layout.pp * _hop(model, device, layout, micro, per_node)


def kv_transfer_time(model: ModelSpec, device: Device, layout: Layout, prompt_len: int) -> float:
    """Disaggregated serving: each prefill device sends its share of the prompt's KV cache to
    its decode counterpart over the network (all devices in parallel)."""
    return comm.send_recv(device, prompt_len * kv_bytes_per_token(model, layout), crosses_nodes=True)


def forward_flops(model: ModelSpec, layout: Layout, tokens: float, context: float, sampled: float) -> float:
    """FLOPs of one forward on one device column (a tensor-parallel rank, all stages) for
    ``tokens`` new tokens each attending over ``context`` cached tokens on average, with
    ``sampled`` rows of logits: GEMMs + attention (decode form) + the output projection."""
    d_qk, d_v = decode_attention_dims(model)
    total = 0.0
    for dense, moe in stage_layers(model, layout.pp):
        total += dense * layer_gemm_flops(model, layout, tokens, False)
        total += moe * layer_gemm_flops(model, layout, tokens, True) if moe else 0.0
        total += (dense + moe) * 2 * tokens * context * model.heads / layout.tp * (d_qk + d_v)
    return total + 2 * sampled * model.hidden * model.vocab / layout.tp
