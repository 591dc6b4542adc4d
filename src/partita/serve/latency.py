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

The embedding is vocab-parallel under tensor parallelism, its output all-reduced once per
forward (vLLM ``VocabParallelEmbedding``: ``tensor_model_parallel_all_reduce``; Partita's
``apply_tp_hf``: a row-parallel ``embed_tokens``): one more all-reduce of the step's hidden
states on the first stage.

**Eager runtimes** (:data:`EAGER_RUNTIMES`: Partita's runtime serving a transformers model as
transformers runs it - DynamicCache, eager attention, DTensor tensor parallel) differ from the
engines in two documented places, each a count, not a fitted factor:

* the KV cache is moved :func:`decode_kv_passes` times per decode step instead of once
  (``DynamicLayer.update`` appends by ``torch.cat``; ``repeat_kv`` materialises GQA's K/V at the
  query width; the two attention matmuls read the expanded copies);
* prefill attention is transformers' ``eager_attention_forward``: the whole ``P x P`` score
  matrix (not flash attention's causal half) and its round trips through memory
  (:func:`eager_prefill_attention`);
* every tensor-parallel layer pays the host-side DTensor work ``partita calibrate`` measures
  (:func:`partita.cost.overheads.tp_framework_us` without sequence parallelism), its forward
  share (``FORWARD_SHARE`` = 1/3 of the forward + backward the micro-run timed).

With ``pp`` stages the engine keeps ``pp`` micro-batches in flight, so a sequence gets a token
every ``pp`` stage steps: ``TPOT = pp x max_stage t_stage(N / pp) + hops``.
"""
from __future__ import annotations

import math

from ..cost import comm
from ..cost.compute import gemm_time, layer_forward
from ..cost.frameworks import FRAMEWORKS
from ..cost.overheads import tp_framework_us
from ..cost.shape import LayerShape
from ..cost.step import FORWARD_SHARE
from ..spec.hardware import Device
from ..spec.model import ModelSpec
from . import eager_step
from .memory import (
    kv_bytes_per_token,
    kv_bytes_per_token_layer,
    kv_heads_per_device,
    layer_weights,
    mla_split_params,
    stage_layers,
)
from .workload import Layout

#: frameworks whose serving path is transformers' own: ``DynamicCache`` (``torch.cat`` per
#: step), ``attn_implementation="eager"`` (``repeat_kv`` + two matmuls), DTensor tensor
#: parallel (``partita.runtime.tensor_parallel.apply_tp_hf``) - what bench/serve_vs_measure.py
#: measures. Every other framework name stands for an engine's fused paged attention.
EAGER_RUNTIMES = frozenset({"partita"})


def bandwidth(device: Device) -> float:
    """Achievable HBM bytes/s of element-wise kernels writing fresh tensors (the device file's
    copy rate: eager prefill's score passes)."""
    return device.hbm_tbps * 1e12 * device.efficiency.memory_bandwidth


def read_bandwidth(device: Device) -> float:
    """Bytes/s of streaming reads of memory already allocated (weights, the KV cache): the
    calibrated ``memory.read_tbps`` where the file has it, else :func:`bandwidth` (one HBM rate
    on accelerators; a CPU's copy into fresh pages runs ~3x slower than its reads:
    :mod:`partita.calibrate.read_rate`)."""
    return device.read_bytes_per_s()


def span(members: int, per_node: int) -> tuple[int, int]:
    """(members per node, nodes) of a group of consecutive devices."""
    g = min(members, per_node)
    return g, math.ceil(members / g)


def all_reduce(device: Device, size: float, g: int, k: int, framework: str = "megatron") -> float:
    """Seconds of a tensor-parallel all-reduce: :func:`partita.cost.comm.all_reduce`, except
    on an NVLink switch node under an engine with a one-shot kernel (:func:`one_shot_all_reduce`),
    and on a full-mesh node (HCCS on the 910B) without a calibrated fit the latency term is
    HCCL's Mesh algorithm's ``2 alpha`` - a reduce-scatter and an all-gather, each one step in
    which every rank talks to all peers at once - not the ring's ``2 (g - 1) alpha``. HCCL
    picks Mesh inside an Atlas A2 server by topology (CANN HCCL user guide, "集合通信算法":
    Server内 Mesh/Ring/Double-Ring/Star, chosen by the hardware topology; Ascend/cann-hccl
    docs, Mesh: AllReduce ``2 alpha + 2/p n beta + (p-1)/p n gamma``, Ring
    ``2 (p-1) alpha + ...``). A decode step's all-reduces are kilobytes: the latency is the
    whole cost (Llama-2-70B tp 8, 160 per step: 45 ms at the ring's 14 alpha, 6 ms at 2)."""
    one_shot = one_shot_all_reduce(device, size, g, k, framework)
    if one_shot is not None:
        return one_shot
    t = comm.all_reduce(device, size, g, k)
    if device.intra_topology == "full-mesh" and g > 2 and comm.collective_fit(device, "all_reduce", g) is None:
        t -= (2 * (g - 1) - 2) * device.intra_latency_us * 1e-6
    return t


#: runtimes whose tensor-parallel all-reduce is the process group's collective (NCCL, HCCL,
#: gloo) at every size: the eager runtimes, and TensorRT-LLM engines built without
#: ``--use_custom_all_reduce`` (its v0.6.1 docs/source/performance.md Llama2-70b build command
#: does not pass it, so its plugin calls NCCL)
NCCL_ALL_REDUCE = EAGER_RUNTIMES | {"tensorrt-llm"}
#: vLLM's custom all-reduce (vllm/distributed/device_communicators/custom_all_reduce.py;
#: SGLang carries the same kernel): world sizes it runs (``_SUPPORTED_WORLD_SIZES``), the
#: largest message (``max_size=8192 * 1024``; larger ones go to NCCL) and, per world size, the
#: largest message of the one-stage kernel (csrc/custom_all_reduce.cuh ``allreduce``: ``bytes <
#: 512 KiB`` up to 4 ranks, ``< 256 KiB`` up to 8; above: the two-stage kernel)
ONE_SHOT_WORLD_SIZES = (2, 4, 6, 8)
ONE_SHOT_MAX_BYTES = 8192 * 1024


def one_shot_stage_limit(g: int) -> float:
    """Largest message (bytes, exclusive) vLLM's custom all-reduce runs in one stage on ``g``
    fully NVLinked ranks (two ranks: always one stage)."""
    return math.inf if g == 2 else (512 if g <= 4 else 256) * 1024


def one_shot_all_reduce(device: Device, size: float, g: int, k: int, framework: str) -> float | None:
    """Seconds of vLLM's / SGLang's custom all-reduce, or None where the engine calls NCCL.

    On one node of NVLink through NVSwitch (every pair of GPUs one hop apart: vLLM's
    ``full_nvlink`` check), with ``g`` in :data:`ONE_SHOT_WORLD_SIZES` and a message of at most
    :data:`ONE_SHOT_MAX_BYTES`, the engines run ``cross_device_reduce_1stage``: a
    ``start_sync`` (each rank writes a flag to every peer at once - "Latency = 1 p2p write"),
    every rank reading all ``g - 1`` peers' inputs over NVLink and reducing them, and an
    ``end_sync`` (again 1 p2p write): two latencies whatever ``g``, where NCCL's ring takes
    ``2 (g - 1)`` steps - the same count as HCCL's Mesh on the 910B (:func:`all_reduce`). Above
    :func:`one_shot_stage_limit` the two-stage kernel (a reduce-scatter then an all-gather
    through the peers' buffers, the ring's ``2 (g - 1)/g`` bytes) keeps the two syncs.
    The latency is the device file's per-step ``intra_latency_us``, as for the ring."""
    if framework in NCCL_ALL_REDUCE or k > 1 or g not in ONE_SHOT_WORLD_SIZES or size > ONE_SHOT_MAX_BYTES:
        return None
    if device.intra_topology != "switch" or "nvlink" not in device.intra_link.lower():
        return None
    if comm.collective_fit(device, "all_reduce", g) is not None:
        return None  # a calibrated file measured its own all-reduce
    peers = (g - 1) * size if size < one_shot_stage_limit(g) else 2 * (g - 1) / g * size
    return peers / comm.intra_bandwidth(device, g) + 2 * device.intra_latency_us * 1e-6


def layer_comm(model: ModelSpec, device: Device, layout: Layout, tokens: float, moe: bool, per_node: int,
               framework: str = "megatron") -> float:
    """Seconds of one layer's collectives for ``tokens`` tokens per attention group."""
    h, tp, stage = model.hidden, layout.tp, layout.tp * layout.dp_attn
    size = tokens * h * layout.weight_bytes
    t = all_reduce(device, size, *span(tp, per_node), framework) if tp > 1 else 0.0  # attention output
    if moe and layout.ep > 1:  # dispatch + combine: each rank sends its 1/tp of the tokens x top_k
        sent = tokens / tp * model.moe.top_k * h * layout.weight_bytes
        return t + 2 * comm.all_to_all(device, sent, *span(stage, per_node))
    if layout.dp_attn > 1:  # gather every attention copy's tokens, scatter the MLP output back
        gathered = size * layout.dp_attn
        g, k = span(stage, per_node)
        return t + comm.all_gather(device, gathered, g, k) + comm.reduce_scatter(device, gathered, g, k)
    return t + (all_reduce(device, size, *span(tp, per_node), framework) if tp > 1 else 0.0)


def embedding_comm(model: ModelSpec, device: Device, layout: Layout, tokens: float, per_node: int,
                   framework: str = "megatron") -> float:
    """The vocab-parallel embedding's all-reduce of ``tokens`` hidden states (module docstring)."""
    if layout.tp == 1:
        return 0.0
    return all_reduce(device, tokens * model.hidden * layout.weight_bytes, *span(layout.tp, per_node), framework)


def dtensor_overhead(device: Device, layout: Layout, framework: str) -> float:
    """Seconds of host-side DTensor work per layer of a forward under tensor parallelism in an
    eager runtime: the forward share of the calibrated per-layer term (0 on engines, at tp 1,
    and on device files that do not measure it)."""
    if layout.tp == 1 or framework not in EAGER_RUNTIMES:
        return 0.0
    return tp_framework_us(device, False) * 1e-6 * FORWARD_SHARE


def decode_kv_passes(model: ModelSpec, tp: int, framework: str) -> float:
    """Times a decode step moves each byte of a layer's cached K and V (read or written).

    Engines (paged attention; Kwon et al. 2023 sec. 4.1, FlashAttention/FlashInfer decode
    kernels) read the cache once, the new token's K/V written in place. transformers'
    ``DynamicLayer.update`` (cache_utils.py) appends with ``torch.cat([self.keys, key_states])``
    - reads the old cache and writes a new one (2); ``eager_attention_forward`` then calls
    ``repeat_kv`` (modeling_llama.py: ``expand`` + ``reshape``, a copy when ``n_rep > 1``) -
    reads it and writes ``n_rep`` copies (``1 + n_rep``) - and its two matmuls read the
    expanded K and V (``n_rep``): ``3 + 2 n_rep`` with GQA, ``3`` without (``repeat_kv``
    returns its input). ``n_rep``: query heads per kv head on one rank. MLA's latent cache
    (absorbed form) is read once either way."""
    if framework not in EAGER_RUNTIMES or model.mla:
        return 1.0
    n_rep = model.heads / tp / kv_heads_per_device(model, tp)
    return 2 + (1 + 2 * n_rep if n_rep > 1 else 1)


def decode_kv_writes(model: ModelSpec, tp: int, framework: str) -> float:
    """Of :func:`decode_kv_passes`, the passes that write a newly allocated tensor: the
    ``torch.cat`` result (1) and ``repeat_kv``'s ``n_rep`` copies with GQA; none on an engine
    (the new token's K/V is written in place)."""
    return sum(decode_kv_allocations(model, tp, framework))


def decode_kv_allocations(model: ModelSpec, tp: int, framework: str) -> list[float]:
    """The tensors one layer of a decode step allocates for its K/V, each as a fraction of the
    layer's cached K + V bytes (K and V are the same size): ``DynamicLayer.update``'s two
    ``torch.cat`` results (1/2 each) and, with GQA (``n_rep > 1``), ``repeat_kv``'s two
    expanded copies (``n_rep / 2`` each). None on an engine or for MLA's latent cache."""
    if framework not in EAGER_RUNTIMES or model.mla:
        return []
    n_rep = model.heads / tp / kv_heads_per_device(model, tp)
    return [0.5, 0.5] + ([n_rep / 2, n_rep / 2] if n_rep > 1 else [])


def decode_kv_seconds(model: ModelSpec, device: Device, tp: int, framework: str, kv: float) -> float:
    """Seconds one layer of a decode step moves its K/V (``kv``: the layer's cached K + V bytes
    for the step's sequences): :func:`decode_kv_passes` passes, the :func:`decode_kv_writes`
    ones into newly allocated tensors at :func:`fresh_write_seconds_per_byte`, the rest at the
    read rate. Measured on this CPU (docs/serve.md, issue 37), the allocator often hands those
    tensors reused pages (no first touch; a ``cat`` into them runs at the read rate), but pricing
    them so (first-touch only above glibc's 32 MiB mmap cap) re-measured worse - median 13 % /
    18.8 % / 18.2 % against 9.2 % / 7.3 % / 14.6 % on the same rows of three runs - because this
    term also stands in for what the model does not price in an eager decode step: the
    ``bmm``s' GEMV rate at q_len 1, the skinny GEMMs and the per-op host dispatch. A file with
    those rates measured (``eager_decode``) prices them instead: :func:`eager_kv_seconds`."""
    if device.eager_decode is not None and framework in EAGER_RUNTIMES and not model.mla:
        return eager_kv_seconds(model, device, tp, framework, kv)
    read = read_bandwidth(device)
    writes = decode_kv_writes(model, tp, framework)
    return kv * (decode_kv_passes(model, tp, framework) - writes) / read + kv * writes * fresh_write_seconds_per_byte(device)


def eager_kv_seconds(model: ModelSpec, device: Device, tp: int, framework: str, kv: float) -> float:
    """:func:`decode_kv_seconds` on a file with the ``eager_decode`` rates: of the
    :func:`decode_kv_passes`, the attention's (``n_rep``: the two matmuls read the expanded K
    and V; 1 without GQA) at the measured eager-attention rate at q_len 1
    (``eager_decode.attention_tbps``: ``matmul``, ``softmax``, ``matmul`` over K and V), the
    ``cat`` and ``repeat_kv`` passes at the read rate - a ``cat`` into pages the allocator
    reuses moves a read and a write per byte at it (measured on the development VM, 8-17 MB:
    ``cat`` and ``copy_`` 6.0-6.4 GB/s per byte written, a ``sum`` 12.8-14.6 GB/s in the same
    minute) - and the :func:`decode_kv_fresh_bytes` (none: :mod:`.eager_step`) at
    :func:`fresh_write_seconds_per_byte` instead of a read's."""
    read = read_bandwidth(device)
    passes = decode_kv_passes(model, tp, framework)
    n_rep = model.heads / tp / kv_heads_per_device(model, tp)
    attention = n_rep if n_rep > 1 else 1.0
    fresh = decode_kv_fresh_bytes(model, device, tp, framework, kv)
    return (kv * (passes - attention) - fresh) / read + fresh * fresh_write_seconds_per_byte(device) \
        + kv * attention / device.eager_decode.attention_bytes_per_s


def decode_kv_fresh_bytes(model: ModelSpec, device: Device, tp: int, framework: str, kv: float) -> float:
    """Bytes of one layer's decode-step K/V allocations (``kv``: the layer's cached K + V bytes)
    the model prices as written into first-touched pages: on a file with the ``eager_decode``
    rates none (the runtime's heap is steady: :mod:`.eager_step`), else every one
    (:func:`decode_kv_seconds`)."""
    if device.eager_decode is not None and framework in EAGER_RUNTIMES:  # pages reused: eager_step
        return 0.0
    return kv * decode_kv_writes(model, tp, framework)


def eager_gemm_time(device: Device, flops: float, rows: float, weight_bytes: float) -> float:
    """Seconds of a decode step's GEMMs with ``rows`` rows on a file with the ``eager_decode``
    rates: their FLOPs at the rate measured for ``rows`` rows
    (:meth:`partita.spec.eager_decode.EagerDecode.gemm_flops_per_s`), never faster than reading
    their ``weight_bytes`` once at the read rate."""
    return max(flops / device.eager_decode.gemm_flops_per_s(rows), weight_bytes / read_bandwidth(device))


def fresh_write_seconds_per_byte(device: Device) -> float:
    """Seconds per byte written into pages touched for the first time: the device file's clone
    (``hbm_tbps``, read + write counted, into a fresh 64 MB tensor - above glibc's 32 MiB mmap
    cap, so every page faults) less its read at the read rate,
    ``2 / B_clone - 1 / B_read``; where the file has no separate read rate the two are one rate
    and this is ``1 / B``. On this CPU (clone 2.85, read 8.66 GB/s): 1.7 GB/s."""
    read = read_bandwidth(device)
    return max(2 / bandwidth(device) - 1 / read, 1 / read)


#: passes through memory over each element of eager attention's ``P x P`` scores per head,
#: from ``eager_attention_forward`` (modeling_llama.py): the ``matmul`` writes (1), ``* scaling``
#: reads and writes (2), ``+ attention_mask`` reads and writes (2), ``softmax`` reads and writes
#: (2), ``dropout`` in eval returns its input (0), the second ``matmul`` reads (1)
EAGER_SCORE_PASSES = 8


def eager_prefill_attention(model: ModelSpec, device: Device, layout: Layout, prompt_len: int) -> float:
    """Seconds one layer of an eager runtime's prefill adds to the flash-attention cost of
    :func:`partita.cost.compute.layer_forward`: the masked half of the score matrix computed
    anyway (``2 P (P - (P+1)/2) heads/tp (d_qk + d_v)`` FLOPs at the attention rate) and the
    scores' :data:`EAGER_SCORE_PASSES` round trips plus one read of the ``P x P`` mask, at
    the memory rate. MLA models: the same with their score and value head sizes."""
    if device.eager_decode is not None:  # the measured eager rates: all of it, less layer_forward's attention
        shape = LayerShape(layout.tp, 1, max(layout.ep, 1), 1, prompt_len, False, layout.dtype, "partita", 1)
        return eager_step.prefill_attention(model, device, layout.tp, layout.weight_bytes, prompt_len) \
            - layer_forward(model, device, shape, False).attn_time
    p, heads = float(prompt_len), model.heads / layout.tp
    d_qk, d_v = model.q_dim // model.heads, model.attn_out_dim // model.heads
    flops = 2 * p * (p - (p + 1) / 2) * heads * (d_qk + d_v)
    rate = device.peak_flops(layout.dtype) * device.efficiency.attention
    scores = p * p * layout.weight_bytes * (heads * EAGER_SCORE_PASSES + 1)
    return flops / rate + scores / bandwidth(device)


def _hop(model: ModelSpec, device: Device, layout: Layout, tokens: float, per_node: int) -> float:
    """One pipeline hop of ``tokens`` hidden states (crosses nodes when a replica does)."""
    if layout.pp == 1:
        return 0.0
    return comm.send_recv(device, tokens * model.hidden * layout.weight_bytes, layout.replica_devices > per_node)


#: prefill tokens one engine step takes (vLLM's ``--max-num-batched-tokens`` / SGLang's
#: ``--chunked-prefill-size`` default on large GPUs: 8192; the activation term of :mod:`.memory`
#: assumes the same chunk)
CHUNK_TOKENS = 8192


def prefill_time(model: ModelSpec, device: Device, layout: Layout, prompt_len: int, per_node: int,
                 framework: str = "megatron") -> float:
    """Seconds to prefill one prompt on an idle replica (module docstring)."""
    return batch_prefill_time(model, device, layout, prompt_len, 1, per_node, framework)


def prefill_share(model: ModelSpec, device: Device, layout: Layout, prompt_len: int, per_node: int,
                  chunk_tokens: int = CHUNK_TOKENS, framework: str = "megatron") -> float:
    """Seconds of a saturated replica's time one prompt takes when the engine packs prompts
    into chunks of ``chunk_tokens`` (chunked prefill: vLLM's scheduler fills each step's token
    budget with waiting prompts; SGLang's ``chunked_prefill_size``; Agrawal et al. 2024,
    Sarathi-Serve sec. 4): a forward of ``floor(C / P)`` prompts shares one read of the
    weights, one launch of each kernel and one collective latency per layer among them.
    A prompt of ``C`` tokens or more fills chunks alone: :func:`prefill_time`."""
    prompts = max(1, chunk_tokens // max(prompt_len, 1))
    return batch_prefill_time(model, device, layout, prompt_len, prompts, per_node, framework) / prompts


def batch_prefill_time(model: ModelSpec, device: Device, layout: Layout, prompt_len: int, prompts: int,
                       per_node: int, framework: str = "megatron") -> float:
    """Seconds of one prefill forward of ``prompts`` prompts of ``prompt_len`` tokens each
    (attention within each prompt; the GEMMs, collectives and weight reads over all of them;
    one logits row per prompt)."""
    bw = read_bandwidth(device)
    kernels = framework if framework in FRAMEWORKS else "megatron"  # an engine's fused kernels: Megatron's
    shape = LayerShape(layout.tp, 1, max(layout.ep, 1), prompts, prompt_len, False, layout.dtype, kernels, 1)
    tokens = prompts * prompt_len
    total = 0.0
    for moe in (False, True):
        if moe and not model.moe:
            continue
        n = sum(stage[moe] for stage in stage_layers(model, layout.pp))
        if not n:
            continue
        compute = eager_step.prefill_layer(layer_forward(model, device, shape, moe), device, tokens,
                                           framework in EAGER_RUNTIMES and not moe)
        if moe and framework not in EAGER_RUNTIMES:
            compute += grouped_expert_gemms(model, device, layout, tokens) - per_expert_gemms(model, device, layout, tokens)
        weights = layer_weights(model, layout, moe) * layout.weight_bytes / bw
        eager = prompts * eager_prefill_attention(model, device, layout, prompt_len) if framework in EAGER_RUNTIMES else 0.0
        total += n * (max(compute, weights) + layer_comm(model, device, layout, tokens, moe, per_node, framework)
                      + dtensor_overhead(device, layout, framework) + eager)
    total += _logits_time(model, device, layout, prompts) + embedding_comm(model, device, layout, tokens, per_node,
                                                                           framework)
    total += engine_host(framework, total)  # a prefill forward is a scheduler call of its own
    return total + (layout.pp - 1) * _hop(model, device, layout, tokens, per_node)


#: grouped GEMMs a MoE layer's routed experts run in an engine: the gate and up projections
#: fused in one, the down projection in another - vLLM ``fused_moe.py`` ``fused_experts``: two
#: ``invoke_fused_moe_kernel`` calls, each one Triton launch over every expert's tiles (rows
#: sorted by expert, ``moe_align_block_size``); vLLM-Ascend / MindIE: ``torch_npu.
#: npu_grouped_matmul`` for gate_up ("gmm1") and down ("gmm2"); SGLang the same fused_moe kernel
GROUPED_EXPERT_GEMMS = 2


def routed_expert_flops(model: ModelSpec, layout: Layout, tokens: float) -> float:
    """FLOPs of one MoE layer's routed experts on one device for ``tokens`` tokens per
    attention group: each token's ``top_k`` expert FFNs, the tokens split ``tp`` ways (as
    :func:`partita.cost.compute.layer_forward` counts them at expert tensor parallel 1)."""
    mo = model.moe
    mats = 3 if model.gated else 2
    return 2 * tokens * mo.top_k / layout.tp * mats * model.hidden * mo.expert_ffn_hidden


def per_expert_gemms(model: ModelSpec, device: Device, layout: Layout, tokens: float) -> float:
    """Seconds the training cost model gives the routed experts: one GEMM per local expert and
    weight matrix, each at the efficiency of its own size (a training framework's loop over
    experts; :func:`partita.cost.compute.layer_forward`)."""
    mats = 3 if model.gated else 2
    count = max(1, int(model.moe.num_experts / max(layout.ep, 1) * mats))
    return gemm_time(device, routed_expert_flops(model, layout, tokens), layout.dtype, count)


def grouped_expert_gemms(model: ModelSpec, device: Device, layout: Layout, tokens: float) -> float:
    """Seconds of the routed experts as an engine runs them at prefill:
    :data:`GROUPED_EXPERT_GEMMS` grouped GEMMs, each one kernel whose tiles over all experts
    fill the device together, so its efficiency is that of its whole size, not of one expert's
    few rows (a 217-token prompt routes ~14 rows to each of Qwen3-30B-A3B's 128 experts). The
    weights are still read once: :func:`batch_prefill_time` keeps the layer's weight-read
    bound (every expert of the stage, as the training model's forward)."""
    return gemm_time(device, routed_expert_flops(model, layout, tokens), layout.dtype, GROUPED_EXPERT_GEMMS)


def _logits_time(model: ModelSpec, device: Device, layout: Layout, rows: float) -> float:
    """The output projection for ``rows`` sampled tokens (weights read once)."""
    flops = 2 * rows * model.hidden * model.vocab / layout.tp
    weights = model.vocab * model.hidden / layout.tp * layout.weight_bytes
    return max(gemm_time(device, flops, layout.dtype), weights / read_bandwidth(device))


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


def decode_launch_overhead(device: Device, framework: str) -> float:
    """Seconds of host-side kernel launches per layer of a decode step: the device file's
    per-layer launch overhead in an eager runtime, none on an engine, whose decode step runs
    as a captured graph - one launch per step, not per kernel (vLLM: CUDA graphs unless
    ``--enforce-eager``, vLLM-Ascend: ACL graphs; SGLang: ``--cuda-graph-max-bs``; torchair:
    graph mode, what its published Llama figures ran). The device-side gaps between a graph's
    kernels (about a microsecond each) are not modelled. A file with the host time of an eager
    decode step measured (``eager_decode.host_us_per_layer``: a hidden-64 transformers Llama's
    decode steps, :mod:`partita.calibrate.decode_rates`) gives it instead of the training
    micro-runs' per-layer figure."""
    if framework not in EAGER_RUNTIMES:
        return 0.0
    if device.eager_decode is not None and device.eager_decode.host_s_per_layer > 0:
        return device.eager_decode.host_s_per_layer
    return device.efficiency.kernel_overhead_us_per_layer * 1e-6


def decode_step_host(device: Device, framework: str) -> float:
    """Host seconds of an eager decode step outside its layers (embedding, rotary tables, mask,
    final norm, logits, cache bookkeeping): ``eager_decode.host_us_per_step`` where the file
    measured it, else 0 (engines: one graph launch a step)."""
    if framework not in EAGER_RUNTIMES or device.eager_decode is None:
        return 0.0
    return device.eager_decode.host_s_per_step


#: Exposed host seconds per scheduler call of engines whose loop waits for each step's sampled
#: tokens on the host before it builds the next step (the GPU idles meanwhile). vLLM's V0 engine:
#: "GPU is often idle, waiting for CPU operations (5-13ms of GPU bubble)"; "each highlighted
#: redbox is about 4ms of GPU bubble ... for baseline, this overhead is incurred on every
#: decode. With multi-step-8, the 4ms only needs to be incurred once for every 8 decode"
#: (vllm-project/vllm issue #6854, the multi-step scheduling RFC, Llama-3-8B on one H100: the
#: sampled tokens' device-to-host copy, their pythonization, the next step's input metadata,
#: the scheduler) - so ``--num-scheduler-steps k`` (vLLM 0.6) pays it once per ``k`` steps.
ENGINE_HOST_SECONDS = {"vllm-v0": 4e-3}
#: The same bubble as a fraction of the device step where the source gives a ratio: SGLang
#: before its overlap scheduler - v0.3.x ``ModelTpServer.forward_decode_batch`` calls
#: ``next_token_ids.tolist()`` (a device sync) and loops over the batch's requests
#: (``check_finished``, ``handle_finished_requests``, ``filter_batch``) before the next
#: ``prepare_for_decode`` - and SGLang v0.4's release blog (lmsys.org 2024-12-04, "Zero-overhead
#: batch scheduler: 1.1x increase in throughput", the scheduler run one batch ahead): the
#: synchronous loop costs 0.1 of the device step. From v0.4 the overlap hides it (not priced).
ENGINE_HOST_FRACTION = {"sglang-sync": 0.1}


def engine_host(framework: str, device_seconds: float, window: int = 1) -> float:
    """Host seconds a synchronous engine adds to one step of ``device_seconds`` on the device
    (:data:`ENGINE_HOST_SECONDS` once per scheduler call of ``window`` steps,
    :data:`ENGINE_HOST_FRACTION` of the step); 0 for every other framework name (an engine
    whose host work hides behind the device, or whose bubble no source gives)."""
    if framework in ENGINE_HOST_SECONDS:
        return ENGINE_HOST_SECONDS[framework] / max(window, 1)
    return ENGINE_HOST_FRACTION.get(framework, 0.0) * device_seconds


def decode_layer(model: ModelSpec, device: Device, layout: Layout, batch: float, context: float, moe: bool,
                 per_node: int, framework: str = "megatron") -> float:
    """Seconds of one layer of a decode step: ``batch`` sequences per attention group
    (``framework``: an engine, or an eager runtime - module docstring)."""
    bw, tp = read_bandwidth(device), layout.tp
    weights = layer_weights(model, layout, moe)
    if moe:  # only the experts some token routes to are read
        mo = model.moe
        routed = mo.num_experts * model.routed_expert_params() / (tp * layout.dp_attn)
        touched = 1 - (1 - mo.top_k / mo.num_experts) ** max(batch * layout.dp_attn, 1e-9)
        weights -= routed * (1 - touched)
    flops = layer_gemm_flops(model, layout, batch, moe)
    gemms = 6 if model.mla else 4
    if device.eager_decode is not None and framework in EAGER_RUNTIMES:
        gemm = eager_gemm_time(device, flops, batch, weights * layout.weight_bytes)
    else:
        gemm = max(gemm_time(device, flops, layout.dtype, gemms + 3), weights * layout.weight_bytes / bw)
    d_qk, d_v = decode_attention_dims(model)
    attn_flops = 2 * batch * context * model.heads / tp * (d_qk + d_v)
    kv = batch * context * kv_bytes_per_token_layer(model, layout)
    kv_time = decode_kv_seconds(model, device, tp, framework, kv)
    attn = max(kv_time, attn_flops / (device.peak_flops(layout.dtype) * device.efficiency.attention))
    overhead = decode_launch_overhead(device, framework)
    overhead += dtensor_overhead(device, layout, framework)
    return gemm + attn + overhead + layer_comm(model, device, layout, batch, moe, per_node, framework)


def decode_stage_time(model: ModelSpec, device: Device, layout: Layout, batch: float, context: float,
                      per_node: int, framework: str = "megatron") -> float:
    """Seconds of the slowest stage's step for ``batch`` sequences per attention group: its
    layers, the embedding's all-reduce on the first stage and the logits on the last."""
    dense_t = decode_layer(model, device, layout, batch, context, False, per_node, framework)
    moe_t = decode_layer(model, device, layout, batch, context, True, per_node, framework) if model.moe else 0.0
    logits = _logits_time(model, device, layout, batch)
    if device.eager_decode is not None and framework in EAGER_RUNTIMES:
        logits = eager_gemm_time(device, 2 * batch * model.hidden * model.vocab / layout.tp, batch,
                                 model.vocab * model.hidden / layout.tp * layout.weight_bytes)
    embed = embedding_comm(model, device, layout, batch, per_node, framework)
    stages = stage_layers(model, layout.pp)
    host = decode_step_host(device, framework)
    return max(dense * dense_t + moe * moe_t + (logits if i == len(stages) - 1 else 0.0) + (embed if i == 0 else 0.0)
               + host for i, (dense, moe) in enumerate(stages))


def tpot(model: ModelSpec, device: Device, layout: Layout, seqs: float, context: float, per_node: int,
         framework: str = "megatron", window: int = 1) -> float:
    """Seconds between two tokens of a sequence when the replica decodes ``seqs`` sequences
    (``pp`` micro-batches of ``seqs / pp``, each split over the ``dp_attn`` attention copies),
    with a synchronous engine's host bubble per step (:func:`engine_host`; ``window``: decode
    steps per scheduler call)."""
    micro = max(seqs / layout.pp, 1.0) / layout.dp_attn
    step = decode_stage_time(model, device, layout, micro, context, per_node, framework)
    # the host bubble once per token of a sequence: with pp micro-batches in flight (vLLM V0's
    # virtual engines, one scheduler loop each) a micro-batch's host turn falls while the
    # stages run the others', so it lengthens its own cycle, not every stage step
    return layout.pp * step + layout.pp * _hop(model, device, layout, micro, per_node) + engine_host(
        framework, layout.pp * step, window)


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
