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


def build_train_model(name: str, seed: int, device: torch.device) -> tuple[nn.Module, str | None]:
    """The model ``partita train`` runs, and the HF directory to load its weights from.

    A directory with an HF ``config.json`` and ``*.safetensors``: the HF model with its
    parameters as uninitialised storage (built on the meta device; nothing is drawn from
    ``seed``), filled after the plan is applied by
    :func:`partita.models.hf_weights.load_hf_weights`. ``hf-llama`` / ``hf-qwen2`` /
    ``hf-mixtral``: the tiny HF models. Anything else: :func:`build_model` (reference
    models; a config-only directory trains its architecture from ``seed``)."""
    from .hf_weights import build_hf_meta, has_hf_weights, materialize
    if has_hf_weights(name):
        return materialize(build_hf_meta(name), device), str(Path(name))
    if name in TINY:
        return build_hf_model(name, seed), None
    return build_model(name, seed=seed), None


def model_vocab(model: nn.Module) -> int:
    """The vocabulary size of a reference or HF model."""
    return getattr(model, "partita_vocab", None) or model.cfg.vocab
