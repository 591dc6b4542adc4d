"""Pipeline stages of a Hugging Face ``*ForCausalLM`` (Llama, Qwen2, Mixtral).

HF models run embedding, rotary tables, decoder layers, norm and head inside one
``forward``, so a stage cannot be "the model minus some layers". :class:`HFStage` keeps the
pieces of one stage under the model's own attribute paths (``model.embed_tokens``,
``model.layers.<i>``, ``model.norm``, ``lm_head``), so parameter names are unchanged, and
runs them the way ``LlamaModel.forward`` does for a batch without padding or cache:
positions ``0..s-1``, rotary tables from ``model.rotary_emb``, and no attention mask, which
makes HF's SDPA attention causal (``is_causal`` when the mask is ``None``). Sequence
parallel runs HF models through a one-stage :class:`HFStage` too: HF's own forward would
take the positions from the sequence shard's length; a later pipeline stage under sequence
parallel receives a shard, and ``seq_shards`` scales its length back. Context parallel
(:func:`.context_parallel.apply_cp_hf`) sets the positions of the rank's chunks and their
causal mask on the stage.
"""
from __future__ import annotations

import torch
from torch import nn


class HFStage(nn.Module):
    #: how many sequence shards a hidden-state input is (tp under sequence parallel, set by
    #: :func:`.tensor_parallel.apply_tp_hf`): a later pipeline stage receives the previous
    #: stage's sequence shard, ``s / tp`` positions of the ``s`` the rotary table must cover
    seq_shards: int = 1
    #: context parallel (:func:`.context_parallel.apply_cp_hf`): the global positions of this
    #: rank's tokens and the causal mask between them and the whole sequence's
    cp_positions: torch.Tensor | None = None
    cp_mask: torch.Tensor | None = None

    def __init__(self, model: nn.Module, keep: list[int], first: bool, last: bool):
        super().__init__()
        self.config = model.config
        self.model = nn.Module()
        self.model.embed_tokens = model.model.embed_tokens if first else None
        self.model.layers = nn.ModuleDict({str(i): model.model.layers[i] for i in keep})
        self.model.rotary_emb = model.model.rotary_emb
        self.model.norm = model.model.norm if last else None
        self.lm_head = model.lm_head if last else None

    def forward(self, x: torch.Tensor | None = None, input_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, **_) -> torch.Tensor:
        x = x if x is not None else input_ids  # also callable as model(input_ids=...)
        h = self.model.embed_tokens(x) if self.model.embed_tokens is not None else x
        # positions from the input's full length: with sequence parallel h holds only a shard,
        # and so does x on a stage after the first (the previous stage's output)
        s = x.shape[1] if self.model.embed_tokens is not None else x.shape[1] * self.seq_shards
        positions = torch.arange(s, device=h.device)[None]
        mask = None
        if position_ids is not None:  # packed SFT rows: positions restart per sample, attention stays inside it
            positions, mask = position_ids, document_mask(position_ids)
        elif self.cp_positions is not None:  # context parallel: this rank's chunks of the sequence
            positions, mask = self.cp_positions.to(h.device)[None], self.cp_mask.to(h.device)
        rotary = self.model.rotary_emb(h, positions)
        for layer in self.model.layers.values():
            out = layer(h, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
            h = out[0] if isinstance(out, tuple) else out
        if self.model.norm is not None:
            h = self.model.norm(h)
        return self.lm_head(h) if self.lm_head is not None else h


def document_mask(positions: torch.Tensor) -> torch.Tensor:
    """The (b, 1, s, s) boolean attention mask of packed rows: causal, and a token attends
    only to tokens of its own sample (a sample starts where the position id is 0) - the
    mask transformers derives from such position ids itself (``find_packed_sequence_indices``)."""
    doc = (positions == 0).cumsum(-1)
    s = positions.shape[-1]
    causal = torch.ones(s, s, dtype=torch.bool, device=positions.device).tril()
    return ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]


def hf_stage(model: nn.Module, keep: list[int], first: bool, last: bool) -> nn.Module:
    """A stage holding layers ``keep`` (+ embedding on the first, norm and head on the last)."""
    import copy
    return HFStage(copy.deepcopy(model), keep, first, last)
