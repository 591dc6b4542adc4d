"""Expert parallelism: routed experts sharded over the ep group, tokens exchanged with
all-to-all (autograd flows through ``torch.distributed.nn.functional.all_to_all_single``).

Each ep rank keeps experts ``[r E/ep, (r+1) E/ep)``. A MoE layer's ``dispatch`` gets its
tokens sorted by global expert id and the per-expert counts; we (1) exchange the counts,
(2) send every rank the tokens of its experts, (3) regroup what arrived by local expert,
run the local experts, undo the regrouping and (4) send the results back.
"""
from __future__ import annotations

import types

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.nn.functional import all_to_all_single

from ..models.llama import MoE


def apply_ep(model: nn.Module, ep_group: dist.ProcessGroup, ep: int) -> None:
    rank = dist.get_rank(ep_group)
    for block in model.layers.values():
        moe = block.feed_forward
        if not isinstance(moe, MoE):
            continue
        per_rank = moe.num_experts // ep
        lo = rank * per_rank
        experts = moe.experts
        for name in ("w1", "w2", "w3"):
            full = getattr(experts, name)
            setattr(experts, name, nn.Parameter(full.detach()[lo:lo + per_rank].clone()))
            getattr(experts, name)._partita_expert = True  # synced over the expert-data-parallel group
        moe.dispatch = types.MethodType(_make_dispatch(ep_group, ep, per_rank), moe)


def _make_dispatch(group: dist.ProcessGroup, ep: int, per_rank: int):
    def dispatch(self: MoE, tokens: torch.Tensor, counts: list[int]) -> torch.Tensor:
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
        per_expert = recv_matrix.sum(0).tolist()
        out_by_expert = self.experts(received[order], per_expert)
        out = torch.empty_like(out_by_expert).index_copy(0, order, out_by_expert)
        return all_to_all_single(torch.empty(tokens.shape[0], out.shape[1], dtype=out.dtype, device=device),
                                 out, send_split, recv_split, group=group)
    return dispatch
