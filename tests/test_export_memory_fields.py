"""The optimizer-state and module-recompute plan fields reach every export, or are refused in one line.

``optimizer_offload`` (Megatron --optimizer-cpu-offload --optimizer-offload-fraction),
``moment_dtype`` (--use-precision-aware-optimizer --exp-avg-dtype/--exp-avg-sq-dtype) and
``recompute_modules`` (--recompute-granularity selective --recompute-modules) lower the memory the
estimate prices; an export that dropped them would launch a run that does not fit. Oracles are the
targets' own parsers (tests/export_oracles: Megatron core_v0.16.1's option table plus its
validate_args / OptimizerConfig / TransformerConfig rules on these flags; MindSpeed-LLM's flags on
Megatron core_v0.12.1; DeepSpeed 0.19's DeepSpeedConfig; torchtitan 0.3.0's ConfigManager), and for
LoRA's optimizer bytes Megatron's docs/user-guide/features/dist_optimizer.md (bf16 parameters with
fp32 gradients: 6 + 12/d bytes per parameter, the 12 = fp32 master + Adam m + v, 4 bytes each).
"""
from __future__ import annotations

import shlex

import pytest

from export_oracles import deepspeed_oracle, megatron_oracle, torchtitan_oracle
from partita.errors import PartitaError
from partita.export import export
from partita.imports.megatron import read_megatron
from partita.plan import Plan
from partita.spec.load import load_model

# a Mixtral-shaped MoE Megatron launch (8 experts, top-2) on 16 ranks: tp 2, ep 4, distributed optimizer
MOE_SCRIPT = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
              "--group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm "
              "--position-embedding-type rope --untie-embeddings-and-output-weights --disable-bias-linear "
              "--vocab-size 32000 --seq-length 4096 --max-position-embeddings 32768 --bf16 "
              "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 14336 --moe-grouped-gemm "
              "--moe-token-dispatcher-type alltoall "
              "--tensor-model-parallel-size 2 --expert-model-parallel-size 4 --sequence-parallel "
              "--micro-batch-size 1 --global-batch-size 64 --use-distributed-optimizer "
              "--recompute-granularity selective --recompute-modules moe_act layernorm mlp "
              "--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 "
              "--optimizer-cpu-offload --optimizer-offload-fraction 0.5")


def _argv(text: str) -> list[str]:
    return shlex.split("\n".join(l for l in text.splitlines() if not l.startswith("#")).replace("\\\n", " "))


def _megatron_ns(plan: Plan, model, target: str = "megatron"):
    """The export parsed by the target's own option table and checked by its validate rules."""
    out = export(target, plan, model)
    if target == "megatron":
        ns = megatron_oracle.megatron_parser().parse_args(_argv(out.text))
        megatron_oracle.optimizer_and_recompute_validate(ns)
    else:
        ns = megatron_oracle.mindspeed_parser().parse_args(_argv(out.text))
        megatron_oracle.mindspeed_validate(ns)
    return ns, out


def test_megatron_script_round_trip_keeps_the_fields():
    """Import a Megatron launch that offloads half the optimizer, stores bf16 moments and recomputes
    three modules; the export of the imported plan carries the same flags and values (parsed by
    Megatron's option table, accepted by its validate_args rules)."""
    read = read_megatron(shlex.split(MOE_SCRIPT), 16)
    plan = read.plan
    assert (plan.optimizer_offload, plan.moment_dtype, plan.recompute_modules) == (0.5, "bf16", "moe_act,layernorm,mlp")
    ns, out = _megatron_ns(plan, read.model)
    assert ns.optimizer_cpu_offload and ns.optimizer_offload_fraction == 0.5 and ns.use_precision_aware_optimizer
    assert (ns.exp_avg_dtype, ns.exp_avg_sq_dtype) == ("bf16", "bf16")
    assert (ns.recompute_granularity, ns.recompute_modules) == ("selective", ["moe_act", "layernorm", "mlp"])
    # HybridDeviceOptimizer's device Adam takes no --exp-avg-dtype (core/optimizer/__init__.py): said, with bytes
    assert any(w.startswith("moment_dtype=bf16 with optimizer_offload=0.5") and "fp32 moments" in w for w in out.warnings)
    again = read_megatron(out.data, 16, read.model).plan
    assert (again.optimizer_offload, again.moment_dtype, again.recompute_modules) == (0.5, "bf16", "moe_act,layernorm,mlp")


@pytest.mark.parametrize("fraction,moments", [(1.0, "fp32"), (0.0, "fp8"), (0.25, "fp32")])
def test_megatron_emits_offload_and_moments_with_the_precision_aware_optimizer(fraction, moments):
    model = load_model("llama3-8b")
    ns, out = _megatron_ns(Plan(dp=8, zero=1, gbs=64, optimizer_offload=fraction, moment_dtype=moments), model)
    assert ns.use_precision_aware_optimizer  # validate_args asserts it beside the offload
    assert ns.optimizer_cpu_offload == (fraction > 0)
    assert ns.optimizer_offload_fraction == (fraction if fraction else 1.0)
    assert (ns.exp_avg_dtype, ns.exp_avg_sq_dtype) == (moments, moments)
    assert out.warnings == []


def test_megatron_fp8_module_recompute_names_a_recipe_that_allows_it():
    """Megatron's --fp8-recipe defaults to delayed, which refuses moe_act/layernorm recompute; the
    export writes the plan's recipe then, and the oracle's TransformerConfig rule accepts it."""
    model = load_model("mixtral-8x7b")
    plan = Plan(dp=8, ep=8, zero=1, gbs=64, dtype="fp8", fp8_recipe="mxfp8", recompute="selective",
                recompute_modules="moe_act,layernorm")
    ns, _ = _megatron_ns(plan, model)
    assert ns.fp8_recipe == "mxfp8" and ns.recompute_modules == ["moe_act", "layernorm"]


REFUSED = [
    ("megatron", "llama3-8b", dict(dp=8, zero=0, optimizer_offload=1.0),
     "optimizer_offload=1: --optimizer-cpu-offload needs --use-precision-aware-optimizer, which needs the distributed "
     "optimizer (optimizer_config.py), and zero=0 exports no distributed optimizer; re-plan with --zero 1"),
    ("mindspeed", "llama3-8b", dict(dp=8, zero=3, optimizer_offload=0.5),
     "optimizer_offload=0.5: --optimizer-cpu-offload needs --use-precision-aware-optimizer, which needs the "
     "distributed optimizer (optimizer_config.py), and zero=3 exports torch FSDP2; re-plan with --zero 1"),
    ("megatron", "llama3-8b", dict(dp=8, zero=1, recompute="selective", recompute_modules="mla_up_proj"),
     "recompute_modules mla_up_proj: Megatron-Core accepts it only with --multi-latent-attention "
     "(transformer_config.py); re-plan without mla_up_proj"),
    ("megatron", "llama3-8b", dict(dp=8, zero=1, recompute="selective", recompute_modules="moe_act"),
     "recompute_modules moe_act: Megatron-Core accepts moe_act only with --moe-grouped-gemm, a MoE model's "
     "(transformer_config.py); the model is dense: re-plan without moe_act"),
    ("megatron", "mixtral-8x7b", dict(dp=8, ep=8, zero=1, dtype="fp8", fp8_recipe="rowwise", recompute="selective",
                                     recompute_modules="layernorm"),
     "recompute_modules layernorm with fp8_recipe rowwise: Megatron's --fp8-recipe has no such recipe and its default "
     "(delayed) refuses moe_act and layernorm recompute (transformer_config.py); re-plan with --fp8-recipe tensorwise "
     "or mxfp8"),
    ("mindspeed", "llama3-8b", dict(dp=8, zero=1, moment_dtype="bf16"),
     "moment_dtype=bf16: MindSpeed-LLM has no narrower Adam moments (its Megatron core_v0.12.1 takes --exp-avg-dtype "
     "from Transformer Engine's FusedAdam, absent on Ascend); re-plan with --moment-dtype fp32, or export --to megatron"),
    ("mindspeed", "mixtral-8x7b", dict(dp=8, ep=8, zero=1, recompute="selective", recompute_modules="moe,shared_experts"),
     "recompute_modules moe,shared_experts: MindSpeed-LLM's Megatron core_v0.12.1 has no --recompute-modules "
     "shared_experts (transformer_config.py allows core_attn, moe_act, layernorm, mla_up_proj, mlp, moe); re-plan "
     "without it, or export --to megatron"),
    ("mindspeed", "mixtral-8x7b", dict(dp=4, tp=2, sp=True, ep=8, zero=1, recompute="selective",
                                      recompute_modules="moe_act"),
     "recompute_modules moe_act with tp and sp in a MoE model: MindSpeed-LLM refuses grouped GEMM beside "
     "--use-ascend-mc2, and Megatron-Core accepts moe_act only with grouped GEMM (transformer_config.py); re-plan "
     "without moe_act, or with --no-sp"),
    ("deepspeed", "llama3-8b", dict(dp=8, zero=1, optimizer_offload=0.5),
     "optimizer_offload=0.5 with zero=1: DeepSpeed offloads all of the optimizer states (a fraction, "
     "offload_optimizer.ratio, is ZeRO-3 only); re-plan with --optimizer-offload 1 or --zero 3"),
    ("deepspeed", "llama3-8b", dict(dp=8, zero=0, optimizer_offload=1.0),
     "optimizer_offload=1: DeepSpeed offloads the optimizer (offload_optimizer) with ZeRO stage 1, 2 or 3 only; "
     "re-plan with --zero 1"),
    ("deepspeed", "llama3-8b", dict(dp=8, zero=1, moment_dtype="bf16"),
     "moment_dtype=bf16: ds_config stores Adam's moments narrower only with bf16 master weights and gradients "
     "(bf16_optimizer_states, runtime/precision_config.py), not beside an fp32 master; re-plan with --moment-dtype "
     "fp32, or export --to megatron"),
    ("deepspeed", "llama3-8b", dict(dp=8, zero=1, recompute="selective", recompute_modules="mlp"),
     "recompute_modules mlp: DeepSpeed checkpoints the whole blocks the model code wraps "
     "(deepspeed.checkpointing.checkpoint; ds_config has no module list); re-plan with --recompute full, or export "
     "--to megatron"),
    ("torchtitan", "llama3-8b", dict(dp=8, zero=1, optimizer_offload=0.5),
     "optimizer_offload=0.5: torchtitan 0.3.0 offloads only everything FSDP holds (training.enable_cpu_offload: "
     "parameters, gradients and optimizer states) and only under FSDP; re-plan with --optimizer-offload 1 and "
     "--zero >= 1 with dp or cp > 1, or export --to megatron"),
    ("torchtitan", "llama3-8b", dict(dp=8, zero=1, moment_dtype="fp8"),
     "moment_dtype=fp8: torchtitan 0.3.0 has no optimizer-state dtype option (its Adam keeps fp32 moments); re-plan "
     "with --moment-dtype fp32, or export --to megatron"),
    ("torchtitan", "llama3-8b", dict(dp=8, zero=1, recompute="selective", recompute_modules="core_attn"),
     "recompute_modules core_attn: torchtitan 0.3.0's activation checkpointing is none, selective (per-op), full or "
     "memory-budget, with no module list (distributed/activation_checkpoint.py); re-plan with --recompute full, or "
     "export --to megatron"),
]


@pytest.mark.parametrize("target,model_name,fields,message", REFUSED,
                         ids=[f"{t}-{'-'.join(f'{k}{v}' for k, v in f.items() if k not in ('dp', 'zero'))}"
                              for t, _, f, _ in REFUSED])
def test_what_a_target_cannot_run_is_refused_in_one_line(target, model_name, fields, message):
    with pytest.raises(PartitaError) as err:
        export(target, Plan(gbs=64, **fields), load_model(model_name))
    assert str(err.value) == message and "\n" not in message


def test_mindspeed_runs_megatrons_optimizer_offload():
    """MindSpeed-LLM builds Megatron's HybridDeviceOptimizer (mindspeed_llm/core/optimizer/__init__.py)
    and asserts the precision-aware optimizer beside it (layerwise_disaggregated_training/initialize.py)."""
    ns, _ = _megatron_ns(Plan(dp=8, zero=1, gbs=64, optimizer_offload=0.75, recompute="selective",
                              recompute_modules="core_attn,mlp"), load_model("llama3-8b"), "mindspeed")
    assert ns.optimizer_cpu_offload and ns.optimizer_offload_fraction == 0.75 and ns.use_precision_aware_optimizer
    assert ns.recompute_modules == ["core_attn", "mlp"]


@pytest.mark.parametrize("zero,fraction", [(1, 1.0), (2, 1.0), (3, 1.0), (3, 0.4)])
def test_deepspeed_offload_optimizer_loads_in_deepspeedconfig(zero, fraction):
    plan = Plan(dp=8, zero=zero, gbs=64, optimizer_offload=fraction)
    out = export("deepspeed", plan, load_model("llama3-8b"))
    off = deepspeed_oracle.load(out.data, plan.world_size, plan.dp).zero_config.offload_optimizer
    assert off is not None and off.device == "cpu" and off.ratio == fraction


def test_torchtitan_whole_offload_is_fsdp_cpu_offload():
    plan = Plan(dp=8, zero=3, gbs=64, optimizer_offload=1.0)
    out = export("torchtitan", plan, load_model("llama3-8b"))
    cfg = torchtitan_oracle.parse(out.data["flags"])
    assert cfg.training.enable_cpu_offload is True
    assert any("offloads the parameters and gradients too" in w for w in out.warnings)


@pytest.mark.parametrize("target", ["deepspeed", "torchtitan"])
def test_unpriced_moments_are_dropped_with_a_warning(target):
    """At zero 0 the estimate prices fp32 moments (cost/states.moment_saving: zero 1-2), so a target
    without the option drops the field and says so instead of refusing."""
    out = export(target, Plan(dp=8, zero=0, gbs=64, moment_dtype="bf16"), load_model("llama3-8b"))
    assert any(w.startswith("moment_dtype=bf16: not emitted") for w in out.warnings)


@pytest.mark.parametrize("dp,fields,per_param", [
    (8, {}, 12 / 8),                                                     # fp32 master + m + v over d
    (8, {"moment_dtype": "bf16"}, (2 + 2 + 2) / 8),  # precision-aware: 2-byte moments, the master as 16 remainder bits
    (8, {"optimizer_offload": 0.5}, 0.5 * 12 / 8),                       # half on the host
    (4, {"optimizer_offload": 1.0}, 0.0),                                # all on the host
    # under --optimizer-cpu-offload Megatron's HybridDeviceOptimizer never gets exp_avg_dtype
    # (megatron/core/optimizer/__init__.py): the device share keeps fp32 moments
    (8, {"moment_dtype": "bf16", "optimizer_offload": 0.25}, 0.75 * 12 / 8),
])
def test_lora_optimizer_states_follow_offload_and_moment_dtype(dp, fields, per_param):
    """LoRA's adapters are the only parameters with optimizer states; Megatron's distributed optimizer
    (and HybridDeviceOptimizer) treat them as any trained parameter: 12/d bytes each at zero 1
    (dist_optimizer.md), 8/d with 2-byte moments, times the device share 1 - offload."""
    from partita.cost.finetune import trainable_params
    from partita.cost.memory import estimate_rank_memory
    from partita.spec.hardware import make_cluster
    model = load_model("llama3-8b")
    plan = Plan(dp=dp, zero=1, gbs=dp, seq_len=4096, finetune="lora", **fields)
    adapters = trainable_params(model, plan)
    parts = estimate_rank_memory(model, make_cluster("h100-sxm", dp).device, plan, 0).parts
    assert parts["optimizer"] == pytest.approx(adapters * per_param, rel=1e-9, abs=1e-6)


@pytest.mark.parametrize("fields,words", [({"optimizer_offload": 1.0}, "optimizer_offload=1: this export writes"),
                                          ({"moment_dtype": "bf16"}, "moment_dtype=bf16: the Hugging Face Trainer")])
def test_llamafactory_refuses_the_optimizer_fields(fields, words):
    with pytest.raises(PartitaError) as err:
        export("llamafactory", Plan(dp=8, zero=2, gbs=64, finetune="lora", **fields), load_model("llama3-8b"))
    assert str(err.value).startswith(words) and "\n" not in str(err.value)


def test_megatron_fp8_op_level_selective_writes_a_recipe_its_modules_allow():
    """An fp8 plan estimated with op-level selective (no module list, a framework whose selective is
    op-level: torchtitan; under megatron it is core_attn, cost/frameworks.py) is written as core_attn
    layernorm moe_act; Megatron's default recipe (delayed) refuses moe_act/layernorm recompute
    ("Delayed scaling does not support moe_act and layernorm recompute for fp8"), so the export
    must name the plan's recipe for the list it actually writes (it wrote none before)."""
    model = load_model("mixtral-8x7b")
    ns, _ = _megatron_ns(Plan(dp=8, ep=8, zero=1, gbs=64, dtype="fp8", recompute="selective", framework="torchtitan"),
                         model)
    assert ns.fp8_recipe == "tensorwise" and {"layernorm", "moe_act"} <= set(ns.recompute_modules)
    # a recipe Megatron cannot name: the default list drops the modules delayed scaling refuses
    ns, out = _megatron_ns(Plan(dp=8, ep=8, zero=1, gbs=64, dtype="fp8", fp8_recipe="rowwise",
                                recompute="selective", framework="torchtitan"), model)
    assert ns.recompute_modules == ["core_attn"] and ns.fp8_recipe == "delayed"
    assert any(w.startswith("fp8_recipe=rowwise: Megatron's --fp8-recipe has no such recipe") for w in out.warnings)


def test_megatron_fp8_plan_names_its_recipe_without_recompute():
    """The plan's recipe is what the estimate priced; Megatron's own default is delayed (arguments.py
    core_v0.12.1 l.1057 / core_v0.16.1 option table: default 'delayed')."""
    ns, _ = _megatron_ns(Plan(dp=8, zero=1, gbs=64, dtype="fp8", fp8_recipe="mxfp8"), load_model("llama3-8b"))
    assert ns.fp8_recipe == "mxfp8"


def test_megatron_op_level_selective_warning_states_the_priced_difference():
    """Partita's op-level selective and Megatron's module list keep different activations; the
    warning quotes both per layer as the estimator prices them (cost/activations.py), instead of
    the former "a bit less memory" (for llama3-8b Megatron's modules keep more, not less)."""
    from partita.cost.activations import activation_bytes_per_layer
    model = load_model("llama3-8b")
    plan = Plan(dp=8, zero=1, gbs=64, seq_len=4096, recompute="selective", framework="torchtitan")  # op-level
    ns, out = _megatron_ns(plan, model)
    written = ",".join(ns.recompute_modules)
    op_level = activation_bytes_per_layer(model, plan, False) / 2**20
    modules = activation_bytes_per_layer(model, plan.with_(recompute_modules=written), False) / 2**20
    assert modules > op_level
    (line,) = [w for w in out.warnings if w.startswith("recompute=selective")]
    assert "a bit less memory" not in line and f"--recompute-modules {written}" in line
    assert f"Megatron keeps {modules:,.1f} MiB" in line and f"priced {op_level:,.1f} MiB" in line
