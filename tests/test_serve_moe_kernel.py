"""bench/serve_moe_kernel.py: the serve model's routed-expert time against vLLM's published
fused-MoE kernel times, and the table docs/serve.md quotes from it.

Oracles: the models' published configs (Qwen/Qwen3-30B-A3B config.json: hidden_size 2048,
moe_intermediate_size 768, num_experts 128, num_experts_per_tok 8; mistralai/Mixtral-8x7B
config.json: hidden_size 4096, intermediate_size 14336, num_local_experts 8,
num_experts_per_tok 2) for the FLOPs, the kernel times as vLLM pull request #24700 prints them,
and the bench's own recomputation for the stored docs table."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "serve.md"


@pytest.fixture(scope="module")
def bench():
    return load_script(ROOT / "bench" / "serve_moe_kernel.py", "serve_moe_kernel")


@pytest.fixture(scope="module")
def table(bench):
    return bench.rows()


def _row(table, case_prefix: str, tokens: int) -> dict:
    return next(r for r in table if r["case"].startswith(case_prefix) and r["tokens"] == tokens)


def test_flop_rates_follow_the_published_configs(table):
    """The bench's measured TF/s is the routed experts' FLOPs over the kernel time: gate, up
    and down projections (3 matrices) for each token's top-k experts, split tp ways - written
    out here from the configs, not from the cost model."""
    qwen = 2 * 4096 * 8 * 3 * 2048 * 768 / 1           # Qwen3-30B-A3B, tp 1, 4096 tokens
    mixtral = 2 * 1536 * 2 * 3 * 4096 * 14336 / 2      # Mixtral-8x7B, tp 2, 1536 tokens
    assert _row(table, "Qwen3", 4096)["measured_tflops"] == pytest.approx(qwen / 1647.57e-6 / 1e12, rel=1e-9)
    assert _row(table, "Mixtral", 1536)["measured_tflops"] == pytest.approx(mixtral / 1122.93e-6 / 1e12, rel=1e-9)


def test_transcribed_kernel_times(bench):
    """Spot checks of the transcription against the pull request's printed lines."""
    times = {label: t for _, _, _, label, t in bench.CASES}
    assert times["Mixtral bf16 tp2, tuned config"][512] == 662.33
    assert times["Qwen3 MoE fp8_w8a8 tp1, main"][1024] == 536.33
    assert times["Qwen3 MoE fp8_w8a8 tp1, main"][48] == 257.83
    assert len(times["Qwen3 MoE fp8_w8a8 tp1, main"]) == 18 and len(times["Mixtral bf16 tp2, tuned config"]) == 15


def test_weight_floor_is_the_touched_experts(bench, table):
    """At one token a layer reads top_k experts' weights: Qwen3-30B-A3B fp8 (1 byte a
    parameter) 8 x 3 x 2048 x 768 bytes at the device's read rate."""
    from partita.serve import latency
    from partita.spec.hardware import load_device
    rate = latency.read_bandwidth(load_device(bench.DEVICE))
    assert _row(table, "Qwen3", 1)["weights_us"] == pytest.approx(8 * 3 * 2048 * 768 / rate * 1e6, rel=1e-6)


def test_docs_table_is_current(bench, table):
    assert bench.markdown(table) in DOC.read_text(), \
        "docs/serve.md's fused-MoE kernel table is stale: paste `python bench/serve_moe_kernel.py --markdown`"
