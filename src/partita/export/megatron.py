"""Megatron-LM (and MindSpeed-LLM) command-line arguments for a plan.

Flag names are the current ones of Megatron-LM core_v0.16 (verified against its real
``arguments.py`` parser, shared/reference/ecosystem.md sec. 5): no deprecated spellings
(``--checkpoint-activations``, ``--recompute-activations``, ``--moe-extended-tp``,
``--use-mcore-models``, ``--virtual-pipeline-model-parallel-size`` are not emitted).
:func:`parse_megatron_args` reads a command line back with a parser that declares the
same flags with Megatron's own types and defaults, for round-trip checks.
"""
from __future__ import annotations

import argparse
import shlex

from ..errors import PartitaError
from ..plan import Plan
from . import Export


FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}


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


def megatron_args(plan: Plan, model=None) -> tuple[list[str], list[str]]:
    """(arguments, warnings) for ``pretrain_gpt.py``."""
    args: list[str] = []
    warn: list[str] = []
    add = args.extend
    add(["--tensor-model-parallel-size", str(plan.tp), "--pipeline-model-parallel-size", str(plan.pp)])
    if plan.pp > 1:
        layers = model.layers if model else None
        if plan.layer_split:
            if layers is None:
                layers = sum(plan.layer_split)
            add(["--pipeline-model-parallel-layout", _layout(plan, layers)])
        elif plan.vpp > 1:
            if layers is None:
                raise PartitaError("exporting vpp > 1 to Megatron needs --model (layers per virtual stage)")
            add(["--num-layers-per-virtual-pipeline-stage", str(layers // (plan.pp * plan.vpp))])
    if plan.cp > 1:
        add(["--context-parallel-size", str(plan.cp), "--cp-comm-type", "p2p"])
    if plan.ep > 1:
        add(["--expert-model-parallel-size", str(plan.ep), "--expert-tensor-parallel-size", "1"])
    if plan.sp and plan.tp > 1:
        add(["--sequence-parallel"])
    add(["--micro-batch-size", str(plan.mbs), "--global-batch-size", str(plan.gbs), "--seq-length", str(plan.seq_len)])
    if plan.recompute == "full":
        add(["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"])
    elif plan.recompute == "selective":
        modules = ["core_attn", "layernorm"] + (["moe_act"] if model is not None and model.moe else [])
        add(["--recompute-granularity", "selective", "--recompute-modules", *modules])
        warn.append(f"recompute=selective: Megatron recomputes whole modules ({', '.join(modules)}); "
                    "partita's estimate assumed op-level selective checkpointing (a bit less memory, more recompute)")
    if plan.zero == 1:
        add(["--use-distributed-optimizer"])
    elif plan.zero >= 2:
        if plan.pp > 1:
            raise PartitaError(f"zero={plan.zero} with pp={plan.pp}: Megatron-FSDP with pipeline parallelism is not a "
                               "standard Megatron-LM path; re-plan with --zero 1 (distributed optimizer) or --pp 1")
        # Megatron-FSDP (docs/user-guide/features/megatron_fsdp.md): validate_args asserts
        # ckpt_format == "fsdp_dtensor" (arguments.py core_v0.16.1 l.690)
        add(["--use-megatron-fsdp", "--data-parallel-sharding-strategy", FSDP_STRATEGY[plan.zero],
             "--ckpt-format", "fsdp_dtensor", "--use-distributed-optimizer"])
    if plan.overlap_grad_reduce and plan.dp * plan.cp > 1:
        add(["--overlap-grad-reduce"])
    if plan.overlap_param_gather and plan.zero >= 1 and plan.dp * plan.cp > 1:
        add(["--overlap-param-gather"])
    if plan.tp_comm_overlap and plan.tp > 1:
        add(["--tp-comm-overlap"])
    if plan.dtype == "bf16":
        add(["--bf16"])
    elif plan.dtype == "fp16":
        add(["--fp16"])
    elif plan.dtype == "fp8":
        add(["--bf16", "--fp8-format", "hybrid"])
    if plan.grad_dtype == "bf16" and plan.dtype != "fp32":
        warn.append("grad_dtype=bf16: Megatron-LM reduces gradients in fp32 with --bf16; "
                    "kept fp32 (the closest exact setting)")
    if plan.schedule == "gpipe":
        warn.append("schedule=gpipe: Megatron-LM always runs 1F1B (interleaved with vpp); emitted 1F1B, "
                    "which holds fewer micro-batches in flight")
    elif plan.schedule == "zero-bubble":
        warn.append("schedule=zero-bubble: not a Megatron-LM option; emitted interleaved 1F1B (the closest)")
    if model is not None:
        args += model_args(model, plan.seq_len)
    return args, warn


def model_args(model, seq_len: int) -> list[str]:
    """The model shape as Megatron arguments (GPT / LLaMA / MoE / MLA)."""
    a = ["--num-layers", str(model.layers), "--hidden-size", str(model.hidden),
         "--ffn-hidden-size", str(model.ffn_hidden), "--num-attention-heads", str(model.heads)]
    if model.kv_heads != model.heads and not model.mla:
        a += ["--group-query-attention", "--num-query-groups", str(model.kv_heads)]
    if model.head_dim and model.head_dim * model.heads != model.hidden:
        a += ["--kv-channels", str(model.head_dim)]
    a += ["--max-position-embeddings", str(max(model.max_positions or 0, seq_len)),
          "--vocab-size", str(model.vocab)]
    if model.gated:
        a += ["--swiglu"]
    if model.norm == "rmsnorm":
        a += ["--normalization", "RMSNorm"]
    a += ["--position-embedding-type", "rope" if model.position == "rope" else "learned_absolute"]
    if not model.tied_embeddings:
        a += ["--untie-embeddings-and-output-weights"]
    if not (model.qkv_bias or model.mlp_bias or model.out_bias):
        a += ["--disable-bias-linear"]
    elif model.qkv_bias and not model.mlp_bias:
        a += ["--disable-bias-linear", "--add-qkv-bias"]
    if model.qk_norm:
        a += ["--qk-layernorm"]
    if model.moe:
        m = model.moe
        a += ["--num-experts", str(m.num_experts), "--moe-router-topk", str(m.top_k),
              "--moe-ffn-hidden-size", str(m.expert_ffn_hidden), "--moe-token-dispatcher-type", "alltoall",
              "--moe-grouped-gemm"]
        if m.shared_experts:
            a += ["--moe-shared-expert-intermediate-size", str(m.shared_experts * m.shared_ffn_hidden)]
        if m.first_dense_layers or m.layer_freq > 1:
            pattern = [0] * m.first_dense_layers + [1 if (i % m.layer_freq == 0) else 0
                                                    for i in range(model.layers - m.first_dense_layers)]
            a += ["--moe-layer-freq", "[" + ",".join(map(str, pattern)) + "]"]
    if model.mla:
        ml = model.mla
        a += ["--multi-latent-attention", "--kv-lora-rank", str(ml.kv_lora_rank),
              "--qk-head-dim", str(ml.qk_nope_head_dim), "--qk-pos-emb-head-dim", str(ml.qk_rope_head_dim),
              "--v-head-dim", str(ml.v_head_dim)]
        if ml.q_lora_rank:
            a += ["--q-lora-rank", str(ml.q_lora_rank)]
    return a


def _render(args: list[str], warnings: list[str], target: str, env: dict[str, str] | None = None) -> str:
    lines = [f"# partita export --to {target}: arguments for pretrain_gpt.py"]
    lines += [f"# export {k}={v}" for k, v in (env or {}).items()]
    lines += [f"# WARNING: {w}" for w in warnings]
    pairs: list[str] = []
    i = 0
    while i < len(args):
        j = i + 1
        while j < len(args) and not args[j].startswith("--"):
            j += 1
        pairs.append(" ".join(shlex.quote(a) for a in args[i:j]))
        i = j
    lines.append(" \\\n".join(pairs))
    return "\n".join(lines) + "\n"


def export_megatron(plan: Plan, model=None) -> Export:
    args, warn = megatron_args(plan, model)
    return Export("megatron", _render(args, warn, "megatron", env_vars(plan)), warn, args)


#: MindSpeed-LLM adds Ascend fused kernels and algorithms on top of Megatron's arguments
#: (MindSpeed / MindSpeed-LLM docs: flash attention, fused RMSNorm/SwiGLU/RoPE, MC2 for
#: TP+SP, ring-attention CP "megatron_cp_algo", MoE all-to-all overlap).
def mindspeed_args(plan: Plan, model=None) -> tuple[list[str], list[str]]:
    args, warn = megatron_args(plan, model)
    if plan.dtype == "fp8":
        raise PartitaError("dtype=fp8: Ascend 910B/910C have no fp8 matrix units (fp8 arrives with Ascend 950); "
                           "re-plan with --dtype bf16")
    extra = ["--use-flash-attn"]
    if model is None or model.position == "rope":
        extra += ["--use-fused-rotary-pos-emb", "--use-rotary-position-embeddings"]
    if model is None or model.norm == "rmsnorm":
        extra += ["--use-fused-rmsnorm"]
    if model is None or model.gated:
        extra += ["--use-fused-swiglu"]
    if plan.tp > 1 and plan.sp:
        extra += ["--use-ascend-mc2"]
        if "--tp-comm-overlap" in args:
            args.remove("--tp-comm-overlap")  # MC2 is Ascend's TP compute/communication fusion
    if plan.cp > 1:
        i = args.index("--cp-comm-type")
        del args[i:i + 2]
        extra += ["--context-parallel-algo", "megatron_cp_algo", "--use-cp-send-recv-overlap"]
    if plan.ep > 1:
        extra += ["--moe-alltoall-overlap-comm"]
    if plan.zero >= 2:
        raise PartitaError(f"zero={plan.zero}: MindSpeed-LLM supports the distributed optimizer (zero 1) only; "
                           "re-plan with --zero 1 or export to torchtitan/deepspeed")
    return args + extra, warn


def export_mindspeed(plan: Plan, model=None) -> Export:
    args, warn = mindspeed_args(plan, model)
    text = _render(args, warn, "mindspeed").replace("pretrain_gpt.py", "MindSpeed-LLM pretrain_gpt.py")
    return Export("mindspeed", text, warn, args)


# ---------------------------------------------------------------------------- parsing back
def megatron_parser() -> argparse.ArgumentParser:
    """The subset of Megatron-LM's parser our exporter emits: same option strings, types,
    choices and defaults as core_v0.16.1's ``arguments.py`` (ecosystem.md sec. 5)."""
    p = argparse.ArgumentParser(prog="pretrain_gpt.py", allow_abbrev=False)
    ints = ["--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
            "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--micro-batch-size",
            "--global-batch-size", "--seq-length", "--num-layers-per-virtual-pipeline-stage", "--recompute-num-layers",
            "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
            "--kv-channels", "--max-position-embeddings", "--vocab-size", "--num-experts", "--moe-router-topk",
            "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size", "--kv-lora-rank", "--q-lora-rank",
            "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim"]
    for flag in ints:
        p.add_argument(flag, type=int, default=None)
    flags = ["--sequence-parallel", "--use-distributed-optimizer", "--use-megatron-fsdp", "--overlap-grad-reduce",
             "--overlap-param-gather", "--tp-comm-overlap", "--bf16", "--fp16", "--group-query-attention", "--swiglu",
             "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--add-qkv-bias", "--qk-layernorm",
             "--moe-grouped-gemm", "--multi-latent-attention"]
    for flag in flags:
        p.add_argument(flag, action="store_true")
    p.add_argument("--pipeline-model-parallel-layout", default=None)
    p.add_argument("--cp-comm-type", nargs="+", default=["p2p"])
    p.add_argument("--recompute-granularity", choices=["full", "selective"], default=None)
    p.add_argument("--recompute-method", choices=["uniform", "block"], default=None)
    p.add_argument("--recompute-modules", nargs="*", default=None,
                   choices=["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"])
    p.add_argument("--data-parallel-sharding-strategy", default="no_shard",
                   choices=["no_shard", "optim", "optim_grads", "optim_grads_params"])
    p.add_argument("--fp8-format", choices=["e4m3", "hybrid"], default=None)
    p.add_argument("--normalization", choices=["LayerNorm", "RMSNorm"], default="LayerNorm")
    p.add_argument("--position-embedding-type", choices=["learned_absolute", "rope", "mrope", "relative", "none"],
                   default="learned_absolute")
    p.add_argument("--moe-token-dispatcher-type", choices=["allgather", "alltoall", "flex"], default="allgather")
    p.add_argument("--moe-layer-freq", default=1)
    return p


def mindspeed_parser() -> argparse.ArgumentParser:
    p = megatron_parser()
    for flag in ("--use-flash-attn", "--use-fused-rotary-pos-emb", "--use-rotary-position-embeddings",
                 "--use-fused-rmsnorm", "--use-fused-swiglu", "--use-ascend-mc2", "--use-cp-send-recv-overlap",
                 "--moe-alltoall-overlap-comm"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--context-parallel-algo", default="ulysses_cp_algo",
                   choices=["ulysses_cp_algo", "megatron_cp_algo", "hybrid_cp_algo", "adaptive_cp_algo",
                            "hybrid_adaptive_cp_algo"])
    return p


def plan_from_megatron(ns: argparse.Namespace, world_size: int, layers: int | None = None) -> dict:
    """The plan fields a parsed Megatron command line implies."""
    tp, pp = ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size
    cp = ns.context_parallel_size or 1
    vpp = 1
    split = None
    if ns.num_layers_per_virtual_pipeline_stage:
        vpp = (layers or ns.num_layers) // (pp * ns.num_layers_per_virtual_pipeline_stage)
    if ns.pipeline_model_parallel_layout:
        stages = ns.pipeline_model_parallel_layout.split("|")
        vpp = len(stages) // pp
        split = tuple(int(s.split("t*")[1].rstrip("L")) if "t*" in s else 0 for s in stages)
    zero = 0
    if ns.use_distributed_optimizer:
        zero = 1
    if ns.use_megatron_fsdp:
        zero = {"optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(ns.data_parallel_sharding_strategy, 0)
    dtype = "fp8" if ns.fp8_format else "bf16" if ns.bf16 else "fp16" if ns.fp16 else "fp32"
    return {"tp": tp, "pp": pp, "cp": cp, "vpp": vpp, "dp": world_size // (tp * pp * cp),
            "ep": ns.expert_model_parallel_size or 1, "sp": ns.sequence_parallel, "zero": zero,
            "mbs": ns.micro_batch_size, "gbs": ns.global_batch_size, "seq_len": ns.seq_length,
            "recompute": ns.recompute_granularity or "none", "dtype": dtype, "layer_split": split}
