"""One function that turns a model name into a built model, for the worker and the CLI.

``build_named_model(name, seed)`` accepts:

* ``hf-llama`` / ``hf-qwen2`` / ``hf-mixtral``: tiny Hugging Face models from a config (no
  download), :func:`partita.models.hf.build_hf_model`;
* a directory holding a Hugging Face ``config.json``: that architecture, with the
  directory's weights when it has them (``from_pretrained``), else initialised from ``seed``;
* anything :func:`partita.models.llama.build_model` knows (``tiny-llama``, ``tiny-moe``,
  ``small-llama``, Partita model presets and spec files of LLaMA-style models).
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..errors import PartitaError
from .hf import TINY, build_hf_model
from .llama import build_model

_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def build_named_model(name: str, seed: int = 0) -> nn.Module:
    """The model called ``name`` (see the module docstring), identical on every rank for a seed."""
    if name in TINY:
        return build_hf_model(name, seed)
    path = Path(name)
    if path.is_dir():
        return build_hf_dir(path, seed)
    return build_model(name, seed=seed)


def build_hf_dir(path: Path, seed: int = 0) -> nn.Module:
    """An HF ``*ForCausalLM`` from ``path/config.json`` (weights loaded when present)."""
    if not (path / "config.json").is_file():
        raise PartitaError(f"--model {path}: a model directory needs a Hugging Face config.json")
    try:
        import transformers
    except ImportError:
        raise PartitaError("HF models need transformers: pip install 'partita[hf]'") from None
    config = transformers.AutoConfig.from_pretrained(str(path))
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    if any((path / w).is_file() for w in _WEIGHTS):
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), config=config, torch_dtype=torch.float32)
    else:
        model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model.partita_vocab = config.vocab_size
    return model
