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
from .hf import TINY, build_hf_from_config, build_hf_model
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


def build_hf_dir(path: Path, seed: int = 0, meta: bool = False) -> nn.Module:
    """An HF ``*ForCausalLM`` from ``path/config.json``: the directory's weights when it has
    them (``from_pretrained``), else initialised from ``seed`` (``meta``: on the meta device)."""
    if not (path / "config.json").is_file():
        raise PartitaError(f"--model {path}: a model directory needs a Hugging Face config.json")
    try:
        import transformers
    except ImportError:
        raise PartitaError("HF models need transformers: pip install 'partita[hf]'") from None
    config = transformers.AutoConfig.from_pretrained(str(path))
    config._attn_implementation = "sdpa"
    if not any((path / w).is_file() for w in _WEIGHTS):
        return build_hf_from_config(config, transformers.AutoModelForCausalLM, seed, meta)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), config=config, torch_dtype=torch.float32)
    model.partita_vocab = config.vocab_size
    return model


def build_train_model(name: str, seed: int, device: torch.device) -> tuple[nn.Module, str | None]:
    """The model ``partita train`` runs, on the meta device, and the HF directory its weights
    come from (None: from ``seed``).

    Every model is built with its parameters on the meta device (no storage, nothing drawn);
    :func:`partita.parallelize` applies the plan and then each rank materialises only its
    shards (:mod:`partita.runtime.materialize`): a directory with an HF ``config.json`` and
    ``*.safetensors`` is read slice by slice (``safe_open(...).get_slice``); ``hf-llama`` /
    ``hf-qwen2`` / ``hf-mixtral``, reference models and config-only directories are
    initialised from ``seed``, parameter by parameter, to the weights the single-process
    model of that seed has. ``device`` is where the plan puts them (kept for callers)."""
    from .hf_weights import build_hf_meta, has_hf_weights
    if has_hf_weights(name):
        return build_hf_meta(name), str(Path(name))
    if name in TINY:
        return build_hf_model(name, seed, meta=True), None
    if Path(name).is_dir():
        return build_hf_dir(Path(name), seed, meta=True), None
    return build_model(name, seed=seed, device="meta"), None


def model_vocab(model: nn.Module) -> int:
    """The vocabulary size of a reference or HF model."""
    return getattr(model, "partita_vocab", None) or model.cfg.vocab
