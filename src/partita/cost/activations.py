"""Activation memory: the bytes a layer keeps for backward, per micro-batch and rank, and
what one in-flight model chunk of a pipeline rank keeps.

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
:func:`partita.search.partial_recompute.least_recompute_layers` solves it for a memory
limit).
"""
from __future__ import annotations

from ..plan import Plan
from ..spec.model import ModelSpec
from .compute import BYTES, FP32_BYTES
from .finetune import lora_activation_bytes
from .frameworks import FRAMEWORKS, selective_modules
from .memo import memoised
from .placement import RankShape
from .shape import LayerShape, layer_shape


def activation_bytes_per_layer(model: ModelSpec, plan: Plan, moe: bool, recompute: str | None = None) -> float:
    """Bytes one layer keeps for backward, per micro-batch, on one rank; ``recompute``
    overrides the plan's mode (:func:`activation_bytes` for the plan's layer shape, or
    :func:`module_recompute_bytes` for a selective plan that names Megatron's modules)."""
    return _layer_bytes(model, plan, layer_shape(plan), recompute or plan.recompute, moe)


def _layer_bytes(model: ModelSpec, plan: Plan, layer: LayerShape, mode: str, moe: bool) -> float:
    """:func:`activation_bytes`, or where selective recompute is module-level
    (:func:`.frameworks.selective_modules`: ``plan.recompute_modules`` set, or a Megatron-Core
    framework's default ``core_attn``) :func:`module_recompute_bytes` of those modules."""
    modules = selective_modules(plan.framework, mode, plan.recompute_modules)
    if modules:
        return module_recompute_bytes(model, layer, modules, moe)
    return activation_bytes(model, layer, mode, moe)


@memoised
def module_recompute_bytes(model: ModelSpec, shape: LayerShape, modules: frozenset, moe: bool) -> float:
    """Bytes one layer keeps per micro-batch on one rank under Megatron-Core's module-level selective
    recompute (``--recompute-granularity selective --recompute-modules ...``): the layer's
    recompute-none bytes (:func:`activation_bytes`) less what each named module no longer stores.

    Megatron-Core's modules (megatron/core/transformer/transformer_config.py, ``recompute_modules``):
    "layernorm" recomputes input_layernorm and pre_mlp_layernorm where they are modules of their own
    (output-discarding checkpoints: their outputs, the QKV and MLP inputs, are not kept; 0, h or 2h
    a token: :func:`norm_outputs_freed`); "core_attn" the core attention
    (with a fused kernel: its log-sum-exp; Q, K, V stay as the checkpoint's input, the output as
    the out-projection's); "mla_up_proj" the MLA up projections and RoPE (Q, K, V not kept; their
    low-rank inputs, which the model does not count either way, stay); "moe_act" the experts'
    activation function (its output, ``top_k x f_e``, not kept); "mlp" the dense MLP and "moe" the
    MoE layer (normal checkpoints: everything inside the block goes, its input - the norm output -
    stays); "shared_experts" the shared experts. Default (no modules, framework megatron or
    mindspeed): ``core_attn`` (:func:`.frameworks.selective_modules`). The recompute's time is the
    forward of these modules (:func:`.compute.module_recompute_forward`).
    Known gap: fp8 activations stored by Transformer Engine in 1 byte are counted at the plan's
    activation width."""
    tp, e = shape.tp, BYTES[shape.dtype]
    h, out_div = model.hidden, (tp if shape.sp else 1)
    kept = activation_bytes(model, shape, "none", moe) / shape.tokens  # per token
    kept -= e * h / out_div * norm_outputs_freed(model, shape, modules, moe)
    if "core_attn" in modules:
        kept -= FP32_BYTES * model.heads / tp
    if "mla_up_proj" in modules and model.mla:
        kept -= e * (model.q_dim + 2 * model.kv_dim) / tp
    if moe and model.moe:
        mo, mats = model.moe, (3 if model.gated else 2)
        routed = mo.top_k * (e * h * shape.etp + e * mats * mo.expert_ffn_hidden) / tp
        shared = mo.shared_experts * e * mats * mo.shared_ffn_hidden / tp
        if "moe" in modules:
            kept -= routed + shared + FP32_BYTES * mo.num_experts / tp
        else:
            kept -= (mo.top_k * e * mo.expert_ffn_hidden / tp if "moe_act" in modules else 0.0) \
                + (shared if "shared_experts" in modules else 0.0)
    elif "mlp" in modules:
        kept -= e * (3 if model.gated else 2) * model.ffn_hidden / tp
    return shape.tokens * kept


def norm_outputs_freed(model: ModelSpec, shape: LayerShape, modules: frozenset, moe: bool) -> int:
    """How many ``[s, b, h]`` norm outputs (the QKV and MLP inputs :func:`activation_bytes` counts)
    a layer no longer keeps under ``modules``.

    Megatron-Core discards a norm's output only where the norm is its own module
    (megatron/core/transformer/transformer_layer.py, ``recompute_input_layernorm`` /
    ``recompute_pre_mlp_layernorm`` are set only ``if not isinstance(..., IdentityOp)``; the same
    check at core_v0.12.1, which MindSpeed-LLM runs). In the Transformer Engine spec
    (megatron/core/models/gpt/gpt_layer_specs.py, ``get_gpt_layer_with_transformer_engine_spec``)
    non-MLA attention fuses input_layernorm into ``linear_qkv`` (a LayerNormLinear; input_layernorm
    stays IdentityOp), MLA keeps it a module, and pre_mlp_layernorm is a module only on MoE layers
    (IdentityOp on dense layers: fused into ``linear_fc1``). So "layernorm" frees 0 on a dense
    non-MLA layer (Llama), 1 on a MoE or an MLA dense layer, 2 on an MLA MoE layer. On a TE dense
    layer "mlp" checkpoints the block from the pre-norm residual (already kept as the norm's input),
    so the fused norm's output that ``linear_fc1`` saved goes too: 1.

    Framework "mindspeed" is priced with Megatron's local spec (``--transformer-impl local``, which
    180 of MindSpeed-LLM@HEAD's 375 example scripts pass): both norms are modules, "layernorm"
    frees 2. Known gap: a MindSpeed run on its default (TE) spec, or Megatron with
    ``--transformer-impl local``, is priced with the other spec (the plan does not carry it)."""
    if shape.framework == "mindspeed":
        return 2 if "layernorm" in modules else 0
    moe_layer = moe and model.moe is not None
    freed = 0
    if "layernorm" in modules:
        freed += (1 if model.mla else 0) + (1 if moe_layer else 0)
    if "mlp" in modules and not moe_layer:
        freed += 1
    return freed


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
        per_chunk = (n_dense * _layer_bytes(model, plan, layer, mode, False)
                     + (shape.n_moe * _layer_bytes(model, plan, layer, mode, True) if shape.n_moe else 0.0)
                     ) / plan.vpp
    if plan.attention == "unfused":  # fused: unfused_attention_bytes is 0, adding 0.0 changes nothing
        per_chunk += _kept_attention_layers(plan, shape, mode) * unfused_attention_bytes(model, plan)
    if plan.finetune == "lora":  # adapters' intermediates, untargeted frozen linears' inputs (cost/finetune.py)
        per_chunk += lora_activation_bytes(model, plan, shape, mode) / plan.vpp
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
    recompute none, the not-recomputed ones of a partial full recompute, all with Megatron's
    module-level selective recompute (:func:`.frameworks.selective_modules`) whose modules lack
    "core_attn" (only that module recomputes the core attention:
    megatron/core/transformer/transformer_layer.py), none otherwise."""
    modules = selective_modules(plan.framework, mode, plan.recompute_modules)
    if mode == "none" or (modules and "core_attn" not in modules):
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
