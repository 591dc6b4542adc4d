"""Scaled dot-product attention as a fused (flash) kernel, for tracing.

On the meta device ``F.scaled_dot_product_attention`` falls back to its math
decomposition (``Q K^T``, softmax, ``P V`` as separate ops), which saves the ``s x s``
probabilities for backward - what no training run on an accelerator does: they run a
fused kernel that saves only Q, K, V, the output and an fp32 log-sum-exp per query row
[Dao 2023, FlashAttention-2, sec. 3.1; PyTorch's ``_scaled_dot_product_flash_attention``
saves the same]. :class:`FusedAttentionMode` replaces every call by the custom op
``partita::fused_attention`` that does exactly that, with torch's FLOP formulas for the
fused kernels (``sdpa_flop_count``: two GEMMs forward; ``sdpa_backward_flop_count``: five
backward, the kernel recomputes the scores, so backward = 2.5x forward), scaled by
``(s+1)/(2s)`` under a causal mask (a flash kernel skips the masked tiles; torch's
formula ignores ``is_causal``).

Outside the meta device (models whose forward needs real data, e.g. routing with
``.tolist()``) the op computes real attention (math), and its backward returns zero
gradients of the right shapes: a trace needs shapes, never gradient values.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count


def _lse_shape(q: torch.Tensor) -> list[int]:
    return list(q.shape[:-1])


@torch.library.custom_op("partita::fused_attention", mutates_args=())
def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                    causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Output and log-sum-exp of attention over ``(..., L, E)`` tensors (real data)."""
    if k.shape[-3:-2] != q.shape[-3:-2] and q.dim() == 4:  # grouped-query attention
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = (q.float() @ k.float().transpose(-2, -1)) * scale
    if causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    lse = torch.logsumexp(scores, dim=-1)
    out = (torch.softmax(scores, dim=-1) @ v.float()).to(q.dtype)
    return _heads_inner(out), lse


def _heads_inner(out: torch.Tensor) -> torch.Tensor:
    """``(b, h, s, d)`` with the memory layout of ``(b, s, h, d)``, as flash kernels
    return it (so the usual ``transpose(1, 2).reshape(b, s, -1)`` after attention is a
    view, not a copy)."""
    if out.dim() != 4:
        return out.contiguous()
    return out.transpose(1, 2).contiguous().transpose(1, 2)


@fused_attention.register_fake
def _(q, k, v, mask, causal, scale):
    out_shape = list(q.shape[:-1]) + [v.shape[-1]]
    if q.dim() == 4:
        b, h, s, d = out_shape
        out = q.new_empty((b, s, h, d)).transpose(1, 2)
    else:
        out = q.new_empty(out_shape)
    return out, q.new_empty(_lse_shape(q), dtype=torch.float32)


@torch.library.custom_op("partita::fused_attention_backward", mutates_args=())
def fused_attention_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             out: torch.Tensor, lse: torch.Tensor, causal: bool
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradient shapes of the fused kernel (values are not needed by a trace)."""
    return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)


@fused_attention_backward.register_fake
def _(grad, q, k, v, out, lse, causal):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output) -> None:
    q, k, v, mask, causal, scale = inputs
    out, lse = output
    ctx.causal = causal
    ctx.save_for_backward(q, k, v, out, lse)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = fused_attention_backward(grad_out, q, k, v, out, lse, ctx.causal)
    return dq, dk, dv, None, None, None


fused_attention.register_autograd(_backward, setup_context=_setup)


def _causal_factor(q_len: int, k_len: int, causal: bool) -> float:
    """Share of (query, key) pairs a causal mask keeps: ``(s+1)/(2s)`` for ``s`` queries
    and keys (square masks; otherwise 1)."""
    return (q_len + 1) / (2 * q_len) if causal and q_len == k_len and q_len > 0 else 1.0


def _as4(t) -> tuple[int, ...]:
    """The ``(b, h, s, d)`` shape torch's SDPA formulas expect, from ``(..., s, d)``."""
    shape = tuple(t)
    if len(shape) == 4:
        return shape
    lead = math.prod(shape[:-2])
    return (lead, 1, *shape[-2:])


def _kv_as_q(q_shape, kv_shape) -> tuple[int, ...]:
    """K/V at the query's head count (grouped-query attention does the work of every query head)."""
    q4, kv4 = _as4(q_shape), _as4(kv_shape)
    return (q4[0], q4[1], kv4[2], kv4[3])


@register_flop_formula(torch.ops.partita.fused_attention)
def _forward_flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    causal = args[1] if len(args) > 1 else kwargs.get("causal", False)
    q4 = _as4(q_shape)
    flops = sdpa_flop_count(q4, _kv_as_q(q_shape, k_shape), _kv_as_q(q_shape, v_shape))
    return int(flops * _causal_factor(q4[2], _as4(k_shape)[2], causal))


@register_flop_formula(torch.ops.partita.fused_attention_backward)
def _backward_flops(grad_shape, q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    causal = args[2] if len(args) > 2 else kwargs.get("causal", False)
    q4 = _as4(q_shape)
    flops = sdpa_backward_flop_count(_as4(grad_shape), q4, _kv_as_q(q_shape, k_shape), _kv_as_q(q_shape, v_shape))
    return int(flops * _causal_factor(q4[2], _as4(k_shape)[2], causal))


class FusedAttentionMode(TorchFunctionMode):
    """Routes ``F.scaled_dot_product_attention`` to :func:`fused_attention` while active.

    ``calls`` counts the substitutions; ``active`` is true while the op runs, so a
    saved-tensor hook can tell the attention kernel's saved tensors from the rest
    (tensor parallelism splits them by heads)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.active = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self._attend(*args, **kwargs)
        return func(*args, **kwargs)

    def _attend(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        self.calls += 1
        scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            attn_mask = attn_mask.to(q.dtype)
        self.active = True
        try:
            out, _ = fused_attention(q, k, v, attn_mask, bool(is_causal), float(scale))
        finally:
            self.active = False
        return out
