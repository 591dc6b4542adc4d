"""A LLaMA-style decoder (RMSNorm, RoPE, GQA, SwiGLU, SDPA) and its MoE variant.

Written for clarity and for parallelisation from outside: layers live in an
``nn.ModuleDict`` keyed by their index so parameter names stay the same when a
pipeline stage drops the others; attention reshapes with ``view(b, s, -1, head_dim)``
so tensor parallelism can shard heads without the module knowing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import PartitaError
from ..spec.load import load_model


@dataclass
class TransformerConfig:
    vocab: int = 256
    hidden: int = 64
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    ffn_hidden: int = 128
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tied_embeddings: bool = False
    # MoE (num_experts == 0: dense)
    num_experts: int = 0
    top_k: int = 2
    expert_ffn_hidden: int = 64
    shared_experts: int = 0
    shared_ffn_hidden: int = 64
    aux_loss_coef: float = 0.01
    init_std: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def from_spec(cls, spec) -> "TransformerConfig":
        """Build from a :class:`partita.spec.model.ModelSpec` (LLaMA-family fields only)."""
        cfg = cls(vocab=spec.vocab, hidden=spec.hidden, layers=spec.layers, heads=spec.heads, kv_heads=spec.kv_heads,
                  ffn_hidden=spec.ffn_hidden, tied_embeddings=spec.tied_embeddings)
        if spec.mla or spec.activation != "swiglu" or spec.norm != "rmsnorm":
            raise PartitaError(f"model {spec.name}: the reference model builds LLaMA-style blocks "
                               "(swiglu, rmsnorm, no MLA); use an HF model for other architectures")
        if spec.moe:
            m = spec.moe
            cfg.num_experts, cfg.top_k, cfg.expert_ffn_hidden = m.num_experts, m.top_k, m.expert_ffn_hidden
            cfg.shared_experts, cfg.shared_ffn_hidden = m.shared_experts, m.shared_ffn_hidden or m.expert_ffn_hidden
        return cfg


#: the reference models' configs, for tests and benchmarks that vary them; read from the
#: catalog presets of the same names (one source: ``catalog/models``), as ``build_model`` does
MODEL_PRESETS = {name: TransformerConfig.from_spec(load_model(name))
                 for name in ("tiny-llama", "small-llama", "tiny-moe")}


def rope_tables(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of the last dim; x is (b, s, heads, head_dim)."""
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


def repeat_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped-query attention: repeat each K/V head for the query heads that share it."""
    if k.shape[1] == q.shape[1]:
        return k, v
    rep = q.shape[1] // k.shape[1]
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)


class Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.hidden, cfg.heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)  # local heads inferred (tensor parallel)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        cos, sin = self.rope_rows(cos, sin, s)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = self.attend(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))

    def rope_rows(self, cos: torch.Tensor, sin: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The RoPE table rows of this sequence's positions: ``0 .. s-1``. A hook: context
        parallel replaces it with the global positions of the rank's sequence chunks."""
        return cos[:s], sin[:s]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention over (b, heads, s, head_dim); a hook context parallel replaces."""
        return F.scaled_dot_product_attention(q, *repeat_kv(q, k, v), is_causal=True)


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(w1 x) * w3 x)."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class GroupedExperts(nn.Module):
    """``num_experts`` SwiGLU experts stored as 3-D weights (expert dim first), so expert
    parallelism can shard dim 0. ``forward`` takes tokens already grouped by expert."""

    def __init__(self, num_experts: int, hidden: int, ffn: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden, ffn))
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden, ffn))
        self.w2 = nn.Parameter(torch.empty(num_experts, ffn, hidden))

    def forward(self, tokens: torch.Tensor, counts: list[int]) -> torch.Tensor:
        outs = []
        for e, chunk in enumerate(torch.split(tokens, counts, dim=0)):
            outs.append((F.silu(chunk @ self.w1[e]) * (chunk @ self.w3[e])) @ self.w2[e])
        return torch.cat(outs, dim=0) if outs else tokens


class MoE(nn.Module):
    """Top-k routed experts plus optional shared experts, with a load-balancing loss.

    Router: softmax over expert logits, top-k, weights renormalised over the chosen k
    (Mixtral). Load-balancing loss (Switch Transformer, Fedus et al. 2021 eq. 4, top-k
    form): ``E * sum_i f_i * P_i`` with ``f_i`` the fraction of routed slots that chose
    expert i and ``P_i`` the mean router probability of expert i.

    ``dispatch`` is the hook expert parallelism replaces: given tokens sorted by expert
    and the per-expert counts, return the expert outputs in the same order.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.num_experts, self.top_k = cfg.num_experts, cfg.top_k
        self.router = nn.Linear(cfg.hidden, cfg.num_experts, bias=False)
        self.experts = GroupedExperts(cfg.num_experts, cfg.hidden, cfg.expert_ffn_hidden)
        self.shared = FeedForward(cfg.hidden, cfg.shared_ffn_hidden * cfg.shared_experts) if cfg.shared_experts else None
        self.aux_loss = torch.zeros(())

    def dispatch(self, tokens: torch.Tensor, counts: list[int]) -> torch.Tensor:
        return self.experts(tokens, counts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        flat = x.reshape(-1, h)
        probs = F.softmax(self.router(flat).float(), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).type_as(x)
        # load-balancing loss on this micro-batch's tokens
        frac = torch.zeros(self.num_experts, device=x.device).scatter_add_(
            0, chosen.flatten(), torch.ones(chosen.numel(), device=x.device)) / chosen.numel()
        self.aux_loss = self.num_experts * (frac * probs.mean(0)).sum()
        order = chosen.flatten().argsort(stable=True)
        counts = torch.bincount(chosen.flatten(), minlength=self.num_experts).tolist()
        routed = flat.repeat_interleave(self.top_k, dim=0)[order]
        out_sorted = self.dispatch(routed, counts)
        out = torch.empty_like(out_sorted).index_copy_(0, order, out_sorted)
        out = (out.view(-1, self.top_k, h) * weights.unsqueeze(-1)).sum(1)
        if self.shared is not None:
            out = out + self.shared(flat)
        return out.view(b, s, h)


class Block(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.attention_norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.feed_forward = MoE(cfg) if cfg.num_experts else FeedForward(cfg.hidden, cfg.ffn_hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """Embedding -> blocks -> norm -> output. Any of the three ends may be ``None``
    (pipeline stages keep only their part)."""

    def __init__(self, cfg: TransformerConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings: nn.Module | None = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.layers)})
        self.norm: nn.Module | None = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.output: nn.Module | None = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        if cfg.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int = 0) -> None:
        """Every parameter from its own generator seeded by ``(seed, name)`` (see
        :mod:`.init`: matrices normal(0, init_std), residual-branch outputs scaled by depth
        as in GPT-2 / Megatron, norms ones), so that a meta-device build sharded by any plan
        gets the same weights. Parameters on the meta device are left alone."""
        from .init import init_model_
        init_model_(self, seed)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens``: (b, s) int64 on the first stage, or (b, s, h) hidden states later."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        cos, sin = self.rope_cos, self.rope_sin
        for block in self.layers.values():
            h = block(h, cos, sin)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h

    def aux_loss(self) -> torch.Tensor:
        """Sum of the MoE load-balancing losses of the last forward, times the coefficient."""
        losses = [b.feed_forward.aux_loss for b in self.layers.values() if isinstance(b.feed_forward, MoE)]
        if not losses:
            return torch.zeros(())
        return self.cfg.aux_loss_coef * torch.stack([l.to(torch.float32) for l in losses]).sum()


def build_model(name_or_cfg: str | TransformerConfig, seed: int = 0, device: str | torch.device = "cpu") -> Transformer:
    """Build a reference model deterministically from ``seed`` (same weights on every rank).

    ``device="meta"``: parameters on the meta device (no storage, nothing drawn; buffers
    real); :func:`partita.parallelize` shards it and each rank initialises only its shard,
    to exactly the weights ``build_model(name, seed)`` has (:mod:`.init`)."""
    cfg = name_or_cfg if isinstance(name_or_cfg, TransformerConfig) else \
        TransformerConfig.from_spec(load_model(name_or_cfg))
    if torch.device(device).type == "meta":
        from .init import params_on_meta
        with params_on_meta():
            model = Transformer(cfg, seed)
    else:
        with torch.device(device):
            model = Transformer(cfg, seed)
    model.partita_seed = seed
    return model
