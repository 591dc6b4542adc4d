"""The serve latency model's eager-runtime terms against oracles outside serve/latency.py.

* the decode step's tensor-parallel all-reduces read the device file's calibrated all-reduce
  fit: the step moves by exactly (2 per layer + the embedding's) x the ring all-reduce's
  alpha-beta time computed here from the file's numbers [Thakur et al. 2005 sec. 4:
  ``2 (n-1) alpha + 2 (n-1)/n S / B``];
* :func:`decode_kv_passes` against the bytes transformers' own DynamicCache and eager
  attention move in one decode step, counted op by op under a TorchDispatchMode;
* the DTensor host term is the calibrated field's forward share, once per layer.

No timing here: bench/serve_vs_measure.py measures.
"""
from __future__ import annotations

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

from partita.serve.latency import EAGER_RUNTIMES, EAGER_SCORE_PASSES, decode_kv_passes, decode_stage_time, prefill_time
from partita.serve.memory import kv_bytes_per_token_layer
from partita.serve.workload import Layout
from partita.spec.hardware import load_device
from partita.spec.hf_config import parse_hf_config

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)


def _spec(**over):
    cfg = transformers.LlamaConfig(**{**TINY, **over})
    return parse_hf_config(cfg.to_dict(), "tiny", "LlamaForCausalLM")


def _device(alpha_us: float, gbps: float, tp_nosp_us: float = 0.0):
    return load_device("cpu", {"collectives": {"all_reduce": [{"group": 2, "latency_us": alpha_us, "gbps": gbps}]},
                               "efficiency": {"tp_nosp_framework_us_per_layer": tp_nosp_us,
                                              "tp_framework_us_per_layer": tp_nosp_us}})


@pytest.mark.parametrize("framework", ["megatron", "partita"])
@pytest.mark.parametrize("batch", [1, 16])
def test_decode_all_reduce_reads_the_calibrated_fit(framework, batch):
    """Two devices that differ only in the all-reduce fit: the tp=2 decode step differs by
    ``(2 L + 1)`` all-reduces of ``batch x h x 4`` bytes, each ``2 alpha + S / B`` on 2 ranks."""
    spec, layout = _spec(), Layout(2, 1, 1, kv_dtype="fp32", dtype="fp32")
    fits = ((300.0, 0.5), (40.0, 3.0))
    steps = [decode_stage_time(spec, _device(a, g), layout, batch, 128, 2, framework) for a, g in fits]
    size = batch * TINY["hidden_size"] * 4

    def ring(alpha_us, gbps):  # Thakur et al. 2005: ring all-reduce on n = 2 ranks
        n = 2
        return 2 * (n - 1) * alpha_us * 1e-6 + 2 * (n - 1) / n * size / (gbps * 1e9)

    count = 2 * TINY["num_hidden_layers"] + 1  # Megatron's 2 per layer + the vocab-parallel embedding
    expected = count * (ring(*fits[0]) - ring(*fits[1]))
    assert steps[0] - steps[1] == pytest.approx(expected, rel=1e-9)
    # tp 1 has no collective: the fits do not move it
    one = Layout(1, 1, 1, kv_dtype="fp32", dtype="fp32")
    assert decode_stage_time(spec, _device(*fits[0]), one, batch, 128, 2, framework) == pytest.approx(
        decode_stage_time(spec, _device(*fits[1]), one, batch, 128, 2, framework), rel=1e-12)


class _KVBytes(TorchDispatchMode):
    """Bytes the ops of a forward read and write in tensors shaped like a layer's K/V (the
    context length and the head size as their last two dims, in either order). Views move
    nothing (an output sharing an input's storage); an input is counted at its storage's
    size when smaller (an ``expand`` reads the original once)."""

    def __init__(self, lengths: set[int], head: int):
        super().__init__()
        self.lengths, self.head, self.bytes = lengths, head, 0

    def _kv(self, t) -> bool:
        return isinstance(t, torch.Tensor) and t.dim() >= 2 and (
            (t.shape[-2] in self.lengths and t.shape[-1] == self.head)
            or (t.shape[-1] in self.lengths and t.shape[-2] == self.head))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        ptrs = {t.untyped_storage().data_ptr() for t in ins}
        if any(t.untyped_storage().data_ptr() in ptrs for t in outs):
            return out  # a view
        for t in ins:
            if self._kv(t):
                self.bytes += min(t.numel() * t.element_size(), t.untyped_storage().nbytes())
        self.bytes += sum(t.numel() * t.element_size() for t in outs if self._kv(t))
        return out


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_kv_passes_match_transformers_dynamic_cache(kv_heads):
    """One decode step of transformers' eager Llama with its DynamicCache moves
    ``decode_kv_passes`` x the cache's bytes in K/V-shaped tensors (GQA and not)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**TINY, "num_key_value_heads": kv_heads}, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).eval()
    batch, context = 2, 96
    head = TINY["hidden_size"] // TINY["num_attention_heads"]
    cache = transformers.DynamicCache(config=config)
    with torch.no_grad():
        model(input_ids=torch.randint(0, 256, (batch, context)), cache=cache, use_cache=True)
        counter = _KVBytes({context, context + 1}, head)
        with counter:
            model(input_ids=torch.randint(0, 256, (batch, 1)), cache=cache, use_cache=True)
    spec = _spec(num_key_value_heads=kv_heads)
    per_layer = batch * context * kv_bytes_per_token_layer(spec, Layout(1, 1, 1, kv_dtype="fp32", dtype="fp32"))
    passes = decode_kv_passes(spec, 1, "partita")
    assert counter.bytes / (per_layer * TINY["num_hidden_layers"]) == pytest.approx(passes, rel=0.05)
    assert decode_kv_passes(spec, 1, "megatron") == 1.0  # an engine's paged attention reads it once


def test_dtensor_term_is_the_calibrated_forward_share():
    """Eager runtimes at tp > 1 pay a third of the calibrated per-layer DTensor term (the
    micro-run timed forward + backward) per layer, in prefill and decode; engines and tp 1 not."""
    spec, layers = _spec(), TINY["num_hidden_layers"]
    tp2, tp1 = Layout(2, 1, 1, kv_dtype="fp32", dtype="fp32"), Layout(1, 1, 1, kv_dtype="fp32", dtype="fp32")
    with_term, without = _device(100.0, 1.0, 3000.0), _device(100.0, 1.0, 0.0)
    for fw in sorted(EAGER_RUNTIMES):
        assert (prefill_time(spec, with_term, tp2, 64, 2, fw) - prefill_time(spec, without, tp2, 64, 2, fw)
                == pytest.approx(layers * 1e-3, rel=1e-9))
        assert (decode_stage_time(spec, with_term, tp2, 4, 64, 2, fw) - decode_stage_time(spec, without, tp2, 4, 64, 2, fw)
                == pytest.approx(layers * 1e-3, rel=1e-9))
        assert decode_stage_time(spec, with_term, tp1, 4, 64, 1, fw) == decode_stage_time(spec, without, tp1, 4, 64, 1, fw)
    assert decode_stage_time(spec, with_term, tp2, 4, 64, 2) == decode_stage_time(spec, without, tp2, 4, 64, 2)


def test_eager_prefill_score_passes_match_transformers():
    """A prefill of transformers' eager Llama moves ``EAGER_SCORE_PASSES`` x the ``P x P``
    scores per head (+ one read of the mask) per layer in ``P x P``-shaped tensors, counted
    op by op (the mask's construction, once per forward, is within the tolerance)."""
    torch.manual_seed(0)
    layers, prompt = 4, 48
    config = transformers.LlamaConfig(**{**TINY, "num_hidden_layers": layers}, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).eval()
    counter = _KVBytes({prompt}, prompt)  # tensors whose last two dims are P x P
    with torch.no_grad(), counter:
        model(input_ids=torch.randint(0, 256, (1, prompt)), use_cache=False)
    per_layer = prompt * prompt * 4 * (TINY["num_attention_heads"] * EAGER_SCORE_PASSES + 1)
    assert counter.bytes / (per_layer * layers) == pytest.approx(1.0, rel=0.06)
