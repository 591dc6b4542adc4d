"""Issue 17: the exports carry the communication knobs each target has an option for, checked
by the target's own parser (Megatron-LM's option table, DeepSpeedConfig, torchtitan's
ConfigManager), and warn where it has none."""
import shlex

import pytest

from export_oracles import deepspeed_oracle, megatron_oracle, torchtitan_oracle
from partita.export import export
from partita.plan import Plan
from partita.spec.load import load_model

MODEL = load_model("llama2-7b")


def _megatron_args(text: str) -> list[str]:
    words = shlex.split(" ".join(l.rstrip("\\") for l in text.splitlines() if not l.lstrip().startswith("#")))
    start = next(i for i, w in enumerate(words) if w.startswith("--"))
    return [w for w in words[start:] if "=" not in w or w.startswith("--")]


@pytest.mark.parametrize("target", ["megatron", "mindspeed"])
def test_megatron_family_reduces_in_bf16_with_the_bucket_size(target):
    plan = Plan(dp=8, zero=1, gbs=64, grad_dtype="bf16", ddp_bucket_mb=40)
    out = export(target, plan, MODEL)
    parser = megatron_oracle.megatron_parser() if target == "megatron" else megatron_oracle.mindspeed_parser()
    ns, _ = parser.parse_known_args(_megatron_args(out.text))
    assert ns.grad_reduce_in_bf16 is True
    assert ns.ddp_bucket_size == 40 * 2**20 // 2  # elements of bf16 gradients
    assert not [w for w in out.warnings if "grad_dtype" in w]


def test_megatron_warns_that_it_has_no_powersgd():
    out = export("megatron", Plan(dp=8, zero=0, gbs=64, grad_compression="powersgd"), MODEL)
    assert any(w.startswith("grad_compression=powersgd (rank 4): Megatron-LM and MindSpeed have no") for w in out.warnings)


def test_deepspeed_config_carries_bf16_communication_and_bucket():
    plan = Plan(dp=8, zero=2, gbs=64, grad_dtype="bf16", ddp_bucket_mb=40)
    cfg = export("deepspeed", plan, MODEL).data
    ds = deepspeed_oracle.load(cfg, 8, 8)
    import torch
    assert ds.communication_data_type == torch.bfloat16
    assert ds.zero_config.reduce_bucket_size == 40 * 2**20 // 2
    warned = export("deepspeed", Plan(dp=8, zero=0, gbs=64, grad_compression="powersgd"), MODEL).warnings
    assert any("ds_config has no PowerSGD option" in w for w in warned)


def test_torchtitan_warns_where_it_has_no_option():
    """torchtitan 0.3.0's ConfigManager accepts mixed_precision_reduce float32 only (its tyro
    Literal rejects bfloat16): the export keeps float32 and says so."""
    with pytest.raises(SystemExit):
        torchtitan_oracle.parse(["--training.mixed_precision_reduce", "bfloat16"])
    out = export("torchtitan", Plan(dp=8, zero=3, gbs=64, grad_dtype="bf16", fsdp_prefetch=2), MODEL)
    cfg = torchtitan_oracle.parse(out.data["flags"])
    assert cfg.training.mixed_precision_reduce == "float32"
    assert any(w.startswith("grad_dtype=bf16: torchtitan 0.3.0") for w in out.warnings)
    assert any("torchtitan has no option for them" in w for w in out.warnings)
