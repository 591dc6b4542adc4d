"""What the runtime needs to know about a model, for every model family it accepts
(:class:`partita.models.Transformer`, Hugging Face ``*ForCausalLM`` models): each answer
comes from the model's family (:func:`partita.models.registry.family_of`)."""
from __future__ import annotations

import torch
from torch import nn

from ..models.registry import family_of


def blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks, in order (the units of recompute, FSDP and pipelining)."""
    layers = family_of(model).layers(model)
    return list(layers.values()) if isinstance(layers, nn.ModuleDict) else list(layers)  # HF pipeline stages: a dict


def logits(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return family_of(model).logits(model, tokens)


def aux_loss(model: nn.Module) -> torch.Tensor:
    """MoE load-balancing loss of the last forward (reference models; HF: not used)."""
    return family_of(model).aux_loss(model)


def vocab_size(model: nn.Module) -> int:
    return family_of(model).vocab(model)
