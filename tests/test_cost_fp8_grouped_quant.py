"""Transformer Engine quantizes a MoE layer's routed-expert inputs in its own kernel
(cost/frameworks.py ``fp8_grouped_quantize_bytes``, cost/compute.py
``fp8_grouped_quantized_elements``).

TE's ``_GroupedLinear.forward`` (transformer_engine/pytorch/module/grouped_linear.py,
NVIDIA/TransformerEngine 0069563f60) takes the experts' inputs in the activation dtype and calls
``tex.fused_multi_quantize`` with rowwise usage and, for the weight gradient, columnwise usage:
per element it reads the 16-bit value and writes the fp8 row and the fp8 transpose. Megatron-Core's
TEGroupedMLP feeds it the permuted tokens (fc1, ``h`` wide) and the SwiGLU output (fc2,
``f_e / etp`` wide). The dense layers' casts stay fused (LayerNormLinear / LayerNormMLP).

Oracles: torch's element sizes of the tensors the kernel reads and writes, with the shapes built
here from the model spec (not from the code under test); and dgxc's Grok-1 fp8 rows, which sit
nearer their measured step with the term than without (MindSpeed's entry, otherwise Megatron's,
does not charge it).
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from partita.cost.compute import fp8_grouped_quantized_elements, layer_forward
from partita.cost.frameworks import FRAMEWORKS
from partita.cost.shape import layer_shape
from partita.estimate import estimate
from partita.plan import Plan
from partita.spec.hardware import make_cluster
from partita.spec.load import load_model

ROOT = Path(__file__).resolve().parents[1]


def _quantize_bytes(rows: int, width: int) -> int:
    """HBM bytes of one fused_multi_quantize of a ``rows x width`` 16-bit input: the input read,
    the fp8 rows and the fp8 transpose written (torch's element sizes)."""
    x = torch.empty(rows, width, dtype=torch.bfloat16)
    fp8 = torch.empty(0, dtype=torch.float8_e4m3fn)
    return x.numel() * x.element_size() + 2 * x.numel() * fp8.element_size()


@pytest.mark.parametrize("tp,etp,ep", [(1, 1, 8), (4, 4, 2), (2, 1, 4)])
def test_quantized_bytes_match_the_tensors_te_writes(tp: int, etp: int, ep: int) -> None:
    model = load_model("mixtral-8x7b")
    mo = model.moe
    plan = Plan(dp=8, tp=tp, ep=ep, etp=etp, sp=tp > 1, mbs=2, gbs=16, seq_len=1024, dtype="fp8")
    shape = layer_shape(plan)
    routed = 2 * 1024 * mo.top_k * etp // tp  # the rank's routed copies after dispatch (and etp gather)
    oracle = _quantize_bytes(routed, model.hidden) + _quantize_bytes(routed, mo.expert_ffn_hidden // etp)
    assert FRAMEWORKS["megatron"].fp8_grouped_quantize_bytes * fp8_grouped_quantized_elements(model, shape) \
        == pytest.approx(oracle, rel=1e-12)
    # the layer's element-wise time carries exactly those bytes over the same layer without the term
    cluster = make_cluster("h100-sxm", devices=8)
    dev = cluster.device
    with_term = layer_forward(model, dev, shape, True).elementwise_time
    without = layer_forward(model, dev, layer_shape(dataclasses.replace(plan, framework="mindspeed")), True)
    rate = dev.hbm_tbps * 1e12 * dev.efficiency.memory_bandwidth
    assert with_term - without.elementwise_time == pytest.approx(oracle / rate, rel=1e-9)
    # bf16 and dense layers: nothing
    bf16 = layer_shape(dataclasses.replace(plan, dtype="bf16"))
    assert layer_forward(model, dev, bf16, True).elementwise_time == pytest.approx(
        layer_forward(model, dev, layer_shape(dataclasses.replace(plan, dtype="bf16", framework="mindspeed")),
                      True).elementwise_time, rel=1e-12)


def test_grok_fp8_rows_nearer_their_measured_step() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from published_runs import load_cases
    cases, _ = load_cases(ROOT / "data" / "published_runs.csv")
    rows = [c for c in cases if c.source.startswith("dgxc") and c.name.startswith("Grok-1")
            and c.plan.dtype == "fp8" and c.metric == "step_time_s"]
    assert len(rows) >= 10
    better = 0
    for c in rows:
        with_term = estimate(c.model, c.cluster, c.plan).step_time_s
        without = estimate(c.model, c.cluster, dataclasses.replace(c.plan, framework="mindspeed")).step_time_s
        assert with_term > without
        better += abs(with_term / c.measured - 1) < abs(without / c.measured - 1)
    assert better >= 0.75 * len(rows)
