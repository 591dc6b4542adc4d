"""The serving planner's formulas against outside oracles (issue 37 item 3's formula half):

* KV-cache bytes per token against transformers' own ``DynamicCache`` after a prefill of the
  tiny HF models (GQA Llama, Qwen2 with qkv bias, Mixtral MoE) in bf16;
* weight bytes per device against the real modules' parameters, whole and per pipeline stage;
* the GEMM + attention FLOPs of a decode step with a cache against torch's
  ``FlopCounterMode`` on the same forward (eager attention, so the score and value products
  are counted as matmuls).

MLA's latent cache is not checked here: transformers' DeepSeek-V3 caches the decompressed
K/V, not the engines' latent (test_serve.py pins the latent size by hand).
"""
from __future__ import annotations

import pytest
import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

from partita.models.hf import TINY_BASE
from partita.models.registry import TINY_HF
from partita.serve.latency import forward_flops
from partita.serve.memory import kv_bytes_per_token, stage_weight_bytes
from partita.serve.workload import Layout
from partita.spec.hf_config import parse_hf_config

NAMES = ["hf-llama", "hf-qwen2", "hf-mixtral"]
PROMPT, BATCH = 12, 3


def _tiny(name: str):
    """The registry's tiny HF model, bf16, eager attention, and the planner's spec of it."""
    config_cls, model_cls, extra = TINY_HF[name]
    # experts looped in eager mode: torch's counter does not count transformers' default
    # grouped_mm experts kernel (it reports 0 FLOPs for them)
    moe = {"experts_implementation": "eager"} if "num_local_experts" in extra else {}
    config = getattr(transformers, config_cls)(**TINY_BASE, **extra, **moe, attn_implementation="eager")
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).to(torch.bfloat16).eval()
    return model, parse_hf_config(config.to_dict(), name, model_cls)


@pytest.fixture(scope="module", params=NAMES)
def prefilled(request):
    """A model after a prefill of BATCH prompts: (model, spec, its cache)."""
    model, spec = _tiny(request.param)
    ids = torch.randint(0, TINY_BASE["vocab_size"], (BATCH, PROMPT), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    return model, spec, cache


def test_kv_bytes_per_token_match_dynamic_cache(prefilled):
    _, spec, cache = prefilled
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert kv_bytes_per_token(spec, Layout(1, 1, 1)) == held / (BATCH * PROMPT)
    # tp=2 splits the 2 kv heads, one per rank: the ranks hold the cache once between them
    assert 2 * kv_bytes_per_token(spec, Layout(2, 1, 1)) == held / (BATCH * PROMPT)


def test_decode_step_flops_match_torch_flop_counter(prefilled):
    model, spec, cache = prefilled
    step = torch.randint(0, TINY_BASE["vocab_size"], (BATCH, 1), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=step, cache=cache, use_cache=True)
    # each new token attends over the prompt and itself; every row samples
    assert forward_flops(spec, Layout(1, 1, 1), BATCH, PROMPT + 1, BATCH) == counter.get_total_flops()


@pytest.mark.parametrize("name", NAMES)
def test_weight_bytes_match_the_modules(name):
    model, spec = _tiny(name)
    nbytes = lambda module: sum(p.numel() * p.element_size() for p in module.parameters())  # noqa: E731
    assert stage_weight_bytes(spec, Layout(1, 1, 1)) == [nbytes(model)]
    first = nbytes(model.model.embed_tokens) + nbytes(model.model.layers[0])
    last = nbytes(model.model.layers[1]) + nbytes(model.model.norm) + nbytes(model.lm_head)
    assert stage_weight_bytes(spec, Layout(1, 2, 1)) == [first, last]
