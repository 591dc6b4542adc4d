"""Fine-tuning: the memory and time of full SFT and of LoRA (``plan.finetune``).

Full SFT (``finetune="full"``) trains every weight: its memory and time are pre-training's
(the model states of :mod:`.states`, the activations of :mod:`.activations`), only the data
differs (:mod:`partita.cost.packing`: padding and packing of variable-length samples).

LoRA (``finetune="lora"``) [Hu et al. 2021, arXiv:2106.09685] freezes every base weight and
trains, beside each targeted linear ``W (out x in)``, two low-rank matrices ``A (r x in)``
and ``B (out x r)``: ``y = W x + (alpha / r) B A x``. Counted here:

* **Adapter parameters** per targeted linear ``r (in + out)`` (no bias; PEFT's default
  ``bias="none"``), over the linears ``plan.lora_targets`` names: ``attention`` = q, k, v, o
  (MLA: q_a, q_b, kv_a, kv_b, o), ``qkv`` = the same less o (Megatron-Core's ``linear_qkv``
  alone: NeMo 1.x's default ``target_modules: ['attention_qkv']`` at NeMo 24.07, NVIDIA/NeMo
  r2.0.0rc1 = 579983fb examples/nlp/language_modeling/tuning/conf/megatron_gpt_finetuning_config.yaml
  l.105; NeMo 2.0's ``llm.peft.LoRA`` at the same tag defaults to all four Megatron linears,
  nemo/collections/llm/peft/lora.py l.69), ``mlp`` = gate, up, down (or fc1, fc2; every routed and
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
  gated product (``h + f``) when only attention (or q, k, v) is targeted, the QKV input
  (``h``) when only the MLP is; a frozen out projection's input is the attention kernel's
  saved output and stays, unless the core attention is checkpointed (:func:`activation_delta`,
  :func:`_proj_input_freed`; before, ``h + o`` was freed for the MLP set). Selective
  recompute is the framework's (:func:`.frameworks.selective_modules`): op-level SAC keeps the
  adapters' intermediates only; Megatron-Core's module-level ``core_attn`` keeps recompute
  none's set less the checkpointed modules' (:func:`activation_delta`).
* **LoRA dropout** (``plan.lora_dropout > 0``; ms-swift's default 0.05, PEFT's and LLaMA-Factory's
  0), as PEFT runs it (before ``A``): each adapter drops its own input, so it keeps
  the dropped copy (``A``'s input, ``T in`` elements) and the mask (1 byte each on an accelerator)
  - PEFT's q, k, v adapters three copies of the attention input - while the input itself is no
  longer saved by ``A``: a frozen base linear's input that only the adapter kept is freed
  (:func:`activation_delta`, :func:`dropout_inputs_per_token`). Time: the dropout's forward and
  backward passes over ``T in`` (:func:`adapter_traffic`). Op-level selective recompute recomputes
  the dropout (its RNG state is replayed): nothing kept.
* **Adapter structure per framework** (:func:`lora_linears`): PEFT on a Hugging Face model
  wraps every ``nn.Linear`` (q, k, v, o, gate, up, down: seven adapters, three reading the
  attention input); Megatron-Core (NeMo, Megatron-Bridge, Megatron-SWIFT, MindSpeed) builds
  fused ``linear_qkv`` and ``linear_fc1`` (gate + up), and its LoRA puts one adapter on each
  (four adapters; ``A`` reads the input once). The framework entry says which
  (:attr:`.frameworks.Framework.lora_fused_projections`): parameter counts, activations and
  time follow it.
* **Time**: a frozen linear's backward runs the input-gradient GEMM only (``dX = dY W``),
  one forward's FLOPs instead of two (the weight-gradient GEMM ``dW = dY^T X`` is skipped);
  the output layer likewise; the embedding has no backward. Each adapter adds its two
  skinny GEMMs forward and their four backward (both weight and input gradients) and its
  pointwise ops, counted op by op as autograd runs them (:func:`adapter_traffic`: ``1 in + 6
  out`` passes forward, ``5 in + 4 out`` backward in eager PyTorch; 2 fewer forward where
  torch.compile fuses the scale and the add: ``Framework.lora_fused_epilogue``), each GEMM
  the slower of its FLOPs and its HBM traffic: at r = 16 they are bandwidth-bound.
  tests/test_finetune_adapters_*.py check the counts against torch's own FLOP counter and
  the bytes its dispatcher sees, on PEFT's and on a NeMo-style fused adapter. The data-parallel gradient reduction, the ZeRO-1/2 weight all-gather
  and the optimizer step cover the adapter parameters only (ZeRO-3 still gathers every
  weight, frozen ones included, and reduce-scatters the adapters' gradients only).
"""
from __future__ import annotations

from typing import NamedTuple

from ..plan import Plan
from ..spec.hardware import Device
from ..spec.model import ModelSpec
from .frameworks import get_framework, selective_modules
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
    """What the LoRA terms depend on beyond the layer shape (a memo key): the rank, the target
    set, whether the framework's model fuses q/k/v and gate/up into one linear each (one adapter
    per fused linear: :func:`lora_linears`) and whether its scale and add run as one compiled
    kernel (:func:`adapter_passes`)."""

    rank: int
    targets: str
    fused: bool = False
    fused_epilogue: bool = False
    dropout: bool = False


def lora_shape(plan: Plan) -> LoraShape:
    """The plan's :class:`LoraShape`, the adapter structure taken from its framework entry
    (:attr:`.frameworks.Framework.lora_fused_projections`, ``lora_fused_epilogue``)."""
    fw = get_framework(plan.framework)
    return LoraShape(plan.lora_rank, plan.lora_targets, fw.lora_fused_projections, fw.lora_fused_epilogue,
                     plan.lora_dropout > 0)


#: bytes per element of a dropout mask: the accelerators' fused ``native_dropout`` returns a bool
#: mask (aten/src/ATen/native/Dropout.cpp ``is_fused_kernel_acceptable``: CUDA, XPU, lazy and
#: PrivateUse1 devices - torch_npu's NPU); on a CPU torch runs ``input * noise`` with a noise
#: tensor of the input's dtype instead (``_dropout_impl``), which this count does not follow
DROPOUT_MASK_BYTES = 1


def dropout_inputs_per_token(model: ModelSpec, moe: bool, plan: Plan, skip_mlp: bool = False) -> float:
    """Elements per token of the inputs the adapters' dropouts read, over one layer's adapters on
    one rank (``skip_mlp``: the MLP's adapters run inside a checkpointed module). PEFT
    (``lora_B(lora_A(dropout(x)))``, huggingface/peft tuners/lora/layer.py ``Linear.forward``) and
    ms-swift drop each adapter's input separately: PEFT's q, k and v adapters each drop the
    attention input. (NeMo's ``ParallelLinearAdapter`` and NeMo AutoModel's ``LinearLoRA`` default to
    ``dropout_position="post"``, a dropout of the adapter's output - a ``T x out`` mask only -
    which is not distinguished here; NeMo's default dropout is 0.) The local width is the
    base linear's: the whole input of a column-parallel base, the tp (or etp) shard of a
    row-parallel one; routed experts see ``top_k / E`` of the tokens each."""
    total = 0.0
    tp = plan.tp
    for lin in lora_linears(model, moe, plan.lora_targets, lora_shape(plan).fused):
        if skip_mlp and lin.group == "mlp":
            continue
        split = plan.etp if lin.expert else tp
        din = lin.in_features if lin.column else lin.in_features / split
        total += lin.count * lin.token_share * din
    return total


def _attention_linears(model: ModelSpec, fused: bool = False) -> list[LoraLinear]:
    h = model.hidden
    if fused and not model.mla:  # Megatron-Core linear_qkv: one adapter over q + 2 kv, then linear_proj
        return [LoraLinear(h, model.q_dim + 2 * model.kv_dim, 1, 1.0, False, "attention", True),
                LoraLinear(model.attn_out_dim, h, 1, 1.0, False, "attention", False)]
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


def _mlp(model: ModelSpec, ffn: int, count: int, share: float, expert: bool, fused: bool = False) -> list[LoraLinear]:
    h = model.hidden
    if fused:  # Megatron-Core linear_fc1: gate and up in one linear of width 2 ffn (gated), then linear_fc2
        ins = [(h, ffn * (2 if model.gated else 1), True), (ffn, h, False)]
    else:
        ins = [(h, ffn, True)] * (2 if model.gated else 1) + [(ffn, h, False)]
    return [LoraLinear(i, o, count, share, expert, "mlp", column) for i, o, column in ins]


@memoised
def lora_linears(model: ModelSpec, moe: bool, targets: str, fused: bool = False) -> tuple[LoraLinear, ...]:
    """The targeted linears of one dense (``moe=False``) or MoE layer. A MoE layer's shared
    experts are one MLP of ``shared_experts x shared_ffn_hidden`` (as HF's Qwen2-MoE and
    DeepSeek-V3 define them); each routed expert its own.

    ``fused`` (Megatron / MindSpeed: :attr:`.frameworks.Framework.lora_fused_projections`):
    the adapters sit on the linears Megatron-Core builds - one ``linear_qkv`` of width
    ``q + 2 kv`` (NVIDIA/Megatron-LM@d98e8a64 megatron/core/transformer/attention.py:1689) and,
    gated, one ``linear_fc1`` of width ``2 ffn`` (mlp.py:206; experts' fc1 likewise) - so one
    adapter reads the input once: ``A`` is ``r x h``, ``B`` ``(q + 2 kv) x r`` (NeMo: "a single
    Low-Rank projection for KQV in a combined fashion", NVIDIA/NeMo
    docs/source/nlp/nemo_megatron/peft/supported_methods.rst). PEFT on a Hugging Face model
    (``fused=False``) wraps each ``nn.Linear``: three ``A`` of ``r x h`` for q, k, v and two for
    gate, up. MLA projections are separate linears in both (not fused)."""
    out: list[LoraLinear] = []
    if targets in ("attention", "all-linear"):
        out += _attention_linears(model, fused)
    elif targets == "qkv":  # every attention projection but the output one (o / linear_proj: the last)
        out += _attention_linears(model, fused)[:-1]
    if targets in ("mlp", "all-linear"):
        if moe and model.moe:
            mo = model.moe
            out += _mlp(model, mo.expert_ffn_hidden, mo.num_experts, mo.top_k / mo.num_experts, True, fused)
            if mo.shared_experts:
                out += _mlp(model, mo.shared_experts * mo.shared_ffn_hidden, 1, 1.0, False, fused)
        else:
            out += _mlp(model, model.ffn_hidden, 1, 1.0, False, fused)
    return tuple(out)


def layer_adapter_params(model: ModelSpec, moe: bool, shape: LoraShape) -> tuple[int, int]:
    """(tp-split, routed-expert) adapter parameters of one layer: ``r (in + out)`` per
    targeted linear (A is ``r x in``, B ``out x r``)."""
    dense = expert = 0
    for lin in lora_linears(model, moe, shape.targets, shape.fused):
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
    for lin in lora_linears(model, moe, lora.targets, lora.fused):
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
    (:func:`.activations.activation_bytes`, or :func:`.activations.module_recompute_bytes` under a
    module-level selective plan), on one rank: each adapter's ``r``-wide intermediate, less the
    inputs only an untargeted frozen linear would have saved (module docstring). Full recompute
    keeps the layer input only (no change).

    What ``selective`` means is the framework's (:func:`.frameworks.selective_modules`, the one
    rule the pre-training count follows too):

    * op-level selective checkpointing (partita's runtime, torchtitan's "op" SAC): the layer
      keeps only its listed GEMM outputs, so the adapters' intermediates are all it adds;
    * Megatron-Core's module-level selective (megatron / mindspeed, default ``core_attn``): only
      the named modules are checkpointed, everything else saves what it saves with recompute
      none - so the delta is recompute none's, less what the checkpointed modules already drop:
      the MLP's adapters and frozen inputs inside a checkpointed ``mlp`` (dense) or ``moe``
      block; norm outputs ``layernorm`` discards (:func:`.activations.norm_outputs_freed`:
      the QKV input on MLA or MindSpeed's local spec, the MLP input on MindSpeed's); and with
      ``core_attn`` checkpointed and the out projection frozen and untargeted (``qkv``, ``mlp``
      targets), its input - the core attention's output, which no kernel keeps then - goes
      too (without the checkpoint the fused attention kernel saves its own output for its
      backward, the tensor ``linear_proj`` reads: a frozen ``linear_proj`` frees nothing there,
      under any framework - :func:`_proj_input_freed`; before this the ``mlp`` set freed it
      with no recompute too).

    tests/test_finetune_targets_recompute.py checks it with saved-tensor hooks on a layer
    written as Megatron-Core builds it, its core attention checkpointed."""
    if plan.finetune != "lora" or mode == "full":
        return 0.0
    e = BYTES[plan.dtype]
    tokens = plan.mbs * plan.seq_len / plan.cp
    targets = plan.lora_targets
    linears = lora_linears(model, moe, targets, lora_shape(plan).fused)
    modules = selective_modules(plan.framework, mode, plan.recompute_modules)
    if mode == "selective" and not modules:  # op-level SAC: the adapters' intermediates only (a dropout recomputed)
        return tokens * sum(lin.count * lin.token_share for lin in linears) * plan.lora_rank * e
    moe_layer = moe and model.moe is not None
    mlp_checkpointed = ("moe" if moe_layer else "mlp") in modules
    per_token = sum(lin.count * lin.token_share for lin in linears
                    if not (lin.group == "mlp" and mlp_checkpointed)) * plan.lora_rank * e
    dropout = plan.lora_dropout > 0
    if dropout:  # each adapter keeps its dropped input (A's input) and the dropout's mask
        per_token += dropout_inputs_per_token(model, moe, plan, mlp_checkpointed) * (e + DROPOUT_MASK_BYTES)
    if (targets == "all-linear" and not dropout) or moe_layer:
        return tokens * per_token
    # a frozen linear frees the input only it saved: an untargeted one, or - with dropout, where
    # A saves its dropped copy instead of the input itself - a targeted one too
    frozen_attention = targets == "mlp" or dropout
    frozen_mlp = targets in ("attention", "qkv") or dropout
    frozen_proj = targets in ("qkv", "mlp") or dropout
    out_div = plan.tp if plan.sp else 1
    norms_freed = "layernorm" in modules and (plan.framework == "mindspeed" or model.mla is not None)
    if frozen_mlp and not mlp_checkpointed:  # the MLP input (norm output) and the gated product (w2's input)
        per_token -= (0.0 if norms_freed and plan.framework == "mindspeed" else e * model.hidden / out_div) \
            + e * model.ffn_hidden / plan.tp
    if frozen_attention:  # the QKV input
        per_token -= 0.0 if norms_freed else e * model.hidden / out_div
    if frozen_proj and _proj_input_freed(plan, modules):  # linear_proj's input, where only it saved it
        per_token -= e * model.attn_out_dim / plan.tp
    return tokens * per_token


def _proj_input_freed(plan: Plan, modules: frozenset) -> bool:
    """Whether a frozen, untargeted out projection frees its input (the attention output): only
    where ``core_attn`` is checkpointed. Without the checkpoint the projection reads the attention
    kernel's own output, which the kernel saves for its backward - Transformer Engine's
    ``FusedAttnFunc`` saves q, k, v and out, and returns that out viewed as ``[s, b, h]``; torch's
    SDPA flash kernels allocate their output in the query's ``(b, s, heads, d)`` memory order, so the
    Hugging Face / torchtitan ``transpose(1, 2).contiguous()`` before ``o_proj`` is a view of it, not
    a copy (tests/test_finetune_targets_recompute.py measures both layers). Unfused attention
    (``attention=unfused``: Megatron-Core's ``DotProductAttention`` ends in ``permute(...)
    .contiguous()``, Hugging Face eager in ``transpose(1, 2).contiguous()``) hands the projection a
    copy only it saves, so freezing it frees that copy. (Megatron-DeepSpeed's flash path also copies
    with mbs > 1 - ``rearrange(...).contiguous()`` - not distinguished here.)"""
    return "core_attn" in modules or plan.attention == "unfused"


# ------------------------------------------------------------------ time
class AdapterTraffic(NamedTuple):
    """One adapter's work on ``tokens`` rows, forward and backward: FLOPs and HBM bytes of its
    two GEMMs each pass (``*_gemm``: (flops, bytes) per GEMM) and the bytes of its pointwise
    ops (``*_pointwise``)."""

    forward_gemm: tuple[tuple[float, float], ...]
    forward_pointwise: float
    backward_gemm: tuple[tuple[float, float], ...]
    backward_pointwise: float

    @property
    def flops(self) -> float:
        return sum(f for f, _ in self.forward_gemm + self.backward_gemm)

    @property
    def bytes(self) -> float:
        return sum(b for _, b in self.forward_gemm + self.backward_gemm) + self.forward_pointwise + self.backward_pointwise


def adapter_traffic(tokens: float, din: float, dout: float, rank: int, e: int, fused_epilogue: bool = False,
                    scale_on_intermediate: bool = False, b_tokens: float | None = None,
                    dropout: bool = False) -> AdapterTraffic:
    """What autograd runs for one adapter ``y = base(x) + s B(A x)`` over a frozen base whose
    input needs a gradient, counted op by op (``b_tokens``: the rows ``B`` sees, the sequence
    shard of a replicated ``B`` with SP; default ``tokens``). Eager PEFT
    (huggingface/peft ``tuners/lora/layer.py`` ``Linear.forward``: ``result = result +
    lora_B(lora_A(dropout(x))) * scaling``; dropout 0 is ``nn.Identity``) and NeMo's
    ``ParallelLinearAdapter`` (``linear_out`` then ``x * (alpha / dim)``, added by the wrapper):

    * forward: ``A x`` (``2 T r in`` FLOPs; read ``T in``, write ``T r``), ``B (.)`` (``2 T r
      out``; read ``T r``, write ``T out``), the scale (read, write ``T out``) and the add (read
      2, write 1): ``1 in + 6 out`` passes with the GEMM outputs;
    * backward (the derivatives of ``mm``, ``mul`` by a number and ``add`` in PyTorch's
      tools/autograd/derivatives.yaml): the add passes its gradient through (no kernel), the
      scale's backward reads and writes ``T out``, ``B``'s weight and input gradients each read
      the ``T out`` gradient (``2 x 2 T r out`` FLOPs), ``A``'s weight gradient reads ``x`` and
      its input gradient writes ``T in`` (``2 x 2 T r in``), and autograd sums that input
      gradient into the base's (read 2, write 1 of ``T in``): ``5 in + 4 out`` passes - not
      twice the forward's ``1 in + 6 out``, which Partita charged before.

    ``fused_epilogue`` (torch.compile: Inductor fuses the scale and the add into one pointwise
    kernel, read 2 write 1): forward pointwise ``3 out`` instead of 5. ``scale_on_intermediate``
    (NeMo AutoModel's ``LinearLoRA``: ``lora_B(lora_A(x) * scale)``,
    NVIDIA-NeMo/Automodel nemo_automodel/components/_peft/lora.py): the scale runs on the
    ``r``-wide intermediate, no ``T out`` pass in either direction for it. The weights' own
    reads (``r x in``, ``out x r``) are not counted (``r / T`` of the rest).

    ``dropout`` (``lora_dropout > 0``): ``native_dropout`` on ``x`` before ``A`` reads ``T in`` and
    writes the dropped copy and its mask (:data:`DROPOUT_MASK_BYTES` per element); its backward
    (``native_dropout_backward``, derivatives.yaml) reads the gradient and the mask and writes the
    input's gradient - torch's own op signatures, checked by tests/test_finetune_lora_dropout.py."""
    bt = tokens if b_tokens is None else b_tokens
    t_in, t_out, t_r, bt_r = tokens * din * e, bt * dout * e, tokens * rank * e, bt * rank * e
    fa, fb = 2 * tokens * rank * din, 2 * bt * rank * dout
    if scale_on_intermediate:
        fwd_pw, bwd_pw = 3 * t_out + 2 * t_r, 2 * t_r
    elif fused_epilogue:
        fwd_pw, bwd_pw = 3 * t_out, 2 * t_out
    else:
        fwd_pw, bwd_pw = 5 * t_out, 2 * t_out
    if dropout:
        mask = tokens * din * DROPOUT_MASK_BYTES
        fwd_pw, bwd_pw = fwd_pw + 2 * t_in + mask, bwd_pw + 2 * t_in + mask
    return AdapterTraffic(forward_gemm=((fa, t_in + t_r), (fb, bt_r + t_out)), forward_pointwise=fwd_pw,
                          backward_gemm=((fb, t_out + bt_r), (fb, t_out + bt_r), (fa, t_r + t_in), (fa, t_r + t_in)),
                          backward_pointwise=bwd_pw + 3 * t_in)


def adapter_forward(model: ModelSpec, device: Device, layer: LayerShape, moe: bool, lora: LoraShape) -> LayerCost:
    """Forward cost of one layer's adapters per micro-batch on one rank (:func:`adapter_costs`)."""
    return adapter_costs(model, device, layer, moe, lora)[0]


@memoised
def adapter_costs(model: ModelSpec, device: Device, layer: LayerShape, moe: bool,
                  lora: LoraShape) -> tuple[LayerCost, LayerCost]:
    """(forward, backward) cost of one layer's adapters per micro-batch on one rank: for each
    targeted linear (:func:`lora_linears`, fused where the framework fuses), the work
    :func:`adapter_traffic` counts, each GEMM the slower of its time (:func:`.compute.gemm_time`)
    and its HBM traffic, each pointwise op its traffic at the device's bandwidth (both in
    ``gemm_time``). ``in``/``out`` are the rank's local widths (the base linear's tp split);
    routed experts see ``top_k / E`` of the tokens."""
    e, r, tp = BYTES[layer.dtype], lora.rank, layer.tp
    bandwidth = device.hbm_tbps * 1e12 * device.efficiency.memory_bandwidth
    fwd, bwd = LayerCost(), LayerCost()
    for lin in lora_linears(model, moe, lora.targets, lora.fused):
        # routed experts: the rank's top_k token slots (etp-gathered) over its E / ep local
        # experts, each split etp ways (as .compute counts them); else every token, split tp ways
        n, split = (lin.count / layer.ep, layer.etp) if lin.expert else (lin.count, tp)
        slots = layer.tokens * lin.token_share * lin.count * (layer.etp / tp if lin.expert else 1.0)
        din = lin.in_features if lin.column else lin.in_features / split
        dout = lin.out_features / split if lin.column else lin.out_features
        # a replicated B after a row-parallel base runs on the sequence shard with SP
        b_slots = slots / tp if (layer.sp and not lin.column and not lin.expert) else slots
        tr = adapter_traffic(slots, din, dout, r, e, lora.fused_epilogue, b_tokens=b_slots, dropout=lora.dropout)
        for cost, gemms, pointwise in ((fwd, tr.forward_gemm, tr.forward_pointwise),
                                       (bwd, tr.backward_gemm, tr.backward_pointwise)):
            for flops, moved in gemms:
                cost.gemm_flops += flops
                cost.gemm_time += max(gemm_time(device, flops, layer.dtype, max(1, int(n))), moved / bandwidth)
            cost.gemm_time += pointwise / bandwidth
    return fwd, bwd


def lora_stage_terms(model: ModelSpec, device: Device, shape, lora: LoraShape, terms: tuple,
                     flash_backward: float) -> tuple:
    """:func:`.step.stage_terms` of a LoRA plan from pre-training's: per layer the base GEMMs'
    backward runs the input gradient only (one forward's GEMM time and FLOPs less), the
    adapters' forward and backward (:func:`adapter_costs`) are added, and full recompute reruns their forward;
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

    def adjust(t, base: LayerCost | None, adapters: tuple[LayerCost, LayerCost] | None, drop_backward: bool = False):
        if base is None:
            return t
        adapter = adapters[0] if adapters is not None else None
        d_time = -base.gemm_time - (base.time if drop_backward else 0.0)
        d_flops = -base.gemm_flops
        if adapters is not None:
            d_time += adapters[0].gemm_time + adapters[1].gemm_time
            d_flops += adapters[0].gemm_flops + adapters[1].gemm_flops
        rc = rc_full * adapter.gemm_time if adapter is not None else 0.0
        rc_flops = rc_full * adapter.gemm_flops if adapter is not None else 0.0
        return t._replace(compute=t.compute + d_time, recompute=t.recompute + rc,
                          forward=t.forward + (adapter.gemm_time if adapter is not None else 0.0),
                          backward=t.backward + d_time - (adapter.gemm_time if adapter is not None else 0.0) + rc,
                          flops=t.flops + d_flops + rc_flops)

    dense = moe = None
    if model.dense_layers:
        dense = adjust(kinds.dense, layer_forward(model, device, layer, False),
                       adapter_costs(model, device, layer, False, lora))
    if model.moe:
        moe = adjust(kinds.moe, layer_forward(model, device, layer, True),
                     adapter_costs(model, device, layer, True, lora))
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
    input gradients (``3 x 2 T r h / tp``; one ``A`` on a fused ``linear_qkv``). With ``mlp`` only: the whole attention block has
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
    n_a = 1 if lora.fused else 3  # A matrices reading the layer input: one on a fused linear_qkv
    if lora.targets != "mlp":
        adapters = n_a * 2 * tokens * r * h / tp
        return gemm_time(device, qkv, layer.dtype, 3) + gemm_time(device, adapters, layer.dtype, n_a), qkv + adapters
    base = layer_forward(model, device, layer, False)
    proj = qkv + 2 * tokens * model.attn_out_dim * h / tp
    ins = 2 if model.gated else 1
    mlp_in = ins * 2 * tokens * h * model.ffn_hidden / tp
    n_a = 1 if lora.fused else ins  # one A on a fused linear_fc1
    adapters = n_a * 2 * tokens * r * h / tp
    seconds = (gemm_time(device, proj, layer.dtype, 4) + flash_backward * base.attn_time
               + gemm_time(device, mlp_in, layer.dtype, ins) + gemm_time(device, adapters, layer.dtype, n_a))
    return seconds, proj + flash_backward * base.attn_flops + mlp_in + adapters
