"""Hugging Face transformers models (optional extra ``[hf]``), built from a config, no download.

``partita.parallelize`` accepts them like the reference models; which name builds which of
them is :mod:`partita.models.registry`'s to say, and what the runtime needs to know about
them (their blocks, their logits) is its :class:`~partita.models.registry.HFFamily`'s.
Their parameter names are never changed.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..errors import PartitaError

TINY_BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
#: files ``from_pretrained`` reads weights from (a directory with none is initialised from the seed)
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def _transformers():
    try:
        import transformers
    except ImportError:
        raise PartitaError("HF models need transformers: pip install 'partita[hf]'") from None
    return transformers


def build_tiny_hf(config_cls: str, model_cls: str, extra: dict, seed: int = 0, meta: bool = False) -> nn.Module:
    """A tiny HF model of :data:`TINY_BASE`'s size: ``transformers.<config_cls>`` with the
    architecture's ``extra`` fields, as ``transformers.<model_cls>`` (the registry's
    ``TINY_HF`` / ``TINY_HF_MOE`` rows).

    The parameters are created on the meta device; ``meta=False`` gives them CPU storage
    and the weights of ``seed`` (:func:`partita.models.init.init_model_`, HF's own
    distributions, one generator per parameter), ``meta=True`` leaves them for
    :func:`partita.parallelize` to shard and initialise shard by shard to the same values."""
    tf = _transformers()
    config = getattr(tf, config_cls)(**TINY_BASE, **extra)
    return build_hf_from_config(config, getattr(tf, model_cls), seed, meta)


def build_hf_dir(path: Path, seed: int = 0, meta: bool = False) -> nn.Module:
    """An HF ``*ForCausalLM`` from ``path/config.json``: the directory's weights when it has
    them (``from_pretrained``), else initialised from ``seed`` (``meta``: on the meta device)."""
    if not (path / "config.json").is_file():
        raise PartitaError(f"--model {path}: a model directory needs a Hugging Face config.json")
    transformers = _transformers()
    config = transformers.AutoConfig.from_pretrained(str(path))
    config._attn_implementation = "sdpa"
    if not any((path / w).is_file() for w in _WEIGHTS):
        return build_hf_from_config(config, transformers.AutoModelForCausalLM, seed, meta)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), config=config, torch_dtype=torch.float32)
    model.partita_vocab = config.vocab_size
    return model


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
