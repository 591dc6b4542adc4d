"""Decoder-only transformer specs (dense, MoE, MLA) and what follows from the shape alone.

A :class:`ModelSpec` is pure data: the numbers a config.json or a paper gives. The
parameter counts here are exact for the architectures we name (tests check them
against the published totals); the FLOP counts follow the standard accounting:

* a GEMM of an ``m x k`` by ``k x n`` matrix costs ``2mkn`` FLOPs; the backward pass
  costs twice the forward (grad w.r.t. input and w.r.t. weight) [Kaplan et al. 2020,
  Narayanan et al. SC'21 appendix];
* attention scores and the weighted sum cost ``2 * s_ctx * d`` per query per head each,
  where ``s_ctx`` is the number of keys a query sees: ``s`` without a causal mask,
  on average ``(s+1)/2`` with one (flash attention skips masked blocks).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import PartitaError

PRESETS_FILE = Path(__file__).resolve().parent.parent / "catalog" / "models" / "presets.json"

POSITIONS = ("rope", "learned", "alibi")  # position encodings the parameter count knows
ACTIVATIONS = {"swiglu": 3, "geglu": 3, "gelu": 2, "relu2": 2, "relu": 2}  # weight matrices per MLP


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts layout (Mixtral, Qwen-MoE, DeepSeek)."""

    num_experts: int
    top_k: int
    expert_ffn_hidden: int
    shared_experts: int = 0
    shared_ffn_hidden: int = 0  # per shared expert
    first_dense_layers: int = 0  # leading layers with a dense MLP (DeepSeek first_k_dense_replace)
    layer_freq: int = 1  # every `layer_freq`-th layer (after the dense ones) is MoE
    shared_expert_gate: bool = False  # Qwen2-MoE's sigmoid gate on the shared expert


@dataclass(frozen=True)
class MLASpec:
    """DeepSeek multi-head latent attention ranks and head dims."""

    q_lora_rank: int  # 0 = no low-rank query projection
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer; everything the cost model needs."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    head_dim: int = 0  # 0 -> hidden // heads
    activation: str = "swiglu"
    norm: str = "rmsnorm"
    qkv_bias: bool = False
    out_bias: bool = False  # bias on attention output and MLP projections (GPT-2, BLOOM, NeoX)
    mlp_bias: bool = False
    tied_embeddings: bool = False
    position: str = "rope"  # rope | learned | alibi
    max_positions: int = 0  # for learned position embeddings
    dropout: bool = False  # GPT-style dropout (adds 1-byte masks to activations)
    embedding_norm: bool = False  # BLOOM's LayerNorm after the word embedding
    qk_norm: bool = False  # Qwen3 per-head RMSNorm on q and k
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    source: str = ""

    # ---------------------------------------------------------------- derived shape
    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of the query projection output (= attention output width for non-MLA)."""
        if self.mla:
            return self.heads * (self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim)
        return self.heads * self.head_size

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V) for standard attention: kv_heads * head_dim."""
        return self.kv_heads * self.head_size

    @property
    def attn_out_dim(self) -> int:
        if self.mla:
            return self.heads * self.mla.v_head_dim
        return self.heads * self.head_size

    @property
    def gated(self) -> bool:
        return ACTIVATIONS[self.activation] == 3

    def is_moe_layer(self, i: int) -> bool:
        m = self.moe
        return bool(m) and i >= m.first_dense_layers and (i - m.first_dense_layers) % m.layer_freq == 0

    @cached_property
    def cache_key(self) -> int:
        """A key for the cost model's memo tables, from the spec's content: two equal
        specs share entries, and a new spec never inherits another's (an ``id`` can be
        reused once an object is freed)."""
        return hash(repr(self))

    @cached_property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.layers))

    @cached_property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    # ---------------------------------------------------------------- parameters
    def _norm_params(self, width: int) -> int:
        return width * (2 if self.norm == "layernorm" else 1)

    def attention_params(self) -> int:
        """Attention weights of one layer (q/k/v/o, biases, MLA low-rank paths and norms)."""
        h = self.hidden
        if self.mla:
            m = self.mla
            qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
            if m.q_lora_rank:
                q = h * m.q_lora_rank + self._norm_params(m.q_lora_rank) + m.q_lora_rank * self.heads * qk_head
            else:
                q = h * self.heads * qk_head
            kv = (h * (m.kv_lora_rank + m.qk_rope_head_dim) + self._norm_params(m.kv_lora_rank)
                  + m.kv_lora_rank * self.heads * (m.qk_nope_head_dim + m.v_head_dim))
            return q + kv + self.attn_out_dim * h
        q, kv = self.q_dim, self.kv_dim
        params = h * (q + 2 * kv) + q * h
        if self.qkv_bias:
            params += q + 2 * kv
        if self.out_bias:
            params += h
        if self.qk_norm:
            params += 2 * self.head_size
        return params

    def mlp_params(self, ffn: int) -> int:
        """One MLP of width ``ffn`` (gated: gate, up, down; otherwise up, down)."""
        params = ACTIVATIONS[self.activation] * self.hidden * ffn
        if self.mlp_bias:
            params += ffn * (ACTIVATIONS[self.activation] - 1) + self.hidden
        return params

    def routed_expert_params(self) -> int:
        """One routed expert."""
        assert self.moe
        return self.mlp_params(self.moe.expert_ffn_hidden)

    def moe_block_params(self, active: bool = False) -> int:
        """Router, routed experts (all, or top-k when ``active``) and shared experts of one MoE layer."""
        m = self.moe
        assert m
        routed = (m.top_k if active else m.num_experts) * self.routed_expert_params()
        shared = m.shared_experts * self.mlp_params(m.shared_ffn_hidden) if m.shared_experts else 0
        gate = self.hidden if m.shared_expert_gate else 0
        return self.hidden * m.num_experts + routed + shared + gate

    def layer_params(self, i: int, active: bool = False) -> int:
        return self.layer_kind_params(self.is_moe_layer(i), active)

    def layer_kind_params(self, moe: bool, active: bool = False) -> int:
        """Parameters of a dense (``moe=False``) or MoE layer."""
        return self._kind_params[(moe, active)]

    @cached_property
    def _kind_params(self) -> dict[tuple[bool, bool], int]:
        norms = 2 * self._norm_params(self.hidden)
        out = {}
        for moe in (False, True):
            for active in (False, True):
                if moe and not self.moe:
                    continue
                mlp = self.moe_block_params(active) if moe else self.mlp_params(self.ffn_hidden)
                out[(moe, active)] = self.attention_params() + mlp + norms
        return out

    @cached_property
    def moe_flags(self) -> tuple[bool, ...]:
        """Per layer: is it a MoE layer?"""
        return tuple(self.is_moe_layer(i) for i in range(self.layers))

    def embedding_params(self) -> int:
        params = self.vocab * self.hidden
        if self.position == "learned":
            params += self.max_positions * self.hidden
        if self.embedding_norm:
            params += self._norm_params(self.hidden)
        return params

    def output_params(self) -> int:
        """Final norm plus the output projection (zero extra weights when tied)."""
        return self._norm_params(self.hidden) + (0 if self.tied_embeddings else self.vocab * self.hidden)

    def total_params(self) -> int:
        return self.embedding_params() + sum(self.layer_params(i) for i in range(self.layers)) + self.output_params()

    def active_params(self) -> int:
        """Parameters one token touches (top-k routed experts only)."""
        return self.embedding_params() + sum(self.layer_params(i, True) for i in range(self.layers)) + self.output_params()

    def expert_params(self) -> int:
        """All routed-expert weights (what expert parallelism shards)."""
        if not self.moe:
            return 0
        return self.moe_layers * self.moe.num_experts * self.routed_expert_params()

    # ---------------------------------------------------------------- FLOPs
    def matmul_params_per_token(self) -> int:
        """Weights a token multiplies with (active experts, output layer; no embedding lookup)."""
        per_layer = sum(self.layer_params(i, True) - 2 * self._norm_params(self.hidden) for i in range(self.layers))
        return per_layer + self.vocab * self.hidden

    def attention_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """Forward FLOPs of scores + weighted sum per token, all layers.

        Per layer and query: ``2 * s_ctx * heads * d_qk`` (QK^T) + ``2 * s_ctx * heads * d_v`` (AV).
        ``s_ctx = (s+1)/2`` on average under a causal mask, ``s`` without.
        """
        s_ctx = (seq_len + 1) / 2 if causal else seq_len
        d_qk = self.q_dim // self.heads
        d_v = self.attn_out_dim // self.heads
        return self.layers * 2 * s_ctx * self.heads * (d_qk + d_v)

    def model_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """Training FLOPs per token (forward + backward = 3x forward), no recomputation.

        ``6 * N_matmul + 3 * attention`` [Kaplan et al. 2020 eq. 2.2; PaLM appendix B].
        This is the numerator of MFU.
        """
        return 6 * self.matmul_params_per_token() + 3 * self.attention_flops_per_token(seq_len, causal)

    # ---------------------------------------------------------------- io
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: v for k, v in d.items() if v not in (None, "", 0, False) or k in ("name", "hidden", "layers")}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "model spec") -> "ModelSpec":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise PartitaError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
        data = dict(data)
        try:
            if data.get("moe"):
                data["moe"] = MoESpec(**data["moe"])
            if data.get("mla"):
                data["mla"] = MLASpec(**data["mla"])
            spec = cls(**data)
        except TypeError as e:
            raise PartitaError(f"{where}: {e}") from None
        return spec.validated(where)

    def validated(self, where: str = "model spec") -> "ModelSpec":
        """This spec, if it can be a model; else a one-line :class:`PartitaError` naming the
        field and what would be valid. Every structural check of a model is here: each field's
        type and range (:func:`_check_fields`), then how the fields fit together
        (:func:`_check_structure`)."""
        _check_fields(self, where)
        for sub, kind in ((self.moe, MoESpec), (self.mla, MLASpec)):
            if sub is not None and not isinstance(sub, kind):
                names = ", ".join(f.name for f in fields(kind))
                raise PartitaError(f"{where}: {'moe' if kind is MoESpec else 'mla'} must be an object with {names}, "
                                   f"got {sub!r}"[:300])
        for sub in (self.moe, self.mla):
            if sub is not None:
                _check_fields(sub, f"{where}: {'moe' if sub is self.moe else 'mla'}")
        if self.activation not in ACTIVATIONS:
            raise PartitaError(f"{where}: activation {self.activation!r} is not one of {', '.join(ACTIVATIONS)}")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise PartitaError(f"{where}: norm must be rmsnorm or layernorm, got {self.norm!r}")
        if self.position not in POSITIONS:
            raise PartitaError(f"{where}: position must be one of {', '.join(POSITIONS)}, got {self.position!r}")
        _check_structure(self, where)
        return self


#: Upper bounds of model sizes: far beyond any real model (the largest have ~10^2 layers,
#: 2.5x10^4 hidden, 2.6x10^5 vocabulary), so that every estimate and search is bounded.
_MAX_FIELD = {"layers": 10_000, "vocab": 1 << 24, "num_experts": 1 << 16, "top_k": 1 << 16,
              "shared_experts": 1 << 16, "heads": 1 << 16, "kv_heads": 1 << 16}
_MAX_WIDTH = 1 << 22  # hidden, ffn and head sizes
#: Integer fields that must be at least 1 (the others may be 0).
_POSITIVE = ("hidden", "layers", "heads", "kv_heads", "vocab", "ffn_hidden", "num_experts", "top_k",
             "expert_ffn_hidden", "layer_freq", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


def _check_fields(spec: Any, where: str) -> None:
    """Every field of the dataclass ``spec`` has its annotated type (int, bool, str) and
    every integer is within bounds, named in one line (a string, a float or a bool where
    a size belongs would otherwise reach the cost model)."""
    for f in fields(spec):
        value, kind = getattr(spec, f.name), str(f.type)
        if kind == "int":
            low = 1 if f.name in _POSITIVE else 0
            high = _MAX_FIELD.get(f.name, _MAX_WIDTH)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise PartitaError(f"{where}: {f.name} must be a whole number from {low} to {high:,}, got {value!r}")
        elif kind == "bool" and not isinstance(value, bool):
            raise PartitaError(f"{where}: {f.name} must be true or false, got {value!r}")
        elif kind == "str" and not isinstance(value, str):
            raise PartitaError(f"{where}: {f.name} must be a string, got {value!r}")


def _check_structure(spec: ModelSpec, where: str) -> None:
    """How the fields of a spec whose every field is in range (:func:`_check_fields`) fit
    together: the heads share out the hidden size and the kv heads, the MoE layout fits the
    layers and its experts, and every width a part of the model has is at least 1."""
    moe = spec.moe
    if moe and moe.first_dense_layers > spec.layers:
        raise PartitaError(f"{where}: moe.first_dense_layers ({moe.first_dense_layers}) must not exceed "
                           f"layers ({spec.layers})")
    if spec.heads % spec.kv_heads:
        raise PartitaError(f"{where}: heads ({spec.heads}) must be a multiple of kv_heads ({spec.kv_heads})")
    if not spec.head_dim and spec.hidden % spec.heads and not spec.mla:
        raise PartitaError(f"{where}: hidden ({spec.hidden}) is not divisible by heads ({spec.heads}); set head_dim")
    if moe and not (0 < moe.top_k <= moe.num_experts):
        raise PartitaError(f"{where}: moe.top_k must be in 1..num_experts ({moe.num_experts}), got {moe.top_k}")
    if moe and moe.shared_experts and not moe.shared_ffn_hidden:  # cost/ would count them as 0, models/ as routed
        raise PartitaError(f"{where}: moe.shared_ffn_hidden must be a whole number from 1 to {_MAX_WIDTH:,} with "
                           f"moe.shared_experts {moe.shared_experts} (each shared expert's MLP width), got 0")
    if spec.position == "learned" and not spec.max_positions:
        raise PartitaError(f"{where}: max_positions must be a whole number from 1 to {_MAX_WIDTH:,} with position "
                           "'learned' (the learned position table's length), got 0")
