"""Hugging Face MoE models with fused routed experts, as expert parallel meets them.

Mixtral, Qwen2-MoE and Qwen3-MoE keep their routed experts as one fused module
(``MixtralExperts`` / ``Qwen2MoeExperts`` / ``Qwen3MoeExperts``: ``gate_up_proj`` (E, 2 f, h),
``down_proj`` (E, h, f), called as ``experts(hidden, top_k_index, top_k_weights)``), so
expert parallel shards them the same way (:mod:`.expert_parallel`). Qwen2-MoE adds a
sigmoid-gated shared expert, which stays dense (replicated over ep, averaged over dp).
The tiny Qwen-MoE models of the equivalence checks (``hf-qwen2-moe``, ``hf-qwen3-moe``) are
:data:`partita.models.registry.TINY_HF_MOE`.
"""
from __future__ import annotations

#: the fused routed-expert modules expert parallel shards (same layout and call)
FUSED_EXPERTS = ("MixtralExperts", "Qwen2MoeExperts", "Qwen3MoeExperts")
