"""LoRA dropout (``plan.lora_dropout``; cost/finetune.py): what it keeps and what it moves.

With ``lora_dropout > 0`` PEFT runs ``lora_B(lora_A(dropout(x)))`` (huggingface/peft
tuners/lora/layer.py ``Linear.forward``), one ``nn.Dropout`` per adapter: each adapter keeps its
own dropped copy of its input and the dropout's mask, and ``A`` no longer keeps ``x`` itself, so a
frozen base linear's input that only the adapter kept is freed.

Oracles:
* memory - ``torch.autograd.graph.saved_tensors_hooks`` on a real PEFT-wrapped Hugging Face Llama
  (transformers, sdpa attention), trained with dropout 0.1 and without: the difference of the
  distinct storages autograd saves, against the difference of ``activation_delta``. The dropout
  runs as ``torch.native_dropout``, the fused kernel CUDA and NPU run (aten/native/Dropout.cpp
  ``is_fused_kernel_acceptable``; on a CPU ``F.dropout`` runs ``input * noise`` with a float noise
  tensor instead, which the model - priced for accelerators - does not follow);
* time - the bytes torch's own ``native_dropout`` and ``native_dropout_backward`` read and write
  (their tensors, seen by a ``TorchDispatchMode``), against what ``adapter_traffic`` adds.
"""
from __future__ import annotations

import pytest
import torch
from conftest import saved_storages
from peft import LoraConfig, get_peft_model
from test_finetune_cost import PEFT_TARGETS, TINY_LLAMA, _hf_model
from torch.utils._python_dispatch import TorchDispatchMode

from partita.cost.finetune import activation_delta, adapter_traffic
from partita.errors import PartitaError
from partita.plan import Plan
from partita.spec.hf_config import parse_hf_config

SEQ = 32
P = 0.1
TARGETS = {**PEFT_TARGETS, "qkv": ["q_proj", "k_proj", "v_proj"]}


class _FusedDropout(torch.nn.Module):
    """``nn.Dropout`` as the accelerators run it: ``native_dropout`` (bool mask)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.native_dropout(x, self.p, self.training)[0]


def saved_bytes(targets: str, dropout: float) -> int:
    """Distinct storages (weights excluded) autograd saves over one forward of a PEFT Llama whose
    input embeddings need a gradient (every layer is then "a layer above the first")."""
    model = get_peft_model(_hf_model(TINY_LLAMA), LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout,
                                                             target_modules=TARGETS[targets]))
    for name, module in model.named_modules():
        for key, sub in list(getattr(module, "lora_dropout", {}).items()):
            if isinstance(sub, torch.nn.Dropout):
                module.lora_dropout[key] = _FusedDropout(sub.p)
    model.train()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    embeds = torch.randn(1, SEQ, TINY_LLAMA["hidden_size"], requires_grad=True)
    with saved_storages(weights) as storages:
        model(inputs_embeds=embeds).logits.sum()
    return sum(storages.values())


def plan(targets: str, dropout: float) -> Plan:
    return Plan(dp=1, gbs=1, mbs=1, seq_len=SEQ, dtype="fp32", recompute="none", framework="deepspeed",
                finetune="lora", lora_rank=4, lora_alpha=8.0, lora_targets=targets, lora_dropout=dropout)


@pytest.mark.parametrize("targets", ["all-linear", "attention", "qkv", "mlp"])
def test_dropout_memory_is_what_peft_saves(targets: str) -> None:
    measured = saved_bytes(targets, P) - saved_bytes(targets, 0.0)
    spec = parse_hf_config(TINY_LLAMA)
    layers = TINY_LLAMA["num_hidden_layers"]
    modelled = layers * (activation_delta(spec, plan(targets, P), False, "none")
                         - activation_delta(spec, plan(targets, 0.0), False, "none"))
    assert measured > 0
    assert modelled == pytest.approx(measured, rel=1e-9), (targets, measured, modelled)


def test_dropout_is_recomputed_under_op_level_selective_and_full_recompute() -> None:
    spec = parse_hf_config(TINY_LLAMA)
    for mode in ("full", "selective"):
        with_, without = (plan("all-linear", p).with_(framework="partita", recompute=mode) for p in (P, 0.0))
        assert activation_delta(spec, with_, False, mode) == activation_delta(spec, without, False, mode)


class _Bytes(TorchDispatchMode):
    """Bytes each named op reads (its tensor inputs) and writes (its tensor outputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        tensors += [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]
        name = func.overloadpacket.__name__
        self.by_op[name] = self.by_op.get(name, 0) + sum(t.numel() * t.element_size() for t in tensors)
        return out


def test_dropout_passes_are_torch_native_dropout_ops() -> None:
    tokens, din, dout, r = 48, 40, 24, 4
    x = torch.randn(tokens, din, dtype=torch.bfloat16, requires_grad=True)
    with _Bytes() as counted:
        out, _ = torch.native_dropout(x, P, True)
        out.backward(torch.ones_like(out))
    with_, without = (adapter_traffic(tokens, din, dout, r, 2, dropout=d) for d in (True, False))
    assert with_.forward_pointwise - without.forward_pointwise == counted.by_op["native_dropout"]
    assert with_.backward_pointwise - without.backward_pointwise == counted.by_op["native_dropout_backward"]
    assert with_.forward_gemm == without.forward_gemm and with_.backward_gemm == without.backward_gemm


def test_readers_take_the_frameworks_defaults_and_refuse_a_bad_value(tmp_path) -> None:
    from test_import_deepspeed_titan import SWIFT

    from partita.imports import load_config
    path = tmp_path / "sft.sh"
    path.write_text(SWIFT.replace("--packing true", "--tuner_type lora"))
    assert load_config(str(path)).plan.lora_dropout == 0.05  # ms-swift's default (tuner_args.py)
    path.write_text(SWIFT.replace("--packing true", "--tuner_type lora --lora_dropout 0.1"))
    assert load_config(str(path)).plan.lora_dropout == 0.1
    path.write_text(SWIFT.replace("--packing true", "--tuner_type lora --lora_dropout 1.5"))
    with pytest.raises(PartitaError, match="--lora_dropout 1.5 must be a dropout probability"):
        load_config(str(path))


def test_runtime_refuses_dropout_with_tp_and_peft_gets_the_plans_dropout() -> None:
    from partita.runtime.lora import TP_DROPOUT, lora_config, lora_problem
    assert lora_problem(plan("all-linear", P).with_(tp=2, dp=1, gbs=1)) == TP_DROPOUT
    assert lora_problem(plan("all-linear", P)) is None
    assert lora_config(_hf_model(TINY_LLAMA), plan("all-linear", P)).lora_dropout == P


def test_summary_and_plan_file_name_the_dropout() -> None:
    p = plan("all-linear", P)
    assert p.summary().endswith("lora4-all-linear-drop0.1")
    assert Plan.from_dict(p.to_dict()) == p
    assert "lora_dropout" not in plan("all-linear", 0.0).to_dict()  # old plan files unchanged
