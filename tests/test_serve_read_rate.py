"""The streaming read rate (``memory.read_tbps``, :mod:`partita.calibrate.read_rate`) from
``partita calibrate`` to the serving model's decode step.

Oracles outside serve/latency.py: the bytes a decode step reads are the model's own
parameters (torch's ``numel`` of the layers and the output head) and the bytes transformers'
``DynamicCache`` holds after a prefill, times :func:`decode_kv_passes` (itself checked op by op
in tests/test_serve_latency.py); the read rate is what the hardware file says. No timing
assertions: bench/serve_vs_measure.py measures.
"""
from __future__ import annotations

import pytest
import torch
import transformers

from partita.calibrate.hardware_file import hardware_file
from partita.calibrate.read_rate import busy_seconds, measure_read_rate, run_queue_wait_s
from partita.serve.latency import decode_kv_passes, decode_stage_time, read_bandwidth
from partita.serve.workload import Layout
from partita.spec.hardware import load_device
from partita.spec.hf_config import parse_hf_config

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)


def test_hardware_file_carries_the_read_rate_and_the_planner_reads_it():
    """A calibration with a read measurement writes ``memory.read_tbps`` (the median of the
    repeats) beside the clone rate; a device file without it reads at the clone rate."""
    m = {"device": "cpu", "dtype": "fp32", "world": 1, "repeats": 3,
         "gemm": [{"class": "square", "shape": [256, 256, 256], "gflop": 2 * 256 ** 3 / 1e9, "seconds": 1e-3,
                   "samples": [1e-3] * 3}],
         "copy": [3.0e9] * 3, "read": [9.0e9, 1.0e10, 1.1e10], "runtime": {}}
    out = hardware_file(m, "cpu", "synthetic")
    assert out["memory"]["read_tbps"] == pytest.approx(1.0e10 / 1e12)
    assert out["memory"]["hbm_tbps"] == pytest.approx(3.0e9 / 1e12)
    assert out["calibration"]["terms"]["memory.read_tbps"]["samples"] == pytest.approx([0.009, 0.01, 0.011])
    dev = load_device("cpu", overrides={"memory": out["memory"]})
    assert read_bandwidth(dev) == pytest.approx(1.0e10)
    plain = load_device("cpu")
    assert read_bandwidth(plain) == pytest.approx(plain.hbm_tbps * 1e12 * plain.efficiency.memory_bandwidth)


def test_decode_reads_the_parameters_and_the_cache_at_the_read_rate():
    """Two devices that differ only in the read rate, both memory-bound: one decode step
    differs by (the parameters a step reads + the cache's bytes x passes) x (1/r1 - 1/r2),
    the parameters counted by torch (every layer and the output head; the embedding is a
    lookup) and the cache's bytes read off transformers' DynamicCache after the prefill."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**TINY, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).eval()
    batch, context = 3, 40
    cache = transformers.DynamicCache(config=config)
    with torch.no_grad():
        model(input_ids=torch.randint(0, 256, (batch, context)), cache=cache, use_cache=True)
    kv = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    params = sum(p.numel() * p.element_size() for p in model.model.layers.parameters())
    params += sum(p.numel() * p.element_size() for p in model.lm_head.parameters())
    spec = parse_hf_config(transformers.LlamaConfig(**TINY).to_dict(), "tiny", "LlamaForCausalLM")
    layout = Layout(1, 1, 1, kv_dtype="fp32", dtype="fp32")
    rates = (1.0e6, 4.0e6)  # far below the GEMM rate: the weights and the cache bound the step
    for framework in ("megatron", "partita"):
        steps = [decode_stage_time(spec, load_device("cpu", {"memory": {"read_tbps": r / 1e12}}), layout, batch,
                                   context, 1, framework) for r in rates]
        moved = params + kv * decode_kv_passes(spec, 1, framework)
        assert steps[0] - steps[1] == pytest.approx(moved * (1 / rates[0] - 1 / rates[1]), rel=1e-9)


def test_read_rate_measures_a_read_and_subtracts_the_wait():
    """The measurement returns one rate per repeat, and a call's busy time is never more than
    its wall-clock (the run-queue wait only comes off)."""
    rates = measure_read_rate(torch.device("cpu"), torch.float32, lambda: None, 2)
    assert len(rates) == 2 and all(r > 0 for r in rates)
    w0 = run_queue_wait_s()
    x = torch.randn(100_000)
    import time
    t0 = time.perf_counter()
    busy = busy_seconds(lambda: x.sum(), 1, min_time=0.01)[0]
    assert busy > 0 and run_queue_wait_s() >= w0
    assert busy <= time.perf_counter() - t0
