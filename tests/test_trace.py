"""partita.trace on Partita's reference models against the analytic spec (issue 19, item 1).

The oracle is the analytic model of :mod:`partita.spec.model` and :mod:`partita.cost.memory`
(parameters and FLOPs closed-form in the shapes; activation bytes from Korthikanti et al.
2022 as generalised there), plus the documented difference between the fused kernels the
cost model assumes and the unfused reference layer (the listing of
``tests/test_cost_oracles.py::unfused_dense_extra`` / ``unfused_moe_extra``, re-derived
below), and the saved-tensor figures torch recorded in ``tests/data/cost_oracles.json``.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from partita.cost.memory import activation_bytes
from partita.cost.shape import LayerShape
from partita.cost.step import FLASH_BACKWARD_PER_FORWARD
from partita.errors import PartitaError
from partita.models.llama import MODEL_PRESETS, build_model
from partita.spec.load import load_model
from partita.spec.traced import TracedSpec
from partita.tracing import trace

ORACLES = json.loads((Path(__file__).resolve().parent / "data" / "cost_oracles.json").read_text())
CASES = [("tiny-llama", 16, 1), ("tiny-llama", 64, 2), ("small-llama", 32, 2), ("small-llama", 128, 1)]
TP_PLAN = {"attention.w[qkv]": "colwise", "attention.wo": "rowwise", "feed_forward.w[13]": "colwise",
           "feed_forward.w2": "rowwise"}


def unfused_extra(spec, tokens: int, e: int) -> float:
    """Bytes the unfused reference layer saves beyond the fused-kernel accounting (dense):
    two fp32 RMSNorms save ``x * rstd`` and ``rstd`` (``(8 - e) h + 4`` per token each),
    GQA's ``repeat_interleave`` widens the saved K and V to the query width, SiLU saves its
    output (``f e``)."""
    per_token = 2 * ((8 - e) * spec.hidden + 4) + (2 * (spec.q_dim - spec.kv_dim) + spec.ffn_hidden) * e
    return tokens * per_token


def unfused_moe_extra(spec, tokens: int, e: int) -> float:
    """The MoE layer's extras (routing indices and weights, expert SiLU outputs, gathered
    expert outputs, the load fractions) besides the norms' and GQA's."""
    mo = spec.moe
    routing = 8 * mo.top_k * 2 + 4 * mo.top_k + 4 + e * mo.top_k
    ffn = e * (mo.top_k * mo.expert_ffn_hidden + mo.shared_experts * mo.shared_ffn_hidden + 2 * mo.top_k * spec.hidden)
    norms_gqa = unfused_extra(spec, 1, e) - spec.ffn_hidden * e
    return tokens * (routing + ffn + norms_gqa) + 4 * mo.num_experts


def _analytic_flops(spec, seq: int, tokens: int) -> tuple[float, float]:
    """(forward, forward + backward) FLOPs of the model: ``2 N_matmul`` per token forward,
    attention causal; backward 2x the GEMMs and 2.5x the fused attention."""
    attn = spec.attention_flops_per_token(seq, causal=True) * tokens
    gemm = 2 * spec.matmul_params_per_token() * tokens
    return gemm + attn, 3 * gemm + (1 + FLASH_BACKWARD_PER_FORWARD) * attn


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name,seq,mbs", CASES)
def test_trace_matches_analytic_dense(name, seq, mbs):
    spec = load_model(name)
    traced = trace(build_model(name, device="meta"), torch.randint(0, spec.vocab, (mbs, seq), device="meta"),
                   tp_plan=TP_PLAN)
    tokens = seq * mbs
    assert traced.total_params == pytest.approx(spec.total_params(), rel=0.01)
    fwd, train = _analytic_flops(spec, seq, tokens)
    assert traced.forward_flops == pytest.approx(fwd, rel=0.01)
    assert traced.forward_flops + traced.backward_flops == pytest.approx(train, rel=0.01)
    assert traced.block_container == "layers" and traced.layers == spec.layers and traced.pipeline
    shape = LayerShape(tp=1, cp=1, ep=1, mbs=mbs, seq_len=seq, sp=False, dtype="fp32")
    expect = activation_bytes(spec, shape, "none", False) + unfused_extra(spec, tokens, 4)
    for block in traced.blocks:
        assert block.saved_bytes == pytest.approx(expect, rel=0.05)
        assert block.recompute_bytes == pytest.approx(activation_bytes(spec, shape, "full", False), rel=0.05)
        assert block.params == pytest.approx(spec.layer_params(0), rel=0.01)
        assert block.tp_params == spec.layer_params(0) - 2 * spec.hidden  # every weight but the two norms
    # the recorded torch oracle (saved_tensors_hooks on one layer, real tensors) where the shapes agree
    for c in ORACLES["activations"]:
        if (c["model"], c["seq_len"], c["mbs"], c["dtype"], c["recompute"], c["tp"]) == (name, seq, mbs, "fp32", "none", 1):
            assert traced.blocks[0].saved_bytes == c["saved_hooks_bytes"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seq,mbs", [(16, 1), (32, 2)])
def test_trace_matches_analytic_moe(seq, mbs):
    """The reference MoE routes with ``.tolist()`` (data-dependent): it cannot run on meta,
    so it is traced with real tensors (``on="auto"`` falls back; ``on="meta"`` says why)."""
    spec = load_model("tiny-moe")
    model = build_model("tiny-moe")
    tokens = torch.randint(0, spec.vocab, (mbs, seq))
    with pytest.raises(PartitaError, match="on='real'"):
        trace(model, tokens, on="meta")
    traced = trace(model, tokens)
    assert all(p.grad is None for p in model.parameters())  # the model is untouched
    assert traced.total_params == pytest.approx(spec.total_params(), rel=0.01)
    fwd, train = _analytic_flops(spec, seq, seq * mbs)
    assert traced.forward_flops == pytest.approx(fwd, rel=0.01)
    assert traced.forward_flops + traced.backward_flops == pytest.approx(train, rel=0.01)
    shape = LayerShape(tp=1, cp=1, ep=1, mbs=mbs, seq_len=seq, sp=False, dtype="fp32")
    expect = activation_bytes(spec, shape, "none", True) + unfused_moe_extra(spec, seq * mbs, 4)
    for block in traced.blocks:
        assert block.saved_bytes == pytest.approx(expect, rel=0.05)


@pytest.mark.timeout(60)
def test_traced_spec_json_roundtrip(tmp_path):
    cfg = dataclasses.replace(MODEL_PRESETS["tiny-llama"], layers=2)
    traced = trace(build_model(cfg, device="meta"), torch.zeros(2, 8, dtype=torch.long))
    path = tmp_path / "t.json"
    traced.to_json(path)
    assert TracedSpec.load(path) == traced
    with pytest.raises(PartitaError, match="not a traced spec"):
        TracedSpec.from_dict({"format": "x"})


@pytest.mark.timeout(120)
def test_replay_traces_each_distinct_block_once():
    """Replaying identical block calls (the default) gives the figures of running every
    block, per block and in total; only the UNet's shared cross-attention context, saved
    once by the first block that uses it, is counted once per replayed block (< 0.5 %)."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from examples import traced_models
    for name in ("tiny_vit", "tiny_unet", "tiny_dit"):
        with torch.device("meta"):
            model, inputs, *plan = getattr(traced_models, name)()
        fast = trace(model, inputs, tp_plan=plan[0] if plan else None)
        full = trace(model, inputs, tp_plan=plan[0] if plan else None, replay=False)
        assert fast.forward_flops == full.forward_flops and fast.backward_flops == full.backward_flops, name
        assert fast.modules == full.modules, name
        for a, b in zip(fast.blocks, full.blocks):
            assert a.forward_flops == b.forward_flops and a.backward_flops == b.backward_flops, name
            assert a.saved_bytes == pytest.approx(b.saved_bytes, rel=0.005), name
        if name != "tiny_unet":
            assert fast.blocks == full.blocks, name


@pytest.mark.timeout(120)
def test_fast_norm_backward_changes_no_figure(monkeypatch):
    """The shape-only GroupNorm forward and GroupNorm/LayerNorm backward (tracing/fastmeta.py)
    against torch's own meta decomposition: the same output and gradient shapes, dtypes (and
    forward strides, fp32 and bf16), and the same traced spec of a diffusers UNet (GroupNorm
    and LayerNorm) with and without it."""
    import sys
    from contextlib import nullcontext
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from examples.traced_models import tiny_unet
    from partita.tracing import fastmeta, tracer

    def grads(mode) -> list:
        x = torch.empty(2, 8, 4, 4, device="meta", requires_grad=True)
        norms = [torch.nn.GroupNorm(4, 8, device="meta"), torch.nn.LayerNorm(4, device="meta")]
        with mode:
            out = sum(n(x).sum() for n in norms)
            got = torch.autograd.grad(out, [x] + [p for n in norms for p in n.parameters()])
        return [(tuple(g.shape), g.dtype, g.device.type) for g in got]

    def forward(mode, dtype) -> list:  # GroupNorm forward: out, mean, rstd
        x = torch.empty(2, 8, 4, 4, device="meta", dtype=dtype)
        w, b = torch.empty(8, device="meta", dtype=dtype), torch.empty(8, device="meta", dtype=dtype)
        with mode:
            outs = torch.ops.aten.native_group_norm(x, w, b, 2, 8, 16, 4, 1e-5)
        return [(tuple(t.shape), t.dtype, t.stride()) for t in outs]

    fast = fastmeta.FastMetaBackward()
    assert grads(fast) == grads(nullcontext())
    assert fast.hits == 3  # the GroupNorm forward and both backward ops took the shortcut
    for dtype in (torch.float32, torch.bfloat16):
        assert forward(fastmeta.FastMetaBackward(), dtype) == forward(nullcontext(), dtype), dtype
    with torch.device("meta"):
        model, inputs = tiny_unet()
    with_shortcut = trace(model, inputs, on="meta")
    monkeypatch.setattr(tracer, "FastMetaBackward", nullcontext)
    assert trace(model, inputs, on="meta") == with_shortcut
