"""torchao's float8 tensor parallel reaches the attention block of MoE layers too.

torchtitan's ``apply_non_moe_tp`` (torchtitan/models/llama4/infra/parallelize.py, 05a6cb3895)
builds every transformer block's plan with ``prepare_module_input`` on ``attention`` and the
float8 colwise / rowwise styles on wq, wk, wv, wo - the MLP's entries alone sit under ``if not
transformer_block.moe_enabled``. So a MoE layer's tp collectives (its attention block's, the
only ones the step model charges it) carry an fp8 all-gather beside a 16-bit reduce-scatter,
as a dense layer's do (cost/step.py).

Oracle: torch's element sizes for the share (an all-gather of 1-byte elements, a
reduce-scatter of 2-byte ones, half the traffic each) and the rowwise recipe, which torchtitan
runs with a plain 16-bit all-gather, as the reference the tensorwise plan is compared with.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from partita.cost.step import stage_terms
from partita.plan import Plan
from partita.spec.hardware import make_cluster
from partita.spec.load import load_model


def _tp_comm(plan: Plan, kind: str) -> float:
    model = load_model("mixtral-8x7b")
    cluster = make_cluster("h100-sxm", devices=plan.dp * plan.tp)
    terms, _ = stage_terms(model, cluster, plan)
    return getattr(terms, kind).tp_comm


def test_moe_layer_attention_takes_the_fp8_all_gather_share() -> None:
    tensorwise = Plan(dp=2, tp=4, sp=True, mbs=1, gbs=2, seq_len=4096, dtype="fp8", framework="torchtitan")
    rowwise = dataclasses.replace(tensorwise, fp8_recipe="rowwise")
    fp8 = torch.empty(0, dtype=torch.float8_e4m3fn).element_size()
    bf16 = torch.empty(0, dtype=torch.bfloat16).element_size()
    share = 0.5 * fp8 / bf16 + 0.5  # all-gather at 1 byte, reduce-scatter at 2
    # the rowwise plan's tp traffic is the 16-bit baseline (torchtitan: "For rowwise recipes, we
    # use regular TP and all-gather happens in high precision")
    for kind in ("moe",):  # mixtral: every layer MoE (dense layers: tests/test_cost_fp8_tp_gather.py)
        assert _tp_comm(rowwise, kind) > 0
        assert _tp_comm(tensorwise, kind) == pytest.approx(share * _tp_comm(rowwise, kind), rel=1e-9)


def test_megatron_moe_layer_keeps_16_bit_tp() -> None:
    """Megatron-Core with Transformer Engine runs its tp collectives in the activation dtype:
    the share is torchtitan's alone."""
    tensorwise = Plan(dp=2, tp=4, sp=True, mbs=1, gbs=2, seq_len=4096, dtype="fp8", framework="megatron")
    rowwise = dataclasses.replace(tensorwise, fp8_recipe="rowwise")
    assert _tp_comm(tensorwise, "moe") == pytest.approx(_tp_comm(rowwise, "moe"), rel=1e-12)
