"""What the runtime needs to know about a model, for both model families it accepts:
:class:`partita.models.Transformer` and Hugging Face ``*ForCausalLM`` models."""
from __future__ import annotations

import torch
from torch import nn

from ..models.hf import is_hf


def blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks, in order (the units of recompute, FSDP and pipelining)."""
    layers = model.model.layers if is_hf(model) else model.layers
    return list(layers.values()) if isinstance(layers, nn.ModuleDict) else list(layers)  # HF pipeline stages: a dict


def logits(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    if is_hf(model):
        out = model(input_ids=tokens, use_cache=False)
        return getattr(out, "logits", out)  # an HF model's output, or an HFStage's logits
    return model(tokens)


def aux_loss(model: nn.Module) -> torch.Tensor:
    """MoE load-balancing loss of the last forward (reference models; HF: not used)."""
    fn = getattr(model, "aux_loss", None)
    return fn() if callable(fn) and not is_hf(model) else torch.zeros(())


def vocab_size(model: nn.Module) -> int:
    return model.config.vocab_size if is_hf(model) else model.cfg.vocab
