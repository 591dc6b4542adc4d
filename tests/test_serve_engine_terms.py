"""Three engine terms of the serving model against oracles outside serve/latency.py.

* chunked prefill: a forward of ``B`` prompts reads the weights once - in the weight-bound
  regime its time is the parameters torch counts over the read rate, whatever ``B``; a
  prompt's share of a chunk is its forward's time over the prompts it holds;
* HCCL's Mesh all-reduce on a full-mesh node: a tp 8 decode step differs from the same
  device wired as a switch (the ring model) by exactly (2 per layer + the embedding's) x
  ``(2 (g-1) - 2) alpha`` - the count from Megatron / vLLM's layer, alpha from the file;
* graph-captured decode: an engine's step pays no host launch overhead, an eager runtime's
  step the file's per-layer figure once per layer.

No timing here: bench/serve_published.py and bench/serve_vs_measure.py measure.
"""
from __future__ import annotations

import pytest
import transformers

from partita.serve.latency import (batch_prefill_time, decode_stage_time, prefill_share, prefill_time)
from partita.serve.workload import Layout
from partita.spec.hardware import load_device
from partita.spec.hf_config import parse_hf_config

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
            num_key_value_heads=8, max_position_embeddings=512, tie_word_embeddings=False)
FP32 = Layout(1, 1, 1, kv_dtype="fp32", dtype="fp32")


def _spec():
    return parse_hf_config(transformers.LlamaConfig(**TINY).to_dict(), "tiny", "LlamaForCausalLM")


def _weight_bound(read_bps: float):
    """A CPU file whose compute and element-wise kernels are free: only the reads cost."""
    return load_device("cpu", {"peak_tflops": {"fp32": 1e9}, "memory": {"hbm_tbps": 1e9, "read_tbps": read_bps / 1e12},
                               "efficiency": {"kernel_overhead_us_per_layer": 0.0}})


@pytest.mark.parametrize("prompts", [1, 4, 32])
def test_a_batched_prefill_reads_the_weights_once(prompts):
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY))
    params = sum(p.numel() * 4 for p in model.model.layers.parameters())
    params += sum(p.numel() * 4 for p in model.lm_head.parameters())
    rate = 1.0e6
    t = batch_prefill_time(_spec(), _weight_bound(rate), FP32, 64, prompts, 1)
    assert t == pytest.approx(params / rate, rel=1e-9)


def test_a_prompts_share_of_a_chunk():
    spec, dev = _spec(), load_device("cpu")
    # 8192 // 1000 = 8 prompts share one forward
    assert prefill_share(spec, dev, FP32, 1000, 1) == pytest.approx(batch_prefill_time(spec, dev, FP32, 1000, 8, 1) / 8)
    # a prompt that fills the chunk alone costs its own prefill
    assert prefill_share(spec, dev, FP32, 300, 1, chunk_tokens=256) == pytest.approx(prefill_time(spec, dev, FP32, 300, 1))
    assert prefill_share(spec, dev, FP32, 64, 1) < prefill_time(spec, dev, FP32, 64, 1)


def test_full_mesh_all_reduce_pays_two_latency_steps():
    spec, tp = _spec(), 8
    layout = Layout(tp, 1, 1, kv_dtype="fp32", dtype="fp32")
    alpha_us = 500.0

    def dev(topology):
        return load_device("cpu", {"intra_node": {"topology": topology, "latency_us": alpha_us}})
    mesh = decode_stage_time(spec, dev("full-mesh"), layout, 2, 64, tp)
    ring = decode_stage_time(spec, dev("switch"), layout, 2, 64, tp)
    count = 2 * TINY["num_hidden_layers"] + 1
    assert ring - mesh == pytest.approx(count * (2 * (tp - 1) - 2) * alpha_us * 1e-6, rel=1e-9)


def test_engine_decode_pays_no_launch_overhead():
    spec = _spec()
    over = {"efficiency": {"kernel_overhead_us_per_layer": 700.0}}
    base, slow = load_device("cpu", {"efficiency": {"kernel_overhead_us_per_layer": 0.0}}), load_device("cpu", over)
    assert decode_stage_time(spec, slow, FP32, 4, 64, 1) == decode_stage_time(spec, base, FP32, 4, 64, 1)
    eager = [decode_stage_time(spec, d, FP32, 4, 64, 1, "partita") for d in (slow, base)]
    assert eager[0] - eager[1] == pytest.approx(TINY["num_hidden_layers"] * 700e-6, rel=1e-9)
