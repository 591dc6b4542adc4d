"""Megatron-LM / MindSpeed-LLM argument parsing for tests, from the frameworks' OWN option tables.

NOT the real parser: Megatron-LM's ``megatron/training/arguments.py`` is not installable from
PyPI (the ``megatron-core`` 0.16.1 wheel ships ``megatron/core`` only), so CI cannot import it.
Instead :data:`FLAGS` is the option table that ``megatron_real_check.py --dump-flags`` dumps
from core_v0.16.1's real parser (every option string, its nargs, type, choices and store_true /
store_false / BooleanOptionalAction kind); :func:`megatron_parser` rebuilds an argparse parser
from it, so an unknown flag, a missing value or a value outside ``choices`` fails exactly as in
Megatron. Megatron's custom type callables (moe_freq_type, tuple_type ...) are kept as strings.
``megatron_real_check.py`` runs the real ``parse_args`` + ``validate_args`` +
``core_transformer_config_from_args`` where a Megatron-LM checkout is at hand; the validate_args
rules the exporter relies on are asserted in tests/test_export.py with their line references.

MindSpeed-LLM declares its own flags on top (``conflict_handler='resolve'``):
:data:`MINDSPEED_FLAGS` transcribes the ones the exporter emits from Ascend/MindSpeed-LLM
``mindspeed_llm/training/arguments.py`` (commit 015ce048) and MindSpeed's feature registrations.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

TABLE = json.loads(Path(__file__).with_name("megatron_flags.json").read_text())
RELEASE = TABLE["release"]
_TYPES = {"int": int, "float": float, "str": str}

#: (option, kind, nargs/type, choices) for MindSpeed-LLM's own flags that exports use.
MINDSPEED_FLAGS = [
    ("--use-flash-attn", "store_true", None, None),
    ("--use-fused-rmsnorm", "store_true", None, None),          # _add_fusion_op_args
    ("--use-fused-swiglu", "store_true", None, None),           # _add_fusion_op_args
    ("--use-fused-rotary-pos-emb", "store_true", None, None),   # _add_fusion_op_args
    ("--use-rotary-position-embeddings", "store_true", None, None),
    ("--use-ascend-mc2", "store_true", None, None),             # mc2 feature (replaces --use-mc2)
    ("--use-cp-send-recv-overlap", "store_true", None, None),   # _add_cp_args
    ("--moe-alltoall-overlap-comm", "store_true", None, None),  # _add_moe_args
    ("--context-parallel-algo", "store", str, ["ulysses_cp_algo", "megatron_cp_algo", "hybrid_cp_algo",
                                               "adaptive_cp_algo", "hybrid_adaptive_cp_algo"]),  # _add_cp_args
    ("--ckpt-format", "store", str, ["torch", "torch_dist", "zarr"]),  # _add_ckpt_args (overrides Megatron's)
    ("--first-k-dense-replace", "store", int, None),            # _add_deepseek_moe_args
    ("--moe-layer-freq", "store", int, None),                   # _add_deepseek_moe_args (an int here)
    ("--num-layer-list", "store", str, None),                   # num_layer_list.py NumLayerListFeature
    ("--noop-layers", "store", str, None),                      # _add_training_args: identity layers
    ("--reuse-fp32-param", "store_true", None, None),           # Ascend/MindSpeed 028de58 mindspeed/arguments.py
    # mindspeed_llm/training/arguments.py (and MindSpeed's features_manager ChimeraFeature, which adds "chimera")
    ("--schedules-method", "store", str, ["dualpipev"]),
    ("--moe-fb-overlap", "store_true", None, None),             # MindSpeed MoEFwdBwdOverlapFeature
    # Megatron core_v0.12.1 (MindSpeed-LLM's base) arguments.py l.2689-2692: no bf16 moments yet
    ("--exp-avg-dtype", "store", str, ["fp32", "fp16", "fp8"]),
    ("--exp-avg-sq-dtype", "store", str, ["fp32", "fp16", "fp8"]),
]

#: Megatron-Core TransformerConfig's ``allowed_modules`` for --recompute-modules: core_v0.16.1
#: transformer_config.py l.1198 and core_v0.12.1 l.728 (MindSpeed-LLM's base; no shared_experts)
RECOMPUTE_MODULES = {"core_v0.16.1": {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                                      "shared_experts"},
                     "core_v0.12.1": {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe"}}


def optimizer_and_recompute_validate(ns: argparse.Namespace, release: str = RELEASE) -> None:
    """Megatron's own rules on the optimizer-state and module-recompute flags, transcribed:
    validate_args (arguments.py core_v0.16.1 l.1190-1198, core_v0.12.1 l.945-949; MindSpeed-LLM
    mindspeed_llm/core/layerwise_disaggregated_training/initialize.py l.1068 repeats it):
    --optimizer-cpu-offload needs --use-precision-aware-optimizer, and with --fp8-param-gather the
    delayed recipe; OptimizerConfig.__post_init__ (optimizer_config.py): the precision-aware
    optimizer needs the distributed optimizer; TransformerConfig.__post_init__
    (transformer_config.py): the module list, moe_act only with --moe-grouped-gemm, mla_up_proj only
    with --multi-latent-attention, fp8 moe_act/layernorm recompute not with the delayed recipe.
    Raises AssertionError / ValueError as Megatron does."""
    if ns.optimizer_cpu_offload:
        if not ns.use_precision_aware_optimizer:
            raise AssertionError("The optimizer cpu offload must be used in conjunction with "
                                 "`--use-precision-aware-optimizer`")
        if ns.fp8_param_gather and getattr(ns, "fp8_recipe", "delayed") != "delayed":
            raise AssertionError("When `--fp8-param-gather` is enabled, the optimizer cpu offload must be used in "
                                 "conjunction with `--fp8-recipe delayed`.")
    if ns.use_precision_aware_optimizer and not ns.use_distributed_optimizer:
        raise AssertionError("--use-precision-aware-optimizer only supported with distributed optimizer")
    if not ns.use_precision_aware_optimizer and {ns.exp_avg_dtype, ns.exp_avg_sq_dtype} - {"fp32", None}:
        # not an assert in Megatron: the dtypes are silently unused without the precision-aware optimizer
        raise ValueError("--exp-avg-dtype has no effect without --use-precision-aware-optimizer")
    if ns.recompute_granularity == "selective" and ns.recompute_modules:
        bad = set(ns.recompute_modules) - RECOMPUTE_MODULES[release]
        if bad:
            raise AssertionError(f"Invalid choices for recompute_modules: {bad}")
        if "moe_act" in ns.recompute_modules and not ns.moe_grouped_gemm:
            raise ValueError("moe_act in recompute_modules is only supported with moe_grouped_gemm.")
        if "mla_up_proj" in ns.recompute_modules and not ns.multi_latent_attention:
            raise ValueError("mla_up_proj in recompute_modules is only supported with multi_latent_attention.")
        if ns.fp8 and {"moe_act", "layernorm"} & set(ns.recompute_modules) and \
                getattr(ns, "fp8_recipe", "delayed") == "delayed":
            raise ValueError("Delayed scaling does not support moe_act and layernorm recompute for fp8.")


def mindspeed_validate(ns: argparse.Namespace) -> None:
    """MindSpeed-LLM's own validate_args rules on the flags an export writes, transcribed from
    Ascend/MindSpeed-LLM c77308a ``mindspeed_llm/features_manager/transformer/transformer_block.py``
    (TransformerBlockFeature.validate_args) and ``mindspeed_llm/training/arguments.py`` (the
    --num-layer-list sum check), and Megatron core_v0.12.1's ``--use-torch-fsdp2`` asserts
    (validate_args; mirrored in mindspeed_llm/core/layerwise_disaggregated_training/initialize.py).
    Raises AssertionError / ValueError with MindSpeed's message, as MindSpeed does."""
    pp = ns.pipeline_model_parallel_size
    optimizer_and_recompute_validate(ns, "core_v0.12.1")
    if ns.first_k_dense_replace and ns.num_layers <= ns.first_k_dense_replace:
        raise AssertionError(f"Num-layer ({ns.num_layers}) must be greater than first-k-dense-replace "
                             f"({ns.first_k_dense_replace}) when first-k-dense-replace is set.")
    if ns.first_k_dense_replace and pp > 1 and ns.first_k_dense_replace >= ns.num_layers // pp:
        raise AssertionError("When using first-k-dense-replace, it is not allowed for all layers within a pp stage "
                             "to be dense layers.")
    if ns.num_experts is not None and ns.use_ascend_mc2 and ns.moe_grouped_gemm:
        raise AssertionError("Moe Grouped Gemm is not supported with mc2 in MOE model.")
    if ns.num_layer_list:
        counts = list(map(int, ns.num_layer_list.split(",")))
        if len(counts) != pp:
            raise ValueError("len(args.num_layer_list) != args.pipeline_model_parallel_size")
        if not pp > 1:
            raise ValueError("Dynamic pipeline model should work with pipeline parallel.")
        if ns.num_layers_per_virtual_pipeline_stage:
            raise ValueError("Dynamic pipeline model and virtual pipeline cannot be enabled at the same time.")
        if sum(counts) != ns.num_layers:
            raise ValueError(f"Incorrect num_layer_list config since its sum({sum(counts)} is unequal to total num "
                             f"layers({ns.num_layers}).")
    if ns.schedules_method == "dualpipev":  # Ascend/MindSpeed docs/features/dualpipev.md 使用方法 / 使用约束
        if ns.num_layers_per_virtual_pipeline_stage is not None:
            raise ValueError("dualpipev is incompatible with --num-layers-per-virtual-pipeline-stage (VPP)")
        if ns.num_layers % (2 * pp):
            raise ValueError("dualpipev: num_layers must be a multiple of pipeline_model_parallel_size * 2")
        if ns.context_parallel_size > 1 or ns.overlap_grad_reduce:
            raise ValueError("dualpipev is not compatible with context parallel or asynchronous DDP")
    if ns.moe_fb_overlap:  # docs/features/megatron_moe/megatron-moe-fb-overlap.md 使用约束 1, 3, 5, 7, 10
        if ns.moe_token_dispatcher_type != "alltoall" or not ns.moe_grouped_gemm:
            raise ValueError("--moe-fb-overlap needs --moe-token-dispatcher-type alltoall and --moe-grouped-gemm")
        if (ns.expert_tensor_parallel_size or 1) != 1 or ns.overlap_grad_reduce or ns.moe_alltoall_overlap_comm:
            raise ValueError("--moe-fb-overlap needs expert tp 1, no --overlap-grad-reduce, no "
                             "--moe-alltoall-overlap-comm")
    if ns.pipeline_model_parallel_layout is not None:  # not an option of Megatron core_v0.12.1, MindSpeed-LLM's base
        raise ValueError("--pipeline-model-parallel-layout: not a MindSpeed-LLM (Megatron core_v0.12.1) argument")
    if ns.use_torch_fsdp2:
        if pp > 1:
            raise AssertionError("--use-torch-fsdp2 is not supported with pipeline parallelism")
        if ns.expert_model_parallel_size > 1:
            raise AssertionError("--use-torch-fsdp2 is not supported with expert parallelism")
        if ns.use_distributed_optimizer:
            raise AssertionError("--use-torch-fsdp2 is not supported with MCore's distributed optimizer")
        if ns.gradient_accumulation_fusion:
            raise AssertionError("--use-torch-fsdp2 is not supported with gradient accumulation fusion")
        if ns.ckpt_format not in ("torch_dist", "torch_dcp"):
            raise AssertionError("--use-torch-fsdp2 requires --ckpt-format torch_dist or torch_dcp")
        if not ns.untie_embeddings_and_output_weights:
            raise AssertionError("--use-torch-fsdp2 requires --untie-embeddings-and-output-weights")
        if ns.fp16:
            raise AssertionError("--use-torch-fsdp2 not supported with fp16 yet")


def _add(parser: argparse.ArgumentParser, row: dict) -> None:
    kind = row["kind"]
    opts = row["options"]
    if kind == "_StoreTrueAction":
        parser.add_argument(*opts, dest=row["dest"], action="store_true", default=row["default"])
    elif kind == "_StoreFalseAction":
        parser.add_argument(*opts, dest=row["dest"], action="store_false", default=row["default"])
    elif kind == "BooleanOptionalAction":
        parser.add_argument(*[o for o in opts if not o.startswith("--no-")], dest=row["dest"],
                            action=argparse.BooleanOptionalAction, default=row["default"])
    else:
        kw = {"dest": row["dest"], "type": _TYPES.get(row["type"] or "str", str), "default": row["default"]}
        if row["nargs"] is not None:
            kw["nargs"] = row["nargs"]
        if row["choices"] is not None and row["type"] in (None, "str", "int"):
            kw["choices"] = [kw["type"](c) for c in row["choices"]]
        elif row["choices"] is not None and row["type"] == "enum_type_handler":
            # Megatron maps the value to its enum by member name (AttnBackend[value]): "unfused" -> AttnBackend.unfused
            kw["choices"] = [c.rsplit(".", 1)[-1] for c in row["choices"]]
        parser.add_argument(*opts, **kw)


def megatron_parser(conflict_handler: str = "error") -> argparse.ArgumentParser:
    """argparse parser with every option of Megatron-LM ``RELEASE``'s own parser."""
    p = argparse.ArgumentParser(prog="pretrain_gpt.py", allow_abbrev=False, conflict_handler=conflict_handler)
    for row in TABLE["options"]:
        _add(p, row)
    return p


def mindspeed_parser() -> argparse.ArgumentParser:
    p = megatron_parser("resolve")
    for opt, kind, typ, choices in MINDSPEED_FLAGS:
        if kind == "store_true":
            p.add_argument(opt, action="store_true")
        else:
            p.add_argument(opt, type=typ, choices=choices)
    return p
