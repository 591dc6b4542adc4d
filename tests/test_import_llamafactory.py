"""LLaMA-Factory YAML in and out (issue 36 item 4): ``partita export --to llamafactory`` writes a YAML
whose every key is one of LLaMA-Factory's own arguments, and ``partita import`` reads it back to the
same fine-tuning plan.

Oracles: LLaMA-Factory's argument dataclasses at hiyouga/LLaMA-Factory@ff6d4d1 (field names, types
and Literal choices, read with ``ast`` into tests/export_oracles/llamafactory_fields.json: the package
itself imports datasets/trl/peft/accelerate at import time), Hugging Face's
``Seq2SeqTrainingArguments`` (which its TrainingArguments extends) from transformers itself, and PyYAML
for the file's syntax (the importer's own flat reader must agree with it)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from partita.cli import main
from partita.errors import PartitaError
from partita.export import export
from partita.imports import load_config
from partita.plan import Plan

ORACLE = json.loads((Path(__file__).parent / "export_oracles" / "llamafactory_fields.json").read_text())
#: our own ds_config using the construct of LLaMA-Factory's presets (every batch and dtype value "auto")
DS_AUTO = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}
FINETUNE_FIELDS = ("finetune", "lora_rank", "lora_alpha", "lora_targets", "lora_dropout", "mbs", "gbs", "seq_len", "dtype", "zero",
                   "recompute", "dp")

PLANS = [Plan(dp=8, mbs=2, gbs=64, seq_len=4096, zero=0, recompute="full", finetune="lora", lora_rank=16,
              lora_alpha=32.0, lora_targets="all-linear"),
         Plan(dp=8, mbs=1, gbs=16, seq_len=2048, zero=3, recompute="none", finetune="lora", lora_rank=64,
              lora_alpha=128.0, lora_targets="attention", lora_dropout=0.1),
         Plan(dp=16, mbs=4, gbs=128, seq_len=8192, zero=2, recompute="full", finetune="lora", lora_rank=8,
              lora_alpha=16.0, lora_targets="mlp", dtype="fp16"),
         Plan(dp=4, mbs=1, gbs=32, seq_len=1024, zero=3, recompute="full", finetune="full"),
         Plan(dp=2, mbs=8, gbs=16, seq_len=512, zero=0, recompute="none", finetune="none", dtype="fp32")]


def _write(tmp_path: Path, plan: Plan) -> Path:
    """The exported YAML in ``tmp_path/run``, LLaMA-Factory's preset paths resolved from ``tmp_path``."""
    for stage in (2, 3):
        preset = tmp_path / "examples" / "deepspeed" / f"ds_z{stage}_config.json"
        preset.parent.mkdir(parents=True, exist_ok=True)
        preset.write_text(json.dumps(dict(DS_AUTO, zero_optimization={"stage": stage})))
    path = tmp_path / "run" / "train.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(export("llamafactory", plan).text)
    return path


@pytest.mark.parametrize("plan", PLANS, ids=[p.summary() for p in PLANS])
def test_round_trip_keeps_the_fine_tuning_plan(tmp_path, plan):
    path = _write(tmp_path, plan)
    back = load_config(str(path), devices=plan.world_size).plan
    assert {f: getattr(back, f) for f in FINETUNE_FIELDS} == {f: getattr(plan, f) for f in FINETUNE_FIELDS}
    assert back.framework == ("deepspeed" if plan.zero in (2, 3) else "partita")


@pytest.mark.parametrize("plan", PLANS, ids=[p.summary() for p in PLANS])
def test_every_exported_key_is_a_llamafactory_argument(tmp_path, plan):
    import transformers
    text = export("llamafactory", plan).text
    parsed = yaml.safe_load(text)
    hf = {f.name: f for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments)}
    lf = ORACLE["fields"]
    unknown = [k for k in parsed if k not in lf and k not in hf]
    assert not unknown, unknown
    for key, value in parsed.items():
        kind = lf[key]["type"] if key in lf else str(hf[key].type)
        if kind.startswith("Literal["):
            assert repr(value) in kind, (key, value, kind)
        elif kind in ("int", "bool"):
            assert type(value).__name__ == kind, (key, value, kind)
    assert ("deepspeed" not in parsed) or Path(parsed["deepspeed"]).name in \
        {Path(p).name for p in ORACLE["deepspeed_presets"]}
    if plan.finetune == "lora":  # LLaMA-Factory's lora_alpha is an int; lora_target "all" or module names
        assert isinstance(parsed["lora_alpha"], int) and lf["lora_alpha"]["type"] == "int | None"


def test_the_oracle_is_llamafactorys_defaults():
    # what the importer assumes where a YAML is silent is what the dataclasses say
    lf = ORACLE["fields"]
    assert (lf["stage"]["default"], lf["finetuning_type"]["default"], lf["lora_rank"]["default"],
            lf["lora_target"]["default"], lf["cutoff_len"]["default"], lf["disable_gradient_checkpointing"]["default"]) \
        == ("sft", "lora", 8, "all", 2048, False)
    import transformers
    default = {f.name: f.default for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments)}
    path_defaults = load_config_defaults()
    assert (path_defaults.mbs, path_defaults.grad_accum) == (default["per_device_train_batch_size"],
                                                               default["gradient_accumulation_steps"])


def load_config_defaults() -> Plan:
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "x.yaml"
        path.write_text("stage: sft\nbf16: true\n")
        return load_config(str(path), devices=1).plan


@pytest.mark.parametrize("fields,words", [
    ({"tp": 2}, "tp=2: LLaMA-Factory trains data parallel only"),
    ({"zero": 1}, "zero=1: LLaMA-Factory ships DeepSpeed presets for ZeRO 0, 2 and 3 only"),
    ({"recompute": "selective"}, "recompute selective"),
])
def test_what_llamafactory_cannot_run_is_refused_in_one_line(fields, words):
    plan = Plan(dp=8 // fields.get("tp", 1), gbs=8, **{"zero": 0, **fields})
    with pytest.raises(PartitaError) as e:
        export("llamafactory", plan)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_yaml_refusals_are_one_line(tmp_path, capsys):
    path = tmp_path / "x.yaml"
    path.write_text("stage: sft\nfinetuning_type: lora\n")
    assert main(["import", str(path)]) == 2
    assert "pass --devices, or --env NPROC_PER_NODE" in capsys.readouterr().err
    assert main(["import", str(path), "--env", "NPROC_PER_NODE=4", "--env", "NNODES=2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dp"] == 8
    path.write_text("model: Qwen/Qwen3-4B\npeft_config:\n  name: lora\n  r: 16\ncutoff_len: 2048\n")
    assert main(["import", str(path), "--devices", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "LLaMA-Factory v1 config (peft_config" in err
    path.write_text("stage: sft\nfinetuning_type: lora\ndeepspeed: nowhere/ds.json\n")
    assert main(["import", str(path), "--devices", "8"]) == 2
    assert "deepspeed nowhere/ds.json not found" in capsys.readouterr().err


def test_estimate_from_a_llamafactory_yaml_names_the_model_it_needs(tmp_path, capsys):
    path = tmp_path / "x.yaml"
    path.write_text("model_name_or_path: Qwen/Qwen2.5-7B\nstage: sft\nfinetuning_type: lora\nbf16: true\n"
                    "per_device_train_batch_size: 1\n")
    assert main(["estimate", "--from-script", str(path), "--hardware", "h100-sxm", "--devices", "8"]) == 2
    assert "names the model Qwen/Qwen2.5-7B: pass --model" in capsys.readouterr().err
    assert main(["estimate", "--from-script", str(path), "--hardware", "h100-sxm", "--devices", "8", "--model",
                 "qwen2.5-7b", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["finetune"] == "lora" and out["plan"]["lora_rank"] == 8 and out["fits"] is True


@pytest.mark.parametrize("plan", [p.with_(tp=2, dp=p.dp // 2, zero=1) for p in PLANS if p.dp % 2 == 0],
                         ids=lambda p: p.summary())
def test_mindspeed_llm_fine_tuning_round_trip(plan):
    # MindSpeed-LLM@c77308a mindspeed_llm/features_manager/finetune/lora.py: --lora-r int, --lora-alpha int,
    # --lora-target-modules nargs='+' (Megatron-Core names); LoRA is on when target modules are listed
    from partita.imports.megatron import plan_from_megatron
    out = export("mindspeed", plan)
    argv = out.data
    back = plan_from_megatron(argv, plan.world_size)
    assert {f: getattr(back, f) for f in FINETUNE_FIELDS[:4]} == {f: getattr(plan, f) for f in FINETUNE_FIELDS[:4]}
    if plan.finetune == "lora":
        i = argv.index("--lora-alpha")
        assert argv[i + 1].isdigit() and argv[argv.index("--lora-r") + 1].isdigit()
        assert "--finetune" in argv and argv[argv.index("--stage") + 1] == "sft"
    else:
        assert "--lora-r" not in argv and ("--finetune" in argv) == (plan.finetune == "full")
