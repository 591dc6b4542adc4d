"""Fine-tuning: the memory and time of full SFT and of LoRA (``plan.finetune``).

Full SFT (``finetune="full"``) trains every weight: its memory and time are pre-training's
(the model states of :mod:`.states`, the activations of :mod:`.activations`), only the data
differs (:mod:`partita.cost.packing`: padding and packing of variable-length samples).

LoRA (``finetune="lora"``) [Hu et al. 2021, arXiv:2106.09685] freezes every base weight and
trains, beside each targeted linear ``W (out x in)``, two low-rank matrices ``A (r x in)``
and ``B (out x r)``: ``y = W x + (alpha / r) B A x``. Counted here:

* **Adapter parameters** per targeted linear ``r (in + out)`` (no bias; PEFT's default
  ``bias="none"``), over the linears ``plan.lora_targets`` names: ``attention`` = q, k, v, o
  (MLA: q_a, q_b, kv_a, kv_b, o), ``mlp`` = gate, up, down (or fc1, fc2; every routed and
  shared expert's), ``all-linear`` = both - PEFT's ``target_modules="all-linear"`` (every
  ``nn.Linear`` but the output layer). :func:`trainable_params` equals PEFT's
  ``get_nb_trainable_parameters`` (tests/test_finetune_cost.py). The MoE router is not
  targeted (Megatron/MindSpeed LoRA never wraps it; HF's routers differ per model).
* **Memory**: frozen weights in the training dtype (2 bytes in 16-bit/fp8 training, 4 in
  fp32; no fp32 master, no gradient, no optimizer state), sharded over the state shard
  group only at ZeRO-3 / FSDP (frozen and trainable parameters in one FSDP unit);
  adapters carry the full pre-training states (working weight, main gradient, fp32 master
  and Adam m, v: :func:`.states._state_bytes`) with the plan's ZeRO sharding, and the
  pre-training rules for those states: moments in ``plan.moment_dtype``
  (:func:`.states.moment_saving`, zero 1-2), the master's 16-bit remainder
  (:func:`.states.param_remainder_saving`) and the ``plan.optimizer_offload`` share on the
  host (:func:`.states.device_optimizer_bytes`) - Megatron's distributed optimizer and
  HybridDeviceOptimizer step whatever parameters require a gradient, adapters included.
* **Tensor parallel**: the adapters follow their base linear as Megatron / NeMo's
  ``ParallelLinearAdapter`` does, and as Partita's runtime does (partita.runtime.lora): on
  a column-parallel base (q, k, v, gate, up) ``A`` is replicated (it reads the whole input)
  and ``B`` is column-parallel like the base; on a row-parallel base (o, down) ``A`` is
  row-parallel (the input shard; its ``r``-wide output all-reduced, or reduce-scattered
  with SP) and ``B`` replicated. Per rank: ``r in + r out / tp`` (column) and
  ``r in / tp + r out`` (row) - :func:`local_adapter`. The extra collectives (the row
  side's ``b s r`` all-reduce, the replicated matrices' gradient all-reduce over tp) are
  ``r / h`` of the base layer's tp traffic (0.2 % at r = 16, h = 8192) - not charged.
  Routed-expert adapters follow their experts (``E / ep`` per rank, split by ``etp`` as
  above); pipeline stages hold their own layers' adapters.
* **Activations**: each adapter keeps its ``r``-wide intermediate ``A x`` (the input of
  ``B``), ``b s r`` elements per targeted linear and layer (not divided by tp: ``A`` is replicated
  or its output all-reduced). The frozen layers' backward still computes the input gradient through every layer
  above the first adapter, so the attention, norm and activation-function inputs are kept
  as in pre-training. What a frozen linear saves for its own weight gradient is dropped:
  torch's autograd saves a ``mm``'s input only when the weight's gradient is required
  (``should_compute_output`` in the generated ``addmm``/``mm`` backward), so an
  untargeted linear whose input no other op keeps frees it - the MLP input and the
  gated product (``h + f``) when only attention is targeted, the QKV input and the
  attention output (``h + o``) when only the MLP is (:func:`activation_delta`).
* **Time**: a frozen linear's backward runs the input-gradient GEMM only (``dX = dY W``),
  one forward's FLOPs instead of two (the weight-gradient GEMM ``dW = dY^T X`` is skipped);
  the output layer likewise; the embedding has no backward. Each adapter adds its two
  skinny GEMMs forward and their four backward (both weight and input gradients), charged
  as the slower of their FLOPs and their HBM traffic (reading ``x`` of width ``in`` and
  writing the ``out``-wide update, then the scale and the add): at r = 16 they are
  bandwidth-bound. The data-parallel gradient reduction, the ZeRO-1/2 weight all-gather
  and the optimizer step cover the adapter parameters only (ZeRO-3 still gathers every
  weight, frozen ones included, and reduce-scatters the adapters' gradients only).
"""
from __future__ import annotations

from typing import NamedTuple

from ..plan import Plan
from ..spec.hardware import Device
from ..spec.model import ModelSpec
from .compute import BYTES, LayerCost, embedding_forward, gemm_time, layer_forward, output_forward
from .memo import memoised
from .placement import RankShape
from .shape import LayerShape
from .states import _shape_params, _state_bytes, device_optimizer_bytes


class LoraLinear(NamedTuple):
    """One kind of targeted linear of a layer: its full ``in`` / ``out`` widths, how many a
    layer holds (``count``: experts), the share of the layer's tokens each sees (routed
    experts: ``top_k / E``), whether it is a routed expert (split by ``ep x etp``, else by
    tp), whether its base is column-parallel (output split; else row-parallel, input split)
    and which target group names it."""

    in_features: int
    out_features: int
    count: int
    token_share: float
    expert: bool
    group: str  # "attention" or "mlp"
    column: bool = True


class LoraShape(NamedTuple):
    """What the LoRA terms depend on beyond the layer shape (a memo key)."""

    rank: int
    targets: str


def lora_shape(plan: Plan) -> LoraShape:
    return LoraShape(plan.lora_rank, plan.lora_targets)


def _attention_linears(model: ModelSpec) -> list[LoraLinear]:
    h = model.hidden
    if model.mla:
        m = model.mla
        qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = ([(h, m.q_lora_rank), (m.q_lora_rank, model.heads * qk_head)] if m.q_lora_rank
             else [(h, model.heads * qk_head)])
        dims = q + [(h, m.kv_lora_rank + m.qk_rope_head_dim),
                    (m.kv_lora_rank, model.heads * (m.qk_nope_head_dim + m.v_head_dim)), (model.attn_out_dim, h)]
    else:
        dims = [(h, model.q_dim), (h, model.kv_dim), (h, model.kv_dim), (model.attn_out_dim, h)]
    return [LoraLinear(i, o, 1, 1.0, False, "attention", n < len(dims) - 1) for n, (i, o) in enumerate(dims)]


def _mlp(model: ModelSpec, ffn: int, count: int, share: float, expert: bool) -> list[LoraLinear]:
    h = model.hidden
    ins = [(h, ffn, True)] * (2 if model.gated else 1) + [(ffn, h, False)]
    return [LoraLinear(i, o, count, share, expert, "mlp", column) for i, o, column in ins]


@memoised
def lora_linears(model: ModelSpec, moe: bool, targets: str) -> tuple[LoraLinear, ...]:
    """The targeted linears of one dense (``moe=False``) or MoE layer. A MoE layer's shared
    experts are one MLP of ``shared_experts x shared_ffn_hidden`` (as HF's Qwen2-MoE and
    DeepSeek-V3 define them); each routed expert its own."""
    out: list[LoraLinear] = []
    if targets in ("attention", "all-linear"):
        out += _attention_linears(model)
    if targets in ("mlp", "all-linear"):
        if moe and model.moe:
            mo = model.moe
            out += _mlp(model, mo.expert_ffn_hidden, mo.num_experts, mo.top_k / mo.num_experts, True)
            if mo.shared_experts:
                out += _mlp(model, mo.shared_experts * mo.shared_ffn_hidden, 1, 1.0, False)
        else:
            out += _mlp(model, model.ffn_hidden, 1, 1.0, False)
    return tuple(out)


def layer_adapter_params(model: ModelSpec, moe: bool, shape: LoraShape) -> tuple[int, int]:
    """(tp-split, routed-expert) adapter parameters of one layer: ``r (in + out)`` per
    targeted linear (A is ``r x in``, B ``out x r``)."""
    dense = expert = 0
    for lin in lora_linears(model, moe, shape.targets):
        n = lin.count * shape.rank * (lin.in_features + lin.out_features)
        if lin.expert:
            expert += n
        else:
            dense += n
    return dense, expert


def trainable_params(model: ModelSpec, plan: Plan) -> int:
    """Parameters the plan trains: every one (pre-training, full SFT) or the LoRA adapters'
    (what PEFT's ``get_nb_trainable_parameters`` reports)."""
    if plan.finetune != "lora":
        return model.total_params()
    shape = lora_shape(plan)
    total = 0
    for moe, n in ((False, model.dense_layers), (True, model.moe_layers)):
        if n:
            total += n * sum(layer_adapter_params(model, moe, shape))
    return total


def frozen_params(model: ModelSpec, plan: Plan) -> int:
    """Base parameters held frozen: all of them with LoRA, none otherwise."""
    return model.total_params() if plan.finetune == "lora" else 0


def local_adapter(lin: LoraLinear, rank: int, split: int) -> tuple[float, float]:
    """(A, B) parameters one rank holds of one adapter whose base linear is split ``split``
    ways (tp; a routed expert's etp): on a column-parallel base ``A`` is replicated and ``B``
    split by output rows, on a row-parallel base ``A`` is split by input columns and ``B``
    replicated (Megatron / NeMo's ``ParallelLinearAdapter``; partita.runtime.lora)."""
    if lin.column:
        return rank * lin.in_features, rank * lin.out_features / split
    return rank * lin.in_features / split, rank * lin.out_features


@memoised
def layer_rank_adapter_params(model: ModelSpec, moe: bool, lora: LoraShape, tp: int, ep: int,
                              etp: int) -> tuple[float, float]:
    """(tp-split, routed-expert) adapter parameters of one layer on one rank
    (:func:`local_adapter`; a rank holds ``E / ep`` of the routed experts)."""
    dense = expert = 0.0
    for lin in lora_linears(model, moe, lora.targets):
        if lin.expert:
            expert += lin.count / ep * sum(local_adapter(lin, lora.rank, etp))
        else:
            dense += lin.count * sum(local_adapter(lin, lora.rank, tp))
    return dense, expert


def rank_adapter_params(model: ModelSpec, plan: Plan, shape: RankShape) -> tuple[float, float]:
    """(dense, expert) adapter parameters pipeline rank ``shape`` holds: its layers'
    adapters as tp (and ep x etp) split them (:func:`layer_rank_adapter_params`)."""
    lshape = lora_shape(plan)
    dense = expert = 0.0
    n_dense = shape.n_layers - shape.n_moe
    for moe, n in ((False, n_dense), (True, shape.n_moe)):
        if n:
            d, e = layer_rank_adapter_params(model, moe, lshape, plan.tp, plan.ep, plan.etp)
            dense += n * d
            expert += n * e
    return dense, expert


def trained_shape_params(model: ModelSpec, plan: Plan, shape: RankShape) -> tuple[float, float]:
    """(dense, expert) parameters of rank ``shape`` whose gradients are reduced and whose
    optimizer states are stepped: the adapters with LoRA, else every parameter the rank holds."""
    if plan.finetune == "lora":
        return rank_adapter_params(model, plan, shape)
    return _shape_params(model, plan, shape)


def frozen_weight_bytes(dtype: str, autocast: bool) -> int:
    """Bytes per frozen weight: the training dtype's (16-bit and fp8 training load the base in
    bf16, as LLaMA-Factory and ms-swift do with ``torch_dtype=bfloat16``; fp32 or autocast over
    fp32 parameters: 4)."""
    return 4 if dtype == "fp32" or autocast else 2


def lora_states(model: ModelSpec, plan: Plan, shape: RankShape, zero: int, grad_b: int, shards: tuple[int, int],
                full_grads: bool, fp8_cache: bool, autocast: bool,
                params: tuple[tuple[float, float], tuple[float, float]] | None = None) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes of a LoRA rank at ZeRO stage ``zero``: frozen
    base weights (sharded at ZeRO-3 only, plus the fp8 cache of an fp8 plan whose framework
    keeps one) and the adapters' full states (:func:`.states._state_bytes`, less the narrower
    moments' saving and the host-offloaded share, as for the full model); ``shards``: the
    (dense, expert) state shard groups; ``params``: the rank's (frozen, adapter) (dense,
    expert) parameters when the caller has them."""
    frozen, adapters = params or (_shape_params(model, plan, shape), rank_adapter_params(model, plan, shape))
    w = frozen_weight_bytes(plan.dtype, autocast) + (1 if plan.dtype == "fp8" and fp8_cache else 0)
    weights = (frozen[0] / (shards[0] if zero >= 3 else 1) + frozen[1] / (shards[1] if zero >= 3 else 1)) * w
    grads = optimizer = 0.0
    for count, shard in zip(adapters, shards):
        if count:
            aw, ag, ao = _state_bytes(plan.dtype, grad_b, zero, count, shard, full_grads, autocast, False)
            weights, grads, optimizer = weights + aw, grads + ag, optimizer + ao
    # narrower precision-aware states and the host share, as cost/memory.py for the full model
    return weights, grads, device_optimizer_bytes(plan, zero, optimizer, tuple(zip(adapters, shards)))


def lora_memory_parts(model: ModelSpec, plan: Plan, shape: RankShape, parts: dict, grad_b: int,
                      shards: tuple[int, int], full_grads: bool, fp8_cache: bool, zero0_autocast: bool) -> dict:
    """``parts`` (:func:`.memory.memory_parts`' {(recompute, zero): MemoryParts}) with the model
    states of a LoRA plan in place of pre-training's (:func:`lora_states`)."""
    out = {}
    params = (_shape_params(model, plan, shape), rank_adapter_params(model, plan, shape))
    states: dict[int, tuple[float, float, float]] = {}
    for (recompute, zero), p in parts.items():
        if zero not in states:
            states[zero] = lora_states(model, plan, shape, zero, grad_b, shards, full_grads, fp8_cache,
                                       zero == 0 and zero0_autocast, params)
        w, g, o = states[zero]
        out[(recompute, zero)] = p._replace(weights=w, gradients=g, optimizer=o)
    return out


# ------------------------------------------------------------------ activations
def activation_delta(model: ModelSpec, plan: Plan, moe: bool, mode: str) -> float:
    """Bytes one layer keeps per micro-batch under LoRA beyond pre-training's count
    (:func:`.activations.activation_bytes`), on one rank: each adapter's ``r``-wide
    intermediate, less the inputs only an untargeted frozen linear would have saved (module
    docstring). Full recompute keeps the layer input only (no change); selective keeps the
    adapters' intermediates only."""
    if plan.finetune != "lora" or mode == "full":
        return 0.0
    e = BYTES[plan.dtype]
    tokens = plan.mbs * plan.seq_len / plan.cp
    linears = lora_linears(model, moe, plan.lora_targets)
    per_token = sum(lin.count * lin.token_share for lin in linears) * plan.lora_rank * e
    if mode == "none" and plan.lora_targets != "all-linear" and not (moe and model.moe):
        out_div = plan.tp if plan.sp else 1
        if plan.lora_targets == "attention":  # MLP input (norm output) and the gated product (w2's input)
            per_token -= e * model.hidden / out_div + e * model.ffn_hidden / plan.tp
        else:  # QKV input and the attention output (wo's input)
            per_token -= e * model.hidden / out_div + e * model.attn_out_dim / plan.tp
    return tokens * per_token


# ------------------------------------------------------------------ time
def adapter_forward(model: ModelSpec, device: Device, layer: LayerShape, moe: bool, lora: LoraShape) -> LayerCost:
    """Forward cost of one layer's adapters per micro-batch on one rank: for each targeted
    linear, ``A`` (``2 T r in`` FLOPs, reading ``T x in`` and writing ``T x r``) and ``B``
    (``2 T r out``, reading ``T x r`` and writing ``T x out``), each the slower of its GEMM
    time (:func:`.compute.gemm_time`) and its HBM traffic, plus the scale and the add to
    the base output (read 3, write 2 of ``T x out``). ``in``/``out`` are the rank's local
    widths (the base linear's tp split); routed experts see ``top_k / E`` of the tokens."""
    return _adapter_forward(model, device, layer, moe, lora)


@memoised
def _adapter_forward(model: ModelSpec, device: Device, layer: LayerShape, moe: bool, lora: LoraShape) -> LayerCost:
    e, r, tp = BYTES[layer.dtype], lora.rank, layer.tp
    bandwidth = device.hbm_tbps * 1e12 * device.efficiency.memory_bandwidth
    cost = LayerCost()
    for lin in lora_linears(model, moe, lora.targets):
        # routed experts: the rank's top_k token slots (etp-gathered) over its E / ep local
        # experts, each split etp ways (as .compute counts them); else every token, split tp ways
        n, split = (lin.count / layer.ep, layer.etp) if lin.expert else (lin.count, tp)
        slots = layer.tokens * lin.token_share * lin.count * (layer.etp / tp if lin.expert else 1.0)
        din = lin.in_features if lin.column else lin.in_features / split
        dout = lin.out_features / split if lin.column else lin.out_features
        a, b = local_adapter(lin, r, split)
        # a replicated B after a row-parallel base runs on the sequence shard with SP
        b_slots = slots / tp if (layer.sp and not lin.column and not lin.expert) else slots
        for flops, moved in ((2 * slots * a, e * slots * (din + r)), (2 * b_slots * b, e * b_slots * (r + 6 * dout))):
            cost.gemm_flops += flops
            cost.gemm_time += max(gemm_time(device, flops, layer.dtype, max(1, int(n))), moved / bandwidth)
    return cost


def lora_stage_terms(model: ModelSpec, device: Device, shape, lora: LoraShape, terms: tuple,
                     flash_backward: float) -> tuple:
    """:func:`.step.stage_terms` of a LoRA plan from pre-training's: per layer the base GEMMs'
    backward runs the input gradient only (one forward's GEMM time and FLOPs less), the
    adapters' forward and backward (2x) are added, and full recompute reruns their forward;
    the output layer's backward likewise loses its weight gradient and the embedding its
    backward, and the first stage skips the first layer's backward that reads the frozen
    embedding (:func:`first_layer_saving`; ``flash_backward``: its attention factor).
    Returns (TermsByKind, TimesByKind) of the same types."""
    return _lora_stage_terms(model, device, shape, lora, terms, flash_backward)


def _lora_stage_terms(model: ModelSpec, device: Device, shape, lora: LoraShape, terms: tuple,
                      flash_backward: float) -> tuple:
    kinds, _ = terms
    layer = shape.layer
    rc_full = 1 if shape.recompute == "full" else 0

    def adjust(t, base: LayerCost | None, adapter: LayerCost | None, drop_backward: bool = False):
        if base is None:
            return t
        d_time = -base.gemm_time - (base.time if drop_backward else 0.0)
        d_flops = -base.gemm_flops
        if adapter is not None:
            d_time += 3 * adapter.gemm_time
            d_flops += 3 * adapter.gemm_flops
        rc = rc_full * adapter.gemm_time if adapter is not None else 0.0
        rc_flops = rc_full * adapter.gemm_flops if adapter is not None else 0.0
        return t._replace(compute=t.compute + d_time, recompute=t.recompute + rc,
                          forward=t.forward + (adapter.gemm_time if adapter is not None else 0.0),
                          backward=t.backward + d_time - (adapter.gemm_time if adapter is not None else 0.0) + rc,
                          flops=t.flops + d_flops + rc_flops)

    dense = moe = None
    if model.dense_layers:
        dense = adjust(kinds.dense, layer_forward(model, device, layer, False),
                       adapter_forward(model, device, layer, False, lora))
    if model.moe:
        moe = adjust(kinds.moe, layer_forward(model, device, layer, True),
                     adapter_forward(model, device, layer, True, lora))
    emb = embedding_forward(model, device, layer)
    first_t, first_flops = first_layer_saving(model, device, layer, lora, flash_backward)
    embedding = kinds.embedding._replace(compute=kinds.embedding.compute - 2 * emb.time - first_t,
                                         backward=kinds.embedding.backward - 2 * emb.time - first_t,
                                         flops=kinds.embedding.flops - first_flops)
    output = adjust(kinds.output, output_forward(model, device, layer), None)
    new = type(kinds)(dense or kinds.dense, moe or kinds.moe, embedding, output, kinds.per_stage)
    return new, type(terms[1])(*(t.time for t in new))


def lora_activation_bytes(model: ModelSpec, plan: Plan, shape: RankShape, mode: str) -> float:
    """What a LoRA rank's layers keep per micro-batch beyond pre-training's count
    (:func:`activation_delta` per layer): every layer with recompute none or selective, the
    layers a partial full recompute does not recompute, none under full recompute."""
    n_dense = shape.n_layers - shape.n_moe
    if mode == "full":
        if not plan.recompute_layers:
            return 0.0
        kept = ((False, n_dense - shape.rc_dense), (True, shape.n_moe - shape.rc_moe))
        return sum(n * activation_delta(model, plan, moe, "none") for moe, n in kept if n)
    return sum(n * activation_delta(model, plan, moe, mode) for moe, n in ((False, n_dense), (True, shape.n_moe)) if n)


@memoised
def first_layer_saving(model: ModelSpec, device: Device, layer: LayerShape, lora: LoraShape,
                       flash_backward: float) -> tuple[float, float]:
    """(seconds, FLOPs) of the first layer's backward that LoRA skips, charged to the first
    stage (with the embedding): the embedding is frozen, so the first layer's input needs no
    gradient and autograd computes none for the GEMMs that read it.

    With attention targeted (``attention``, ``all-linear``): the q, k, v projections' input
    gradients (one forward's GEMM, ``2 T h (q + 2 kv) / tp``) and their adapters' ``A``
    input gradients (``3 x 2 T r h / tp``). With ``mlp`` only: the whole attention block has
    no trainable parameter and an input without gradient, so its backward is skipped -
    q, k, v and o input gradients, the attention kernel's backward - and so are the MLP
    input projections' input gradients and their ``A`` input gradients (the down projection
    still gets its input gradient: its input depends on the adapters of gate and up). MLA
    and MoE first layers: not modelled (0). ``flash_backward``: the attention kernel's backward
    per forward (:data:`.step.FLASH_BACKWARD_PER_FORWARD`)."""
    if model.mla or model.is_moe_layer(0):
        return 0.0, 0.0
    tp, tokens, h, r = layer.tp, layer.tokens, model.hidden, lora.rank
    qkv = 2 * tokens * h * (model.q_dim + 2 * model.kv_dim) / tp
    if lora.targets != "mlp":
        adapters = 3 * 2 * tokens * r * h / tp
        return gemm_time(device, qkv, layer.dtype, 3) + gemm_time(device, adapters, layer.dtype, 3), qkv + adapters
    base = layer_forward(model, device, layer, False)
    proj = qkv + 2 * tokens * model.attn_out_dim * h / tp
    ins = 2 if model.gated else 1
    mlp_in = ins * 2 * tokens * h * model.ffn_hidden / tp
    adapters = ins * 2 * tokens * r * h / tp
    seconds = (gemm_time(device, proj, layer.dtype, 4) + flash_backward * base.attn_time
               + gemm_time(device, mlp_in, layer.dtype, ins) + gemm_time(device, adapters, layer.dtype, ins))
    return seconds, proj + flash_backward * base.attn_flops + mlp_in + adapters
