"""Megatron-Core's module-level selective recompute (``--recompute-modules``) read into the plan
(``recompute_modules``) and its activation bytes (issue 33: Megatron-MoE-ModelZoo's DeepSeek-V3 run
on 256 H100s, ``--recompute-modules mla_up_proj moe mlp layernorm``, was ruled out at 94.7 GiB).

The module semantics are Megatron-Core's (megatron/core/transformer/transformer_config.py,
``recompute_modules``): "layernorm" discards input_layernorm's and pre_mlp_layernorm's outputs,
"mlp" / "moe" checkpoint the whole dense MLP / MoE block (its input kept), "moe_act" discards the
experts' activation output. Expected bytes are written from those tensors' shapes by hand."""
from __future__ import annotations

import shlex

import pytest

from partita.cost.activations import activation_bytes, module_recompute_bytes
from partita.cost.compute import BYTES
from partita.errors import PartitaError
from partita.imports.megatron import read_megatron
from partita.plan import Plan, check
from partita.cost.shape import layer_shape
from partita.spec.load import load_model

DSV3 = ("--num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128 "
        "--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 "
        "--v-head-dim 128 --num-experts 256 --moe-router-topk 8 --moe-ffn-hidden-size 2048 "
        "--moe-shared-expert-intermediate-size 2048 --moe-layer-freq '([0]*3+[1]*58)' --swiglu "
        "--normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights "
        "--disable-bias-linear --padded-vocab-size 129280 --bf16 --use-distributed-optimizer --seq-length 4096 ")


#: Megatron-MoE-ModelZoo@e865051 best_practice/deepseek-v3/run_deepseek_v3_h100.sh, 256 H100s at 4k tokens
LAYOUT = ("--pipeline-model-parallel-size 8 --expert-model-parallel-size 32 --expert-tensor-parallel-size 1 "
          "--pipeline-model-parallel-layout 'Et*2|(tt|)*22t|(tt|)*7mL' --micro-batch-size 1 --global-batch-size 8192 "
          "--fp8-format e4m3 --fp8-recipe blockwise --use-precision-aware-optimizer "
          "--optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d ")


def read(text: str, world: int):
    return read_megatron(shlex.split(text), world)


@pytest.mark.parametrize("flags,modules", [
    ("--recompute-granularity selective --recompute-modules mla_up_proj moe mlp layernorm",
     "mla_up_proj,moe,mlp,layernorm"),
    ("--recompute-granularity selective --recompute-modules moe_act layernorm", "moe_act,layernorm"),
    # no --recompute-modules: Megatron-Core's default list, ["core_attn"] (transformer_config.py __post_init__)
    ("--recompute-granularity selective", "core_attn"),
    ("--recompute-activations", "core_attn"),  # arguments.py: sets recompute_granularity = 'selective'
    ("--recompute-granularity selective --recompute-modules moe_act mhc", ""),  # mhc: not modelled, stays named
    ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 --recompute-modules moe", ""),
])
def test_recompute_modules_are_read_with_selective_recompute(flags, modules):
    r = read(DSV3 + LAYOUT + flags, 256)
    # order-free: the plan may hold them canonically sorted
    assert sorted(filter(None, r.plan.recompute_modules.split(","))) == sorted(filter(None, modules.split(",")))
    note = [n for n in r.not_modelled if n.startswith("--recompute-modules")]
    if modules and "--recompute-modules" in flags:
        assert note and "memory is modelled" in note[0]
    elif "--recompute-modules" in flags:
        assert note and "estimated as Megatron-Core's default, core_attn" in note[0]


def _layer(model_name: str, **fields):
    plan = Plan(dp=8, gbs=8, seq_len=4096, recompute="selective", **fields)
    return load_model(model_name), layer_shape(plan)


def _saved(model_name: str, modules: set, moe: bool, **fields) -> float:
    """Bytes a layer no longer keeps under ``modules`` against recompute none, per micro-batch."""
    model, shape = _layer(model_name, **fields)
    return activation_bytes(model, shape, "none", moe) - module_recompute_bytes(model, shape, frozenset(modules), moe)


E, S = BYTES["bf16"], 4096  # bf16 activations, micro-batch 1 x 4096 tokens


# Megatron-Core discards a norm's output only where the norm is its own module (transformer_layer.py:
# ``if not isinstance(self.input_layernorm, IdentityOp)``); the Transformer Engine spec
# (gpt_layer_specs.py) fuses non-MLA attention's input norm into linear_qkv and, on dense layers, the
# pre-MLP norm into linear_fc1 (pre_mlp_layernorm=IdentityOp unless num_experts).
@pytest.mark.parametrize("model_name,moe,tensors", [
    ("llama3-8b", False, 0),      # dense, non-MLA: both norms fused, nothing to discard
    ("qwen3-30b-a3b", True, 1),   # MoE, non-MLA: pre_mlp_layernorm is a module, input norm fused
    ("deepseek-v3", True, 2),     # MLA + MoE: both are modules
    ("deepseek-v3", False, 1),    # MLA, dense (first 3 layers): input_layernorm only
])
def test_layernorm_discards_only_unfused_norm_outputs(model_name, moe, tensors):
    hidden = {"llama3-8b": 4096, "qwen3-30b-a3b": 2048, "deepseek-v3": 7168}[model_name]
    assert _saved(model_name, {"layernorm"}, moe, tp=1, ep=8 if moe else 1) == pytest.approx(tensors * S * hidden * E)


def test_layernorm_on_megatrons_local_spec_discards_both():
    # framework mindspeed is priced with the local spec (--transformer-impl local): two [s, b, h] norm outputs
    assert _saved("llama3-8b", {"layernorm"}, False, tp=1, framework="mindspeed") == pytest.approx(2 * S * 4096 * E)


def test_mlp_discards_the_gated_mlps_intermediates_and_the_fused_norm_output():
    # linear_fc1's output [s, b, 2f/tp] and the SwiGLU output [s, b, f/tp]; the checkpoint's input is the
    # pre-norm residual, so the norm output fused linear_fc1 (TE LayerNormLinear) saved goes too: [s/tp, b, h]
    assert _saved("llama3-8b", {"mlp"}, False, tp=2, sp=True) == pytest.approx(
        S * 3 * 14336 / 2 * E + S * 4096 / 2 * E)
    # with layernorm too nothing more goes (both norms are fused)
    assert _saved("llama3-8b", {"mlp", "layernorm"}, False, tp=2, sp=True) == pytest.approx(
        S * 3 * 14336 / 2 * E + S * 4096 / 2 * E)


# qwen3-30b-a3b: h 2048, 128 experts, top-8, expert ffn 768, SwiGLU; tp 1, etp 1
QWEN_MOE = S * (8 * (2048 * E + 3 * 768 * E) + 128 * 4)  # permuted inputs, fc1 out + act out, fp32 router probs
QWEN_ACT = S * 8 * 768 * E  # the experts' SwiGLU output
# deepseek-v3: one shared expert of ffn 2048, SwiGLU
DSV3_SHARED = S * 3 * 2048 * E


@pytest.mark.parametrize("model_name,modules,saved", [
    ("qwen3-30b-a3b", {"moe"}, QWEN_MOE),
    ("qwen3-30b-a3b", {"moe_act"}, QWEN_ACT),
    ("qwen3-30b-a3b", {"moe", "moe_act"}, QWEN_MOE),  # moe_act's output is inside the moe checkpoint
    ("deepseek-v3", {"shared_experts"}, DSV3_SHARED),
    ("deepseek-v3", {"moe_act", "shared_experts"}, S * 8 * 2048 * E + DSV3_SHARED),
])
def test_moe_modules_discard_what_their_checkpoints_hold(model_name, modules, saved):
    assert _saved(model_name, modules, True, tp=1, ep=8) == pytest.approx(saved)


def test_unfused_attention_probabilities_stay_unless_core_attn_is_recomputed():
    # Megatron recomputes the core attention (softmax output, b x a x s x s) only under "core_attn"
    from partita.cost.activations import _activations_per_chunk
    from partita.cost.placement import rank_shapes
    model = load_model("llama3-8b")
    base = Plan(dp=8, gbs=8, seq_len=4096, recompute="selective", attention="unfused")
    shape = rank_shapes(model, base)[0]
    probs = 32 * 4096 * 4096 * E  # 32 heads, one layer
    mlp = _activations_per_chunk(model, base.with_(recompute_modules="mlp"), shape)
    both = _activations_per_chunk(model, base.with_(recompute_modules="mlp,core_attn"), shape)
    lse = S * 32 * 4  # the fp32 log-sum-exp core_attn also discards
    assert mlp - both == pytest.approx(32 * (probs + lse))


def test_recompute_modules_need_selective_and_known_modules():
    with pytest.raises(PartitaError) as e:
        check(Plan(dp=8, gbs=8, recompute="full", recompute_modules="moe"), None, 8)
    assert "needs recompute selective" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(PartitaError, match="mhc"):
        check(Plan(dp=8, gbs=8, recompute="selective", recompute_modules="moe,mhc"), None, 8)


def test_modelzoo_deepseek_v3_4k_on_256_h100s_is_not_ruled_out():
    # it ran (ModelZoo's published H100 recipe); with Partita's op-level selective it was 94.7 GiB, P(fit) 0.03
    from partita.estimate import estimate
    from partita.spec.hardware import make_cluster
    model = load_model("deepseek-v3")
    argv = shlex.split(DSV3 + LAYOUT + "--recompute-granularity selective "
                       "--recompute-modules mla_up_proj moe mlp layernorm --mtp-num-layers 1")
    plan = read_megatron(argv, 256, model).plan
    cluster = make_cluster("h100-sxm", 256)
    assert estimate(model, cluster, plan).p_fit >= 0.05
    assert estimate(model, cluster, plan.with_(recompute_modules="")).p_fit < 0.05


def test_the_plan_summary_names_a_module_list():
    """Two selective plans that recompute different modules were summarized alike (a table of
    the search's plans showed two equal rows); the list is named, the default is not."""
    default = Plan(dp=8, gbs=8, recompute="selective")
    listed = Plan(dp=8, gbs=8, recompute="selective", recompute_modules="mlp,core_attn")
    assert default.summary().endswith("rc-selective")
    assert f"rc-selective[{listed.recompute_modules}]" in listed.summary()
    assert set(listed.recompute_modules.split(",")) == {"mlp", "core_attn"}
