"""Context parallelism: the sequence split over the cp ranks, K/V all-gathered.

Load-balanced causal sharding (Megatron-Core CP, Llama 3 paper sec. 3.3.2): the sequence
is cut into ``2 cp`` chunks and cp rank ``r`` keeps chunks ``r`` and ``2cp-1-r``, so every
rank has the same amount of causal attention work. Each attention layer computes Q, K, V
for its own tokens, all-gathers K and V over the cp group (backward: reduce-scatter of
their gradients) and attends with a causal mask built from the tokens' global positions;
RoPE uses those global positions too. This is the all-gather-KV form of context parallel
(Llama 3's choice for its CP); PyTorch's ``context_parallel`` needs a device with SDPA
flash/efficient kernels and does not run on gloo (see the shared pytorch_cpu notes).

The loss of a rank is the mean over its tokens; as all ranks hold the same number,
averaging gradients and losses over the flattened (dp, cp) group gives the global mean.

MoE load-balancing loss ``E sum_i f_i P_i`` (see :class:`partita.models.llama.MoE`) is not
a mean over tokens: the product of two token averages. Computed from a cp rank's own
tokens it differs from the single-process loss. As Megatron-Core does (the router's
``tokens_per_expert`` all-reduced over the tp x cp "sequence partition group" before
``switch_load_balancing_loss_func``), the routing fractions ``f_i`` are summed over the
cp group - they carry no gradient - while ``P_i`` stays the mean router probability of
the rank's own tokens: the cp ranks' average of ``E sum_i f_i P_i^(r)`` is then exactly
the loss of the whole sequence, and averaging the gradients over cp gives its gradient.
"""
from __future__ import annotations

import types

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..models.llama import Attention, MoE, repeat_kv
from ..models.registry import family_of


def local_positions(seq_len: int, cp: int, cp_rank: int) -> torch.Tensor:
    """Global positions of rank ``cp_rank``'s tokens: chunks ``r`` and ``2cp-1-r`` of ``2cp``."""
    chunk = seq_len // (2 * cp)
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk)
    second = torch.arange((2 * cp - 1 - cp_rank) * chunk, (2 * cp - cp_rank) * chunk)
    return torch.cat([first, second])


class _GatherSeq(torch.autograd.Function):
    """All-gather along dim 2 (the sequence of (b, heads, s, d)); backward reduce-scatters."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        n = dist.get_world_size(group)
        parts = x.movedim(2, 0).contiguous()
        out = torch.empty((n * parts.shape[0], *parts.shape[1:]), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, parts, group=group)
        return out.movedim(0, 2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        n = dist.get_world_size(ctx.group)
        full = grad.movedim(2, 0).contiguous()
        out = torch.empty((full.shape[0] // n, *full.shape[1:]), dtype=grad.dtype, device=grad.device)
        dist.reduce_scatter_tensor(out, full, group=ctx.group)
        return out.movedim(0, 2), None


def apply_cp(model: nn.Module, group: dist.ProcessGroup, seq_len: int, cp: int) -> torch.Tensor:
    """Make every attention layer of ``model`` context-parallel over ``group``; returns this
    rank's token positions (the columns of the batch it must feed)."""
    rank = dist.get_rank(group)
    mine = local_positions(seq_len, cp, rank)
    everyone = torch.cat([local_positions(seq_len, cp, r) for r in range(cp)])  # all-gather order
    if family_of(model).name == "hf":
        apply_cp_hf(model, group, mine, everyone)
        return mine
    for module in model.modules():
        if isinstance(module, Attention):
            module.rope_rows = types.MethodType(_rope_rows(mine), module)
            module.attend = types.MethodType(_attend(group, mine, everyone), module)
        elif isinstance(module, MoE):
            _global_routing_fractions(module, group)
    return mine


def _global_routing_fractions(moe: MoE, group: dist.ProcessGroup) -> None:
    """Recompute ``moe.aux_loss`` after each forward with the routing fractions of the
    whole sequence (all cp ranks) and this rank's router probabilities (module docstring).
    The router's logits are caught by a forward hook; the top-k choice is the one the
    layer made (same logits, same ``topk``)."""
    seen: dict[str, torch.Tensor] = {}
    moe.router.register_forward_hook(lambda _m, _inputs, out: seen.__setitem__("logits", out))
    forward = moe.forward

    def wrapped(x: torch.Tensor, _forward=forward) -> torch.Tensor:
        out = _forward(x)
        probs = F.softmax(seen.pop("logits").float(), dim=-1)
        chosen = probs.topk(moe.top_k, dim=-1).indices.flatten()
        counts = torch.bincount(chosen, minlength=moe.num_experts).float()
        dist.all_reduce(counts, group=group)
        frac = counts / (chosen.numel() * dist.get_world_size(group))
        moe.aux_loss = moe.num_experts * (frac * probs.mean(0)).sum()
        return out

    moe.forward = wrapped


def _rope_rows(mine: torch.Tensor):
    def rope_rows(self, cos: torch.Tensor, sin: torch.Tensor, s: int):
        idx = mine.to(cos.device)
        return cos[idx], sin[idx]
    return rope_rows


def _attend(group: dist.ProcessGroup, mine: torch.Tensor, everyone: torch.Tensor):
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k, v = _GatherSeq.apply(k, group), _GatherSeq.apply(v, group)
        mask = everyone.to(q.device)[None, :] <= mine.to(q.device)[:, None]  # causal on global positions
        return F.scaled_dot_product_attention(q, *repeat_kv(q, k, v), attn_mask=mask)
    return attend


#: the transformers attention implementation :func:`apply_cp_hf` gives each attention layer
HF_CP_ATTENTION = "partita_cp"


def apply_cp_hf(stage: nn.Module, group: dist.ProcessGroup, mine: torch.Tensor, everyone: torch.Tensor) -> None:
    """Context parallel for an HF dense model run as an :class:`~.hf_pipeline.HFStage`
    (Llama, Qwen2): the stage takes RoPE positions and the causal mask from the global
    positions of this rank's tokens (``mine`` against ``everyone``, the all-gather order),
    and each attention layer all-gathers its K and V over ``group`` before transformers' own
    SDPA attention (:func:`_cp_attention`, registered as an attention implementation and
    set on a copy of the layer's config, so the model's config stays as it was)."""
    import copy

    from transformers import AttentionInterface
    AttentionInterface.register(HF_CP_ATTENTION, _cp_attention)
    stage.cp_positions = mine
    stage.cp_mask = (everyone[None, :] <= mine[:, None])[None, None]  # (1, 1, s_local, s): causal, global
    for layer in stage.model.layers.values():
        attn = layer.self_attn
        attn.config = copy.copy(attn.config)
        attn.config._attn_implementation = HF_CP_ATTENTION
        attn.partita_cp_group = group


def _cp_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention over the K/V of the whole sequence: this rank's keys and
    values (b, kv_heads, s_local, d) all-gathered over the cp group (backward: their
    gradients reduce-scattered), attended under the stage's global-position causal mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    group = module.partita_cp_group
    key, value = _GatherSeq.apply(key, group), _GatherSeq.apply(value, group)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
