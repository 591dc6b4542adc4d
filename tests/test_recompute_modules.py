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
    ("--recompute-granularity selective", ""),  # Partita's op-level selective, as before
    ("--recompute-granularity selective --recompute-modules moe_act mhc", ""),  # mhc: not modelled, stays named
    ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 --recompute-modules moe", ""),
])
def test_recompute_modules_are_read_with_selective_recompute(flags, modules):
    r = read(DSV3 + LAYOUT + flags, 256)
    assert r.plan.recompute_modules == modules
    note = [n for n in r.not_modelled if n.startswith("--recompute-modules")]
    if modules:
        assert note and "memory is modelled" in note[0]
    elif "--recompute-modules" in flags:
        assert note and "estimated as Partita's selective" in note[0]


def _layer(model_name: str, **fields):
    plan = Plan(dp=8, gbs=8, seq_len=4096, recompute="selective", **fields)
    return load_model(model_name), layer_shape(plan)


def test_layernorm_discards_the_two_norm_outputs():
    model, shape = _layer("llama3-8b", tp=1)
    none = activation_bytes(model, shape, "none", False)
    saved = none - module_recompute_bytes(model, shape, frozenset({"layernorm"}), False)
    assert saved == pytest.approx(2 * 4096 * model.hidden * BYTES["bf16"])  # two [s, b, h] bf16 tensors


def test_mlp_discards_the_gated_mlps_intermediates():
    model, shape = _layer("llama3-8b", tp=2, sp=True)
    none = activation_bytes(model, shape, "none", False)
    saved = none - module_recompute_bytes(model, shape, frozenset({"mlp"}), False)
    # linear_fc1's output [s, b, 2f/tp] and the SwiGLU output [s, b, f/tp], bf16
    assert saved == pytest.approx(4096 * 3 * model.ffn_hidden / 2 * BYTES["bf16"])


def test_moe_checkpoint_keeps_what_a_dense_mlp_checkpoint_keeps():
    # "moe" and "mlp" are both normal checkpoints of the block after pre_mlp_layernorm: only the
    # block's input (counted outside the block) and the attention half stay
    model, shape = _layer("qwen3-30b-a3b", tp=1, ep=8)
    assert module_recompute_bytes(model, shape, frozenset({"moe"}), True) == pytest.approx(
        module_recompute_bytes(model, shape, frozenset({"mlp"}), False))
    assert module_recompute_bytes(model, shape, frozenset({"moe_act"}), True) < activation_bytes(
        model, shape, "none", True)


def test_recompute_modules_need_selective_and_known_modules():
    with pytest.raises(PartitaError) as e:
        check(Plan(dp=8, gbs=8, recompute="full", recompute_modules="moe"), None, 8)
    assert "needs recompute selective" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(PartitaError, match="unknown mhc"):
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
