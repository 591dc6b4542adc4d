"""LoRA activations under selective recompute as each framework means it (cost/finetune.py
``activation_delta``): Megatron-Core's ``--recompute-granularity selective`` checkpoints only the
core attention (``recompute_modules`` default ``["core_attn"]``, NVIDIA/Megatron-LM@d98e8a64dd
megatron/core/transformer/transformer_config.py l.1940-1941; attention.py
``_checkpointed_attention_forward``), so every other op of a LoRA layer saves what it saves with no
recompute - a frozen, untargeted linear frees its input - while op-level SAC (partita's runtime,
torchtitan) keeps only its listed GEMM outputs.

Oracle: ``torch.autograd.graph.saved_tensors_hooks`` on one dense layer written as Megatron-Core
builds it (fused ``linear_qkv`` of width ``q + 2 kv``, the core attention under
``torch.utils.checkpoint``, ``linear_proj``, gated ``linear_fc1`` of width ``2 f``, ``linear_fc2``),
its adapters as NeMo's ``ParallelLinearAdapter`` (tests/test_finetune_adapters_fused.py): the bytes a
LoRA layer saves (frozen base, adapters on the plan's targets) less those the same layer saves fully
trained, against ``activation_delta`` of a ``framework=megatron, recompute=selective`` plan.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from test_finetune_adapters_fused import CFG, RANK, NemoLoraLinear

from partita.cost.finetune import activation_delta
from partita.plan import Plan
from partita.spec.hf_config import parse_hf_config

SEQ = 64
#: which of Megatron-Core's four linears each plan target set adapts (NeMo's target_modules names)
TARGETED = {"attention": {"linear_qkv", "linear_proj"}, "qkv": {"linear_qkv"}, "mlp": {"linear_fc1", "linear_fc2"},
            "all-linear": {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"}}


class MegatronLayer(torch.nn.Module):
    """A Megatron-Core dense GPT layer (norms as modules, no dropout), the core attention checkpointed."""

    def __init__(self, targets: set[str], lora: bool) -> None:
        super().__init__()
        h, self.heads = CFG["hidden_size"], CFG["num_attention_heads"]
        self.head, self.kv_heads, f = h // self.heads, CFG["num_key_value_heads"], CFG["intermediate_size"]
        q, kv = self.heads * self.head, self.kv_heads * self.head
        torch.manual_seed(0)
        self.norm1, self.norm2 = torch.nn.RMSNorm(h), torch.nn.RMSNorm(h)
        self.lin = {"linear_qkv": NemoLoraLinear(h, q + 2 * kv, RANK, 8.0), "linear_proj": NemoLoraLinear(q, h, RANK, 8.0),
                    "linear_fc1": NemoLoraLinear(h, 2 * f, RANK, 8.0), "linear_fc2": NemoLoraLinear(f, h, RANK, 8.0)}
        self.targets, self.lora = targets, lora
        for m in self.lin.values():
            m.base.requires_grad_(not lora)  # full training: every weight; LoRA: the base frozen
        # the norms' weights frozen in both runs: an eager RMSNorm saves its normalised input for a
        # weight gradient, which Transformer Engine's fused norm (input and rstd only) does not
        self.norm1.requires_grad_(False), self.norm2.requires_grad_(False)

    def _linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return self.lin[name](x, lora=self.lora and name in self.targets)

    def _core_attention(self, qkv: torch.Tensor) -> torch.Tensor:
        b, s, _ = qkv.shape
        q, k, v = qkv.split([self.heads * self.head, self.kv_heads * self.head, self.kv_heads * self.head], dim=-1)
        q = q.view(b, s, self.heads, self.head).transpose(1, 2)
        k, v = (t.view(b, s, self.kv_heads, self.head).transpose(1, 2) for t in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return out.transpose(1, 2).reshape(b, s, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self._linear("linear_qkv", self.norm1(x))
        attn = torch.utils.checkpoint.checkpoint(self._core_attention, qkv, use_reentrant=False)
        x = x + self._linear("linear_proj", attn)
        gate, up = self._linear("linear_fc1", self.norm2(x)).chunk(2, dim=-1)
        return x + self._linear("linear_fc2", F.silu(gate) * up)


def saved_activation_bytes(layer: MegatronLayer) -> int:
    """Bytes of the distinct storages autograd saves over one forward (weights excluded), with the
    layer's input requiring a gradient (a layer above the first)."""
    weights = {p.untyped_storage().data_ptr() for m in layer.lin.values() for p in m.parameters()}
    weights |= {p.untyped_storage().data_ptr() for p in layer.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in weights:
            storages[st.data_ptr()] = st.nbytes()
        return t

    x = torch.randn(1, SEQ, CFG["hidden_size"], requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return sum(storages.values())


@pytest.mark.parametrize("targets", ["attention", "qkv", "mlp", "all-linear"])
def test_module_selective_lora_delta_is_what_a_megatron_layer_saves(targets: str) -> None:
    spec = parse_hf_config(CFG)
    measured = saved_activation_bytes(MegatronLayer(TARGETED[targets], lora=True)) \
        - saved_activation_bytes(MegatronLayer(TARGETED[targets], lora=False))
    plan = Plan(seq_len=SEQ, mbs=1, gbs=1, dtype="fp32", finetune="lora", lora_rank=RANK, lora_targets=targets,
                framework="megatron", recompute="selective")
    assert activation_delta(spec, plan, False, "selective") == measured
    # the op-level rule (the adapters' intermediates only, what the count charged a megatron plan
    # before) misses the inputs a frozen, untargeted linear frees: wrong wherever one stays frozen
    fused_adapters_only = SEQ * RANK * 4 * len(TARGETED[targets])
    assert (measured == fused_adapters_only) == (targets == "all-linear")
    # op-level SAC (torchtitan: PEFT's unfused adapters, one per nn.Linear) keeps exactly those
    peft_adapters = {"attention": 4, "qkv": 3, "mlp": 3, "all-linear": 7}[targets]
    op_level = activation_delta(spec, dataclasses.replace(plan, framework="torchtitan"), False, "selective")
    assert op_level == SEQ * RANK * 4 * peft_adapters
