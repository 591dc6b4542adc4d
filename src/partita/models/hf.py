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


def build_hf_model(name: str, seed: int = 0) -> nn.Module:
    """A tiny HF model (``hf-llama``, ``hf-qwen2``, ``hf-mixtral``) with weights from ``seed``."""
    if name not in TINY:
        raise PartitaError(f"unknown HF test model {name!r}; known: {', '.join(TINY)}")
    tf = _transformers()
    config_cls, model_cls, extra = TINY[name]
    config = getattr(tf, config_cls)(**TINY_BASE, **extra)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = getattr(tf, model_cls)(config)
    model.partita_vocab = config.vocab_size
    return model


def is_hf(model: nn.Module) -> bool:
    return hasattr(model, "config") and hasattr(model, "model") and hasattr(model.model, "layers")
