"""Megatron-LM (and MindSpeed-LLM) command-line arguments for a plan.

Flag names are the current ones of Megatron-LM core_v0.16 (verified against its real
``arguments.py`` parser, docs/reference/ecosystem.md sec. 5): no deprecated spellings
(``--checkpoint-activations``, ``--recompute-activations``, ``--moe-extended-tp``,
``--use-mcore-models``, ``--virtual-pipeline-model-parallel-size`` are not emitted).
Tests parse every export with Megatron's own option table (tests/export_oracles/megatron_flags.json,
dumped from core_v0.16.1's parser) and tests/export_oracles/megatron_real_check.py runs the real
``parse_args`` + ``validate_args`` where a Megatron-LM checkout is at hand.
"""
from __future__ import annotations

import shlex

from ..errors import PartitaError
from ..plan import Plan
from .result import Export


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


def _recompute_args(plan: Plan, model, warn: list[str]) -> list[str]:
    """Megatron's recompute flags for the plan: full (every layer: uniform with 1 layer per
    group; the first N of each stage/chunk: the block method, transformer_block.py
    ``_checkpointed_forward``: ``layer_idx < recompute_num_layers``) or selective modules."""
    if plan.recompute == "full" and plan.recompute_layers:
        return ["--recompute-granularity", "full", "--recompute-method", "block",
                "--recompute-num-layers", str(plan.recompute_layers)]
    if plan.recompute == "full":
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if plan.recompute == "selective":
        modules = ["core_attn", "layernorm"] + (["moe_act"] if model is not None and model.moe else [])
        warn.append(f"recompute=selective: Megatron recomputes whole modules ({', '.join(modules)}); "
                    "partita's estimate assumed op-level selective checkpointing (a bit less memory, more recompute)")
        return ["--recompute-granularity", "selective", "--recompute-modules", *modules]
    return []


def megatron_args(plan: Plan, model=None, fsdp: str = "megatron") -> tuple[list[str], list[str]]:
    """(arguments, warnings) for ``pretrain_gpt.py``; ``fsdp`` picks Megatron-FSDP or torch FSDP2
    for zero 2/3 (MindSpeed-LLM runs the latter)."""
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
    if plan.ep > 1 or plan.etp > 1:
        # always written: Megatron's default (None) means etp = tp, not the plan's etp
        # (arguments.py core_v0.16.1, --expert-tensor-parallel-size; parallel_state.py folds
        # the expert grid etp x ep x edp out of tp x cp x dp)
        add(["--expert-model-parallel-size", str(plan.ep), "--expert-tensor-parallel-size", str(plan.etp)])
    if plan.sp and plan.tp > 1:
        add(["--sequence-parallel"])
    add(["--micro-batch-size", str(plan.mbs), "--global-batch-size", str(plan.gbs), "--seq-length", str(plan.seq_len)])
    add(_recompute_args(plan, model, warn))
    if plan.zero == 1:
        add(["--use-distributed-optimizer"])
        if 0 < plan.dp_shard < plan.dp:
            # HSDP of the optimizer (ZeRO-1 within groups of dp_shard, replicated across): Megatron-Core's
            # DDP shards within each of num_distributed_optimizer_instances groups and all-reduces
            # across them (distributed/param_and_grad_buffer.py; it needs the distributed optimizer)
            add(["--num-distributed-optimizer-instances", str(plan.dp // plan.dp_shard)])
    elif plan.zero >= 2 and 0 < plan.dp_shard < plan.dp:
        warn.append(f"dp_shard={plan.dp_shard}: HSDP under FSDP is not emitted; {target_fsdp(fsdp)} shards over all "
                    f"dp={plan.dp} ranks (less memory, more all-gather traffic than planned)")
    if plan.zero >= 2 and fsdp == "torch":
        add(_torch_fsdp2_args(plan, model, warn))
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
    if plan.overlap_param_gather and "--use-distributed-optimizer" in args and plan.dp * plan.cp > 1:
        add(["--overlap-param-gather"])
    if plan.tp_comm_overlap and plan.tp > 1:
        add(["--tp-comm-overlap"])
    if plan.attention == "unfused":  # Megatron-Core AttnBackend.unfused: softmax probabilities kept for backward
        add(["--attention-backend", "unfused"])
    if plan.dtype == "bf16":
        add(["--bf16"])
    elif plan.dtype == "fp16":
        add(["--fp16"])
    elif plan.dtype == "fp8":
        add(["--bf16", "--fp8-format", "hybrid"])
    if plan.grad_dtype == "bf16" and plan.dtype != "fp32":
        add(["--grad-reduce-in-bf16"])  # Megatron-Core DDP: gradient buffers and reduction in bf16
    warn += comm_knob_warnings(plan)
    if plan.ddp_bucket_mb and plan.dp * plan.cp > 1:  # --ddp-bucket-size counts elements, not bytes
        add(["--ddp-bucket-size", str(plan.ddp_bucket_mb * 2**20 // (2 if plan.grad_dtype == "bf16" else 4))])
    if plan.schedule == "gpipe":
        warn.append("schedule=gpipe: Megatron-LM always runs 1F1B (interleaved with vpp); emitted 1F1B, "
                    "which holds fewer micro-batches in flight")
    elif plan.schedule == "zero-bubble":
        warn.append("schedule=zero-bubble: not a Megatron-LM option; emitted interleaved 1F1B (the closest)")
    if model is not None:
        args += model_args(model, plan.seq_len)
    return args, warn


def target_fsdp(fsdp: str) -> str:
    """The FSDP a zero 2/3 export runs, by name (for warnings)."""
    return "torch FSDP2" if fsdp == "torch" else "Megatron-FSDP"


def _torch_fsdp2_args(plan: Plan, model, warn: list[str]) -> list[str]:
    """``--use-torch-fsdp2`` and the rules Megatron's validate_args asserts for it (arguments.py
    core_v0.16.1 l.605-621: pp 1, ep 1, no distributed optimizer, ckpt torch_dist/torch_dcp,
    untied embeddings, no fp16)."""
    for bad, why in ((plan.pp > 1, f"pp={plan.pp}"), (plan.ep > 1, f"ep={plan.ep}"), (plan.dtype == "fp16", "fp16"),
                     (model is not None and model.tied_embeddings, "tied embeddings")):
        if bad:
            raise PartitaError(f"zero={plan.zero} with {why}: --use-torch-fsdp2 is not supported with {why} "
                               "(Megatron validate_args); re-plan with --zero 1")
    if plan.zero == 2:
        warn.append("zero=2: torch FSDP2 also shards parameters (ZeRO-3-like): less memory than planned, "
                    "one more all-gather per micro-batch")
    return ["--use-torch-fsdp2", "--ckpt-format", "torch_dist", "--no-gradient-accumulation-fusion"]


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


def export_megatron(plan: Plan, model=None) -> Export:
    args, warn = megatron_args(plan, model)
    return Export("megatron", _render(args, warn, "megatron", env_vars(plan)), warn, args)


#: MindSpeed-LLM adds Ascend fused kernels and algorithms on top of Megatron's arguments
#: (MindSpeed / MindSpeed-LLM docs: flash attention, fused RMSNorm/SwiGLU/RoPE, MC2 for
#: TP+SP, ring-attention CP "megatron_cp_algo", MoE all-to-all overlap).
def mindspeed_args(plan: Plan, model=None) -> tuple[list[str], list[str]]:
    args, warn = megatron_args(plan, model, fsdp="torch")
    if plan.dtype == "fp8":
        raise PartitaError("dtype=fp8: Ascend 910B/910C have no fp8 matrix units (fp8 arrives with Ascend 950); "
                           "re-plan with --dtype bf16")
    # npu_fusion_attention, or (unfused) the core attention Megatron's --attention-backend selects
    extra = [] if plan.attention == "unfused" else ["--use-flash-attn"]
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
    if "--moe-layer-freq" in args:  # MindSpeed-LLM takes an int frequency plus --first-k-dense-replace
        i = args.index("--moe-layer-freq")
        del args[i:i + 2]
        extra += ["--first-k-dense-replace", str(model.moe.first_dense_layers), "--moe-layer-freq",
                  str(model.moe.layer_freq)]
    return args + extra, warn


def export_mindspeed(plan: Plan, model=None) -> Export:
    args, warn = mindspeed_args(plan, model)
    text = _render(args, warn, "mindspeed", env_vars(plan)).replace("pretrain_gpt.py", "MindSpeed-LLM pretrain_gpt.py")
    return Export("mindspeed", text, warn, args)
