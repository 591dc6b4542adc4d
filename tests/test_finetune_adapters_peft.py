"""LoRA adapters as PEFT builds them, against what the cost model charges (cost/finetune.py).

Oracles from outside the cost model: huggingface/peft's own ``LoraConfig`` / ``get_peft_model``
on a tiny Hugging Face Llama (which modules get an adapter, their shapes), torch's
``FlopCounterMode`` (the adapters' FLOPs) and the bytes torch's dispatcher sees each aten op
read and write (a ``TorchDispatchMode`` summing every non-view op's tensor arguments and
results) - with LoRA less without it, on the same frozen linear whose input needs a gradient.
"""
from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM

from partita.cost.finetune import adapter_traffic, lora_linears, lora_shape
from partita.plan import Plan
from partita.spec.hf_config import parse_hf_config

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "tie_word_embeddings": False}
#: PEFT's names for Partita's target sets on a Hugging Face Llama
TARGETS = {"attention": ["q_proj", "k_proj", "v_proj", "o_proj"], "mlp": ["gate_proj", "up_proj", "down_proj"],
           "all-linear": "all-linear"}


class ByteCounter(TorchDispatchMode):
    """Bytes every aten op reads and writes (its tensor arguments and results), views left out
    (they move nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            tensors = [t for t in tree_flatten((args, kwargs or {}, out))[0] if isinstance(t, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
        return out


def _adapter_structure(targets: str) -> list[tuple[int, int]]:
    """(in, out) of every adapter PEFT puts on one layer of the tiny Llama, from its lora_A / lora_B."""
    model = get_peft_model(LlamaForCausalLM(LlamaConfig(**TINY)), LoraConfig(r=4, target_modules=TARGETS[targets]))
    layer = model.base_model.model.model.layers[0]
    return sorted((m.lora_A["default"].in_features, m.lora_B["default"].out_features)
                  for m in layer.modules() if hasattr(m, "lora_A"))


def test_peft_wraps_each_linear_as_the_unfused_structure_counts() -> None:
    """PEFT on a Hugging Face model: one adapter per nn.Linear (q, k, v separate), which is what
    a plan under an HF framework (deepspeed) prices; Megatron's fused structure has fewer."""
    spec = parse_hf_config(TINY)
    for targets in TARGETS:
        plan = Plan(finetune="lora", lora_rank=4, lora_targets=targets, framework="deepspeed")
        shape = lora_shape(plan)
        assert not shape.fused
        ours = sorted((lin.in_features, lin.out_features) for lin in lora_linears(spec, False, targets, shape.fused))
        assert ours == _adapter_structure(targets)
    fused = lora_linears(spec, False, "all-linear", lora_shape(Plan(finetune="lora", framework="megatron")).fused)
    assert len(fused) == 4 < len(_adapter_structure("all-linear")) == 7


def _run(model: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor) -> tuple[int, int, float]:
    """(forward bytes, forward + backward bytes, forward + backward FLOPs) of one step."""
    with ByteCounter() as fwd_counter:
        y = model(x)
    with ByteCounter() as bwd_counter, FlopCounterMode(display=False) as flops:
        y.backward(grad)
    with FlopCounterMode(display=False) as fwd_flops:
        model(x.detach().requires_grad_())
    return fwd_counter.bytes, fwd_counter.bytes + bwd_counter.bytes, flops.get_total_flops() + fwd_flops.get_total_flops()


def test_one_peft_adapter_moves_and_computes_what_adapter_traffic_counts() -> None:
    """A frozen nn.Linear wrapped by PEFT (r 4, eager): the bytes and FLOPs LoRA adds over the
    bare frozen linear are adapter_traffic's - 1 in + 6 out passes forward, 5 in + 4 out
    backward (not twice the forward, the count before), FLOPs 6 T r (in + out)."""
    tokens, din, dout, r = 4096, 48, 80, 4
    torch.manual_seed(0)

    def build(lora: bool) -> torch.nn.Module:
        net = torch.nn.Sequential()
        net.add_module("proj", torch.nn.Linear(din, dout, bias=False))
        net.requires_grad_(False)
        if lora:
            net = get_peft_model(net, LoraConfig(r=r, lora_alpha=8, target_modules=["proj"]))
            torch.nn.init.normal_(net.base_model.model.proj.lora_B["default"].weight)
        return net

    x = torch.randn(tokens, din, requires_grad=True)
    grad = torch.randn(tokens, dout)
    base = _run(build(False), x, grad)
    x.grad = None
    lora = _run(build(True), x, grad)
    measured_fwd, measured_all, measured_flops = (a - b for a, b in zip(lora, base))
    tr = adapter_traffic(tokens, din, dout, r, 4)
    fwd = sum(b for _, b in tr.forward_gemm) + tr.forward_pointwise
    # the weights' own reads (r x in, out x r: under 0.1 % here) are the only bytes not charged
    assert abs(measured_fwd / fwd - 1) < 0.01
    assert abs(measured_all / tr.bytes - 1) < 0.01
    assert measured_flops == tr.flops == 6 * tokens * r * (din + dout)
    twice_forward = 3 * fwd  # the old charge: backward = 2 x forward
    assert abs(measured_all / twice_forward - 1) > 0.2
