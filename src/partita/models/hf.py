"""Hugging Face transformers models (optional extra ``[hf]``), built from a config, no download.

``partita.parallelize`` accepts them like the reference models; the helpers here give the
runtime what it needs to know about them (their blocks, their logits) without changing
their parameter names.
"""
from __future__ import annotations

import torch
from torch import nn

from ..errors import PartitaError

TINY = {
    "hf-llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "hf-qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "hf-mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
}
TINY_BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)


def _transformers():
    try:
        import transformers
    except ImportError:
        raise PartitaError("HF models need transformers: pip install 'partita[hf]'") from None
    return transformers


def build_hf_model(name: str, seed: int = 0, meta: bool = False, table: dict | None = None) -> nn.Module:
    """A tiny HF model (``hf-llama``, ``hf-qwen2``, ``hf-mixtral``; or ``table``'s, e.g.
    :data:`partita.runtime.hf_moe.TINY_MOE`) of :data:`TINY_BASE`'s size.

    The parameters are created on the meta device; ``meta=False`` gives them CPU storage
    and the weights of ``seed`` (:func:`partita.models.init.init_model_`, HF's own
    distributions, one generator per parameter), ``meta=True`` leaves them for
    :func:`partita.parallelize` to shard and initialise shard by shard to the same values."""
    table = TINY if table is None else table
    if name not in table:
        raise PartitaError(f"unknown HF test model {name!r}; known: {', '.join(table)}")
    tf = _transformers()
    config_cls, model_cls, extra = table[name]
    config = getattr(tf, config_cls)(**TINY_BASE, **extra)
    return build_hf_from_config(config, getattr(tf, model_cls), seed, meta)


def build_hf_from_config(config, model_cls, seed: int = 0, meta: bool = False) -> nn.Module:
    """``model_cls(config)`` with parameters on the meta device, then (``meta=False``) on the
    CPU with the weights of ``seed``; fp32, SDPA attention."""
    from .init import init_model_, materialize_params, params_on_meta
    config._attn_implementation = "sdpa"
    with params_on_meta():
        model = model_cls(config) if not hasattr(model_cls, "from_config") else model_cls.from_config(config)
    model = model.float()
    model.partita_vocab = config.vocab_size
    model.partita_seed = seed
    if not meta:
        init_model_(materialize_params(model, torch.device("cpu")), seed)
    return model


def is_hf(model: nn.Module) -> bool:
    return hasattr(model, "config") and hasattr(model, "model") and hasattr(model.model, "layers")
