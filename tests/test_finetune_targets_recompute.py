"""LoRA activations as each framework's layer saves them (cost/finetune.py ``activation_delta``).

* Selective recompute is the framework's: Megatron-Core's ``--recompute-granularity selective``
  checkpoints only the core attention (``recompute_modules`` default ``["core_attn"]``,
  NVIDIA/Megatron-LM@d98e8a64dd megatron/core/transformer/transformer_config.py l.1940-1941;
  attention.py ``_checkpointed_attention_forward``), so every other op of a LoRA layer saves what it
  saves with no recompute - a frozen, untargeted linear frees its input - while op-level SAC
  (partita's runtime, torchtitan) keeps only its listed GEMM outputs.
* The out projection's input is the attention kernel's own output, which the kernel saves for its
  backward (Transformer Engine ``FusedAttnFunc`` saves q, k, v and out; torch's SDPA flash kernels
  write their output in the query's (b, s, heads, d) memory order, so Hugging Face's
  ``transpose(1, 2).contiguous()`` before ``o_proj`` is a view of it): a frozen out projection frees
  nothing unless the core attention is checkpointed.

Oracle: ``torch.autograd.graph.saved_tensors_hooks`` on one dense layer built the way each framework
builds it - Megatron-Core's fused ``linear_qkv`` (q + 2 kv) and ``linear_fc1`` (2 f) with NeMo's
``ParallelLinearAdapter`` (tests/test_finetune_adapters_fused.py), or PEFT's one adapter per
``nn.Linear`` - with its core attention checkpointed, run as a kernel that saves its output, or run
as torch's SDPA followed by the transpose and reshape Hugging Face runs: the bytes a LoRA layer saves (frozen base, adapters on the plan's
targets) less those the same layer saves fully trained, against ``activation_delta``.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import saved_storages
from test_finetune_adapters_fused import CFG, RANK, NemoLoraLinear

from partita.cost.finetune import activation_delta
from partita.plan import Plan
from partita.spec.hf_config import parse_hf_config

SEQ = 64
#: which linears each plan target set adapts: Megatron-Core's fused names, PEFT's per-nn.Linear names
TARGETED = {
    True: {"attention": {"linear_qkv", "linear_proj"}, "qkv": {"linear_qkv"}, "mlp": {"linear_fc1", "linear_fc2"}},
    False: {"attention": {"q", "k", "v", "o"}, "qkv": {"q", "k", "v"}, "mlp": {"gate", "up", "down"}},
}
for _fused, _sets in TARGETED.items():
    _sets["all-linear"] = _sets["attention"] | _sets["mlp"]


class KernelAttention(torch.autograd.Function):
    """A fused attention kernel as Transformer Engine's ``FusedAttnFunc`` runs it: returns its output
    in the layer's ``[b, s, heads x d]`` layout and saves q, k, v and that same output for backward."""

    @staticmethod
    def forward(ctx, q, k, v):  # noqa: D102 - torch.autograd.Function protocol
        with torch.no_grad():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            out = out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)
        ctx.save_for_backward(q, k, v, out)
        return out

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        q, k, v, _ = ctx.saved_tensors
        with torch.enable_grad():
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return torch.autograd.grad(out.transpose(1, 2).reshape(grad.shape), (q, k, v), grad)


class Layer(torch.nn.Module):
    """A dense GPT layer (norms as modules, no dropout): Megatron-Core's fused linears (``fused``) or
    one ``nn.Linear`` each; the core attention ``checkpoint``-ed, a saving ``kernel``, or ``sdpa``
    then transpose and reshape (as Hugging Face's attention)."""

    def __init__(self, targets: set[str], lora: bool, fused: bool, attention: str) -> None:
        super().__init__()
        h, self.heads = CFG["hidden_size"], CFG["num_attention_heads"]
        self.head, self.kv_heads, f = h // self.heads, CFG["num_key_value_heads"], CFG["intermediate_size"]
        q, kv = self.heads * self.head, self.kv_heads * self.head
        torch.manual_seed(0)
        self.norm1, self.norm2 = torch.nn.RMSNorm(h), torch.nn.RMSNorm(h)
        # the norms' weights frozen in both runs: an eager RMSNorm saves its normalised input for a
        # weight gradient, which Transformer Engine's fused norm (input and rstd only) does not
        self.norm1.requires_grad_(False), self.norm2.requires_grad_(False)
        dims = ({"linear_qkv": (h, q + 2 * kv), "linear_proj": (q, h), "linear_fc1": (h, 2 * f), "linear_fc2": (f, h)}
                if fused else {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "gate": (h, f), "up": (h, f),
                               "down": (f, h)})
        self.lin = {n: NemoLoraLinear(i, o, RANK, 8.0) for n, (i, o) in dims.items()}
        for m in self.lin.values():
            m.base.requires_grad_(not lora)  # full training: every weight; LoRA: the base frozen
        self.targets, self.lora, self.fused, self.attention = targets, lora, fused, attention

    def _linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return self.lin[name](x, lora=self.lora and name in self.targets)

    def _heads(self, t: torch.Tensor, n: int) -> torch.Tensor:
        return t.view(t.shape[0], t.shape[1], n, self.head).transpose(1, 2)

    def _core_attention(self, q, k, v) -> torch.Tensor:
        if self.attention == "kernel":
            return KernelAttention.apply(q, k, v)
        if self.attention == "unfused":  # matmul, softmax, matmul; then the contiguous copy (HF eager)
            k, v = (t.repeat_interleave(self.heads // self.kv_heads, dim=1) for t in (k, v))
            scores = (q @ k.transpose(-1, -2)) / self.head ** 0.5
            mask = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).triu(1)
            out = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
            return out.transpose(1, 2).contiguous().view(q.shape[0], q.shape[2], -1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n1 = self.norm1(x)
        if self.fused:
            q, k, v = self._linear("linear_qkv", n1).split(
                [self.heads * self.head, self.kv_heads * self.head, self.kv_heads * self.head], dim=-1)
        else:
            q, k, v = (self._linear(n, n1) for n in ("q", "k", "v"))
        q, k, v = self._heads(q, self.heads), self._heads(k, self.kv_heads), self._heads(v, self.kv_heads)
        if self.attention == "checkpoint":
            attn = torch.utils.checkpoint.checkpoint(self._core_attention, q, k, v, use_reentrant=False)
        else:
            attn = self._core_attention(q, k, v)
        x = x + self._linear("linear_proj" if self.fused else "o", attn)
        n2 = self.norm2(x)
        if self.fused:
            gate, up = self._linear("linear_fc1", n2).chunk(2, dim=-1)
        else:
            gate, up = self._linear("gate", n2), self._linear("up", n2)
        return x + self._linear("linear_fc2" if self.fused else "down", F.silu(gate) * up)


def saved_activation_bytes(layer: Layer) -> int:
    """Bytes of the distinct storages autograd saves over one forward (weights excluded), with the
    layer's input requiring a gradient (a layer above the first)."""
    weights = {p.untyped_storage().data_ptr() for m in layer.lin.values() for p in m.parameters()}
    weights |= {p.untyped_storage().data_ptr() for p in layer.parameters()}
    x = torch.randn(1, SEQ, CFG["hidden_size"], requires_grad=True)
    with saved_storages(weights) as storages:
        layer(x)
    return sum(storages.values())


def measured_delta(targets: str, fused: bool, attention: str) -> int:
    names = TARGETED[fused][targets]
    return saved_activation_bytes(Layer(names, True, fused, attention)) \
        - saved_activation_bytes(Layer(names, False, fused, attention))


def _plan(targets: str, framework: str, recompute: str) -> Plan:
    return Plan(seq_len=SEQ, mbs=1, gbs=1, dtype="fp32", finetune="lora", lora_rank=RANK, lora_targets=targets,
                framework=framework, recompute=recompute)


TARGET_SETS = ["attention", "qkv", "mlp", "all-linear"]


@pytest.mark.parametrize("targets", TARGET_SETS)
def test_module_selective_lora_delta_is_what_a_megatron_layer_saves(targets: str) -> None:
    """framework megatron, recompute selective: the core attention checkpointed, all else as saved."""
    spec = parse_hf_config(CFG)
    measured = measured_delta(targets, True, "checkpoint")
    assert activation_delta(spec, _plan(targets, "megatron", "selective"), False, "selective") == measured
    # the op-level rule (the adapters' intermediates only, what the count charged a megatron plan
    # before) misses the inputs a frozen, untargeted linear frees: wrong wherever one stays frozen
    assert (measured == SEQ * RANK * 4 * len(TARGETED[True][targets])) == (targets == "all-linear")
    # op-level SAC (torchtitan: PEFT's unfused adapters, one per nn.Linear) keeps exactly those
    op_level = activation_delta(spec, _plan(targets, "torchtitan", "selective"), False, "selective")
    assert op_level == SEQ * RANK * 4 * len(TARGETED[False][targets])


@pytest.mark.parametrize("targets", TARGET_SETS)
def test_no_recompute_delta_follows_where_the_out_projection_reads(targets: str) -> None:
    """Recompute none: the out projection reads the attention kernel's saved output, in
    Megatron-Core's layer and in a PEFT layer over SDPA alike - freezing it frees nothing (the
    count freed it for the ``mlp`` set before: 16 KiB too low here, ``SEQ x q x 4`` bytes)."""
    spec = parse_hf_config(CFG)
    megatron = measured_delta(targets, True, "kernel")
    assert activation_delta(spec, _plan(targets, "megatron", "none"), False, "none") == megatron
    peft = measured_delta(targets, False, "sdpa")
    assert activation_delta(spec, _plan(targets, "deepspeed", "none"), False, "none") == peft


@pytest.mark.parametrize("targets", TARGET_SETS)
def test_unfused_attention_hands_the_out_projection_its_own_copy(targets: str) -> None:
    """attention=unfused, recompute none: the attention output reaches the out projection as a
    contiguous copy only the projection saves, so a frozen projection frees it."""
    spec = parse_hf_config(CFG)
    plan = _plan(targets, "deepspeed", "none").with_(attention="unfused")
    assert activation_delta(spec, plan, False, "none") == measured_delta(targets, False, "unfused")
