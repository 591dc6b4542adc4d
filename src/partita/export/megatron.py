"""Megatron-LM (and MindSpeed-LLM) command-line arguments for a plan.

Flag names are the current ones of Megatron-LM core_v0.16 (verified against its real
``arguments.py`` parser, docs/reference/ecosystem.md sec. 5): no deprecated spellings
(``--checkpoint-activations``, ``--recompute-activations``, ``--moe-extended-tp``,
``--use-mcore-models``, ``--virtual-pipeline-model-parallel-size`` are not emitted).
Tests parse every export with Megatron's own option table (tests/export_oracles/megatron_flags.json,
dumped from core_v0.16.1's parser) and tests/export_oracles/megatron_real_check.py runs the real
``parse_args`` + ``validate_args`` where a Megatron-LM checkout is at hand.

The arguments are built as a mapping, flag -> values (:class:`MegatronArgs`), and MindSpeed-LLM's
are Megatron's with an :class:`Overlay` applied by flag name (flags added, replaced, removed),
so a variant never edits another target's argument list by position.
"""
from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import PartitaError
from ..plan import Plan
from .context import ExportContext
from .result import Export

if TYPE_CHECKING:
    from ..spec.model import MLASpec, ModelSpec


FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}


class MegatronArgs(dict[str, tuple[str, ...]]):
    """Megatron-LM arguments: flag -> its values (an empty tuple for a switch), in the order
    they are written. A mapping rather than an argv list so that a variant changes a flag by
    its name (:class:`Overlay`), and so that writing one flag twice is caught here instead of
    being left to whichever value Megatron's argparse happens to keep (the last)."""

    def set(self, flag: str, *values: object) -> None:
        """Add ``flag`` with ``values``; a flag already present is an exporter bug."""
        if flag in self:
            raise ValueError(f"{flag} is written twice")
        self[flag] = tuple(str(v) for v in values)

    def merge(self, other: Mapping[str, tuple[str, ...]]) -> None:
        """Add every flag of ``other`` (none of which may be present yet), in its order."""
        for flag, values in other.items():
            self.set(flag, *values)

    def argv(self) -> list[str]:
        """The arguments as ``pretrain_gpt.py`` receives them."""
        return [token for flag, values in self.items() for token in (flag, *values)]


@dataclass(frozen=True)
class Overlay:
    """A variant of Megatron-LM's arguments, by flag name: ``remove`` drops flags, ``add`` sets
    flags (replacing Megatron's value where the flag is already there). The added flags are
    written after Megatron's own, in ``add``'s order, so the variant's flags read as one block
    at the end of the command (and a replaced flag sits with the flags it goes with)."""

    add: MegatronArgs = field(default_factory=MegatronArgs)
    remove: frozenset[str] = frozenset()

    def apply(self, base: Mapping[str, tuple[str, ...]]) -> MegatronArgs:
        """``base`` with this overlay applied (``base`` itself is left as it was)."""
        out = MegatronArgs((k, v) for k, v in base.items() if k not in self.remove and k not in self.add)
        out.update(self.add)
        return out


def env_vars(plan: Plan) -> dict[str, str]:
    """Environment Megatron-LM's validate_args requires (arguments.py core_v0.16.1 l.928-952):
    CUDA_DEVICE_MAX_CONNECTIONS=1 with tp or cp > 1 on pre-Blackwell GPUs, unless FSDP (which
    asserts it is not 1)."""
    if (plan.tp > 1 or plan.cp > 1) and plan.zero < 2:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    return {}


def _layout(plan: Plan, layers: int) -> str:
    """``--pipeline-model-parallel-layout``: E = embedding, t = decoder layer, L = loss, one
    ``|``-separated entry per virtual stage in pipeline order."""
    stages = []
    split = plan.stage_layers(layers)
    for j, n in enumerate(split):
        s = ("E" if j == 0 else "") + (f"t*{n}" if n else "") + ("L" if j == len(split) - 1 else "")
        stages.append(s)
    return "|".join(stages)


def _recompute_args(plan: Plan, model: ModelSpec | None, warn: list[str]) -> MegatronArgs:
    """Megatron's recompute flags for the plan: full (every layer: uniform with 1 layer per
    group; the first N of each stage/chunk: the block method, transformer_block.py
    ``_checkpointed_forward``: ``layer_idx < recompute_num_layers``) or selective modules."""
    a = MegatronArgs()
    if plan.recompute == "full":
        a.set("--recompute-granularity", "full")
        a.set("--recompute-method", "block" if plan.recompute_layers else "uniform")
        a.set("--recompute-num-layers", plan.recompute_layers or 1)
    elif plan.recompute == "selective":
        modules = written_recompute_modules(plan, model)
        _check_modules(plan, modules, model)
        from ..cost.frameworks import selective_modules
        if not selective_modules(plan.framework, plan.recompute, plan.recompute_modules):
            warn.append(_op_level_selective_warning(plan, model, modules))
        a.set("--recompute-granularity", "selective")
        a.set("--recompute-modules", *modules)
    return a


def written_recompute_modules(plan: Plan, model: ModelSpec | None) -> list[str]:
    """The ``--recompute-modules`` the export writes for a selective plan: the modules the
    estimate priced (:func:`partita.cost.frameworks.selective_modules`: the plan's own, or under
    framework megatron / mindspeed Megatron-Core's default core_attn), else - a plan estimated
    with op-level selective (torchtitan, partita, ...) - the modules nearest to it that
    Megatron accepts with the plan: core_attn and layernorm (+ moe_act on a MoE model), but
    core_attn alone with an fp8 recipe ``--fp8-recipe`` cannot name (its default, delayed,
    refuses moe_act / layernorm recompute: transformer_config.py)."""
    from ..cost.frameworks import selective_modules
    priced = selective_modules(plan.framework, plan.recompute, plan.recompute_modules)
    if plan.recompute_modules:
        return plan.recompute_modules.split(",")
    if priced:
        return sorted(priced)
    if plan.dtype == "fp8" and plan.fp8_recipe not in FP8_RECIPES:
        return ["core_attn"]
    return ["core_attn", "layernorm"] + (["moe_act"] if model is not None and model.moe else [])


def _op_level_selective_warning(plan: Plan, model: ModelSpec | None, modules: list[str]) -> str:
    """The warning for an op-level selective plan written as Megatron's modules, with the
    activation bytes a layer keeps per micro-batch under each (cost/activations.py prices both),
    so that the difference is stated rather than guessed."""
    head = (f"recompute=selective: Megatron recomputes whole modules (--recompute-modules {' '.join(modules)}); "
            "the estimate priced Partita's op-level selective checkpointing")
    if model is None:
        return head + ": the activation memory differs; re-estimate with --recompute-modules " + ",".join(modules)
    from ..cost.activations import activation_bytes_per_layer
    moe = bool(model.moe)
    priced = activation_bytes_per_layer(model, plan, moe)
    megatron = activation_bytes_per_layer(model, plan.with_(recompute_modules=",".join(modules)), moe)
    return (head + f": Megatron keeps {megatron / 2**20:,.1f} MiB of activations a layer per micro-batch where the "
            f"estimate priced {priced / 2**20:,.1f} MiB ({(megatron - priced) / 2**20:+,.1f} MiB); re-estimate with "
            f"--recompute-modules {','.join(modules)} for the memory of this script")


def _check_modules(plan: Plan, modules: list[str], model: ModelSpec | None) -> None:
    """Megatron-Core's TransformerConfig.__post_init__ rules on ``--recompute-modules``
    (transformer_config.py core_v0.16.1): moe_act needs grouped GEMM (which this export writes
    for a MoE model only), mla_up_proj needs multi-latent attention, and with fp8 moe_act /
    layernorm refuse the delayed recipe (``--fp8-recipe`` defaults to delayed: the export
    writes the plan's recipe then, :func:`_overlap_and_precision_args`)."""
    if model is not None and "moe_act" in modules and not model.moe:
        raise PartitaError("recompute_modules moe_act: Megatron-Core accepts moe_act only with --moe-grouped-gemm, a "
                           "MoE model's (transformer_config.py); the model is dense: re-plan without moe_act")
    if model is not None and "mla_up_proj" in modules and not model.mla:
        raise PartitaError("recompute_modules mla_up_proj: Megatron-Core accepts it only with "
                           "--multi-latent-attention (transformer_config.py); re-plan without mla_up_proj")
    if plan.dtype == "fp8" and {"moe_act", "layernorm"} & set(modules) and plan.fp8_recipe not in FP8_RECIPES:
        raise PartitaError(f"recompute_modules {','.join(modules)} with fp8_recipe {plan.fp8_recipe}: Megatron's "
                           "--fp8-recipe has no such recipe and its default (delayed) refuses moe_act and layernorm "
                           "recompute (transformer_config.py); re-plan with --fp8-recipe tensorwise or mxfp8")


#: the plan's fp8 recipes that Megatron's ``--fp8-recipe`` names alike (arguments.py core_v0.16.1 choices)
FP8_RECIPES = ("tensorwise", "mxfp8")


def _optimizer_state_args(plan: Plan, args: MegatronArgs, fsdp: str, warn: list[str]) -> MegatronArgs:
    """Where the optimizer states live and in what dtype: ``plan.optimizer_offload`` as
    ``--optimizer-cpu-offload --optimizer-offload-fraction f`` and ``plan.moment_dtype`` as
    ``--exp-avg-dtype / --exp-avg-sq-dtype``, both with ``--use-precision-aware-optimizer``:
    validate_args asserts it beside the offload ("the hybrid device optimizer reuses the code path
    of this flag", arguments.py core_v0.16.1 l.1190) and OptimizerConfig.__post_init__ asserts the
    distributed optimizer under it (megatron/core/optimizer/optimizer_config.py). Without the
    distributed optimizer (zero 0, torch FSDP2) an offload is refused (its launch would hold every
    state on the device); narrower moments are dropped with a warning there, where the estimate
    priced fp32 moments too (cost/states.moment_saving: zero 1-2 only)."""
    a = MegatronArgs()
    if not plan.optimizer_offload and plan.moment_dtype == "fp32":
        return a
    if "--use-distributed-optimizer" not in args:
        how = "no distributed optimizer" if plan.zero == 0 else target_fsdp(fsdp)
        if plan.optimizer_offload:
            raise PartitaError(f"optimizer_offload={plan.optimizer_offload:g}: --optimizer-cpu-offload needs "
                               "--use-precision-aware-optimizer, which needs the distributed optimizer "
                               f"(optimizer_config.py), and zero={plan.zero} exports {how}; re-plan with --zero 1")
        warn.append(f"moment_dtype={plan.moment_dtype}: --exp-avg-dtype needs the distributed optimizer and "
                    f"zero={plan.zero} exports {how}: emitted fp32 moments, as the estimate priced them")
        return a
    a.set("--use-precision-aware-optimizer")
    if plan.optimizer_offload:
        a.set("--optimizer-cpu-offload")
        a.set("--optimizer-offload-fraction", f"{plan.optimizer_offload:g}")
        if plan.fp8_param_gather and args.get("--fp8-recipe", ("delayed",)) != ("delayed",):
            raise PartitaError(f"optimizer_offload with fp8_param_gather and fp8_recipe {plan.fp8_recipe}: Megatron "
                               "asserts --fp8-recipe delayed beside --fp8-param-gather under --optimizer-cpu-offload "
                               "(arguments.py validate_args); re-plan without fp8_param_gather or the offload")
    if plan.moment_dtype != "fp32":
        a.set("--exp-avg-dtype", plan.moment_dtype)
        a.set("--exp-avg-sq-dtype", plan.moment_dtype)
        if 0 < plan.optimizer_offload < 1:
            warn.append(f"moment_dtype={plan.moment_dtype} with optimizer_offload={plan.optimizer_offload:g}: "
                        "Megatron's HybridDeviceOptimizer builds its device Adam without --exp-avg-dtype "
                        "(megatron/core/optimizer/__init__.py), so the device share keeps fp32 moments "
                        "(the estimate prices them so: cost/states.stored_moment_dtype)")
    return a


def _layout_args(plan: Plan, model: ModelSpec | None) -> MegatronArgs:
    """The parallel degrees and the pipeline's layer layout."""
    a = MegatronArgs()
    a.set("--tensor-model-parallel-size", plan.tp)
    a.set("--pipeline-model-parallel-size", plan.pp)
    if plan.pp > 1:
        layers = model.layers if model else None
        if plan.layer_split:
            a.set("--pipeline-model-parallel-layout", _layout(plan, sum(plan.layer_split) if layers is None else layers))
        elif plan.vpp > 1 and plan.schedule != "dualpipev":  # DualPipeV's two chunks come with its schedule
            if layers is None:
                raise PartitaError("exporting vpp > 1 to Megatron needs --model (layers per virtual stage)")
            a.set("--num-layers-per-virtual-pipeline-stage", layers // (plan.pp * plan.vpp))
    if plan.cp > 1:
        a.set("--context-parallel-size", plan.cp)
        a.set("--cp-comm-type", "p2p")
    if plan.ep > 1 or plan.etp > 1:
        # always written: Megatron's default (None) means etp = tp, not the plan's etp
        # (arguments.py core_v0.16.1, --expert-tensor-parallel-size; parallel_state.py folds
        # the expert grid etp x ep x edp out of tp x cp x dp)
        a.set("--expert-model-parallel-size", plan.ep)
        a.set("--expert-tensor-parallel-size", plan.etp)
    if plan.sp and plan.tp > 1:
        a.set("--sequence-parallel")
    return a


def _sharding_args(plan: Plan, model: ModelSpec | None, fsdp: str, warn: list[str]) -> MegatronArgs:
    """ZeRO as Megatron runs it: the distributed optimizer (zero 1, HSDP of it with dp_shard),
    Megatron-FSDP or torch FSDP2 (zero 2/3, ``fsdp`` picks)."""
    a = MegatronArgs()
    if plan.zero == 1:
        a.set("--use-distributed-optimizer")
        if 0 < plan.dp_shard < plan.dp:
            # HSDP of the optimizer (ZeRO-1 within groups of dp_shard, replicated across): Megatron-Core's
            # DDP shards within each of num_distributed_optimizer_instances groups and all-reduces
            # across them (distributed/param_and_grad_buffer.py; it needs the distributed optimizer)
            a.set("--num-distributed-optimizer-instances", plan.dp // plan.dp_shard)
    elif plan.zero >= 2 and 0 < plan.dp_shard < plan.dp:
        warn.append(f"dp_shard={plan.dp_shard}: HSDP under FSDP is not emitted; {target_fsdp(fsdp)} shards over all "
                    f"dp={plan.dp} ranks (less memory, more all-gather traffic than planned)")
    if plan.zero >= 2 and fsdp == "torch":
        a.merge(_torch_fsdp2_args(plan, model, warn))
    elif plan.zero >= 2:
        if plan.pp > 1:
            raise PartitaError(f"zero={plan.zero} with pp={plan.pp}: Megatron-FSDP with pipeline parallelism is not a "
                               "standard Megatron-LM path; re-plan with --zero 1 (distributed optimizer) or --pp 1")
        # Megatron-FSDP (docs/user-guide/features/megatron_fsdp.md): validate_args asserts
        # ckpt_format == "fsdp_dtensor" (arguments.py core_v0.16.1 l.690)
        a.set("--use-megatron-fsdp")
        a.set("--data-parallel-sharding-strategy", FSDP_STRATEGY[plan.zero])
        a.set("--ckpt-format", "fsdp_dtensor")
        a.set("--use-distributed-optimizer")
    return a


def _overlap_and_precision_args(plan: Plan, sharded_optimizer: bool) -> MegatronArgs:
    """Communication overlap, attention backend and precision flags."""
    a = MegatronArgs()
    if plan.overlap_grad_reduce and plan.dp * plan.cp > 1:
        a.set("--overlap-grad-reduce")
    if plan.overlap_param_gather and sharded_optimizer and plan.dp * plan.cp > 1:
        a.set("--overlap-param-gather")
    if plan.tp_comm_overlap and plan.tp > 1:
        a.set("--tp-comm-overlap")
    if plan.attention == "unfused":  # Megatron-Core AttnBackend.unfused: softmax probabilities kept for backward
        a.set("--attention-backend", "unfused")
    if plan.dtype in ("bf16", "fp8"):
        a.set("--bf16")
    elif plan.dtype == "fp16":
        a.set("--fp16")
    if plan.dtype == "fp8":
        a.set("--fp8-format", "hybrid")
        if plan.fp8_recipe in FP8_RECIPES:  # the recipe the plan priced (default delayed would refuse
            a.set("--fp8-recipe", plan.fp8_recipe)  # moe_act / layernorm recompute: transformer_config.py)
    if plan.fp8_param_gather:  # fp8 weights only, gathered in fp8 (megatron/training/arguments.py)
        a.set("--fp8-param-gather")
    if plan.grad_dtype == "bf16" and plan.dtype != "fp32":
        a.set("--grad-reduce-in-bf16")  # Megatron-Core DDP: gradient buffers and reduction in bf16
    return a


def megatron_args(plan: Plan, model: ModelSpec | None = None, fsdp: str = "megatron") -> tuple[MegatronArgs, list[str]]:
    """(arguments, warnings) for ``pretrain_gpt.py``; ``fsdp`` picks Megatron-FSDP or torch FSDP2
    for zero 2/3 (MindSpeed-LLM runs the latter)."""
    warn: list[str] = []
    args = _layout_args(plan, model)
    args.set("--micro-batch-size", plan.mbs)
    args.set("--global-batch-size", plan.gbs)
    args.set("--seq-length", plan.seq_len)
    args.merge(_recompute_args(plan, model, warn))
    args.merge(_sharding_args(plan, model, fsdp, warn))
    args.merge(_overlap_and_precision_args(plan, "--use-distributed-optimizer" in args))
    args.merge(_optimizer_state_args(plan, args, fsdp, warn))
    warn += comm_knob_warnings(plan)
    if plan.dtype == "fp8" and plan.fp8_recipe not in FP8_RECIPES:
        warn.append(f"fp8_recipe={plan.fp8_recipe}: Megatron's --fp8-recipe has no such recipe (arguments.py choices "
                    "tensorwise, delayed, mxfp8, blockwise, custom); emitted its default, delayed scaling")
    if plan.reuse_fp32_param:
        warn.append("reuse_fp32_param is MindSpeed's --reuse-fp32-param (fp32 master = bf16 weight + 16-bit "
                    "residual); Megatron-LM has no such flag, so its optimizer holds 2 bytes per parameter more "
                    "than planned: export --to mindspeed, or re-plan without it")
    if plan.ddp_bucket_mb and plan.dp * plan.cp > 1:  # --ddp-bucket-size counts elements, not bytes
        args.set("--ddp-bucket-size", plan.ddp_bucket_mb * 2**20 // (2 if plan.grad_dtype == "bf16" else 4))
    if plan.schedule == "gpipe":
        warn.append("schedule=gpipe: Megatron-LM always runs 1F1B (interleaved with vpp); emitted 1F1B, "
                    "which holds fewer micro-batches in flight")
    elif plan.schedule == "zero-bubble":
        warn.append("schedule=zero-bubble: not a Megatron-LM option; emitted interleaved 1F1B (the closest)")
    if model is not None:
        args.merge(model_args(model, plan.seq_len))
    return args, warn


def target_fsdp(fsdp: str) -> str:
    """The FSDP a zero 2/3 export runs, by name (for warnings)."""
    return "torch FSDP2" if fsdp == "torch" else "Megatron-FSDP"


def _torch_fsdp2_args(plan: Plan, model: ModelSpec | None, warn: list[str]) -> MegatronArgs:
    """``--use-torch-fsdp2`` and the rules Megatron's validate_args asserts for it (arguments.py
    core_v0.16.1 l.605-621: pp 1, ep 1, no distributed optimizer, ckpt torch_dist/torch_dcp,
    untied embeddings, no fp16)."""
    for bad, why in ((plan.pp > 1, f"pp={plan.pp}"), (plan.ep > 1, f"ep={plan.ep}"), (plan.dtype == "fp16", "fp16"),
                     (model is not None and model.tied_embeddings, "tied embeddings")):
        if bad:
            raise PartitaError(f"zero={plan.zero} with {why}: --use-torch-fsdp2 is not supported with {why} "
                               "(Megatron validate_args); re-plan with --zero 1")
    if plan.zero == 2:  # FSDP2 shards parameters too: ZeRO-3, never a ZeRO-2 plan's export
        raise PartitaError("zero=2: torch FSDP2 (--use-torch-fsdp2) is ZeRO-3 (it shards parameters too); "
                           "re-plan with --zero 1 or --zero 3")
    a = MegatronArgs()
    a.set("--use-torch-fsdp2")
    a.set("--ckpt-format", "torch_dist")
    a.set("--no-gradient-accumulation-fusion")
    return a


def has_moe_layer_pattern(model: ModelSpec) -> bool:
    """Whether the MoE layers are not every layer (dense first layers or a frequency above 1),
    which Megatron writes as a ``--moe-layer-freq`` pattern and MindSpeed-LLM as its own pair."""
    m = model.moe
    return bool(m and (m.first_dense_layers or m.layer_freq > 1))


def _moe_args(model: ModelSpec) -> MegatronArgs:
    """The mixture-of-experts shape (router, expert widths, which layers are MoE)."""
    m, a = model.moe, MegatronArgs()
    a.set("--num-experts", m.num_experts)
    a.set("--moe-router-topk", m.top_k)
    a.set("--moe-ffn-hidden-size", m.expert_ffn_hidden)
    a.set("--moe-token-dispatcher-type", "alltoall")
    a.set("--moe-grouped-gemm")
    if m.shared_experts:
        a.set("--moe-shared-expert-intermediate-size", m.shared_experts * m.shared_ffn_hidden)
    if has_moe_layer_pattern(model):
        pattern = [0] * m.first_dense_layers + [1 if (i % m.layer_freq == 0) else 0
                                                for i in range(model.layers - m.first_dense_layers)]
        a.set("--moe-layer-freq", "[" + ",".join(map(str, pattern)) + "]")
    return a


def _mla_args(mla: MLASpec) -> MegatronArgs:
    """Multi-latent attention's low-rank widths (DeepSeek-V2/V3)."""
    a = MegatronArgs()
    a.set("--multi-latent-attention")
    a.set("--kv-lora-rank", mla.kv_lora_rank)
    a.set("--qk-head-dim", mla.qk_nope_head_dim)
    a.set("--qk-pos-emb-head-dim", mla.qk_rope_head_dim)
    a.set("--v-head-dim", mla.v_head_dim)
    if mla.q_lora_rank:
        a.set("--q-lora-rank", mla.q_lora_rank)
    return a


def model_args(model: ModelSpec, seq_len: int) -> MegatronArgs:
    """The model shape as Megatron arguments (GPT / LLaMA / MoE / MLA)."""
    a = MegatronArgs()
    a.set("--num-layers", model.layers)
    a.set("--hidden-size", model.hidden)
    a.set("--ffn-hidden-size", model.ffn_hidden)
    a.set("--num-attention-heads", model.heads)
    if model.kv_heads != model.heads and not model.mla:
        a.set("--group-query-attention")
        a.set("--num-query-groups", model.kv_heads)
    if model.head_dim and model.head_dim * model.heads != model.hidden:
        a.set("--kv-channels", model.head_dim)
    a.set("--max-position-embeddings", max(model.max_positions or 0, seq_len))
    a.set("--vocab-size", model.vocab)
    if model.gated:
        a.set("--swiglu")
    if model.norm == "rmsnorm":
        a.set("--normalization", "RMSNorm")
    a.set("--position-embedding-type", "rope" if model.position == "rope" else "learned_absolute")
    if not model.tied_embeddings:
        a.set("--untie-embeddings-and-output-weights")
    if not (model.qkv_bias or model.mlp_bias or model.out_bias):
        a.set("--disable-bias-linear")
    elif model.qkv_bias and not model.mlp_bias:
        a.set("--disable-bias-linear")
        a.set("--add-qkv-bias")
    if model.qk_norm:
        a.set("--qk-layernorm")
    if model.moe:
        a.merge(_moe_args(model))
    if model.mla:
        a.merge(_mla_args(model.mla))
    return a


def _render(args: MegatronArgs, warnings: list[str], target: str, env: dict[str, str] | None = None,
            script: str = "pretrain_gpt.py") -> str:
    """The export's text: a comment header (environment, warnings), then one flag per line."""
    lines = [f"# partita export --to {target}: arguments for {script}"]
    lines += [f"# export {k}={v}" for k, v in (env or {}).items()]
    lines += [f"# WARNING: {w}" for w in warnings]
    lines.append(" \\\n".join(" ".join(shlex.quote(t) for t in (flag, *values)) for flag, values in args.items()))
    return "\n".join(lines) + "\n"


def comm_knob_warnings(plan: Plan) -> list[str]:
    """Issue 17's knobs that Megatron-LM / MindSpeed-LLM have no option for."""
    warn = []
    if plan.grad_compression == "powersgd":
        warn.append(f"grad_compression=powersgd (rank {plan.powersgd_rank}): Megatron-LM and MindSpeed have no "
                    "gradient compression option; emitted an uncompressed all-reduce (the plan's dp sync estimate "
                    "assumes PowerSGD: re-estimate without it, or run Partita's runtime, which applies torch's "
                    "powerSGD_hook)")
    if plan.fsdp_prefetch != 1 and plan.zero >= 2:
        warn.append(f"fsdp_prefetch={plan.fsdp_prefetch}: Megatron-FSDP sets no prefetch depth from the command "
                    "line; emitted its default")
    return warn


def export_megatron(ctx: ExportContext) -> Export:
    """Megatron-LM ``pretrain_gpt.py`` arguments (the model shape too when a model is given)."""
    if ctx.plan.schedule == "dualpipev":
        raise PartitaError("schedule=dualpipev: Megatron-LM (core_v0.16.1) has no DualPipeV schedule (1F1B and "
                           "interleaved 1F1B; its MoE all-to-all overlap is --overlap-moe-expert-parallel-comm with "
                           "interleaving); re-plan with --schedule interleaved-1f1b, or export --to mindspeed or "
                           "torchtitan")
    args, warn = megatron_args(ctx.plan, ctx.model)
    return Export("megatron", _render(args, warn, "megatron", env_vars(ctx.plan)), warn, args.argv())


def mindspeed_overlay(plan: Plan, model: ModelSpec | None = None) -> Overlay:
    """What MindSpeed-LLM changes in Megatron's arguments: Ascend fused kernels and algorithms
    (MindSpeed / MindSpeed-LLM docs: flash attention, fused RMSNorm/SwiGLU/RoPE, MC2 for TP+SP,
    ring-attention CP "megatron_cp_algo", MoE all-to-all overlap) and its own MoE layer pattern."""
    add, remove = MegatronArgs(), set()
    if plan.attention != "unfused":  # else the core attention Megatron's --attention-backend selects
        add.set("--use-flash-attn")  # npu_fusion_attention
    if model is None or model.position == "rope":
        add.set("--use-fused-rotary-pos-emb")
        add.set("--use-rotary-position-embeddings")
    if model is None or model.norm == "rmsnorm":
        add.set("--use-fused-rmsnorm")
    if model is None or model.gated:
        add.set("--use-fused-swiglu")
    if plan.tp > 1 and plan.sp:
        add.set("--use-ascend-mc2")
        remove.add("--tp-comm-overlap")  # MC2 is Ascend's TP compute/communication fusion
        if model is not None and model.moe:
            # mindspeed_llm/features_manager/transformer/transformer_block.py validate_args: "Moe Grouped
            # Gemm is not supported with mc2 in MOE model" - MC2 is the plan's tp overlap, grouped GEMM a kernel
            remove.add("--moe-grouped-gemm")
    if plan.cp > 1:
        remove.add("--cp-comm-type")
        add.set("--context-parallel-algo", "megatron_cp_algo")
        add.set("--use-cp-send-recv-overlap")
    if plan.ep > 1:
        add.set("--moe-alltoall-overlap-comm")
    if model is not None and has_moe_layer_pattern(model):
        # MindSpeed-LLM declares --moe-layer-freq as an int, plus --first-k-dense-replace
        add.set("--first-k-dense-replace", model.moe.first_dense_layers)
        add.set("--moe-layer-freq", model.moe.layer_freq)
    return Overlay(add, frozenset(remove))


def _mindspeed_checks(plan: Plan, model: ModelSpec | None, num_layers: int | None) -> None:
    """What MindSpeed-LLM refuses that Megatron's arguments do not say (one line each): fp8, ZeRO-2
    (its distributed optimizer is ZeRO-1, torch FSDP2 is ZeRO-3), and first-k-dense-replace with a
    pipeline stage of dense layers only (mindspeed_llm/features_manager/transformer/transformer_block.py
    validate_args refuses ``first_k_dense_replace >= num_layers // pp``, ``num_layers`` counting the
    noop layers of :func:`_mindspeed_split`)."""
    if plan.dtype == "fp8":
        raise PartitaError("dtype=fp8: Ascend 910B/910C have no fp8 matrix units (fp8 arrives with Ascend 950); "
                           "re-plan with --dtype bf16")
    if plan.zero == 2:
        raise PartitaError("zero=2: MindSpeed-LLM has no ZeRO-2 (its distributed optimizer is ZeRO-1, torch FSDP2 "
                           "is ZeRO-3); re-plan with --zero 1 or --zero 3, or plan with --framework mindspeed")
    first = model.moe.first_dense_layers if model is not None and model.moe else 0
    if first and plan.pp > 1 and num_layers and first >= num_layers // plan.pp:
        raise PartitaError(f"pp={plan.pp} with {first} first dense layers: MindSpeed-LLM refuses "
                           f"first-k-dense-replace {first} >= num-layers {num_layers} // pp {plan.pp} (a pipeline "
                           "stage of dense layers only); re-plan with a smaller --pp, or plan with --framework mindspeed")


def noop_padding(split: tuple[int, ...]) -> tuple[int, list[int]]:
    """(padded layer count, noop layer indices) that give every virtual stage ``max(split)``
    layers: each stage's missing layers as noop layers at its end (MindSpeed-LLM's
    ``--noop-layers``: identity layers with no parameters, how its DeepSeek-V3 scripts put 61
    layers on pp 8 - examples/mcore/deepseek3, ``--num-layers 64 --noop-layers 61,62,63``)."""
    per = max(split)
    return per * len(split), [c * per + n + j for c, n in enumerate(split) for j in range(per - n)]


def _mindspeed_split(plan: Plan, args: MegatronArgs) -> Overlay:
    """The layer split as MindSpeed-LLM runs it. Its Megatron (core_v0.12.1) has no
    ``--pipeline-model-parallel-layout``, and ``--num-layer-list`` excludes virtual stages
    (num_layer_list.py validate_args), so an uneven split pads every virtual stage to the
    largest with noop layers (:func:`noop_padding`): the stages then split evenly, interleaved
    or not, and each holds the planned layers."""
    add = MegatronArgs()
    if "--pipeline-model-parallel-layout" not in args:
        return Overlay(add)
    split = tuple(plan.layer_split)
    if min(split) < 1:  # mindspeed_llm/training/utils.py check_pipeline_config: no stage of noop layers only
        raise PartitaError(f"layer_split {','.join(map(str, split))}: MindSpeed-LLM refuses a pipeline stage of noop "
                           "layers only (an empty stage); re-plan with a split that gives every stage a layer")
    total, noop = noop_padding(split)
    if noop:
        add.set("--num-layers", total)
        add.set("--noop-layers", ",".join(map(str, noop)))
    if plan.vpp > 1 and plan.schedule != "dualpipev":  # MindSpeed: dualpipev and vpp-stage are incompatible
        add.set("--num-layers-per-virtual-pipeline-stage", max(split))
    return Overlay(add, frozenset({"--pipeline-model-parallel-layout"}))


def _dualpipev_args(plan: Plan, model: ModelSpec | None, args: MegatronArgs, warn: list[str]) -> MegatronArgs:
    """MindSpeed-LLM's DualPipeV (Ascend/MindSpeed docs/features/dualpipev.md): ``--schedules-method
    dualpipev`` (layers a multiple of 2 pp, at least 2 pp micro-batches, no vpp stage; incompatible
    with context parallelism and asynchronous DDP), and for a MoE plan with ep > 1 its cross-micro-batch
    all-to-all overlap ``--moe-fb-overlap`` (docs/features/megatron_moe/megatron-moe-fb-overlap.md:
    alltoall dispatcher, grouped GEMM, expert tp 1, no ``--overlap-grad-reduce``, not with
    ``--moe-alltoall-overlap-comm``), which the plan's cost model credits (cost/pipeline.py)."""
    if plan.cp > 1:
        raise PartitaError(f"schedule=dualpipev with cp={plan.cp}: MindSpeed-LLM's DualPipeV does not run with context "
                           "parallelism (docs/features/dualpipev.md); re-plan with --cp 1 or --schedule "
                           "interleaved-1f1b")
    num_layers = int(args["--num-layers"][0]) if "--num-layers" in args else sum(plan.stage_layers(
        model.layers if model is not None else sum(plan.layer_split or ())))
    if num_layers % (2 * plan.pp):
        raise PartitaError(f"schedule=dualpipev: MindSpeed-LLM needs the layers ({num_layers}) to be a multiple of "
                           f"2*pp = {2 * plan.pp}; re-plan with a pp that divides them, or --schedule interleaved-1f1b")
    out = MegatronArgs()
    out.set("--schedules-method", "dualpipev")
    moe = model is not None and model.moe is not None
    if moe and plan.ep > 1:
        if plan.etp > 1:
            raise PartitaError(f"schedule=dualpipev with etp={plan.etp}: MindSpeed's --moe-fb-overlap (the all-to-all "
                               "overlap the plan prices) needs --expert-tensor-parallel-size 1; re-plan with --etp 1")
        out.set("--moe-fb-overlap")
    if "--overlap-grad-reduce" in args:
        warn.append("schedule=dualpipev: MindSpeed-LLM's DualPipeV does not run with asynchronous DDP; emitted "
                    "without --overlap-grad-reduce (the dp gradient sync is exposed where the plan overlapped it)")
    return out


#: ``--recompute-modules`` choices of Megatron core_v0.12.1, MindSpeed-LLM's base
#: (transformer_config.py: ``allowed_modules``; shared_experts came later)
MINDSPEED_RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe")


def _mindspeed_optimizer_checks(plan: Plan) -> None:
    """What MindSpeed-LLM (on Megatron core_v0.12.1) lacks of the optimizer-state and recompute
    fields, one line each. It has ``--optimizer-cpu-offload`` (its own
    mindspeed_llm/core/optimizer/__init__.py builds Megatron's HybridDeviceOptimizer) but not
    narrower Adam moments: core_v0.12.1's ``--exp-avg-dtype`` offers fp32/fp16/fp8 only, and its
    OptimizerConfig takes them from Transformer Engine's FusedAdam, which Ascend has not
    (MindSpeed-LLM builds apex's FusedAdam, which has no ``exp_avg_dtype``)."""
    if plan.moment_dtype != "fp32" and plan.zero == 1:
        raise PartitaError(f"moment_dtype={plan.moment_dtype}: MindSpeed-LLM has no narrower Adam moments (its "
                           "Megatron core_v0.12.1 takes --exp-avg-dtype from Transformer Engine's FusedAdam, absent on "
                           "Ascend); re-plan with --moment-dtype fp32, or export --to megatron")
    extra = [m for m in plan.recompute_modules.split(",") if m and m not in MINDSPEED_RECOMPUTE_MODULES]
    if extra and plan.recompute == "selective":
        raise PartitaError(f"recompute_modules {plan.recompute_modules}: MindSpeed-LLM's Megatron core_v0.12.1 has no "
                           f"--recompute-modules {' '.join(extra)} (transformer_config.py allows "
                           f"{', '.join(MINDSPEED_RECOMPUTE_MODULES)}); re-plan without it, or export --to megatron")


def mindspeed_args(plan: Plan, model: ModelSpec | None = None) -> tuple[MegatronArgs, list[str]]:
    """(arguments, warnings) for MindSpeed-LLM: Megatron's, with ZeRO-3 as torch FSDP2 (what
    MindSpeed-LLM runs), its layer split (:func:`_mindspeed_split`) and :func:`mindspeed_overlay`
    applied."""
    _mindspeed_checks(plan, model, None)  # before Megatron's FSDP2 rules: ZeRO-2 is refused as such
    _mindspeed_optimizer_checks(plan)
    args, warn = megatron_args(plan, model, fsdp="torch")
    args = _mindspeed_split(plan, args).apply(args)
    _mindspeed_checks(plan, model, int(args["--num-layers"][0]) if "--num-layers" in args else None)
    first = model.moe.first_dense_layers if model is not None and model.moe else 0
    if first and plan.pp > 1 and plan.vpp == 1 and plan.stage_layers(model.layers)[0] <= first:
        raise PartitaError(f"layer_split {','.join(map(str, plan.stage_layers(model.layers)))}: the first pipeline "
                           f"stage holds only the {first} dense layers (first-k-dense-replace), which MindSpeed-LLM "
                           "does not allow; re-plan with a first stage of more layers, or plan with --framework "
                           "mindspeed")
    if "--noop-layers" in args and model is not None and model.moe and model.moe.layer_freq > 1:
        raise PartitaError(f"layer_split {','.join(map(str, plan.layer_split))} with --moe-layer-freq "
                           f"{model.moe.layer_freq}: MindSpeed-LLM's noop layers would shift which layers are MoE; "
                           "re-plan with layers that divide into pp*vpp stages")
    if plan.reuse_fp32_param:  # MindSpeed mindspeed/features_manager/memory/reuse_fp32_param.py
        args.set("--reuse-fp32-param")
        warn = [w for w in warn if not w.startswith("reuse_fp32_param is MindSpeed's")]
    from ..imports.finetune import mindspeed_finetune_flags
    tune, tune_warn = mindspeed_finetune_flags(plan)  # issue 36: MindSpeed-LLM's SFT / LoRA arguments
    for flag, *values in tune:
        args.set(flag, *values)
    warn += tune_warn
    overlay = mindspeed_overlay(plan, model)
    if plan.schedule == "dualpipev":
        for flag, values in _dualpipev_args(plan, model, args, warn).items():
            args.set(flag, *values)
        remove, keep = {"--overlap-grad-reduce", "--overlap-param-gather"}, set()
        if "--moe-fb-overlap" in args:  # it needs grouped GEMM, which MindSpeed refuses beside MC2 in a MoE model
            remove |= {"--moe-alltoall-overlap-comm", "--use-ascend-mc2"}
            keep.add("--moe-grouped-gemm")
            if "--use-ascend-mc2" in overlay.add:
                warn.append("schedule=dualpipev: --moe-fb-overlap needs --moe-grouped-gemm, which MindSpeed-LLM "
                            "refuses with --use-ascend-mc2 in a MoE model: emitted without MC2 (the tp "
                            "communication the plan overlapped is exposed)")
        overlay = Overlay(MegatronArgs((k, v) for k, v in overlay.add.items() if k not in remove),
                          (overlay.remove | remove) - keep)
    if "--moe-grouped-gemm" in overlay.remove and "--moe-grouped-gemm" in args and \
            "moe_act" in plan.recompute_modules.split(","):
        raise PartitaError("recompute_modules moe_act with tp and sp in a MoE model: MindSpeed-LLM refuses grouped "
                           "GEMM beside --use-ascend-mc2, and Megatron-Core accepts moe_act only with grouped GEMM "
                           "(transformer_config.py); re-plan without moe_act, or with --no-sp")
    if "--moe-grouped-gemm" in overlay.remove and "--moe-grouped-gemm" in args:
        warn.append("MindSpeed-LLM refuses --moe-grouped-gemm with --use-ascend-mc2 in a MoE model: emitted MC2 "
                    "(the plan's tp communication overlap) without grouped GEMM")
    return overlay.apply(args), warn


def export_mindspeed(ctx: ExportContext) -> Export:
    """MindSpeed-LLM ``pretrain_gpt.py`` arguments (Megatron's with MindSpeed's overlay)."""
    args, warn = mindspeed_args(ctx.plan, ctx.model)
    text = _render(args, warn, "mindspeed", env_vars(ctx.plan), script="MindSpeed-LLM pretrain_gpt.py")
    return Export("mindspeed", text, warn, args.argv())
