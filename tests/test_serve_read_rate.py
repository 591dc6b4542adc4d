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
from torch.utils._python_dispatch import TorchDispatchMode

from partita.calibrate.hardware_file import hardware_file
from partita.calibrate.busy_clock import run_queue_wait_s, seconds_per_call
from partita.calibrate.read_rate import measure_read_rate
from partita.serve.latency import (decode_kv_allocations, decode_kv_passes, decode_kv_writes, decode_stage_time,
                                   fresh_write_seconds_per_byte, read_bandwidth)
from partita.serve.memory import kv_bytes_per_token_layer
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
    busy = seconds_per_call(lambda: x.sum(), 1, min_time=0.01)[0]
    assert busy > 0 and run_queue_wait_s() >= w0
    assert busy <= time.perf_counter() - t0


class _FreshKV(TorchDispatchMode):
    """Bytes of the K/V-shaped tensors the ops of a forward allocate and write (an output that
    is a view of an input writes nothing)."""

    def __init__(self, lengths: set[int], head: int):
        super().__init__()
        self.lengths, self.head, self.bytes = lengths, head, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        ptrs = {t.untyped_storage().data_ptr() for t in ins}
        for t in torch.utils._pytree.tree_leaves(out):
            if (isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-2] in self.lengths
                    and t.shape[-1] == self.head and t.untyped_storage().data_ptr() not in ptrs):
                self.bytes += t.numel() * t.element_size()
        return out


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_fresh_kv_writes_match_transformers(kv_heads):
    """A decode step of transformers' eager Llama allocates and writes ``decode_kv_writes`` x
    the cache's bytes in K/V-shaped tensors (``torch.cat``'s result, ``repeat_kv``'s copies),
    counted op by op; a byte written into first-touched pages costs ``2 / B_clone - 1 / B_read``."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**TINY, "num_key_value_heads": kv_heads}, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).eval()
    batch, context = 2, 96
    head = TINY["hidden_size"] // TINY["num_attention_heads"]
    cache = transformers.DynamicCache(config=config)
    with torch.no_grad():
        model(input_ids=torch.randint(0, 256, (batch, context)), cache=cache, use_cache=True)
        counter = _FreshKV({context + 1}, head)
        with counter:
            model(input_ids=torch.randint(0, 256, (batch, 1)), cache=cache, use_cache=True)
    spec = parse_hf_config(transformers.LlamaConfig(**{**TINY, "num_key_value_heads": kv_heads}).to_dict(), "tiny",
                           "LlamaForCausalLM")
    per_layer = batch * (context + 1) * kv_bytes_per_token_layer(spec, Layout(1, 1, 1, kv_dtype="fp32", dtype="fp32"))
    assert counter.bytes / (per_layer * TINY["num_hidden_layers"]) == pytest.approx(
        decode_kv_writes(spec, 1, "partita"), rel=1e-9)
    assert decode_kv_writes(spec, 1, "megatron") == 0.0
    dev = load_device("cpu", {"memory": {"hbm_tbps": 3e-3, "read_tbps": 9e-3}, "efficiency": {"memory_bandwidth": 1.0}})
    assert fresh_write_seconds_per_byte(dev) == pytest.approx(2 / 3e9 - 1 / 9e9)


def _tiny_decode(kv_heads: int, batch: int, context: int):
    """transformers' eager tiny Llama (fp32) with a DynamicCache of ``context`` tokens, its
    spec, and a callable running one decode step (the cache grows by a token a call)."""
    torch.manual_seed(0)
    cfg = {**TINY, "num_key_value_heads": kv_heads, "max_position_embeddings": 2048}
    config = transformers.LlamaConfig(**cfg, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).eval()
    cache = transformers.DynamicCache(config=config)
    with torch.no_grad():
        model(input_ids=torch.randint(0, 256, (batch, context)), cache=cache, use_cache=True)
    step = torch.randint(0, 256, (batch, 1))

    def decode():
        with torch.no_grad():
            model(input_ids=step, cache=cache, use_cache=True)
    spec = parse_hf_config(transformers.LlamaConfig(**cfg).to_dict(), "tiny", "LlamaForCausalLM")
    return spec, cache, decode


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_decode_kv_allocations_are_what_torch_allocates(kv_heads):
    """The K/V tensors a decode step allocates, one by one, as torch's profiler records them
    (each op's own allocation, ``profile_memory``): ``decode_kv_allocations`` x the layer's
    cache bytes, per layer - the two ``cat`` results of the whole cache (not one token's
    write) and, with GQA, the two ``repeat_kv`` copies. Everything else the step allocates is
    smaller than a ``cat`` result (scores of one query row, one token's activations)."""
    from torch.profiler import ProfilerActivity, profile
    batch, context = 4, 512
    spec, cache, decode = _tiny_decode(kv_heads, batch, context)
    decode()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        decode()
    kv = sum(t.numel() * t.element_size() for t in (cache.layers[0].keys, cache.layers[0].values))
    expected = sorted(f * kv for f in decode_kv_allocations(spec, 1, "partita")) * TINY["num_hidden_layers"]
    seen = [e.self_cpu_memory_usage for e in prof.events() if e.self_cpu_memory_usage >= kv / 2]
    assert sorted(seen) == pytest.approx(sorted(expected), rel=1e-9)
    assert decode_kv_allocations(spec, 1, "megatron") == []
