"""The serve model's routed-expert time against published fused-MoE kernel times (issue 33).

The GPUStack Qwen3-235B-A22B bursts are predicted too fast (docs/serve.md, "Against published
serving benchmarks"), and their pages' own side figures point at the prefill: the vLLM
ShareGPT burst on 8 x H100 reports a mean TTFT of 8.7 s (P99 12.9 s) while the model's
backlog of the same 212,894 prompt tokens lasts about 6.6 s. This script isolates the one
term those steps are made of that an external measurement can check by itself: the routed
experts of one MoE layer, which vLLM runs as its Triton ``fused_experts`` (two grouped GEMMs,
the activation, ``moe_align_block_size`` and ``moe_sum``).

Oracle: kernel times vLLM's own ``benchmarks/kernels/benchmark_moe.py`` printed on an H100
(vllm-project/vllm pull request #24700, "[Perf] Improve default fused moe configs by
analyzing tuned configs", 2025-09-11, its description's "Benchmarks on H100"):

* Mixtral-8x7B, bf16, ``-tp=2``, "Tuned Config" (``E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json``):
  8 experts 14,336 wide (gate and up, per rank), top 2;
* Qwen3-30B-A3B, ``--dtype=fp8_w8a8``, ``-tp=1``, the "Main" column (vLLM before that pull
  request): 128 experts 1,536 wide, top 8 - the fine-grained experts of the Qwen3 MoE family.

Each batch size is the number of tokens entering the layer. The model's figures:
``grouped`` - :func:`partita.serve.latency.grouped_expert_gemms`, what an engine's prefill is
priced with (two grouped GEMMs at the efficiency of their whole size), ``per-expert`` -
:func:`partita.serve.latency.per_expert_gemms`, the training model's loop over experts (each
GEMM at the efficiency of its own size); both bounded below by reading the touched experts'
weights at the device's read rate, as :func:`partita.serve.latency.batch_prefill_time` and
the decode step do. Nothing here is fitted; the figures are printed, not used by the model.

Run ``python bench/serve_moe_kernel.py`` (``--markdown``: the table docs/serve.md quotes;
tests/test_serve_moe_kernel.py checks it is current).
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from partita.models.registry import resolve_model
from partita.serve import latency
from partita.serve.workload import Layout
from partita.spec.hardware import load_device

SOURCE = "https://github.com/vllm-project/vllm/pull/24700"
DEVICE = "h100-sxm"
#: (model, tp, weight dtype, the PR's label, {tokens: kernel microseconds}) as the PR prints them
CASES = (
    ("mixtral-8x7b", 2, "bf16", "Mixtral bf16 tp2, tuned config",
     {1: 144.03, 2: 229.28, 4: 351.10, 8: 434.98, 16: 471.49, 24: 478.27, 32: 487.35, 48: 487.85,
      64: 483.14, 96: 494.42, 128: 491.39, 256: 536.77, 512: 662.33, 1024: 833.72, 1536: 1122.93}),
    ("qwen3-30b-a3b", 1, "fp8", "Qwen3 MoE fp8_w8a8 tp1, main",
     {1: 44.54, 2: 59.94, 4: 90.46, 8: 129.77, 16: 185.40, 24: 215.99, 32: 238.37, 48: 257.83,
      64: 262.73, 96: 270.98, 128: 273.72, 256: 355.49, 512: 391.86, 1024: 536.33, 1536: 727.31,
      2048: 911.64, 3072: 1279.17, 4096: 1647.57}),
)
#: tokens per layer from which a step is prefill-sized (a chunk of prompts, not a decode batch)
PREFILL_TOKENS = 1024


def touched_weight_seconds(model, device, layout: Layout, tokens: int) -> float:
    """Seconds to read the routed experts some of ``tokens`` tokens pick (``E (1 - (1 -
    k/E)^T)`` of them, :func:`partita.serve.latency.decode_layer`'s expectation) at the read rate."""
    mo = model.moe
    touched = 1 - (1 - mo.top_k / mo.num_experts) ** tokens
    params = mo.num_experts * model.routed_expert_params() / layout.tp
    return params * touched * layout.weight_bytes / latency.read_bandwidth(device)


def rows() -> list[dict]:
    """One row per (case, tokens): measured and modelled microseconds."""
    device = load_device(DEVICE)
    out = []
    for name, tp, dtype, label, times in CASES:
        model = resolve_model(name).spec()
        layout = Layout(tp, 1, 1, "bf16", 1, dtype=dtype)
        for tokens, measured in times.items():
            floor = touched_weight_seconds(model, device, layout, tokens)
            flops = latency.routed_expert_flops(model, layout, tokens)
            out.append({"case": label, "tokens": tokens, "measured_us": measured,
                        "grouped_us": 1e6 * max(latency.grouped_expert_gemms(model, device, layout, tokens), floor),
                        "per_expert_us": 1e6 * max(latency.per_expert_gemms(model, device, layout, tokens), floor),
                        "weights_us": 1e6 * floor,
                        "measured_tflops": flops / (measured * 1e-6) / 1e12})
    return out


def summary(table: list[dict]) -> list[tuple[str, str, int, float, float]]:
    """(case, regime, rows, median predicted/measured grouped, per-expert) per case and regime
    (decode-sized steps below :data:`PREFILL_TOKENS` tokens, prefill-sized from it)."""
    out = []
    for label in dict.fromkeys(r["case"] for r in table):
        for regime, pick in (("decode-sized", lambda t: t < PREFILL_TOKENS),
                             ("prefill-sized", lambda t: t >= PREFILL_TOKENS)):
            mine = [r for r in table if r["case"] == label and pick(r["tokens"])]
            out.append((label, regime, len(mine),
                        statistics.median(r["grouped_us"] / r["measured_us"] for r in mine),
                        statistics.median(r["per_expert_us"] / r["measured_us"] for r in mine)))
    return out


def markdown(table: list[dict]) -> str:
    lines = ["| kernel (H100, vLLM PR #24700) | tokens | rows | grouped / measured | per-expert / measured |",
             "|---|---|---|---|---|"]
    for label, regime, n, g, p in summary(table):
        lines.append(f"| {label} | {regime} | {n} | {g:.2f} | {p:.2f} |")
    return "\n".join(lines)


def report(table: list[dict]) -> str:
    lines = [f"Routed experts of one MoE layer on {DEVICE}: the serve model vs vLLM's fused_moe kernel times "
             f"({SOURCE})", f"{'case':34s} {'tokens':>6s} {'measured':>9s} {'grouped':>8s} {'per-exp':>8s} "
             f"{'weights':>8s} {'meas TF/s':>9s}"]
    for r in table:
        lines.append(f"{r['case']:34s} {r['tokens']:6d} {r['measured_us']:9.1f} {r['grouped_us']:8.1f} "
                     f"{r['per_expert_us']:8.1f} {r['weights_us']:8.1f} {r['measured_tflops']:9.1f}")
    lines.append("median predicted / measured:")
    for label, regime, n, g, p in summary(table):
        lines.append(f"  {label:34s} {regime:14s} rows {n:2d}  grouped {g:5.2f}  per-expert {p:5.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--markdown", action="store_true", help="print the table docs/serve.md quotes")
    args = p.parse_args(argv)
    table = rows()
    print(markdown(table) if args.markdown else report(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
