"""LoRA on Megatron-Core's fused projections (NeMo, Megatron-Bridge, Megatron-SWIFT, MindSpeed),
against what the cost model charges for a plan under framework megatron (cost/finetune.py).

The oracle is a small module written as NeMo's source builds the adapter - not the cost
model's code: Megatron-Core's ``linear_qkv`` of width ``q + 2 kv`` (NVIDIA/Megatron-LM@d98e8a64
megatron/core/transformer/attention.py:1689) and, gated, ``linear_fc1`` of width ``2 ffn``
(mlp.py:206), each wrapped like NeMo's ``AdapterParallelAdd``: the frozen base's output plus a
``ParallelLinearAdapter`` (``linear_in`` r x in, ``linear_out`` out x r, then ``x * (alpha /
dim)``; nemo/collections/nlp/modules/common/megatron/adapters/parallel_adapters.py) reading the
same input once. Its parameters are counted from the module, its FLOPs by torch's
``FlopCounterMode`` and its bytes by the dispatcher (tests/test_finetune_adapters_peft.py).
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode
from test_finetune_adapters_peft import ByteCounter

from partita.cost.finetune import adapter_costs, adapter_traffic, layer_adapter_params, lora_linears, lora_shape
from partita.cost.shape import layer_shape
from partita.plan import Plan
from partita.spec.hardware import make_cluster
from partita.spec.hf_config import parse_hf_config

CFG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "tie_word_embeddings": False}
RANK, TOKENS = 4, 2048


class NemoLoraLinear(torch.nn.Module):
    """A frozen Megatron linear plus NeMo's LoRA adapter, added to its output."""

    def __init__(self, din: int, dout: int, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = torch.nn.Linear(din, dout, bias=False).requires_grad_(False)
        self.linear_in = torch.nn.Linear(din, rank, bias=False)
        self.linear_out = torch.nn.Linear(rank, dout, bias=False)
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor, lora: bool = True) -> torch.Tensor:
        out = self.base(x)
        return out + self.linear_out(self.linear_in(x)) * self.scale if lora else out


def _megatron_layer() -> dict[str, NemoLoraLinear]:
    """One layer's four targeted linears as Megatron-Core builds them (widths from the config)."""
    h, head = CFG["hidden_size"], CFG["hidden_size"] // CFG["num_attention_heads"]
    q, kv, f = CFG["num_attention_heads"] * head, CFG["num_key_value_heads"] * head, CFG["intermediate_size"]
    torch.manual_seed(0)
    return {"linear_qkv": NemoLoraLinear(h, q + 2 * kv, RANK, 8.0), "linear_proj": NemoLoraLinear(q, h, RANK, 8.0),
            "linear_fc1": NemoLoraLinear(h, 2 * f, RANK, 8.0), "linear_fc2": NemoLoraLinear(f, h, RANK, 8.0)}


def _plan(framework: str) -> Plan:
    return Plan(seq_len=TOKENS, mbs=1, gbs=1, dtype="fp32", finetune="lora", lora_rank=RANK,
                lora_targets="all-linear", framework=framework)


def test_megatron_plan_counts_one_adapter_per_fused_linear() -> None:
    spec, layer = parse_hf_config(CFG), _megatron_layer()
    lora = lora_shape(_plan("megatron"))
    assert lora.fused
    trained = sum(p.numel() for m in layer.values() for p in m.parameters() if p.requires_grad)
    assert layer_adapter_params(spec, False, lora) == (trained, 0)
    ours = sorted((lin.in_features, lin.out_features) for lin in lora_linears(spec, False, "all-linear", True))
    assert ours == sorted((m.base.in_features, m.base.out_features) for m in layer.values())
    # the unfused (PEFT) count has two more A matrices on q/k/v and one more on gate/up
    unfused = layer_adapter_params(spec, False, lora_shape(_plan("deepspeed")))[0]
    assert unfused - trained == RANK * CFG["hidden_size"] * 3


def test_fused_adapters_flops_and_bytes_are_what_the_megatron_plan_charges() -> None:
    """Each fused linear run forward and backward on T tokens: LoRA's added FLOPs equal the
    layer's adapter FLOPs in the megatron plan's stage terms (adapter_costs), and its added bytes
    the fused structure's count - PEFT's unfused structure would move 19 % more here."""
    spec, layer = parse_hf_config(CFG), _megatron_layer()
    flops = bytes_ = 0.0
    for m in layer.values():
        x = torch.randn(TOKENS, m.base.in_features, requires_grad=True)
        grad = torch.randn(TOKENS, m.base.out_features)
        for lora, sign in ((True, 1), (False, -1)):
            with ByteCounter() as moved, FlopCounterMode(display=False) as counted:
                m(x, lora).backward(grad)
            flops += sign * counted.get_total_flops()
            bytes_ += sign * moved.bytes
            x.grad = None
    plan = _plan("megatron")
    fwd, bwd = adapter_costs(spec, make_cluster("h100", 1).device, layer_shape(plan), False, lora_shape(plan))
    assert flops == fwd.gemm_flops + bwd.gemm_flops
    fused = sum(adapter_traffic(TOKENS, lin.in_features, lin.out_features, RANK, 4).bytes
                for lin in lora_linears(spec, False, "all-linear", True))
    unfused = sum(adapter_traffic(TOKENS, lin.in_features, lin.out_features, RANK, 4).bytes
                  for lin in lora_linears(spec, False, "all-linear", False))
    assert abs(bytes_ / fused - 1) < 0.01
    assert unfused / bytes_ - 1 > 0.1
