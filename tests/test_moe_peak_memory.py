"""What torchtitan's MoE body saves for backward, pinned by torch's own saved-tensor hooks.

The oracle is a re-statement (not a copy) of the op sequence of torchtitan's ``MoE.forward``
(torchtitan/models/moe/moe.py at commit cbdb3113, lines 405-480) between the compiled router /
reorderer and the compiled grouped-GEMM experts: the gather of the routed rows, the fp32 score
product (``score_before_experts``) or the fp32 ``bmm`` with the scores after the experts, and
the scatter back. ``torch.autograd.graph.saved_tensors_hooks`` lists every tensor autograd
keeps; the experts and shared experts run under an inner hook that does not count (their
saved set is priced by the routed / shared terms of ``activation_bytes``).
"""
from __future__ import annotations

import pytest
import torch

from partita.cost.activations import activation_bytes, torchtitan_moe_body_bytes_per_token
from partita.cost.shape import LayerShape
from partita.spec.model import ModelSpec, MoESpec

H, E, T = 16, 4, 48


def _saved_bytes_of_body(top_k: int, score_before_experts: bool) -> int:
    """Bytes of the distinct storages autograd saves in the MoE body for ``T`` tokens."""
    torch.manual_seed(0)
    x = torch.randn(T, H, dtype=torch.bfloat16, requires_grad=True)
    gate = torch.randn(E, H, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(H, H, dtype=torch.bfloat16, requires_grad=True)
    # router + reorderer (compiled separately in torchtitan; counted by the model elsewhere)
    scores = torch.sigmoid((x @ gate.t()).float())
    top_scores, chosen = torch.topk(scores, k=top_k, dim=1)
    order = torch.argsort(chosen.view(-1), stable=True)
    sorted_scores = top_scores.view(-1)[order]

    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        saved[st.data_ptr()] = st.nbytes()
        return t

    def ignore(t: torch.Tensor) -> torch.Tensor:
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, ignore):
        routed = x[order // top_k]
        if score_before_experts:
            routed = (routed.to(torch.float32) * sorted_scores.reshape(-1, 1)).to(x.dtype)
        with torch.autograd.graph.saved_tensors_hooks(ignore, ignore):
            routed_out = routed @ w  # stand-in for the grouped-GEMM experts
            shared = x @ w  # stand-in for the shared expert
        unsorted = torch.zeros(T * top_k, H, dtype=routed_out.dtype)
        unsorted[order] = routed_out
        unsorted = unsorted.reshape(-1, top_k, H)
        if score_before_experts:
            experts = unsorted.sum(dim=1)
        else:
            experts = torch.bmm(top_scores.reshape(-1, 1, top_k), unsorted.float()).to(x.dtype).squeeze(1)
        out = shared + experts
    out.float().sum().backward()  # the graph is a valid one
    return sum(saved.values())


def _model(top_k: int) -> ModelSpec:
    return ModelSpec(name="tiny-moe", hidden=H, layers=2, heads=2, kv_heads=2, ffn_hidden=32, vocab=64,
                     moe=MoESpec(num_experts=E, top_k=top_k, expert_ffn_hidden=32, shared_experts=1,
                                 shared_ffn_hidden=32))


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("score_before_experts", [True, False])
def test_torchtitan_moe_body_saved_bytes_match_hooks(top_k: int, score_before_experts: bool) -> None:
    measured = _saved_bytes_of_body(top_k, score_before_experts)
    shape = LayerShape(tp=1, cp=1, ep=1, mbs=1, seq_len=T, sp=False, dtype="bf16", framework="torchtitan")
    assert T * torchtitan_moe_body_bytes_per_token(_model(top_k), shape) == measured


def test_moe_layer_activations_include_the_body_for_torchtitan_only() -> None:
    """The torchtitan MoE layer keeps the body's bytes on top of what Megatron's layer keeps
    (both price fused norms and the GEMM inputs, eager_activations off); a dense layer and
    Megatron's MoE layer get none of it."""
    model = _model(1)
    tt = LayerShape(tp=1, cp=1, ep=1, mbs=1, seq_len=T, sp=False, dtype="bf16", framework="torchtitan")
    mg = tt._replace(framework="megatron")
    measured = _saved_bytes_of_body(1, True)
    assert activation_bytes(model, tt, "none", True) - activation_bytes(model, mg, "none", True) == measured
    assert activation_bytes(model, tt, "none", False) == activation_bytes(model, mg, "none", False)
    assert torchtitan_moe_body_bytes_per_token(model, mg) == 0.0
