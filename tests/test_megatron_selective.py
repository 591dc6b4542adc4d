"""``recompute=selective`` priced as the framework runs it (cost/frameworks.py ``selective_modules``).

Megatron-Core's ``--recompute-granularity selective`` without ``--recompute-modules`` recomputes its
default module list, ``["core_attn"]`` (megatron/core/transformer/transformer_config.py
``__post_init__``; attention.py ``_checkpointed_attention_forward`` wraps the core attention in
``tensor_parallel.checkpoint``, a reentrant checkpoint). Before, a megatron plan's selective was
priced as torchtitan's op-level SAC: llama3-8b tp4 seq 8192 124 MiB a layer where Partita's core_attn
pricing keeps 272 (Partita's own figure, not a measurement under Megatron).

Oracles from outside the cost model:
* memory: ``torch.autograd.graph.saved_tensors_hooks`` on a small Megatron-style layer (fused QKV
  projection, flash-style core attention, out-projection, SwiGLU MLP) with and without its core
  attention wrapped in a reentrant ``torch.utils.checkpoint`` (as Megatron's CheckpointFunction):
  the bytes the checkpoint frees per token must be what the estimate stops charging;
* time: ``torch.utils.flop_counter.FlopCounterMode`` over the recomputed module's forward (the core
  attention; the MLP for ``recompute_modules=mlp``) must be the recompute FLOPs the step terms charge.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import saved_storages
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from partita.cost import comm
from partita.cost.activations import activation_bytes_per_layer
from partita.cost.frameworks import FRAMEWORKS, MODULE_SELECTIVE_FRAMEWORKS, selective_modules
from partita.cost.step import stage_terms
from partita.estimate import estimate
from partita.export.megatron import written_recompute_modules
from partita.plan import Plan
from partita.search import SearchSpace, search_plans
from partita.spec.hardware import make_cluster
from partita.spec.load import load_model
from partita.spec.model import ModelSpec

#: a small Llama-style model with GQA (the layer below is built from it)
MODEL = ModelSpec(name="megsel-tiny", hidden=64, layers=2, heads=4, kv_heads=2, ffn_hidden=128, vocab=256)
CLUSTER = make_cluster("h100", 8)


def _layer_weights(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    m, d = MODEL, MODEL.hidden // MODEL.heads

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.05).to(dtype).requires_grad_()
    return {"qkv": w(m.hidden + 2 * m.kv_heads * d, m.hidden), "proj": w(m.hidden, m.hidden),
            "fc1": w(2 * m.ffn_hidden, m.hidden), "fc2": w(m.hidden, m.ffn_hidden)}


def _core_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Megatron's core attention (flash: GQA K/V unexpanded, output [b, s, h] for linear_proj)."""
    b, s = q.shape[0], q.shape[2]
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return out.transpose(1, 2).reshape(b, s, -1)  # a view: the out-projection saves the kernel's output


def _layer(x: torch.Tensor, w: dict[str, torch.Tensor], wrap_core_attn: bool) -> torch.Tensor:
    """A Megatron-style layer: (fused norm +) QKV, core attention, out-projection, SwiGLU MLP."""
    m, d = MODEL, MODEL.hidden // MODEL.heads
    b, s, _ = x.shape
    qkv = F.linear(x, w["qkv"])
    q, k, v = qkv.split([m.hidden, m.kv_heads * d, m.kv_heads * d], dim=-1)
    q = q.view(b, s, m.heads, d).transpose(1, 2)
    k = k.view(b, s, m.kv_heads, d).transpose(1, 2)
    v = v.view(b, s, m.kv_heads, d).transpose(1, 2)
    if wrap_core_attn:  # attention.py _checkpointed_attention_forward: a reentrant checkpoint of the core only
        ctx = checkpoint(_core_attention, q, k, v, use_reentrant=True)
    else:
        ctx = _core_attention(q, k, v)
    h = x + F.linear(ctx, w["proj"])
    a, g = F.linear(h, w["fc1"]).chunk(2, dim=-1)
    return h + F.linear(F.silu(a) * g, w["fc2"])


def _saved_bytes(b: int, s: int, wrap: bool) -> int:
    """Bytes of the distinct storages autograd saves for one forward of the layer."""
    w = _layer_weights(torch.bfloat16)
    params = {t.untyped_storage().data_ptr() for t in w.values()}
    x = torch.randn(b, s, MODEL.hidden, dtype=torch.bfloat16, requires_grad=True)
    with saved_storages(params) as storages:
        out = _layer(x, w, wrap)
    out.sum().backward()  # the wrapped layer's backward runs (reentrant recompute) and agrees with it
    return sum(storages.values())


def _plan(**kw) -> Plan:
    return Plan(**{"dp": 1, "gbs": 2, "mbs": 2, "seq_len": 64, "dtype": "bf16", **kw})


def test_the_rule_prices_megatrons_default_module_and_op_level_elsewhere():
    """megatron / mindspeed: core_attn (Megatron-Core's default); every other framework: op-level
    SAC (empty); a named list is that list under any framework; no selective: nothing."""
    assert MODULE_SELECTIVE_FRAMEWORKS == {"megatron", "mindspeed"}
    for fw in FRAMEWORKS:
        want = frozenset({"core_attn"}) if fw in MODULE_SELECTIVE_FRAMEWORKS else frozenset()
        assert selective_modules(fw, "selective", "") == want
        assert selective_modules(fw, "selective", "mlp,core_attn") == {"mlp", "core_attn"}
        assert selective_modules(fw, "full", "") == frozenset() == selective_modules(fw, "none", "")


def test_core_attn_checkpoint_frees_what_the_estimate_stops_charging():
    """Saved-tensor oracle: wrapping the core attention in a reentrant checkpoint frees, per token,
    exactly the bytes the megatron estimate of selective stops charging against recompute none
    (the kernel's fp32 log-sum-exp: Q, K, V stay as the checkpoint's inputs, the output as the
    out-projection's). The old op-level pricing stopped charging 4x more per token (q/k/v, norms,
    MLP intermediates) - what torchtitan's SAC frees, not Megatron."""
    b, s1, s2 = 2, 32, 64
    freed = [_saved_bytes(b, s, False) - _saved_bytes(b, s, True) for s in (s1, s2)]
    oracle_per_token = (freed[1] - freed[0]) / (b * (s2 - s1))  # slope: no per-call constants
    plan = _plan(seq_len=s2)
    none = activation_bytes_per_layer(MODEL, plan, False, "none")
    for fw in MODULE_SELECTIVE_FRAMEWORKS:
        sel = activation_bytes_per_layer(MODEL, plan.with_(framework=fw, recompute="selective"), False)
        assert (none - sel) / (plan.mbs * plan.seq_len) == pytest.approx(oracle_per_token, rel=1e-9)
    # op-level frameworks keep their op-level pricing: it frees far more than the core_attn checkpoint
    titan = activation_bytes_per_layer(MODEL, plan.with_(framework="torchtitan", recompute="selective"), False)
    assert (none - titan) / (plan.mbs * plan.seq_len) > 4 * oracle_per_token
    # a megatron plan with the default list named prices the same bytes as without it
    named = plan.with_(recompute="selective", recompute_modules="core_attn")
    assert activation_bytes_per_layer(MODEL, named, False) == \
        activation_bytes_per_layer(MODEL, plan.with_(recompute="selective"), False)


def _recompute_flops(plan: Plan) -> float:
    """FLOPs a dense layer's recompute adds per micro-batch (step terms: selective - none)."""
    sel = stage_terms(MODEL, CLUSTER, plan)[0].dense
    none = stage_terms(MODEL, CLUSTER, plan.with_(recompute="none", recompute_modules=""))[0].dense
    return sel.flops - none.flops


def _counted(fn, *args) -> int:
    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


@pytest.mark.parametrize("attention", ["fused", "unfused"])
def test_core_attn_recompute_time_is_the_core_attentions_forward(attention):
    """FlopCounterMode over the recomputed module (the core attention, run by SDPA's math path so
    that torch counts its two batched GEMMs): unfused attention computes the whole score square, as
    counted; a flash kernel skips the causal mask's upper half, (s + 1) / 2s of it (the cost model's
    documented causal halving, cost/compute.py). The old code charged op-level SAC's GEMM share and
    element-wise ops instead. The time is those FLOPs at the attention efficiency (fused)."""
    b, s, m = 2, 64, MODEL
    d = m.hidden // m.heads
    q = torch.randn(b, m.heads, s, d)
    k = torch.randn(b, m.kv_heads, s, d)
    with sdpa_kernel(SDPBackend.MATH):
        counted = _counted(_core_attention, q, k, k)
    plan = _plan(mbs=b, seq_len=s, recompute="selective", attention=attention)
    want = counted if attention == "unfused" else counted * (s + 1) / (2 * s)
    assert _recompute_flops(plan) == pytest.approx(want, rel=1e-12)
    if attention == "fused":
        dev = CLUSTER.device
        rc = stage_terms(MODEL, CLUSTER, plan)[0].dense.recompute
        assert rc == pytest.approx(want / (dev.peak_flops("bf16") * dev.efficiency.attention), rel=1e-9)
    # torchtitan's op-level SAC keeps its own recompute (every other GEMM): not the core attention
    assert _recompute_flops(plan.with_(framework="torchtitan")) != pytest.approx(want, rel=1e-3)


def test_named_mlp_recompute_time_is_the_mlps_forward():
    """An explicit ``recompute_modules=mlp`` is timed as the MLP's forward (FlopCounterMode over
    fc1 + SwiGLU + fc2), under any framework (before: op-level SAC's share whatever the list)."""
    b, s, m = 2, 64, MODEL
    w = _layer_weights(torch.float32)
    h = torch.randn(b, s, m.hidden)

    def mlp(h):
        a, g = F.linear(h, w["fc1"]).chunk(2, dim=-1)
        return F.linear(F.silu(a) * g, w["fc2"])
    counted = _counted(mlp, h)
    for fw in ("megatron", "torchtitan"):
        plan = _plan(mbs=b, seq_len=s, recompute="selective", recompute_modules="mlp", framework=fw)
        assert _recompute_flops(plan) == pytest.approx(counted, rel=1e-12)
    # with tp the checkpointed MLP (transformer_layer.py _forward_mlp) reruns its forward collective: one
    # more of the layer's four (attention and MLP, forward and backward) tp collectives
    plan = _plan(dp=1, tp=2, sp=True, seq_len=s, recompute="selective", recompute_modules="mlp")
    sel = stage_terms(MODEL, CLUSTER, plan)[0].dense.tp_comm
    none = stage_terms(MODEL, CLUSTER, plan.with_(recompute="none", recompute_modules=""))[0].dense.tp_comm
    host = CLUSTER.device.efficiency.tp_framework_us_per_layer * 1e-6
    assert sel - none == pytest.approx((none - host) / 4, rel=1e-9) and sel > none


def test_core_attn_recompute_reruns_the_context_parallel_exchange():
    """With cp the K/V exchange runs inside the core attention (Megatron's TEDotProductAttention
    -> TransformerEngine's AttnFuncWithCPAndKVP2P, whose forward sends and receives the K/V
    chunks: context_parallel.py d0067d0da6 l.1356, l.1707), so the checkpointed core_attn reruns
    it in the backward: the cp term grows by one forward exchange, as under full recompute.
    Without recompute the ring runs once forward and twice backward (dK and dV), the all-gather
    once each way (K/V gathered forward, gradients reduce-scattered backward)."""
    for fw in ("megatron", "partita"):  # the ring p2p and the all-gather exchange (cp_kv_all_gather)
        plan = _plan(cp=2, seq_len=4096, framework=fw)
        none, attn, mlp, full = (stage_terms(MODEL, CLUSTER, plan.with_(**kw))[0].dense.cp_comm for kw in (
            {}, {"recompute": "selective", "recompute_modules": "core_attn"},
            {"recompute": "selective", "recompute_modules": "mlp"}, {"recompute": "full"}))
        assert none > 0 and mlp == none  # recomputing the MLP reruns no exchange
        assert attn == full > none
        if fw == "megatron":
            assert attn - none == pytest.approx(none / 3, rel=1e-12)
        else:
            # one more all-gather each of K and V: the gathered [mbs 2, seq 4096, kv_dim] bf16 buffer
            # over the 2 cp ranks inside one node
            ag = comm.all_gather(CLUSTER.device, 2 * 4096 * MODEL.kv_dim * 2, 2, 1)
            assert attn - none == pytest.approx(2 * ag, rel=1e-12)


def test_export_writes_what_the_estimate_priced_without_a_warning():
    """framework megatron: the export writes core_attn (what was priced) and warns of nothing;
    an op-level framework's plan still gets the nearest modules and the warning with both figures."""
    model = load_model("llama3-8b")
    plan = Plan(dp=2, tp=4, sp=True, zero=1, gbs=16, seq_len=8192, recompute="selective")
    assert written_recompute_modules(plan, model) == ["core_attn"]
    from partita.export import export
    out = export("megatron", plan, model)
    assert not [w for w in out.warnings if w.startswith("recompute=selective")]
    # regression pin, not an oracle: 272 MiB a layer (llama3-8b tp4 sp seq 8192) is Partita's own figure for
    # Megatron's core_attn selective; the oracle for the bytes freed is the saved_tensors_hooks
    # test above (test_core_attn_checkpoint_frees_what_the_estimate_stops_charging)
    assert activation_bytes_per_layer(model, plan, False) / 2**20 == pytest.approx(272.0, abs=0.5)
    titan = plan.with_(framework="torchtitan")
    assert activation_bytes_per_layer(model, titan, False) / 2**20 == pytest.approx(124.25, abs=0.5)
    assert any(w.startswith("recompute=selective") for w in export("megatron", titan, model).warnings)


def test_search_prices_megatron_selective_candidates_module_level():
    """The search's selective candidates under framework megatron are priced as core_attn: each
    estimate equals the estimate of the same plan with the module named."""
    result = search_plans(MODEL, make_cluster("h100", 8), 16, 2048,
                          SearchSpace(recompute="selective", options={"framework": "megatron"}), top=2)
    sel = [a for a in result.attempts if a.estimate is not None and a.plan.recompute == "selective"]
    assert sel
    for a in sel[:4]:
        named = estimate(MODEL, make_cluster("h100", 8), a.plan.with_(recompute_modules="core_attn"))
        assert (a.estimate.peak_memory_gib, a.estimate.step_time_s) == (named.peak_memory_gib, named.step_time_s)
        titan = estimate(MODEL, make_cluster("h100", 8), a.plan.with_(framework="torchtitan"))
        assert titan.peak_memory_gib < a.estimate.peak_memory_gib
