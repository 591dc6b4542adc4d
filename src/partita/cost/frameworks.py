"""How the same plan runs under different training frameworks ("as run by"; issue 12 item 4).

The cost model's formulas describe one way of running a layer; frameworks differ in a few
documented places, and only there. Each difference is a named field of
:class:`Framework`, read by exactly one formula, with the source that says the framework
behaves so. There is no per-framework efficiency factor and no per-row tuning: a
framework changes which bytes are saved, which FLOPs are recomputed and which
collectives may overlap - never a fitted constant.

==========================  ==================================================================
field                       what it changes (where)
==========================  ==================================================================
``eager_activations``       recompute none: the layer saves what eager PyTorch modules save
                            beyond fused kernels (:func:`.activations.eager_extra_bytes`): unfused
                            RMSNorm's fp32 ``x * rstd`` and ``rstd``, GQA's K/V expanded to the
                            query width before SDPA, SiLU's output, the MoE router's index and
                            weight tensors
``checkpoint_early_stop``   full recompute stops after the last tensor backward needs: the
                            layer's last GEMM (the MLP's / shared expert's ``w2``) is not
                            recomputed (:func:`.compute.last_gemm`, :mod:`.step`)
``zero0_autocast``          zero 0 with 16-bit training keeps fp32 parameters and casts per op
                            (torch.autocast): 4 B weights + 4 B fp32 gradients + 8 B AdamW per
                            parameter instead of Megatron's 2 + 4 + 12 (:mod:`.memory`)
``param_gather_overlap``    zero 1/2: whether the all-gather of updated weights can overlap the
                            next forward (Megatron ``--overlap-param-gather``); else it is
                            exposed whatever the plan's ``overlap_param_gather`` says
``tp_comm_overlap``         whether the plan's ``tp_comm_overlap`` can be honoured (Megatron /
                            TE userbuffers, MindSpeed MC2, torchtitan async TP)
``fp8_cast_bytes``          fp8 plans: HBM bytes per element of every GEMM input and weight that
                            the framework casts to fp8 in its own pass (torchao's dynamic
                            scaling: amax read 2 + cast read 2 + write 1); 0 where the cast is
                            fused into the producing kernel (Transformer Engine)
                            (:func:`.compute.fp8_cast_elements`)
``unfused_elementwise``      the element-wise ops run as separate eager kernels, each a round trip
                            through HBM: the extra bytes beyond the fused count of
                            :func:`.compute.layer_forward` (:func:`unfused_elementwise_bytes`),
                            added to the layer's element-wise HBM traffic there.
``param_broadcast_per_owner`` zero 1/2: the updated weights are broadcast by each owner of a
                            shard, one collective call per member of the shard group, instead
                            of one all-gather: the all-gather's bytes plus ``n`` times the
                            device's ``collective_call_us`` (:mod:`.step`)
``cp_kv_all_gather``        context parallel all-gathers K and V over the cp group (backward:
                            reduce-scatter of their gradients), synchronous, instead of the ring
                            of ``cp - 1`` K/V hops that overlaps attention (:mod:`.step`)
``zero1_grad_all_reduce``   zero 1: gradients are all-reduced in full (DDP) and each owner
                            updates its parameters, instead of reduce-scattered into the
                            owners' shards: twice the reduce-scatter's bytes (:mod:`.step`)
``param_broadcast_per_tensor`` zero 1: the updated weights are broadcast tensor by tensor from
                            their owners: the all-gather's bytes in as many collective calls as
                            the stage has parameter tensors, each paying a call's latency
``grad_overlap_needs_ddp``  zero 0/1: the gradient all-reduce overlaps the backward only at zero
                            0 on a model DDP can wrap (no tp, pp, ep); otherwise one bucketed
                            all-reduce runs after the last micro-batch (:mod:`.step`)
``persistent_grad_buffer``  the gradients live in a buffer allocated once and kept across steps
                            (Megatron's contiguous ``main_grad`` buffer), so they are alive at the
                            forward's end and the loss phase; False: ``zero_grad(set_to_none=True)``
                            frees them after each step and backward re-creates them while it frees
                            the activations - at one micro-batch per step the peak holds
                            ``max(activations, gradients)``, not their sum
                            (:meth:`.memory.MemoryParts.gradients_at_peak`)
``master_in_params``        16-bit training keeps no fp32 master weight: the bf16/fp16 parameters
                            are the optimizer's copy, updated in fp32 and cast back, so the states
                            are 2 + gradients + 8 (fp32 AdamW m, v) bytes per parameter, not
                            Megatron's 2 + 4 + 12 (:func:`.states._state_bytes`; memory only)
``fp8_grouped_quantize_bytes`` fp8 MoE: HBM bytes per element of the routed experts' GEMM inputs
                            that the framework quantizes in a separate kernel (Transformer Engine's
                            ``GroupedLinear``: ``fused_multi_quantize`` reads the 16-bit input and
                            writes its fp8 rows and their transpose, 2 + 1 + 1 B), where no
                            producing kernel fuses the cast (:func:`.compute.fp8_grouped_quantized_elements`)
``fp8_tp_gather``           fp8 tensorwise with tp and SP: the sequence-sharded input of the
                            attention / MLP block is cast to fp8 once, before the tp all-gather
                            (torchao ``PrepareFloat8ModuleInput``), so q/k/v and w1/w3 share one
                            cast of ``h / tp`` per token and the forward all-gathers (and the
                            gradients' all-gathers before wo / w2's backward) move 1-byte
                            elements (:func:`.compute.fp8_tp_gathered`, :mod:`.step`)
``ce_bytes_per_logit``      HBM bytes per logit of the framework's own cross-entropy, forward and
                            backward together, where it runs as separate primitive ops; 0: the
                            fused fp32 softmax of :func:`.compute.output_forward` (2 + 12 B forward,
                            backward 2x: 42 B)
``fsdp2_stream_copies``     zero 3 is torch FSDP2: the all-gather's copy-out and the reduce-scatter's
                            copy-in run on the compute stream, beside no overlap
                            (:func:`.step._zero3_exposed`)
``lora_fused_projections``  LoRA adapters sit on Megatron-Core's fused linear_qkv and linear_fc1,
                            one per fused linear (megatron, mindspeed; a LoRA plan under megatron
                            counts these, not PEFT's per-nn.Linear adapters: .finetune.lora_linears)
``lora_fused_epilogue``     LoRA's scale and add are one compiled kernel (torchtitan, compiled)
                            (:func:`.finetune.adapter_traffic`)
==========================  ==================================================================

Entries: ``megatron`` (reference), ``mindspeed``, ``torchtitan`` (compiled blocks, the
default of its llama configs), ``torchtitan-eager`` (torchtitan without ``torch.compile``),
``torchtitan-eager-loss`` (compiled blocks, eager loss: torchtitan before 2025-04),
``mindformers`` (MindSpore/MindFormers on Ascend: MindSpeed's terms, its own optimizer states),
``deepspeed``, ``partita`` (this project's eager runtime), ``internevo`` (the InternLM trainer:
Megatron's kernels and checkpoint, its hybrid ZeRO-1 syncing parameters by per-owner
broadcasts after the step).

Why ``torchtitan-eager`` is an entry and not a ``compile`` knob on torchtitan: every field
above is a fact about how a named stack runs a layer, and compile is one more such fact - it
decides four of them at once (saved set, element-wise kernels, async TP, nothing else). A
knob would be a second axis that only torchtitan honours (Megatron/TE and MindSpeed are fused
either way, DeepSpeed has no compile mode modelled), a new plan field to validate, export and
record, and a cross product in which most cells mean nothing. An entry derived with
``dataclasses.replace`` from torchtitan changes exactly the fields compile changes, is
recorded in a plan's ``framework`` like any other, and is chosen per published row from the
row's own notes (``runs_as`` in ``bench/published_runs.py``).

``megatron`` is the cost model's reference (every field at the value the formulas had
before frameworks were named), so estimates without ``--framework`` are unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import PartitaError
from ..plan import FRAMEWORKS as FRAMEWORK_NAMES
from ..spec.model import ModelSpec

DEFAULT_FRAMEWORK = "megatron"


@dataclass(frozen=True)
class Framework:
    """The documented differences of one framework (see the module docstring); ``sources``
    names, per field, where the behaviour is written down."""

    name: str
    eager_activations: bool = False
    checkpoint_early_stop: bool = False
    zero0_autocast: bool = False
    param_gather_overlap: bool = True
    tp_comm_overlap: bool = True
    #: keyword-only and required: 0 means "fused into the producing kernel" (Transformer
    #: Engine), a default that a new entry would inherit silently - the first torchtitan-eager
    #: trial built its entry without it and the eager fp8 rows came out 15 points *faster*
    fp8_cast_bytes: float = field(kw_only=True)
    unfused_elementwise: bool = False
    #: zero 1/2: the updated weights reach the other ranks as one broadcast per owner (each
    #: member of the shard group broadcasts its shard), not one all-gather - the same bytes
    #: per rank, but as many collective calls as the group has members (:mod:`.step`)
    param_broadcast_per_owner: bool = False
    #: cp: K/V all-gathered (Llama 3's context parallel) rather than passed round a ring
    cp_kv_all_gather: bool = False
    #: zero 1: the gradients all-reduced in full (DDP), not reduce-scattered to the owners
    zero1_grad_all_reduce: bool = False
    #: zero 1: the updated weights broadcast one parameter tensor per collective call
    param_broadcast_per_tensor: bool = False
    #: zero 0/1: the gradient reduction overlaps the backward only where DDP wraps the model (zero 0, no tp/pp/ep)
    grad_overlap_needs_ddp: bool = False
    #: gradients kept in a buffer across steps (Megatron main_grad); False: freed by zero_grad(set_to_none=True)
    persistent_grad_buffer: bool = True
    #: ZeRO-3 is torch FSDP2 (``fully_shard``): the all-gather's copy-out into the parameters and
    #: the reduce-scatter's copy-in of the gradients run on the compute stream (:mod:`.step`)
    fsdp2_stream_copies: bool = False
    #: 16-bit parameters are the master copy (MindSpore): no separate fp32 master in the optimizer states
    master_in_params: bool = False
    #: the loss's own HBM bytes per logit, forward + backward (:data:`MINDFORMERS_CE_BYTES`); 0: the fused count
    ce_bytes_per_logit: float = 0.0
    #: fp8 tensorwise + tp: inputs cast before the tp all-gather (torchao float8 TP, torchtitan)
    fp8_tp_gather: bool = False
    #: fp8 MoE: bytes per routed-expert GEMM input element quantized in its own kernel (TE GroupedLinear)
    fp8_grouped_quantize_bytes: float = 0.0
    #: LoRA on the fused projections the framework's model has (Megatron-Core linear_qkv, and linear_fc1 = gate
    #: and up): one adapter per fused linear, reading its input once (cost/finetune.py); False: PEFT's one
    #: adapter per nn.Linear (HF q/k/v/gate/up separate)
    lora_fused_projections: bool = False
    #: LoRA's scale and add run as one compiled pointwise kernel (torch.compile / Inductor), not two eager ops
    lora_fused_epilogue: bool = False
    sources: tuple[tuple[str, str], ...] = ()


_MEGATRON_SOURCES = (
    ("eager_activations", "Megatron-Core with Transformer Engine: LayerNormLinear/LayerNormMLP fuse the norm into "
     "the GEMM and save its input and rstd only; TE DotProductAttention takes GQA K/V unexpanded; bias_swiglu_fusion "
     "saves the fc1 output only (megatron/core/transformer, transformer_engine/pytorch/module)"),
    ("checkpoint_early_stop", "megatron/core/tensor_parallel/random.py CheckpointFunction: a reentrant "
     "torch.autograd.Function that reruns the whole forward of the checkpointed layers in backward"),
    ("zero0_autocast", "Megatron Float16Module: bf16 parameters, fp32 main gradients and fp32 master weights in "
     "the optimizer (megatron/core/optimizer/optimizer.py Float16OptimizerWithFloat16Params)"),
    ("param_gather_overlap", "--overlap-param-gather (distributed optimizer): the next forward's layers wait "
     "only for their own bucket's all-gather (megatron/core/distributed/param_and_grad_buffer.py)"),
    ("tp_comm_overlap", "--tp-comm-overlap: Transformer Engine userbuffers overlap the tp all-gather / "
     "reduce-scatter with the GEMMs"),
    ("persistent_grad_buffer", "megatron/core/distributed/param_and_grad_buffer.py _ParamAndGradBuffer: one "
     "contiguous grad_data tensor per dtype allocated at DDP construction, each param.main_grad a view into it; "
     "zero_grad_buffer() zeroes it in place (grad_data.zero_()) - never freed"),
    ("fp8_cast_bytes", "Transformer Engine fp8: LayerNormLinear / LayerNormMLP emit the norm's and the "
     "activation's output in fp8 from the same kernel, and delayed scaling takes the scale from the amax "
     "history the producing kernel records - no separate cast or amax pass"),
    ("fp8_grouped_quantize_bytes", "Transformer Engine transformer_engine/pytorch/module/grouped_linear.py "
     "(NVIDIA/TransformerEngine 0069563f60) _GroupedLinear.forward: the routed experts' inputs arrive in the "
     "activation dtype (Megatron-Core TEGroupedMLP: the permuted tokens for fc1, the bias-SwiGLU output for fc2) "
     "and are quantized by tex.fused_multi_quantize with rowwise and, for the weight gradient, columnwise "
     "usage - read 2 B, write the fp8 rows and their transpose (1 + 1 B); backward quantizes grad_output the "
     "same way. Weights: cached per step (is_first_microbatch), not charged"),
)

#: Where FSDP2 runs its copies (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, torch 2.4+):
#: ``foreach_reduce`` packs the gradients into the reduce-scatter input with
#: ``foreach_reduce_scatter_copy_in`` on the current (compute) stream, and only then does
#: ``reduce_scatter_stream.wait_stream(current_stream)``; ``FSDPParamGroup.wait_for_unshard`` calls
#: ``foreach_all_gather_copy_out`` (split_with_sizes_copy of the gathered buffer into the parameters) on
#: the compute stream after waiting for the all-gather; only the copy-in of the all-gather runs on its
#: own ``all_gather_copy_in_stream``.
_FSDP2_COPIES = ("torch FSDP2 (fully_shard): all-gather copy-out and reduce-scatter copy-in on the compute "
                 "stream (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce, "
                 "_fsdp_param_group.py wait_for_unshard)")

#: LoRA on Megatron-Core's fused projections (cost/finetune.py lora_linears): SelfAttention builds one linear_qkv of
#: width q + 2 kv (NVIDIA/Megatron-LM@d98e8a64 megatron/core/transformer/attention.py:1689-1692) and a gated MLP one
#: linear_fc1 of width 2 ffn (mlp.py:206, ffn_hidden_size *= 2); NeMo's LoRA "learns a single Low-Rank projection
#: for KQV in a combined fashion" (NVIDIA/NeMo docs/source/nlp/nemo_megatron/peft/supported_methods.rst), its
#: ParallelLinearAdapter reading the layernorm output once (AdapterParallelAdd in nemo/collections/llm/peft/lora.py)
_LORA_FUSED_SOURCE = ("lora_fused_projections", "Megatron-Core linear_qkv (q + 2 kv) and linear_fc1 (gate + up): one "
                      "adapter per fused linear (Megatron-LM@d98e8a64 attention.py:1689, mlp.py:206; NeMo "
                      "supported_methods.rst: a single low-rank projection for KQV)")

_TORCHTITAN = Framework("torchtitan", checkpoint_early_stop=True, zero0_autocast=True, fp8_cast_bytes=5.0,
                        lora_fused_epilogue=True,
                        fsdp2_stream_copies=True, fp8_tp_gather=True, sources=(
    ("lora_fused_epilogue", "torch.compile (Inductor) fuses pointwise ops that follow each other into one kernel: "
     "LoRA's scale and add read B's output and the base output once and write the sum (cost/finetune.py "
     "adapter_traffic)"),
        ("fsdp2_stream_copies", _FSDP2_COPIES),
        ("eager_activations", "torchtitan compiles each TransformerBlock (apply_compile in "
         "torchtitan/models/llama3/infra/parallelize.py); the min-cut partitioner "
         "(torch/_functorch/partitioners.py min_cut_rematerialization_partition) recomputes the norm, RoPE, "
         "repeat_kv and SiLU in backward instead of saving them, so the saved set is the GEMM/SDPA inputs; "
         "without compile: ``torchtitan-eager``"),
        ("checkpoint_early_stop", "torchtitan apply_ac: ptd_checkpoint_wrapper with "
         "CheckpointImpl.NO_REENTRANT (torch.utils.checkpoint non-reentrant, early stop on by default, "
         "torch.utils.checkpoint.set_checkpoint_early_stop)"),
        ("zero0_autocast", "torchtitan/distributed/utils.py maybe_enable_amp: without FSDP the model trains "
         "under torch.autocast over fp32 parameters"),
        ("tp_comm_overlap", "torchtitan async TP (--parallelism.enable_async_tensor_parallel, needs compile)"),
        ("persistent_grad_buffer", "kept True, though torchtitan/train.py train_step calls "
         "self.optimizers.zero_grad() (set_to_none=True) and FSDP2 (torch/distributed/fsdp/_fully_shard/"
         "_fsdp_param_group.py post_backward) assigns each step a new sharded gradient: its published peaks "
         "(max_reserved of the CUDA caching allocator) stay linear in the activations with the gradients counted "
         "- torchao float8nocompile's every-2nd-layer AC rows sit 0.50 of the way from no AC to full AC "
         "(tests/test_recompute_layers.py), 0.556 if the gradients were freed. Unverified cause: the freed "
         "gradient blocks stay reserved (too small for the activations' blocks); not measured here"),
        ("fp8_cast_bytes", "torchao.float8 Float8Linear with dynamic scaling (torchtitan --model.converters "
         "float8): each linear computes its input's and weight's amax (a reduction that must finish before the "
         "scale exists) and then casts, so per element one 2-byte read for the amax and a 2-byte read plus "
         "1-byte write for the cast; every linear casts its own input (wq, wk, wv and w1, w3 each cast the "
         "same x) - torchao/float8/float8_linear.py, torchao/float8/float8_scaling_utils.py"),
        ("fp8_tp_gather", "torchtitan/models/llama3/infra/parallelize.py (Jun-2025, 6b11290c1e) apply_tp: with "
         "float8 and a tensorwise recipe ('For now, float8 all-gather with TP is only supported for tensorwise "
         "float8 scaling recipes. For rowwise recipes, we use regular TP and all-gather happens in high "
         "precision') the plan is PrepareFloat8ModuleInput on attention / feed_forward, Float8ColwiseParallel on "
         "wq, wk, wv, w1, w3 and Float8RowwiseParallel on wo, w2; torchao/float8/float8_tensor_parallel.py: "
         "PrepareFloat8ModuleInput casts the Shard(1) input with hp_tensor_to_float8_dynamic and then "
         "redistributes it to Replicate ('the float8 cast happens before the all-gather'), the colwise "
         "linears skip an input already cast (tensor_already_casted_to_fp8), and the rowwise output's "
         "NoopFwToFloat8BwDynamic casts its gradient before the redistribute's backward all-gather"),
    ))

#: What changes when torchtitan runs without ``torch.compile`` (``--compile.enable`` off),
#: field by field; the fields not named here are torchtitan's (``replace`` below).
_TORCHTITAN_EAGER_SOURCES = (
    ("eager_activations", "without apply_compile each TransformerBlock runs as eager modules, and autograd saves "
     "what each op's backward formula asks for (PyTorch autograd, tools/autograd/derivatives.yaml): nn.RMSNorm's "
     "fp32 normalised input and rstd, repeat_kv's K/V copies at the query width that SDPA saves, SiLU's output "
     "besides w1's - the unfused element-wise ops Korthikanti et al. 2022 (arXiv:2205.05198) Sec. 4.1 count "
     "separately in their per-layer activation sum, where the compiled block's min-cut partitioner "
     "recomputes them (torch/_functorch/partitioners.py); :func:`.memory.eager_extra_bytes`, "
     "pinned by the saved-tensor hooks of partita's eager layers (tests/data/cost_oracles.json)"),
    ("tp_comm_overlap", "torchtitan's async TP is torch.compile's micro-pipeline TP pass (torchtitan sets "
     "torch._inductor.config._micro_pipeline_tp): without compile the TP collectives are synchronous"),
    ("fp8_cast_bytes", "torchao/prototype/float8nocompile/kernels/fp8_dynamic_tensorwise.py: eager fp8 through "
     "handwritten Triton kernels, an amax kernel (read 2 B per element, atomic max) then a cast kernel (read 2, "
     "write 1): 5 B per element as the compiled cast, not the ~10 unfused passes plain eager torchao would run; "
     "the README measures +6-10 % tokens/s over bf16 eager against +25-28 % for float8 + torch.compile"),
    ("unfused_elementwise", "torchtitan/models/llama3/model/model.py run op by op: torch.rms_norm's composite "
     "(aten/src/ATen/native/layer_norm.cpp rms_norm_symint: upcast, pow, mean, rsqrt, mul, mul weight, cast back), "
     "apply_rotary_emb through fp32 complex views, repeat_kv's expand + reshape copy, F.silu(w1 x) * w3 x as two "
     "kernels; each op reads its inputs from and writes its output to HBM (:func:`unfused_elementwise_bytes`)"),
    ("checkpoint_early_stop", "as torchtitan (ptd_checkpoint_wrapper NO_REENTRANT does not depend on compile)"),
    ("zero0_autocast", "as torchtitan (maybe_enable_amp does not depend on compile)"),
)

_TORCHTITAN_SOURCES_EAGER_LOSS = _TORCHTITAN.sources + (
    ("loss", "torchtitan torchtitan/components/loss.py before commit bbb1b616e (2025-04-02): the cross-entropy "
     "ran eager (F.cross_entropy(pred.flatten(0, 1).float(), ...)) while the blocks were compiled"),)

#: The frameworks ``--framework`` accepts, by name.
#: MindFormers' training cross-entropy, op by op, per logit of the rank's vocabulary shard
#: (name, bytes read, bytes written), 16-bit logits. LlamaForCausalLM.construct casts the
#: lm_head's compute-dtype logits to fp32 and calls CrossEntropyLoss, which is _LogSoftmax then
#: _NLLLoss written as separate MindSpore primitives, each with a hand-written bprop
#: (mindspore-lab/mindformers mindformers/core/loss/loss.py and mindformers/models/llama/llama.py,
#: commit 9719c5cd2): forward Cast, ReduceMax, Sub, Exp, ReduceSum, Log (per row), Sub, OneHot
#: (fp32 on/off values), Mul, Neg, ReduceSum; backward _NLLLoss.bprop's Exp, Sub, Mul by the
#: expanded dout and Mul by ``repeat_loss`` (_LogSoftmax.bprop passes dout through), then the
#: forward Cast's bprop back to 16 bits. Each primitive reads its N x V inputs and writes its
#: N x V output once (per-row tensors are negligible); nothing in these files asks the graph
#: compiler to fuse them. (tests/test_cost_mindformers_loss.py replays the chain in torch and
#: counts each op's bytes.)
MINDFORMERS_CE_OPS: tuple[tuple[str, float, float], ...] = (
    ("Cast 16-bit -> fp32", 2, 4), ("ReduceMax", 4, 0), ("Sub max", 4, 4), ("Exp", 4, 4),
    ("ReduceSum", 4, 0), ("Sub log-sum", 4, 4), ("OneHot", 0, 4), ("Mul one-hot", 8, 4), ("Neg", 4, 4),
    ("ReduceSum", 4, 0),
    ("bprop Exp", 4, 4), ("bprop Sub one-hot", 8, 4), ("bprop Mul dout", 4, 4), ("bprop Mul repeat_loss", 4, 4),
    ("bprop Cast fp32 -> 16-bit", 4, 2),
)
MINDFORMERS_CE_BYTES = float(sum(r + w for _, r, w in MINDFORMERS_CE_OPS))  # 108 B per logit


FRAMEWORKS: dict[str, Framework] = {
    "megatron": Framework("megatron", fp8_cast_bytes=0.0, fp8_grouped_quantize_bytes=4.0, lora_fused_projections=True,
                          sources=_MEGATRON_SOURCES + (_LORA_FUSED_SOURCE,)),
    # MindSpeed patches Megatron-LM on Ascend (torch_npu fused kernels npu_rms_norm,
    # npu_swiglu, npu_fusion_attention with GQA; Megatron's reentrant checkpoint and
    # distributed optimizer; MC2 for tp overlap): every modelled term as Megatron's.
    "mindspeed": Framework("mindspeed", fp8_cast_bytes=0.0, lora_fused_projections=True, sources=(_LORA_FUSED_SOURCE,
        ("*", "Ascend/MindSpeed: a Megatron-LM patch set; fused kernels via --use-fused-rmsnorm, --use-fused-swiglu, "
         "--use-flash-attn (npu_fusion_attention, GQA native), MC2 for tp overlap (--use-ascend-mc2); Megatron's "
         "reentrant checkpoint and distributed optimizer"),)),
    "torchtitan": _TORCHTITAN,
    # torchtitan without --compile.enable (eager; the rows of torchao's float8nocompile
    # table): the torchtitan entry with the fields compile changes, and only those.
    "torchtitan-eager": replace(_TORCHTITAN, name="torchtitan-eager", eager_activations=True, tp_comm_overlap=False,
                                lora_fused_epilogue=False,
                                unfused_elementwise=True, sources=_TORCHTITAN_EAGER_SOURCES),
    # torchtitan with compiled blocks but an eager loss: every torchtitan run before its commit
    # bbb1b616e (2025-04-02), when the loss joined compile (torchtitan/components/loss.py had
    # `compiled_cross_entropy_loss = torch.compile(...)` commented out; today
    # `--compile.components model,loss`). Only the loss phase's bytes differ (cost/transient.py LOSS_MODE).
    "torchtitan-eager-loss": replace(_TORCHTITAN, name="torchtitan-eager-loss", sources=_TORCHTITAN_SOURCES_EAGER_LOSS),
    # DeepSpeed (Megatron-DeepSpeed model code: fused kernels, reentrant activation
    # checkpointing) with ZeRO stages 1/2: the updated fp16 partitions are all-gathered
    # after the optimizer step, before the next forward starts.
    "deepspeed": Framework("deepspeed", param_gather_overlap=False, tp_comm_overlap=False, fp8_cast_bytes=0.0,
                           sources=(
        ("checkpoint_early_stop", "deepspeed/runtime/activation_checkpointing/checkpointing.py CheckpointFunction: "
         "reentrant, reruns the whole forward"),
        ("param_gather_overlap", "deepspeed/runtime/zero/stage_1_and_2.py step(): all_gather_dp_groups of the "
         "updated partitions at the end of step, not overlapped with the next forward"),
        ("tp_comm_overlap", "DeepSpeed has no tensor-parallel communication overlap (Megatron-DeepSpeed TP "
         "all-reduces are synchronous)"),
    )),
    "partita": Framework("partita", eager_activations=True, checkpoint_early_stop=True, zero0_autocast=True,
                         tp_comm_overlap=False, fp8_cast_bytes=0.0, cp_kv_all_gather=True,
                         param_gather_overlap=False, zero1_grad_all_reduce=True, param_broadcast_per_tensor=True,
                         grad_overlap_needs_ddp=True, persistent_grad_buffer=False,
                         fsdp2_stream_copies=True, sources=(
        ("fsdp2_stream_copies", "partita.runtime.data_parallel: zero 3 is torch fully_shard; " + _FSDP2_COPIES),
        ("eager_activations", "partita.models: nn.RMSNorm, repeat_interleave before SDPA, F.silu(w1 x) * w3 x, "
         "eager MoE routing (tests/data/cost_oracles.json: saved-tensor hooks)"),
        ("checkpoint_early_stop", "partita.runtime.recompute: torch.utils.checkpoint(use_reentrant=False), early "
         "stop on (tests/data/cost_oracles.json: FlopCounterMode)"),
        ("zero0_autocast", "partita.runtime.parallelize: zero 0 trains fp32 parameters under torch.autocast "
         "(tests/data/cost_oracles.json: the tensors each rank holds)"),
        ("tp_comm_overlap", "partita.runtime.tensor_parallel: DTensor collectives, no async TP"),
        ("persistent_grad_buffer", "partita.runtime.parallelize._clip_and_step: optimizer.zero_grad(set_to_none="
         "True) after each step; zero 1's GradientSync flattens into a temporary, FSDP2 as torchtitan's; DDP "
         "(zero 0, dp > 1) keeps its buckets. Profile of tests/measure_lora_memory.py (full SFT, one micro-batch): "
         "the peak is in LogSoftmaxBackward0, before the first AccumulateGrad"),
        ("cp_kv_all_gather", "partita.runtime.context_parallel: K and V all-gathered over the cp group in an "
         "autograd function (reduce-scatter of dK, dV backward), the all-gather form of Llama 3's context "
         "parallelism (Llama 3 paper, sec. 3.3.2)"),
        ("param_gather_overlap", "partita.runtime.data_parallel.ShardedOptimizer.step: the owners' broadcasts "
         "run inside the optimizer step, before the next forward starts"),
        ("zero1_grad_all_reduce", "partita.runtime.data_parallel: zero 1 is zero 0's gradient all-reduce (DDP or "
         "one bucketed all-reduce) plus ShardedOptimizer (the ZeroRedundancyOptimizer algorithm)"),
        ("param_broadcast_per_tensor", "partita.runtime.data_parallel.ShardedOptimizer.step: dist.broadcast of "
         "every parameter from its owner, one call per tensor (profile: 39 broadcasts per step for small-llama)"),
        ("grad_overlap_needs_ddp", "partita.runtime.parallelize._apply_data_parallel: DistributedDataParallel "
         "wraps plain models at zero 0; zero 1 and DTensor (tp), pipeline stages and expert shards use "
         "GradientSync's one bucketed all-reduce per step after the last micro-batch"),
    )),
    # InternEvo (the InternLM trainer): Megatron-style fused kernels and reentrant checkpoint,
    # with its own hybrid ZeRO-1 optimizer.
    "internevo": Framework("internevo", param_gather_overlap=False, param_broadcast_per_owner=True,
                           fp8_cast_bytes=0.0, sources=_MEGATRON_SOURCES[:3] + (
        ("param_gather_overlap", "InternLM/InternEvo configs (configs/_base_/models/internlm2_7B.py, "
         "configs/7B_sft.py): hybrid_zero_optimizer overlap_sync_param=False - the updated parameters are "
         "synchronised after the optimizer step, before the next forward starts"),
        ("param_broadcast_per_owner", "InternEvo internlm/solver/optimizer/hybrid_zero_optim.py broadcast_params: "
         "every rank of the zero1 group broadcasts the parameter shard it owns (dist.broadcast src=owner), one "
         "call per member of the group; zero1=-1 makes the group the whole data-parallel group, zero1=8 one node"),
    )),
    # MindSpore/MindFormers (graph mode on Ascend): every time term as MindSpeed's (the fused
    # kernels and reentrant recompute the MindFormers rows were fitted with); its optimizer keeps
    # no fp32 master weight.
    "mindformers": Framework("mindformers", fp8_cast_bytes=0.0, master_in_params=True,
                             ce_bytes_per_logit=MINDFORMERS_CE_BYTES, sources=(
        ("*", "as mindspeed: MindSpore graph mode fuses the element-wise ops and its recompute reruns the forward"),
        ("ce_bytes_per_logit", "mindspore-lab/mindformers mindformers/core/loss/loss.py CrossEntropyLoss = "
         "_LogSoftmax + _NLLLoss, primitives with hand-written bprops, on the fp32 cast of the logits "
         "(mindformers/models/llama/llama.py LlamaForCausalLM.construct): MINDFORMERS_CE_OPS"),
        ("master_in_params", "mindspore-lab/mindformers mindformers/core/optim/adamw.py AdamW: clone_state makes "
         "exp_avg / exp_avg_sq with dtype=mstype.float32; _update_run_op casts the parameter to fp32, updates it "
         "and assigns it back with F.assign(parameters, op_cast(return_param, F.dtype(parameters))) - the "
         "param_init_type (bfloat16 / float16) parameter is the only weight copy"),
    )),
}


assert tuple(FRAMEWORKS) == FRAMEWORK_NAMES, "partita.plan.FRAMEWORKS names the frameworks of this table"

#: The frameworks whose ``--recompute-granularity selective`` is Megatron-Core's module-level
#: selective recompute (MindSpeed-LLM runs Megatron-Core core_v0.12.1's TransformerConfig).
MODULE_SELECTIVE_FRAMEWORKS = frozenset({"megatron", "mindspeed"})
#: Megatron-Core's default ``recompute_modules``.
DEFAULT_RECOMPUTE_MODULES = frozenset({"core_attn"})


def selective_modules(framework: str, recompute: str, recompute_modules: str) -> frozenset[str]:
    """The Megatron modules a plan's selective recompute reruns; empty: none, or op-level SAC.

    The one rule for what ``recompute=selective`` means (memory: cost/activations.py; time:
    cost/compute.py :func:`~.compute.module_recompute_forward`; the Megatron export writes it):

    * ``recompute_modules`` named: those modules, whatever the framework (the user said so);
    * framework in :data:`MODULE_SELECTIVE_FRAMEWORKS`, no modules: Megatron-Core's default,
      ``["core_attn"]`` - NVIDIA/Megatron-LM d98e8a64dd megatron/core/transformer/
      transformer_config.py l.560-575 (``recompute_modules`` "default: ["core_attn"]") and
      l.1940-1941 (``__post_init__``: ``if self.recompute_modules is None:
      self.recompute_modules = ["core_attn"]``); core_v0.12.1 (MindSpeed-LLM's) l.723-724. With
      selective granularity attention.py (d98e8a64dd l.392-395, core_v0.12.1 l.137-140) sets
      ``checkpoint_core_attention`` and wraps only the core attention in
      ``_checkpointed_attention_forward`` (l.446-497: ``tensor_parallel.checkpoint`` of
      ``_run_core_attention``), the Korthikanti et al. 2022 (arXiv:2205.05198) sec. 4.2 scheme;
    * any other framework (partita, torchtitan, deepspeed, internevo, mindformers): op-level
      selective activation checkpointing (torchtitan's "op" SAC, partita's runtime), empty.
    """
    if recompute != "selective":
        return frozenset()
    if recompute_modules:
        return frozenset(recompute_modules.split(","))
    return DEFAULT_RECOMPUTE_MODULES if framework in MODULE_SELECTIVE_FRAMEWORKS else frozenset()


def unfused_elementwise_bytes(model: ModelSpec, shape: Any, moe: bool, e: int) -> float:
    """HBM bytes one layer's forward moves per micro-batch on one rank beyond the fused
    element-wise count of :func:`.compute.layer_forward` when its element-wise ops run as
    separate eager kernels (:attr:`Framework.unfused_elementwise`); the step model doubles
    element-wise work for the backward, as for the fused count.

    ``shape`` is a :class:`.shape.LayerShape` (not imported: shape imports this module).
    Per element, ``e`` the activation dtype's bytes (passed by :mod:`.compute`, which owns them) (PyTorch's eager kernels, each reading its
    inputs and writing its output; Korthikanti et al. 2022 Sec. 4.1 list the same ops as
    separate memory-bound steps):

    * RMSNorm (``torch.rms_norm`` composite): upcast (read e, write 4), square (4 + 4), mean
      (read 4), ``x * rstd`` (4 + 4), ``* weight`` (4 + 4), cast back (4 + e): ``32 + 2e``
      against the fused kernel's ``2e`` - 32 B more per element, two norms per layer, on
      ``h`` elements per token (divided by tp only with SP);
    * RoPE (torchtitan ``apply_rotary_emb``): ``float()`` (e + 4), complex multiply (4 + 4),
      ``type_as`` (4 + e): ``16 + 2e`` against ``2e`` - 16 B more on ``(q + kv) / tp``;
    * ``repeat_kv`` (GQA): expand + reshape copies K and V to the query width: read
      ``2 kv e``, write ``2 q e`` per token (/ tp); absent without GQA (q = kv: a view);
    * SwiGLU: ``silu(w1 x)`` (read f, write f) then ``* w3 x`` (read 2f, write f): ``5 f e``
      against the fused ``3 f e`` - ``2 f e`` more per token (/ tp; MoE: on the routed
      and shared experts' widths).

    Known gaps: the residual adds are unfused in both counts; fp32 autocast copies and the
    backward's own unfused passes are taken as twice the forward like the fused count."""
    fw = FRAMEWORKS[shape.framework]
    if not fw.unfused_elementwise:
        return 0.0
    tp, h = shape.tp, model.hidden
    out_div = tp if shape.sp else 1
    per_token = 2 * 32 * h / out_div
    if model.position == "rope":
        per_token += 16 * (model.q_dim + model.kv_dim) / tp
    if model.kv_dim < model.q_dim:
        per_token += 2 * e * (model.kv_dim + model.q_dim) / tp
    if model.gated:
        if moe and model.moe:
            mo = model.moe
            width = mo.top_k * mo.expert_ffn_hidden + mo.shared_experts * mo.shared_ffn_hidden
        else:
            width = model.ffn_hidden
        per_token += 2 * e * width / tp
    return shape.tokens * per_token


def get_framework(name: str) -> Framework:
    """The :class:`Framework` called ``name``; a one-line error listing the valid names otherwise."""
    fw = FRAMEWORKS.get(str(name).strip().lower())
    if fw is None:
        raise PartitaError(f"unknown framework {str(name)[:40]!r}: use one of {', '.join(FRAMEWORKS)}")
    return fw
