"""Expert parallelism: routed experts sharded over the ep group, tokens exchanged with
all-to-all (autograd flows through ``torch.distributed.nn.functional.all_to_all_single``).

Each ep rank keeps experts ``[r E/ep, (r+1) E/ep)``. Given the routed tokens sorted by
global expert id and the per-expert counts, :func:`exchange` (1) exchanges the counts,
(2) sends every rank the tokens of its experts, (3) regroups what arrived by local expert,
runs the local experts, undoes the regrouping and (4) sends the results back. The
reference MoE (``partita.models.llama.MoE``) calls it through its ``dispatch`` hook; the
fused expert modules of HF Mixtral, Qwen2-MoE and Qwen3-MoE (``MixtralExperts``,
``Qwen2MoeExperts``, ``Qwen3MoeExperts``: one layout, one call) get a forward that routes
through it.
"""
from __future__ import annotations

import types
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.nn.functional import all_to_all_single

from ..models.llama import MoE
from .hf_moe import FUSED_EXPERTS


def _shard_dim0(module: nn.Module, names: tuple[str, ...], lo: int, n: int) -> None:
    for name in names:
        full = getattr(module, name)
        setattr(module, name, nn.Parameter(full.detach()[lo:lo + n].clone()))
        getattr(module, name)._partita_expert = True  # synced over the expert-data-parallel group


def apply_ep(model: nn.Module, ep_group: dist.ProcessGroup, ep: int) -> None:
    """Shard the routed experts of every MoE layer of ``model`` (reference, HF Mixtral / Qwen-MoE)."""
    rank = dist.get_rank(ep_group)
    for module in list(model.modules()):
        if isinstance(module, MoE):
            per_rank = module.num_experts // ep
            _shard_dim0(module.experts, ("w1", "w2", "w3"), rank * per_rank, per_rank)
            module.dispatch = types.MethodType(_make_dispatch(ep_group, ep, per_rank), module)
        elif type(module).__name__ in FUSED_EXPERTS:
            per_rank = module.num_experts // ep
            _shard_dim0(module, ("gate_up_proj", "down_proj"), rank * per_rank, per_rank)
            module.forward = types.MethodType(_hf_fused_experts_forward(ep_group, ep, per_rank), module)


def exchange(tokens: torch.Tensor, counts: list[int], group: dist.ProcessGroup, ep: int, per_rank: int,
             compute: Callable[[torch.Tensor, list[int]], torch.Tensor]) -> torch.Tensor:
    """Run ``compute`` (local experts on tokens grouped by local expert) on the tokens of
    every rank routed to this rank's experts; return the outputs in ``tokens``' order."""
    device = tokens.device
    send_counts = torch.tensor(counts, dtype=torch.int64, device=device)  # per global expert
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)  # [src rank][local expert]
    send_split = send_counts.view(ep, per_rank).sum(1).tolist()
    recv_matrix = recv_counts.view(ep, per_rank)
    recv_split = recv_matrix.sum(1).tolist()
    received = all_to_all_single(torch.empty(sum(recv_split), tokens.shape[1], dtype=tokens.dtype, device=device),
                                 tokens, recv_split, send_split, group=group)
    # arrived grouped by source rank, then local expert; regroup by local expert
    sizes = recv_matrix.flatten().tolist()
    chunks = list(torch.split(torch.arange(received.shape[0], device=device), sizes))
    order = torch.cat([chunks[src * per_rank + e] for e in range(per_rank) for src in range(ep)]) \
        if received.shape[0] else torch.zeros(0, dtype=torch.long, device=device)
    out_by_expert = compute(received[order], recv_matrix.sum(0).tolist())
    out = torch.empty_like(out_by_expert).index_copy(0, order, out_by_expert)
    return all_to_all_single(torch.empty(tokens.shape[0], out.shape[1], dtype=out.dtype, device=device),
                             out, send_split, recv_split, group=group)


def _make_dispatch(group: dist.ProcessGroup, ep: int, per_rank: int):
    def dispatch(self: MoE, tokens: torch.Tensor, counts: list[int]) -> torch.Tensor:
        return exchange(tokens, counts, group, ep, per_rank, self.experts)
    return dispatch


def _hf_fused_experts_forward(group: dist.ProcessGroup, ep: int, per_rank: int):
    """HF ``MixtralExperts.forward(hidden (T, h), top_k_index (T, k), top_k_weights (T, k))``
    (Qwen2-MoE's and Qwen3-MoE's experts: the same)
    with this rank's share of the fused expert weights (``gate_up_proj``, ``down_proj``)."""
    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        k = top_k_index.shape[1]
        chosen = top_k_index.flatten()
        order = chosen.argsort(stable=True)
        counts = torch.bincount(chosen, minlength=self.num_experts).tolist()  # num_experts: all of them
        routed = hidden.repeat_interleave(k, dim=0)[order]

        def compute(tokens: torch.Tensor, per_expert: list[int]) -> torch.Tensor:
            outs = []
            for e, chunk in enumerate(torch.split(tokens, per_expert, dim=0)):
                gate, up = nn.functional.linear(chunk, self.gate_up_proj[e]).chunk(2, dim=-1)
                outs.append(nn.functional.linear(self.act_fn(gate) * up, self.down_proj[e]))
            return torch.cat(outs, dim=0) if outs else tokens

        out_sorted = exchange(routed, counts, group, ep, per_rank, compute)
        out = torch.empty_like(out_sorted).index_copy(0, order, out_sorted)
        weights = top_k_weights.to(out.dtype).unsqueeze(-1)
        return (out.view(-1, k, out.shape[-1]) * weights).sum(1).to(hidden.dtype)
    return forward
