"""Engines run a MoE layer's routed experts at prefill as grouped GEMMs (issue 37, item b).

Oracles outside the code under test: torch's FlopCounterMode on the experts' matmuls (one per
expert, rows as routed), and the published MindIE row of data/published_serving.csv
(GPUStack's Qwen3-30B-A3B page, TTFT at 4 requests in flight), which the per-expert pricing
put at +115 %.
"""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from test_serve_published import _bench
from torch.utils.flop_counter import FlopCounterMode

from partita.models.registry import resolve_model
from partita.serve import latency
from partita.serve.workload import Layout
from partita.spec.hardware import load_device

ROOT = Path(__file__).resolve().parents[1]


def test_routed_expert_flops_match_torchs_count():
    """Qwen3-30B-A3B's experts (gated: gate and up fused, then down) over 16 tokens x top 8,
    routed unevenly over the 128 experts; meta tensors, so nothing is computed."""
    model = resolve_model("qwen3-30b-a3b").spec()
    mo, h = model.moe, model.hidden
    tokens = 16
    rows = [0] * mo.num_experts
    for i in range(tokens * mo.top_k):
        rows[(i * 37) % mo.num_experts] += 1
    with FlopCounterMode(display=False) as counter:
        for n in rows:
            if n:
                x = torch.empty(n, h, device="meta")
                up = x @ torch.empty(h, 2 * mo.expert_ffn_hidden, device="meta")
                _ = up[:, :mo.expert_ffn_hidden] @ torch.empty(mo.expert_ffn_hidden, h, device="meta")
    assert latency.routed_expert_flops(model, Layout(1, 1, 1), tokens) == counter.get_total_flops()
    assert latency.routed_expert_flops(model, Layout(2, 1, 1), tokens) == counter.get_total_flops() / 2


def test_a_grouped_gemm_is_priced_by_its_whole_size():
    """The per-expert price grows with the number of experts sharing the same FLOPs (each GEMM
    smaller); the grouped one does not, and is never slower."""
    dev = load_device("ascend-910b3")
    model = resolve_model("qwen3-30b-a3b").spec()
    for tokens in (217, 8192):
        for ep in (1, 2, 8):
            lay = Layout(1, 1, 1, ep=ep)
            grouped = latency.grouped_expert_gemms(model, dev, lay, tokens)
            assert grouped == latency.grouped_expert_gemms(model, dev, Layout(1, 1, 1), tokens)
            assert grouped <= latency.per_expert_gemms(model, dev, lay, tokens)


def test_eager_runtimes_keep_the_loop_over_experts():
    """transformers' MoE blocks loop over experts: Partita's eager runtime keeps their price."""
    dev = load_device("ascend-910b3")
    model = resolve_model("qwen3-30b-a3b").spec()
    lay = Layout(2, 1, 1)
    engine = latency.prefill_time(model, dev, lay, 217, 8)
    eager = latency.prefill_time(model, dev, lay, 217, 8, "partita")
    assert eager > engine


def test_the_mindie_first_token_row():
    bench = _bench()  # bench/serve_published.py, loaded as test_serve_published loads it
    with (ROOT / "data" / "published_serving.csv").open(newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["engine"].startswith("MindIE") and r["metric"] == "ttft_s")
    error = bench.predict(row) / float(row["value"]) - 1
    assert abs(error) < 1.15 and error == pytest.approx(-0.59, abs=0.05)
