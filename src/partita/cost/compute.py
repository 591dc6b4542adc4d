"""Compute time of one transformer layer (and the embedding/output ends) on one rank.

Time = GEMMs at the device's achievable rate + fused attention at its own rate +
element-wise kernels bound by HBM bandwidth + a fixed per-layer launch overhead.

GEMM efficiency falls for small GEMMs; we use the saturating curve
``eff(G) = eff_max * G / (G + G_half)`` in the GEMM's size ``G`` (GFLOP), a smooth
version of Calculon's step table (0.95/0.9/0.6/0.1 at 128/16/1/<1 GFLOP) and
consistent with MAMF measurements that only large shapes reach the plateau
(docs/reference/hardware.md sec. 2.1). ``eff_max`` and ``G_half`` are named
parameters of the hardware family.

Per rank, tensor parallelism divides every GEMM's output (or input) width by ``tp``;
context parallelism divides the tokens by ``cp``. Routed experts are not tensor-split
at the default expert tensor parallel 1 (the usual Megatron MoE layout); with sequence
parallel the ``tp`` ranks route disjoint tokens, so expert work per rank is also divided
by ``tp``.

Expert tensor parallel ``etp`` (plan.py; Megatron-Core ``--expert-tensor-parallel-size``,
MoE parallel folding [Liu et al. 2025, arXiv:2504.14960, sec. 3]): Megatron's alltoall
token dispatcher all-gathers the tokens an ep all-to-all brought to a rank over its etp
group, each etp rank runs its ``1/etp`` slice of every local expert's FFN on all of them,
and the outputs are reduce-scattered back (megatron/core/transformer/moe/token_dispatcher.py,
``MoEAlltoAllTokenDispatcher``: ``gather_from_sequence_parallel_region`` over the expert
tp group). Per rank: ``etp`` times the tokens x ``1/etp`` of the FFN width = the same
expert FLOPs, in ``E/ep`` local experts - so at a fixed ``ep x etp`` (same expert memory)
a larger etp means more local experts and smaller GEMMs, which the GEMM-size efficiency
curve below charges. The gather/scatter traffic is in :mod:`.step`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..spec.hardware import Device
from ..spec.model import ModelSpec
from .frameworks import FRAMEWORKS, unfused_elementwise_bytes
from .memo import memoised
from .shape import LayerShape

BYTES = {"bf16": 2, "fp16": 2, "fp8": 2, "fp32": 4}  # activation bytes; fp8 keeps bf16 activations
FP32_BYTES = 4


@dataclass
class LayerCost:
    """Forward cost of one layer for one micro-batch on one rank (backward = 2x GEMM/attention)."""

    gemm_flops: float = 0.0
    gemm_time: float = 0.0
    attn_flops: float = 0.0
    attn_time: float = 0.0
    elementwise_time: float = 0.0
    overhead_time: float = 0.0

    @property
    def flops(self) -> float:
        return self.gemm_flops + self.attn_flops

    @property
    def time(self) -> float:
        return self.gemm_time + self.attn_time + self.elementwise_time + self.overhead_time

    def __add__(self, other: "LayerCost") -> "LayerCost":
        return LayerCost(*(a + b for a, b in zip(self.astuple(), other.astuple())))

    def scaled(self, k: float) -> "LayerCost":
        return LayerCost(*(a * k for a in self.astuple()))

    def astuple(self) -> tuple[float, ...]:
        return (self.gemm_flops, self.gemm_time, self.attn_flops, self.attn_time,
                self.elementwise_time, self.overhead_time)


def gemm_time(device: Device, flops: float, dtype: str, count: int = 1) -> float:
    """Seconds for ``count`` equal GEMMs totalling ``flops`` FLOPs."""
    if flops <= 0:
        return 0.0
    eff = device.efficiency.gemm_fp8 if dtype == "fp8" else device.efficiency.gemm
    peak = device.peak_flops("fp8" if dtype == "fp8" else dtype)
    size_gflop = flops / count / 1e9
    eff *= size_gflop / (size_gflop + device.efficiency.gemm_half_gflop)
    return flops / (peak * eff)


@memoised
def layer_forward(model: ModelSpec, device: Device, shape: LayerShape, moe: bool) -> LayerCost:
    """Forward cost of one layer (dense or MoE) for one micro-batch on one rank.

    The shape holds the fields it depends on (not pp/vpp/zero/recompute), so the search's
    plans that share it share the value."""
    return _layer_forward(model, device, shape, moe)


def fp8_cast_elements(model: ModelSpec, shape: LayerShape, moe: bool) -> float:
    """Elements one layer's forward casts to fp8 per micro-batch on one rank when every
    linear casts its own input and weight (torchao ``Float8Linear``,
    :attr:`.frameworks.Framework.fp8_cast_bytes` bytes each).

    Per token the linears' inputs: wq, wk and wv each cast the normed ``x`` (``3h``; MLA:
    wq_a and wkv_a cast ``x``, wq_b and wkv_b their latents - ``2h + q_lora_rank +
    kv_lora_rank``, or ``2h + kv_lora_rank`` without a query LoRA, DeepSeek-V3 technical
    report sec. 2.1.1), wo the attention output (``o / tp``); the MLP's
    input projections each cast ``x`` again (``(mats - 1) h``: w1 and w3) and w2 its input
    (``f / tp``); a MoE layer's experts do the same on their ``top_k`` routed copies of each
    token (the router and shared experts as a dense MLP). Plus every local weight, cast on
    each forward. The backward casts the output gradients (as many elements as the
    outputs) and transposes the fp8 copies: about twice the forward's traffic, the factor
    the step model applies to all element-wise work (:mod:`.step`)."""
    tp, h = shape.tp, model.hidden
    mats = 3 if model.gated else 2
    ml = model.mla
    if ml:  # wq_a and wkv_a cast x, wq_b and wkv_b their latents (no q LoRA: wq casts x)
        attn_in = 2 * h + (ml.q_lora_rank or 0) + ml.kv_lora_rank + model.attn_out_dim / tp
    else:
        attn_in = 3 * h + model.attn_out_dim / tp
    gathered = fp8_tp_gathered(shape)
    if gathered and not ml:  # one cast of the sequence shard feeds wq, wk and wv (after the all-gather)
        attn_in = h / tp + model.attn_out_dim / tp
    weights = (h * (model.q_dim + 2 * model.kv_dim) + model.attn_out_dim * h) / tp
    if moe and model.moe:
        mo = model.moe
        # etp: each rank casts the etp-gathered routed inputs (etp x its own) for w1/w3 and
        # its 1/etp of w2's input for all of them (unchanged), and its 1/etp of the weights
        per_token = attn_in + mo.top_k * ((mats - 1) * h * shape.etp + mo.expert_ffn_hidden) / tp
        per_token += mo.shared_experts * ((mats - 1) * h + mo.shared_ffn_hidden / tp)
        weights += mats * h * (mo.num_experts / (shape.ep * shape.etp) * mo.expert_ffn_hidden
                               + mo.shared_experts * mo.shared_ffn_hidden / tp)
    else:  # w1 (and w3) cast x, or with fp8_tp_gather share one cast of its sequence shard
        per_token = attn_in + (h / tp if gathered else (mats - 1) * h) + model.ffn_hidden / tp
        weights += mats * h * model.ffn_hidden / tp
    return shape.tokens * per_token + weights


def fp8_grouped_quantized_elements(model: ModelSpec, shape: LayerShape) -> float:
    """Elements one MoE layer's forward quantizes to fp8 per micro-batch on one rank in
    Transformer Engine's ``GroupedLinear`` (:attr:`.frameworks.Framework.fp8_grouped_quantize_bytes`
    bytes each): fc1's input, the ``top_k`` routed copies of each token (``h`` wide; with etp the
    rank's etp-gathered tokens), and fc2's input, the activation's output (``f_e / etp`` wide per
    routed copy). The backward quantizes fc2's and fc1's output gradients (``h`` and
    ``(mats - 1) f_e / etp`` wide): the step model charges it as twice the forward, like all
    element-wise work. The shared experts and the attention are TE ``LayerNormLinear`` /
    ``LayerNormMLP`` / ``Linear`` modules whose casts the producing kernels fuse."""
    mo = model.moe
    routed = shape.tokens * mo.top_k * shape.etp / shape.tp  # type: ignore[union-attr]
    return routed * (model.hidden + mo.expert_ffn_hidden / shape.etp)  # type: ignore[union-attr]


def fp8_tp_gathered(shape: LayerShape) -> bool:
    """Whether the layer's tp blocks take their input cast to fp8 before the tp all-gather
    (:attr:`.frameworks.Framework.fp8_tp_gather`): an fp8 tensorwise plan with sequence-parallel
    tp under a framework that does so. Then the attention and MLP inputs are cast once per
    block on the ``tokens / tp`` shard (``h / tp`` elements per token, not one full ``h`` per
    column-parallel linear), and those all-gathers move 1-byte elements (:mod:`.step`)."""
    return (shape.dtype == "fp8" and shape.fp8_recipe == "tensorwise" and shape.tp > 1 and shape.sp
            and FRAMEWORKS[shape.framework].fp8_tp_gather)


@memoised
def last_gemm(model: ModelSpec, device: Device, shape: LayerShape, moe: bool) -> tuple[float, float]:
    """(FLOPs, seconds) of the layer's last GEMM in execution order, which full recompute
    skips under a checkpoint that stops early (:attr:`.frameworks.Framework.checkpoint_early_stop`).

    Backward needs the saved inputs of each op, not the layer's output (the residual add
    saves nothing), so torch's non-reentrant checkpoint, which stops once the last saved
    tensor is rebuilt (``torch.utils.checkpoint.set_checkpoint_early_stop``, default on),
    never reruns the GEMM whose output only feeds the residual: the dense MLP's ``w2``
    (one of its ``mats`` equal GEMMs, so ``1 / mats`` of the MLP's FLOPs and time) or, in a
    MoE layer, the shared expert's ``w2`` (run after the routed experts, whose outputs the
    weighted combine saves, so they are recomputed). A MoE layer without shared experts
    skips none. Measured: tests/data/cost_oracles.json ``layer_train.full``."""
    tp, tokens, h = shape.tp, shape.tokens, model.hidden
    mats = 3 if model.gated else 2
    if moe and model.moe:
        mo = model.moe
        if not mo.shared_experts:
            return 0.0, 0.0
        shared_mlp = mo.shared_experts * mats * 2 * tokens * h * mo.shared_ffn_hidden / tp
        return shared_mlp / mats, gemm_time(device, shared_mlp, shape.dtype, mats) / mats
    dense_mlp = mats * 2 * tokens * h * model.ffn_hidden / tp  # as _layer_forward's, three equal GEMMs
    return dense_mlp / mats, gemm_time(device, dense_mlp, shape.dtype, mats) / mats


@memoised
def selective_gemm_fraction(model: ModelSpec, moe: bool) -> float:
    """Share of a layer's GEMM FLOPs that op-level selective checkpointing recomputes.

    The policy (runtime/recompute.py, torchtitan's "op" SAC) saves the output of every
    other matmul in execution order - the 1st, 3rd, ... - and recomputes the others.
    A LLaMA layer runs wq, wk, wv, wo, then w1, w3, w2, so it recomputes wk, wo and w3:
    per token ``(kv + o + f) / (q + 2 kv + o + 3 f)`` of the GEMM FLOPs (``q``, ``kv``,
    ``o``: the q, k/v and attention-output widths; ``f``: the FFN width) - 0.365 for
    Llama-3-8B, 0.363 for Llama-3-70B. MLA runs its down/up projections in the same
    alternation. Routed and shared experts run many equal matmuls in a row, so half
    of their FLOPs are recomputed; the router's matmul is one of the sequence."""
    h = model.hidden
    if model.mla:
        m = model.mla
        qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
        attn = ([h * m.q_lora_rank, m.q_lora_rank * model.heads * qk_head] if m.q_lora_rank
                else [h * model.heads * qk_head])
        attn += [h * (m.kv_lora_rank + m.qk_rope_head_dim), m.kv_lora_rank * model.heads * (m.qk_nope_head_dim + m.v_head_dim)]
    else:
        attn = [h * model.q_dim, h * model.kv_dim, h * model.kv_dim]
    gemms = attn + [model.attn_out_dim * h]
    mats = 3 if model.gated else 2
    halves = 0.0  # expert FLOPs, of which half are recomputed
    if moe and model.moe:
        mo = model.moe
        gemms.append(h * mo.num_experts)  # router
        halves = mats * h * (mo.top_k * mo.expert_ffn_hidden + mo.shared_experts * mo.shared_ffn_hidden)
    else:
        gemms += [h * model.ffn_hidden] * mats
    recomputed = sum(gemms[1::2]) + halves / 2
    return recomputed / (sum(gemms) + halves)


def module_recompute_forward(model: ModelSpec, device: Device, shape: LayerShape, moe: bool, modules: frozenset,
                             norms: int, layer: LayerCost) -> LayerCost:
    """Forward cost (one layer, one micro-batch, one rank) of what Megatron-Core's module-level
    selective recompute reruns in backward: each checkpointed module's forward once more
    (``tensor_parallel.checkpoint`` / ``CheckpointWithoutOutput`` rerun the wrapped function;
    megatron/core/transformer/attention.py ``_checkpointed_attention_forward``, mlp.py,
    moe/moe_layer.py, moe/experts.py, transformer_layer.py; modules: :func:`.frameworks.selective_modules`).
    ``layer`` is the layer's own forward (:func:`layer_forward`), ``norms`` how many norm modules
    rerun (:func:`.activations.norm_outputs_freed`: those whose output is no longer kept).

    * core_attn: the core attention - the score, softmax and context work and nothing else (the
      Q/K/V projections and RoPE run before, the out-projection after it): the layer's flash
      attention FLOPs at the attention efficiency, or with ``attention == "unfused"``
      :func:`unfused_attention_core` (its two score GEMMs and the softmax passes over the scores);
    * layernorm: ``norms`` norms, each reading and writing ``h`` per token (element-wise, HBM-bound);
    * mlp (dense layer): the MLP's ``mats`` GEMMs and its activation (read 2f, write f gated);
    * moe (MoE layer): router, routed and shared experts' GEMMs, their activations and the
      permutation (the dispatch/combine all-to-all again: :mod:`.step`);
    * moe_act: the routed experts' activation; shared_experts: the shared experts' GEMMs and
      activation; mla_up_proj: MLA's q and kv up-projections and RoPE.

    Known gaps: fp8 cast/quantize passes of the recomputed GEMMs are not charged; the launch
    overhead of the rerun kernels is not charged."""
    tp, tokens, h, dtype = shape.tp, shape.tokens, model.hidden, shape.dtype
    e = BYTES[dtype]
    mats = 3 if model.gated else 2
    act = 3 if model.gated else 2  # activation bytes per FFN element: read 2f, write f (gated)
    cost = LayerCost()
    elem_bytes = 0.0
    if "core_attn" in modules:
        if shape.attention == "unfused":
            span = min(shape.sample_len, shape.seq_len) if shape.sample_len else shape.seq_len
            cost += unfused_attention_core(model, device, shape, span, "bf16" if dtype == "fp8" else dtype)
        else:
            cost += LayerCost(attn_flops=layer.attn_flops, attn_time=layer.attn_time)
    elem_bytes += norms * 2 * tokens * e * h / (tp if shape.sp else 1)
    if moe and model.moe:
        mo = model.moe
        shared = 2 * tokens * mats * h * mo.shared_ffn_hidden * mo.shared_experts / tp
        shared_act = tokens * e * act * mo.shared_experts * mo.shared_ffn_hidden / tp
        if "moe" in modules:
            router = 2 * tokens * h * mo.num_experts / tp
            routed = 2 * tokens * mo.top_k * shape.etp / tp * mats * h * mo.expert_ffn_hidden / shape.etp
            cost.gemm_flops += router + routed + shared
            cost.gemm_time += (gemm_time(device, router, dtype)
                               + gemm_time(device, routed, dtype, max(1, int(mo.num_experts / shape.ep * mats)))
                               + (gemm_time(device, shared, dtype, mats) if shared else 0.0))
            elem_bytes += tokens * e * act * mo.top_k * mo.expert_ffn_hidden / tp + shared_act
            elem_bytes += 4 * e * tokens * mo.top_k * h / tp  # permutation, as layer_forward's
        else:
            if "moe_act" in modules:
                elem_bytes += tokens * e * act * mo.top_k * mo.expert_ffn_hidden / tp
            if "shared_experts" in modules and shared:
                cost.gemm_flops += shared
                cost.gemm_time += gemm_time(device, shared, dtype, mats)
                elem_bytes += shared_act
    elif "mlp" in modules:
        mlp = 2 * tokens * mats * h * model.ffn_hidden / tp
        cost.gemm_flops += mlp
        cost.gemm_time += gemm_time(device, mlp, dtype, mats)
        elem_bytes += tokens * e * act * model.ffn_hidden / tp
    if "mla_up_proj" in modules and model.mla:
        m = model.mla
        qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
        up = ((m.q_lora_rank * model.heads * qk_head if m.q_lora_rank else 0)
              + m.kv_lora_rank * model.heads * (m.qk_nope_head_dim + m.v_head_dim))
        flops = 2 * tokens * up / tp
        cost.gemm_flops += flops
        cost.gemm_time += gemm_time(device, flops, dtype, 2 if m.q_lora_rank else 1)
        elem_bytes += tokens * e * 2 * (model.q_dim + model.kv_dim) / tp  # RoPE
    cost.elementwise_time += elem_bytes / (device.hbm_tbps * 1e12 * device.efficiency.memory_bandwidth)
    return cost


def _layer_forward(model: ModelSpec, device: Device, shape: LayerShape, moe: bool) -> LayerCost:
    tp = shape.tp
    tokens = shape.tokens  # tokens this rank's GEMMs see (SP gathers them back)
    h, dtype = model.hidden, shape.dtype
    e = BYTES[dtype]
    cost = LayerCost()

    # ---- attention projections
    if model.mla:
        m = model.mla
        qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
        q_proj = (h * m.q_lora_rank + m.q_lora_rank * model.heads * qk_head) if m.q_lora_rank else h * model.heads * qk_head
        kv_proj = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * model.heads * (m.qk_nope_head_dim + m.v_head_dim)
        proj_weights = (q_proj + kv_proj) / tp + model.attn_out_dim * h / tp
        n_gemms = 6
    else:
        proj_weights = h * (model.q_dim + 2 * model.kv_dim) / tp + model.q_dim * h / tp
        n_gemms = 4
    attn_proj_flops = 2 * tokens * proj_weights
    cost.gemm_flops += attn_proj_flops
    cost.gemm_time += gemm_time(device, attn_proj_flops, dtype, n_gemms)

    # ---- attention core (flash attention, causal: half the score matrix). Packed samples with
    # attention per sample (plan.sample_len = sum(L^2)/sum(L)): a sample of L tokens has L(L+1)/2
    # (query, key) pairs, sum(L(L+1)/2) / sum(L) = (sample_len + 1) / 2 per token
    span = min(shape.sample_len, shape.seq_len) if shape.sample_len else shape.seq_len
    attn_dtype = "bf16" if dtype == "fp8" else dtype
    if shape.attention == "unfused":
        cost += unfused_attention_core(model, device, shape, span, attn_dtype)
    else:
        s_ctx = (span + 1) / 2
        d_qk, d_v = model.q_dim // model.heads, model.attn_out_dim // model.heads
        attn_flops = 2 * tokens * s_ctx * (model.heads / tp) * (d_qk + d_v)
        cost.attn_flops += attn_flops
        cost.attn_time += attn_flops / (device.peak_flops(attn_dtype) * device.efficiency.attention)

    # ---- MLP / experts
    mats = 3 if model.gated else 2
    if moe and model.moe:
        mo = model.moe
        router = 2 * tokens * h * mo.num_experts / tp
        # SP: the tp ranks route disjoint token slices; etp gathers etp of them per rank and
        # splits the expert FFN etp ways (module docstring): the FLOPs per rank do not change
        routed_tokens = tokens * mo.top_k * shape.etp / tp
        local_experts = mo.num_experts / shape.ep
        routed = 2 * routed_tokens * mats * h * mo.expert_ffn_hidden / shape.etp
        shared = 2 * tokens * mats * h * mo.shared_ffn_hidden * mo.shared_experts / tp
        cost.gemm_flops += router + routed + shared
        cost.gemm_time += gemm_time(device, router, dtype)
        cost.gemm_time += gemm_time(device, routed, dtype, max(1, int(local_experts * mats)))
        cost.gemm_time += gemm_time(device, shared, dtype, mats) if shared else 0.0
        ffn_width = (mo.top_k * mo.expert_ffn_hidden + mo.shared_experts * mo.shared_ffn_hidden) / tp
        permute_bytes = 4 * e * tokens * mo.top_k * h / tp  # scatter to experts and gather back
    else:
        mlp = 2 * tokens * mats * h * model.ffn_hidden / tp
        cost.gemm_flops += mlp
        cost.gemm_time += gemm_time(device, mlp, dtype, mats)
        ffn_width = model.ffn_hidden / tp
        permute_bytes = 0.0

    # ---- element-wise traffic (read + write), per token:
    #   2 norms (read h, write h) and 2 residual adds (read 2h, write h): 10h, sharded by tp only with SP
    #   RoPE on q and k: read + write (q + kv); activation: read 2f write f (gated) or read f write f
    #   dropout (GPT): 2 x (read h, write h, write 1-byte mask)
    outside = 10 * h + (5 * h if model.dropout else 0)
    outside_div = tp if shape.sp else 1
    rope = 2 * (model.q_dim + model.kv_dim) / tp if model.position == "rope" else 0.0
    act = (3 if model.gated else 2) * ffn_width
    elem_bytes = tokens * e * (outside / outside_div + rope + act) + permute_bytes
    elem_bytes += unfused_elementwise_bytes(model, shape, moe, e)  # eager frameworks: op-by-op HBM traffic
    if dtype == "fp8":
        elem_bytes += FRAMEWORKS[shape.framework].fp8_cast_bytes * fp8_cast_elements(model, shape, moe)
        if moe and model.moe:  # Transformer Engine's GroupedLinear quantizes the experts' inputs itself
            elem_bytes += (FRAMEWORKS[shape.framework].fp8_grouped_quantize_bytes
                           * fp8_grouped_quantized_elements(model, shape))
    cost.elementwise_time += elem_bytes / (device.hbm_tbps * 1e12 * device.efficiency.memory_bandwidth)
    cost.overhead_time += device.efficiency.kernel_overhead_us_per_layer * 1e-6
    return cost


#: HBM bytes per element of the score matrix, per byte of activation dtype, of unfused
#: attention's forward (:func:`unfused_attention_core`): the ``Q K^T`` GEMM writes the scores,
#: the fused scale-mask-softmax reads them and writes the probabilities, ``P V`` reads those.
UNFUSED_SCORE_PASSES = 4
#: What attention dropout adds per element: it reads the probabilities and writes its output
#: (2 passes) plus a 1-byte mask.
UNFUSED_DROPOUT_PASSES, UNFUSED_DROPOUT_MASK_BYTES = 2, 1


def unfused_attention_core(model: ModelSpec, device: Device, shape: LayerShape, span: int,
                           dtype: str) -> LayerCost:
    """Forward cost of the attention core when it runs unfused (``plan.attention ==
    "unfused"``): two batched GEMMs over the whole score matrix and element-wise passes over it.

    Derivation (Megatron-LM's ``ParallelSelfAttention.forward`` as of v2, 2021, and
    Megatron-Core's ``DotProductAttention``, the ``--attention-backend unfused`` path):
    ``scores = baddbmm(Q, K^T)`` [b a/tp, s_q, s_kv], ``probs = FusedScaleMaskSoftmax(scores)``,
    ``attention_dropout(probs)``, ``context = bmm(probs, V)``. The GEMMs compute the whole
    ``s_q x s_kv`` square - the causal mask is applied to the scores after the product, so
    unlike a flash kernel nothing is skipped: ``2 s_q s_kv (d_qk + d_v)`` FLOPs per head,
    charged as GEMMs (their backward, ``dQ dK dV dP``, is the usual 2x). The score matrix
    itself, ``b a/tp s_q s_kv`` elements of ``e`` bytes, makes :data:`UNFUSED_SCORE_PASSES`
    round trips to HBM in the forward (GEMM write, softmax read + write, ``P V`` read), two
    more and a 1-byte mask with dropout (Korthikanti et al. 2022, arXiv:2205.05198, sec. 4.1:
    the same ``2as^2b + as^2b + 2as^2b`` tensors its activation count stores), at the device's
    element-wise bandwidth; the backward is charged at twice the forward like every
    element-wise term (by op count it is 7 passes against the forward's 4: ``dP`` written,
    ``P`` read for ``dV`` and for the softmax backward, ``dP`` read, ``dS`` written and read
    twice). With cp each rank's ``s/cp`` queries meet all ``span`` keys.

    Flash kernels keep the scores on chip (Dao et al. 2022, arXiv:2205.14135): that is the
    ``fused`` path of :func:`_layer_forward`, which halves the square for causal masks."""
    heads = model.heads / shape.tp
    d_qk, d_v = model.q_dim // model.heads, model.attn_out_dim // model.heads
    elements = shape.tokens * span * heads  # s_q (this rank's queries, x mbs) x s_kv x heads
    flops = 2 * elements * (d_qk + d_v)
    e = BYTES[dtype]
    passes = UNFUSED_SCORE_PASSES * e
    if model.dropout:
        passes += UNFUSED_DROPOUT_PASSES * e + UNFUSED_DROPOUT_MASK_BYTES
    return LayerCost(gemm_flops=flops, gemm_time=gemm_time(device, flops, dtype, 2),
                     elementwise_time=elements * passes / (device.hbm_tbps * 1e12 * device.efficiency.memory_bandwidth))


#: An end layer's time is its forward plus a backward at 2x (:func:`.step._end_terms`,
#: ``step.BACKWARD_PER_FORWARD``): what a loss priced as forward + backward bytes is divided by.
END_LAYER_PASSES = 3


@memoised
def output_forward(model: ModelSpec, device: Device, shape: LayerShape) -> LayerCost:
    """Final norm, output projection and cross-entropy for one micro-batch on the last stage."""
    tokens = shape.tokens
    flops = 2 * tokens * model.hidden * model.vocab / shape.tp
    cost = LayerCost(gemm_flops=flops, gemm_time=gemm_time(device, flops, "bf16" if shape.dtype == "fp8" else shape.dtype))
    # softmax cross-entropy in fp32 over the vocab shard: read logits, write probs, read again for the loss
    per_logit = BYTES[shape.dtype] + 3 * FP32_BYTES
    loss_bytes = FRAMEWORKS[shape.framework].ce_bytes_per_logit
    if loss_bytes:  # the framework's own op-by-op loss, forward + backward: as a forward the end rule triples
        per_logit = loss_bytes / END_LAYER_PASSES
    ce_bytes = tokens * model.vocab / shape.tp * per_logit
    cost.elementwise_time = ce_bytes / (device.hbm_tbps * 1e12 * device.efficiency.memory_bandwidth)
    return cost


@memoised
def embedding_forward(model: ModelSpec, device: Device, shape: LayerShape) -> LayerCost:
    """Embedding lookup on the first stage: a gather (read + write the rows), bandwidth-bound."""
    nbytes = 2 * shape.tokens * model.hidden * BYTES[shape.dtype]
    return LayerCost(elementwise_time=nbytes / (device.hbm_tbps * 1e12 * device.efficiency.memory_bandwidth))
