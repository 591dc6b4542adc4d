"""LoRA target sets (plan ``lora_targets``), ``qkv`` in particular: the q, k and v projections
without the out projection - NeMo 1.x's default ``peft.lora_tuning.target_modules:
['attention_qkv']`` at NeMo 24.07 (NVIDIA/NeMo r2.0.0rc1 = 579983fb
examples/nlp/language_modeling/tuning/conf/megatron_gpt_finetuning_config.yaml:105).

Oracles: PEFT's own ``get_peft_model`` on a tiny transformers Llama (which modules it wraps, what
it counts trainable) with the runtime's own target names (partita.runtime.lora), torch's
``FlopCounterMode`` over one forward + backward, and a module written as NeMo builds the adapter
on Megatron-Core's fused ``linear_qkv`` (tests/test_finetune_adapters_fused.py).
"""
from __future__ import annotations

import pytest
import torch
import transformers
from peft import LoraConfig, get_peft_model
from test_finetune_adapters_fused import CFG, RANK, NemoLoraLinear
from torch.utils.flop_counter import FlopCounterMode

from partita.cost.compute import layer_forward
from partita.cost.finetune import layer_adapter_params, lora_shape, trainable_params
from partita.cost.shape import layer_shape
from partita.cost.step import stage_terms
from partita.errors import PartitaError
from partita.imports.finetune import HF_NAMES, lora_targets, mindspeed_finetune_flags
from partita.plan import LORA_TARGETS, Plan
from partita.runtime.lora import target_names
from partita.spec.hardware import make_cluster
from partita.spec.hf_config import parse_hf_config

HF_CFG = {**CFG, "max_position_embeddings": 256}


def _hf_model() -> torch.nn.Module:
    config = transformers.AutoConfig.for_model(**HF_CFG)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config)


def _plan(targets: str, framework: str = "deepspeed", seq: int = 32) -> Plan:
    return Plan(seq_len=seq, mbs=1, gbs=1, dtype="fp32", finetune="lora", lora_rank=RANK, lora_targets=targets,
                framework=framework)


@pytest.mark.parametrize("targets", LORA_TARGETS)
def test_runtime_targets_are_what_peft_wraps_and_counts(targets: str) -> None:
    """PEFT wraps exactly the runtime's names for the set, and counts the cost model's parameters."""
    model = _hf_model()
    names = target_names(model, targets)
    peft_model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=names))
    wrapped = {n.rsplit(".", 1)[-1] for n, m in peft_model.named_modules() if hasattr(m, "lora_A")}
    expected = {"attention": {"q_proj", "k_proj", "v_proj", "o_proj"}, "qkv": {"q_proj", "k_proj", "v_proj"},
                "mlp": {"gate_proj", "up_proj", "down_proj"}}.get(targets)
    assert wrapped == (expected or {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
    trainable, _ = peft_model.get_nb_trainable_parameters()
    assert trainable_params(parse_hf_config(HF_CFG), _plan(targets)) == trainable


def test_qkv_on_megatron_is_one_adapter_on_linear_qkv() -> None:
    """Under framework megatron, ``qkv`` is NeMo's one adapter on the fused ``linear_qkv``
    (``linear_in`` r x h, ``linear_out`` (q + 2 kv) x r): nothing on ``linear_proj``."""
    h, head = CFG["hidden_size"], CFG["hidden_size"] // CFG["num_attention_heads"]
    qkv = NemoLoraLinear(h, (CFG["num_attention_heads"] + 2 * CFG["num_key_value_heads"]) * head, RANK, 8.0)
    trained = sum(p.numel() for p in qkv.parameters() if p.requires_grad)
    spec = parse_hf_config(CFG)
    assert layer_adapter_params(spec, False, lora_shape(_plan("qkv", "megatron"))) == (trained, 0)
    attention = layer_adapter_params(spec, False, lora_shape(_plan("attention", "megatron")))[0]
    assert attention - trained == RANK * (CFG["num_attention_heads"] * head + h)  # linear_proj's adapter


def _counted_gemm_flops(model: torch.nn.Module, seq: int) -> float:
    ids = torch.randint(0, HF_CFG["vocab_size"], (1, seq))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return float(sum(v for op, v in counter.get_flop_counts()["Global"].items() if str(op).split(".")[1] in ("mm", "addmm")))


def test_qkv_flops_equal_torch_flop_counter() -> None:
    """A PEFT model adapting q, k, v only: its matmul FLOPs (one forward + backward) are Partita's
    stage FLOPs less the attention kernel's (SDPA is not a matmul to the counter: forward + 2.5x)."""
    seq, spec, cluster = 32, parse_hf_config(HF_CFG), make_cluster("h100", 1)
    plan = _plan("qkv", seq=seq)
    kinds, _ = stage_terms(spec, cluster, plan)
    attn = layer_forward(spec, cluster.device, layer_shape(plan), False).attn_flops
    ours = spec.layers * kinds.dense.flops + kinds.embedding.flops + kinds.output.flops - spec.layers * 3.5 * attn
    model = _hf_model()
    peft_model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=target_names(model, "qkv")))
    assert _counted_gemm_flops(peft_model, seq) == pytest.approx(ours, rel=1e-12)


def test_unknown_target_is_a_one_line_error_naming_the_valid_ones() -> None:
    with pytest.raises(PartitaError) as err:
        Plan.parse("finetune=lora,lora_targets=q_proj", 1)
    assert "\n" not in str(err.value) and all(t in str(err.value) for t in LORA_TARGETS)


def test_qkv_round_trips_through_framework_names() -> None:
    """MindSpeed-LLM's ``--lora-target-modules linear_qkv`` and PEFT's q/k/v names read as ``qkv``
    exactly (no note), and a ``qkv`` plan writes ``linear_qkv`` alone (Megatron names) and q/k/v
    (LLaMA-Factory's ``lora_target``), both read back as ``qkv``."""
    assert lora_targets(["linear_qkv"], "--lora-target-modules") == ("qkv", "")
    assert lora_targets(["q_proj,k_proj,v_proj"], "lora_target") == ("qkv", "")
    assert lora_targets([HF_NAMES["qkv"]], "lora_target") == ("qkv", "")  # LLaMA-Factory's export, read back
    flags, _ = mindspeed_finetune_flags(_plan("qkv", "mindspeed"))
    assert ("--lora-target-modules", "linear_qkv") in flags
