"""Tiny Hugging Face Qwen-MoE models (Qwen2-MoE, Qwen3-MoE) for the runtime's equivalence
checks, built from a config (no download), like ``partita.models.hf``'s tiny models.

Both architectures keep their routed experts as one fused module (``Qwen2MoeExperts`` /
``Qwen3MoeExperts``: ``gate_up_proj`` (E, 2 f, h), ``down_proj`` (E, h, f), called as
``experts(hidden, top_k_index, top_k_weights)``), the layout of ``MixtralExperts``, so
expert parallel shards them the same way (:mod:`.expert_parallel`). Qwen2-MoE adds a
sigmoid-gated shared expert, which stays dense (replicated over ep, averaged over dp).
"""
from __future__ import annotations

from torch import nn

from ..models.hf import build_hf_model

#: name -> (config class, model class, architecture-specific config fields)
TINY_MOE = {
    "hf-qwen2-moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                     {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                      "shared_expert_intermediate_size": 64}),
    "hf-qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                     {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "norm_topk_prob": True}),
}
#: the fused routed-expert modules expert parallel shards (same layout and call)
FUSED_EXPERTS = ("MixtralExperts", "Qwen2MoeExperts", "Qwen3MoeExperts")


def build_tiny_moe(name: str, seed: int = 0, meta: bool = False) -> nn.Module:
    """A tiny Qwen2-MoE / Qwen3-MoE ``*ForCausalLM`` with weights from ``seed``: the shape of
    :data:`partita.models.hf.TINY_BASE`, built by :func:`partita.models.hf.build_hf_model`
    from this module's table (``meta=True``: on the meta device, for ``parallelize``)."""
    return build_hf_model(name, seed, meta=meta, table=TINY_MOE)
