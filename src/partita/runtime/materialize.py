"""Meta-device models: storage and weights for this rank's shards only, after the plan is applied.

:func:`partita.parallelize` accepts a model whose parameters are on the meta device
(``build_model(name, seed, device="meta")``, ``resolve_model(name).build(seed, meta=True)``,
``build_hf_meta(DIR)``). It splits and shards it while it is still meta (pipeline stages,
DTensor tensor parallel, expert slices, FSDP2), then :func:`materialize_shards` gives every
parameter storage of its *local* shape on the device (``_apply(empty_like)``, what
``nn.Module.to_empty`` does, but buffers - real already - are kept; FSDP2's ``_apply``
re-points its padded shard storage) and fills it from a source:

* :class:`SeedInit`: the full parameter drawn from its own generator (``(seed, name)``,
  :mod:`partita.models.init`), sliced to the shard - bit-identical to the single-process
  model of the same seed, under every plan; at most one full parameter lives at a time;
* :class:`~partita.models.hf_weights.CheckpointReader`: the shard's slice of the HF
  safetensors files (``safe_open(...).get_slice``), nothing else read.

Where a shard starts in the full tensor comes from DTensor's own
``compute_local_shape_and_global_offset`` (tensor parallel, FSDP, HSDP) and, for expert
parallel's dim-0 slices, from the ep rank (:func:`partita.models.hf_weights._placement`).
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ..models.hf_weights import CheckpointReader, fill_shards
from ..models.init import full_init, init_rules


class SeedInit:
    """Slices of the weights ``seed`` gives a model (the rules and names of the unsplit model)."""

    def __init__(self, model: nn.Module, seed: int):
        self.seed = seed
        self.rules = init_rules(model)
        # tied parameters (one tensor, several names): every name maps to the first one
        first: dict[int, str] = {}
        self.alias: dict[str, str] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            self.alias[name] = first.setdefault(id(p), name)

    def read(self, name: str, shape: tuple[int, ...], offset: tuple[int, ...], local: tuple[int, ...]) -> torch.Tensor:
        name = self.alias.get(name, name)
        full = full_init(self.rules[name], name, tuple(shape), self.seed)
        return full[tuple(slice(o, o + n) for o, n in zip(offset, local))]


def init_source(model: nn.Module):
    """Where a meta model's weights come from: its HF directory, else its seed (a LoRA model:
    the source :func:`.lora.inject_lora` set, which wraps one of those)."""
    custom = getattr(model, "partita_init", None)
    if custom is not None:
        return custom
    source = getattr(model, "partita_source", None)
    if source:
        return CheckpointReader(Path(source), bool(getattr(model.config, "tie_word_embeddings", False)))
    return SeedInit(model, int(getattr(model, "partita_seed", 0)))


def move_buffers(model: nn.Module, device: torch.device) -> nn.Module:
    """``model.to(device)`` for the real tensors of a meta model (its buffers)."""
    return model._apply(lambda t: t if t.device.type == "meta" else t.to(device))


def _to_empty(module: nn.Module, device: torch.device) -> None:
    """Uninitialised storage of each meta parameter's local shape; attributes the runtime set
    on a parameter (``_partita_expert``) survive even where ``_apply`` makes a new Parameter."""
    marks = {name: dict(p.__dict__) for name, p in module.named_parameters() if p.__dict__}
    module._apply(lambda t: torch.empty_like(t, device=device) if t.device.type == "meta" else t)
    for name, p in module.named_parameters():
        for key, value in marks.get(name, {}).items():
            if not hasattr(p, key):
                setattr(p, key, value)


@torch.no_grad()
def materialize_shards(modules: list[nn.Module], device: torch.device, source, ep_group=None, ep: int = 1) -> int:
    """Storage for and values of this rank's shards of every (sharded, meta) parameter of
    ``modules``; returns the number of values this rank wrote."""
    ep_rank = dist.get_rank(ep_group) if ep_group is not None else -1
    cores = []
    for module in modules:
        _to_empty(module, device)
        cores.append(module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module)
    return fill_shards(cores, source, ep, ep_rank)
