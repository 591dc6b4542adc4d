"""DeepSpeed configs, torchtitan TOMLs and Megatron-SWIFT scripts read as the frameworks run them
(issue 32, "what went wrong" items 4-6; "what to build" item 4: the framework detected carries into
estimate and plan).

Oracles: DeepSpeed's own ``DeepSpeedConfig`` (tests/export_oracles/deepspeed_oracle.py) for the
batch it derives and the dtype key it reads; otherwise the plan read by hand from the framework's
source, cited in partita/imports/deepspeed.py, torchtitan.py and swift.py. Each test below failed
on the importers before issue 32 (noted per test).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from partita.cli import main
from partita.errors import PartitaError
from partita.imports import load_config
from partita.imports.deepspeed import REMOVED_KEYS, ds_not_modelled

CORPUS = Path(__file__).resolve().parent / "data" / "launch_configs"


def _ds(tmp_path: Path, cfg: dict, name: str = "ds_config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return str(path)


def _plan(path: str, devices: int | None = None, **kwargs):
    plan, _ = load_config(path, devices=devices, **kwargs)  # (plan, framework), as before issue 32
    return plan


# ---------------------------------------------------------------------------------------------- DeepSpeed
@pytest.mark.parametrize("cfg, devices, pp, expected", [
    # train_batch_size alone: accumulation 1, micro = T / W (before: micro 1, accumulation 32)
    ({"train_batch_size": 128}, 4, None, (32, 128)),
    # train_batch_size and accumulation: micro = T / W / g (before: micro 1)
    ({"train_batch_size": 512, "gradient_accumulation_steps": 2}, 8, None, (32, 512)),
    # micro alone: accumulation 1
    ({"train_micro_batch_size_per_gpu": 4}, 8, None, (4, 32)),
    # a PipelineModule: DeepSpeed's world is the data-parallel grid (world / stages)
    ({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 2}, 16, 4, (2, 256)),
])
def test_deepspeed_batch_is_derived_as_deepspeed_derives_it(tmp_path, cfg, devices, pp, expected):
    plan = _plan(_ds(tmp_path, cfg), devices, pp=pp)
    assert (plan.mbs, plan.gbs) == expected


def test_deepspeed_batch_agrees_with_deepspeedconfig(tmp_path):
    """DeepSpeed's own config class derives the same micro-batch and accumulation from the corpus files
    that give numbers (and reads the same dtype, the old "bfloat16" key included)."""
    pytest.importorskip("deepspeed")
    from export_oracles import deepspeed_oracle
    checked = 0
    for spec_path in sorted((CORPUS / "deepspeed").glob("*.expected.json")):
        spec = json.loads(spec_path.read_text())
        cfg = json.loads(spec_path.with_name(spec_path.name.replace(".expected", "")).read_text())
        if any(v == "auto" for v in (cfg.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                          "gradient_accumulation_steps"))):
            continue
        plan = _plan(_ds(tmp_path, cfg), spec["devices"], pp=spec.get("flags", {}).get("pp"))
        removed = REMOVED_KEYS & set(cfg)
        if removed:  # DeepSpeed refuses a block it removed: Partita says so, and the batch is read without it
            with pytest.raises(Exception, match="has been removed"):
                deepspeed_oracle.load(cfg, plan.world_size, plan.dp)
            notes = ds_not_modelled(cfg)
            assert all(any(n.startswith(k) and "removed from DeepSpeed" in n for n in notes) for k in removed)
            cfg = {k: v for k, v in cfg.items() if k not in removed}
        ds = deepspeed_oracle.load(cfg, plan.world_size, plan.dp)
        assert (ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps) == (plan.mbs, plan.grad_accum), \
            spec_path.name
        assert {True: "bf16"}.get(ds.bfloat16_config.enabled, {True: "fp16"}.get(ds.float16_config.enabled, "fp32")) \
            == plan.dtype, spec_path.name
        checked += 1
    assert checked >= 6


def test_deepspeed_old_bfloat16_key_is_bf16(tmp_path):
    # DeepSpeed-Chat writes "bfloat16"; DeepSpeed reads it when "bf16" is absent (before: fp32)
    cfg = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8, "bfloat16": {"enabled": True}}
    assert _plan(_ds(tmp_path, cfg), 8).dtype == "bf16"


@pytest.mark.parametrize("dtype, pp, zero", [("bf16", 2, 1), ("bf16", None, 0), ("fp16", 2, 0)])
def test_deepspeed_bf16_pipeline_at_zero0_is_the_bf16_optimizer(tmp_path, dtype, pp, zero):
    # engine.py _do_optimizer_sanity_check: bf16 PipelineModule without ZeRO -> BF16_Optimizer, which
    # partitions master weights and optimizer states (ZeRO-1); elsewhere ZeRO 0 stays 0 (before: 0 always)
    cfg = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, dtype: {"enabled": True},
           "zero_optimization": {"stage": 0}}
    assert _plan(_ds(tmp_path, cfg), 8, pp=pp).zero == zero


def test_deepspeed_export_of_a_bf16_pipeline_at_zero0_says_it_runs_as_zero1():
    from partita.export import export
    from partita.plan import Plan
    from partita.spec.load import load_model
    out = export("deepspeed", Plan(dp=4, pp=2, zero=0, mbs=1, gbs=16, dtype="bf16"), load_model("llama3-8b"))
    assert any(w.startswith("zero=0 with bf16 and pp > 1") and "BF16_Optimizer" in w for w in out.warnings)


def test_deepspeed_overlap_comm_defaults_on_at_zero3(tmp_path):
    # runtime/zero/config.py overlap_comm_valid: unset means stage == 3 (before: off)
    for stage, overlap in ((3, True), (2, False)):
        cfg = {"train_batch_size": 64, "zero_optimization": {"stage": stage}}
        assert _plan(_ds(tmp_path, cfg), 8).overlap_grad_reduce is overlap


HF_AUTO = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}, "zero_optimization": {"stage": 2}}


def test_deepspeed_auto_values_filled_from_flags(tmp_path):
    # before: "auto" could not be filled (import had no flags; estimate refused them beside --from-script)
    plan = _plan(_ds(tmp_path, HF_AUTO), 8, fill={"mbs": 2, "gbs": 64, "dtype": "bf16"})
    assert (plan.dp, plan.zero, plan.mbs, plan.gbs, plan.grad_accum, plan.dtype) == (8, 2, 2, 64, 4, "bf16")


def test_deepspeed_auto_left_open_is_one_line_naming_each_flag(tmp_path, capsys):
    path = _ds(tmp_path, HF_AUTO)
    assert main(["import", path, "--devices", "8", "--mbs", "2"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "pass --dtype" in err and "pass --global-batch" in err and "pass --mbs" not in err


def test_deepspeed_flag_never_overrides_the_file(tmp_path):
    cfg = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}}
    for fill, flag in (({"mbs": 4}, "--mbs"), ({"gbs": 128}, "--global-batch"), ({"dtype": "fp16"}, "--dtype")):
        with pytest.raises(PartitaError, match=re.escape(flag)):
            _plan(_ds(tmp_path, cfg), 8, fill=fill)


def test_deepspeed_refuses_what_deepspeed_refuses(tmp_path):
    # _batch_assertion: train_batch_size == micro x accumulation x world
    cfg = {"train_batch_size": 100, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}
    with pytest.raises(PartitaError, match="DeepSpeed refuses this batch"):
        _plan(_ds(tmp_path, cfg), 8)


def test_deepspeed_autotp_ranks_count_in_its_batch_world(tmp_path):
    # no mpu with AutoTP: DeepSpeedConfig's world is every rank; the distinct samples are dp's
    cfg = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 2}}
    plan = _plan(_ds(tmp_path, cfg), 8)
    assert (plan.tp, plan.dp, plan.mbs, plan.grad_accum, plan.gbs) == (2, 4, 1, 4, 16)


def test_deepspeed_offload_is_the_plans_optimizer_offload(tmp_path):
    # runtime/zero/offload_config.py: ratio default 1.0 (all the optimizer states on the host); a part only at ZeRO-3
    # (runtime/zero/config.py offload_ratio_check); parameter offload (ZeRO-Infinity) stays named
    fill = {"mbs": 1, "gbs": 8, "dtype": "bf16"}
    cfg = dict(HF_AUTO, zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu"},
                                           "offload_param": {"device": "cpu"}})
    read = load_config(_ds(tmp_path, cfg), devices=8, fill=fill)
    assert read.plan.optimizer_offload == 1.0
    assert [n.split(" ")[0] for n in read.not_modelled] == ["zero_optimization.offload_param"]
    cfg["zero_optimization"]["offload_optimizer"]["ratio"] = 0.25
    assert load_config(_ds(tmp_path, cfg), devices=8, fill=fill).plan.optimizer_offload == 0.25
    cfg["zero_optimization"]["stage"] = 2
    with pytest.raises(PartitaError, match="Partial offloading only supported for ZeRO Stage 3"):
        load_config(_ds(tmp_path, cfg), devices=8, fill=fill)
    cfg["zero_optimization"] = {"stage": 0, "offload_optimizer": {"device": "cpu"}}  # no ZeRO optimizer: no offload
    read = load_config(_ds(tmp_path, cfg), devices=8, fill=fill)
    assert read.plan.optimizer_offload == 0 and read.not_modelled[0].startswith("zero_optimization.offload_optimizer")


# --------------------------------------------------------------------------------------------- torchtitan
def _toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "train.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("extra, framework", [
    ("", "torchtitan-eager"),  # compile.enable defaults to false
    ("[compile]\nenable = true\ncomponents = [\"model\", \"loss\"]\n", "torchtitan"),
    ("[compile]\nenable = true\ncomponents = [\"model\"]\n", "torchtitan-eager-loss"),
    ("[compile]\nenable = true\ncomponents = [\"loss\"]\n", "torchtitan-eager"),
    ("[training]\ncompile = true\n", "torchtitan"),  # v0.1
    ("[compile]\nenable=true\n", "torchtitan"),  # llama3_405b.toml's spelling (once read as a shell assignment)
])
def test_torchtitan_compile_decides_the_framework(tmp_path, extra, framework):
    # before: every torchtitan file was estimated as Megatron runs it
    text = "[parallelism]\ntensor_parallel_degree = 2\n" + extra
    assert _plan(_toml(tmp_path, text), 8).framework == framework


def test_torchtitan_float8_converter_is_fp8(tmp_path):
    # before: converters = ["float8"] was skipped (bf16)
    for name in ("float8", "quantize.linear.float8"):
        text = f"[model]\nname = \"llama3\"\nconverters = [\"{name}\"]\n[parallelism]\ntensor_parallel_degree = 1\n"
        assert _plan(_toml(tmp_path, text), 8).dtype == "fp8"
    text = "[model]\nconverters = [\"quantize.grouped_mm.float8\"]\n[parallelism]\ntensor_parallel_degree = 1\n"
    read = load_config(_toml(tmp_path, text), devices=8)
    assert read.plan.dtype == "bf16" and read.not_modelled[0].startswith("model.converters quantize.grouped_mm.float8")


def test_torchtitan_defaults_as_torchtitan_has_them(tmp_path):
    # job_config.py: local_batch_size 8 (before: 1); global_batch_size -1 = local x dp
    plan = _plan(_toml(tmp_path, "[parallelism]\ntensor_parallel_degree = 2\n"), 8)
    assert (plan.dp, plan.mbs, plan.gbs, plan.seq_len, plan.zero) == (4, 8, 32, 2048, 3)


def test_torchtitan_default_reshard_with_a_pipeline_is_zero2(tmp_path):
    # parallelize.py: reshard_after_forward = not pp_enabled under "default" (before: 3)
    text = ("[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_microbatch_size = 1\n"
            "[training]\nlocal_batch_size = 4\n")
    plan = _plan(_toml(tmp_path, text), 8)
    assert (plan.pp, plan.dp, plan.zero, plan.mbs, plan.gbs) == (2, 4, 2, 1, 16)


def test_torchtitan_layer_sac_is_full_recompute_of_every_nth_block(tmp_path):
    # activation_checkpoint.py _apply_layer_sac: selective with a number N (a TOML's default "2" up to
    # v0.2) fully checkpoints every N-th block (before: read as Megatron's selective recompute)
    from partita.spec.load import load_model
    model = load_model("llama3-8b")  # 32 layers
    path = _toml(tmp_path, "[parallelism]\ntensor_parallel_degree = 1\n[activation_checkpoint]\n"
                           "mode = \"selective\"\n")
    plan = _plan(path, 8, model=model)
    assert (plan.recompute, plan.recompute_layers) == ("full", 16)
    read = load_config(path, devices=8)  # no layer count: selective, and said so
    assert read.plan.recompute == "selective"
    assert read.not_modelled[0].startswith("activation_checkpoint.selective_ac_option 2")
    path = _toml(tmp_path, "[training]\nseq_len = 2048\n[activation_checkpoint]\nmode = \"selective\"\n"
                           "selective_ac_option = \"op\"\n")
    assert _plan(path, 8, model=model).recompute == "selective"


def test_torchtitan_etp_hsdp_and_async_tp(tmp_path):
    text = ("[parallelism]\ndata_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 4\n"
            "tensor_parallel_degree = 2\nenable_async_tensor_parallel = true\nexpert_parallel_degree = 4\n"
            "expert_tensor_parallel_degree = 2\n")
    plan = _plan(_toml(tmp_path, text), 16)
    assert (plan.dp, plan.dp_shard, plan.etp, plan.tp_comm_overlap) == (8, 4, 2, True)


RUN_TRAIN = """#!/usr/bin/bash
set -ex
NGPU=${NGPU:-"8"}
CONFIG_FILE=${CONFIG_FILE:-"./train_configs/debug_model.toml"}
TRAIN_FILE=${TRAIN_FILE:-"torchtitan.train"}
torchrun --nproc_per_node=${NGPU} --rdzv_backend c10d --rdzv_endpoint="localhost:0" \\
-m ${TRAIN_FILE} --job.config_file ${CONFIG_FILE} "$@"
"""


def test_torchtitan_launch_script_with_its_toml_and_overrides(tmp_path):
    # torchtitan's run_train.sh: CONFIG_FILE=... ./run_train.sh --overrides (before: not a launch config)
    (tmp_path / "run_train.sh").write_text(RUN_TRAIN)
    (tmp_path / "big.toml").write_text("[parallelism]\ntensor_parallel_degree = 8\n[training]\nlocal_batch_size = 4\n"
                                       "seq_len = 8192\n[activation_checkpoint]\nmode = \"full\"\n")
    path = str(tmp_path / "run_train.sh")
    plan = _plan(path, env={"CONFIG_FILE": str(tmp_path / "big.toml"), "NGPU": "8"},
                 args=["--training.local_batch_size=2", "--activation_checkpoint.mode", "selective"])
    assert (plan.world_size, plan.tp, plan.mbs, plan.seq_len, plan.recompute) == (8, 8, 2, 8192, "selective")
    with pytest.raises(PartitaError, match="--job.config_file ./train_configs/debug_model.toml: no such file"):
        _plan(path)


# ----------------------------------------------------------------------------------------- Megatron-SWIFT
SWIFT = """# 2 nodes x 4
NNODES=2 \\
NPROC_PER_NODE=4 \\
megatron sft \\
    --model Qwen/Qwen2.5-14B \\
    --dataset 'a#100' 'b#100' \\
    --tensor_model_parallel_size 4 \\
    --sequence_parallel true \\
    --micro_batch_size 2 \\
    --max_length 4096 \\
    --packing true
"""


def test_swift_command_line_is_read(tmp_path):
    # before: "not a recognised launch config"
    path = tmp_path / "sft.sh"
    path.write_text(SWIFT)
    read = load_config(str(path))
    plan = read.plan
    assert read.framework == "megatron" and plan.framework == "megatron"
    # ms-swift's own defaults: distributed optimizer (zero 1), selective recompute, global batch 16
    assert (plan.world_size, plan.dp, plan.tp, plan.sp, plan.zero, plan.mbs, plan.gbs, plan.seq_len,
            plan.recompute, plan.dtype) == (8, 2, 4, True, 1, 2, 16, 4096, "selective", "bf16")


def test_swift_words_as_bash_splits_them(tmp_path):
    # "--dataset 'a#100'" and a#100 keep their "#" (shlex's comments cut them); a last line ending in "\\"
    path = tmp_path / "sft.sh"
    path.write_text(SWIFT.replace("'b#100'", "b#100").replace("--packing true", "--packing true  # packed \\"))
    plan = load_config(str(path)).plan
    assert (plan.tp, plan.mbs, plan.seq_len) == (4, 2, 4096)
    path.write_text(SWIFT.rstrip("\n") + " \\\n")  # ms-swift's seq_cls/full.sh ends so
    assert load_config(str(path)).plan.tp == 4


def test_swift_world_from_env_and_ascend_is_mindspeed(tmp_path):
    path = tmp_path / "sft.sh"
    path.write_text(SWIFT.replace("NNODES=2", "NNODES=$WORLD_SIZE ASCEND_RT_VISIBLE_DEVICES=0,1,2,3"))
    with pytest.raises(PartitaError, match="pass --devices"):
        load_config(str(path))
    plan = load_config(str(path), env={"WORLD_SIZE": "4"}).plan
    assert (plan.world_size, plan.framework) == (16, "mindspeed")


def test_swift_false_flags_defaults_and_lora(tmp_path):
    path = tmp_path / "sft.sh"
    path.write_text(SWIFT.replace("--packing true", "--use_distributed_optimizer false --fp16 true --padding_free false "
                                  "--expert_model_parallel_size 2 --tuner_type lora --recompute_granularity none"))
    read = load_config(str(path))
    plan = read.plan
    assert (plan.zero, plan.dtype, plan.ep, plan.etp, plan.recompute) == (0, "fp16", 2, 1, "none")
    assert read.not_modelled == ()  # LoRA is a plan (issue 36): ms-swift's defaults rank 8, alpha 32, all-linear
    assert (read.plan.finetune, read.plan.lora_rank, read.plan.lora_alpha, read.plan.lora_targets,
            read.plan.lora_dropout) == ("lora", 8, 32.0, "all-linear", 0.05)


def test_swift_without_a_length_names_seq_len(tmp_path):
    path = tmp_path / "sft.sh"
    path.write_text(SWIFT.replace("--max_length 4096", ""))
    with pytest.raises(PartitaError, match="pass --seq-len"):
        load_config(str(path), seq_len=None)
    assert load_config(str(path), seq_len=None, fill={"seq_len": 8192}).plan.seq_len == 8192


TRAINER = """nproc=4
NPROC_PER_NODE=$nproc \\
swift sft \\
    --model Qwen/Qwen2.5-7B \\
    --torch_dtype bfloat16 \\
    --per_device_train_batch_size 2 \\
    --gradient_accumulation_steps $(expr 16 / $nproc) \\
    --max_length 2048 \\
    --deepspeed zero3_offload
"""


def test_swift_trainer_with_deepspeed_is_the_ds_config_it_runs(tmp_path):
    # ms-swift's `swift sft --deepspeed zero3_offload`: swift/config/zero3_offload.json, its "auto" filled
    # by the Trainer from ms-swift's arguments (before: not a recognised launch config)
    path = tmp_path / "sft.sh"
    path.write_text(TRAINER)
    read = load_config(str(path))
    plan = read.plan
    assert read.framework == "deepspeed" and plan.framework == "deepspeed"
    assert (plan.dp, plan.zero, plan.mbs, plan.grad_accum, plan.gbs, plan.seq_len, plan.dtype) == \
        (4, 3, 2, 4, 32, 2048, "bf16")
    assert plan.optimizer_offload == 1.0  # zero3_offload.json: offload_optimizer on the cpu, no ratio
    assert sorted(n.split(" ")[0] for n in read.not_modelled) == ["zero_optimization.offload_param"]
    # gradient_accumulation_steps unset: max(1, ceil(16 / per_device / world)) (swift/trainers/arguments.py)
    path.write_text(TRAINER.replace("    --gradient_accumulation_steps $(expr 16 / $nproc) \\\n", "")
                    .replace("zero3_offload", "zero2").replace("--torch_dtype bfloat16", "--tuner_type lora"))
    with pytest.raises(PartitaError, match="pass --dtype"):  # the model's own dtype
        load_config(str(path))
    read = load_config(str(path), fill={"dtype": "bf16"})
    assert (read.plan.zero, read.plan.grad_accum, read.plan.gbs) == (2, 2, 16)
    assert read.not_modelled == ()  # LoRA is a plan (issue 36): ms-swift's defaults rank 8, alpha 32, all-linear
    assert (read.plan.finetune, read.plan.lora_rank, read.plan.lora_alpha, read.plan.lora_targets,
            read.plan.lora_dropout) == ("lora", 8, 32.0, "all-linear", 0.05)


# ------------------------------------------------------------------------------ the CLI: estimate and plan
def test_estimate_from_script_fills_auto_and_runs_as_the_file_framework(tmp_path, capsys):
    # before: --global-batch beside --from-script was refused; the framework was Megatron's
    path = _ds(tmp_path, HF_AUTO)
    argv = ["estimate", "--from-script", path, "--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "8",
            "--mbs", "1", "--global-batch", "16", "--dtype", "bf16", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["framework"] == "deepspeed" and out["plan"]["gbs"] == 16 and out["not_modelled"] == []
    toml = _toml(tmp_path, "[parallelism]\ntensor_parallel_degree = 2\n[training]\nlocal_batch_size = 1\n")
    assert main(["estimate", "--from-script", toml, "--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "8",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["framework"] == "torchtitan-eager"


def test_plan_from_script_searches_as_the_file_framework(tmp_path, capsys):
    toml = _toml(tmp_path, "[parallelism]\ntensor_parallel_degree = 2\n[training]\nlocal_batch_size = 1\n"
                           "seq_len = 4096\n")
    assert main(["plan", "--from-script", toml, "--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "8",
                 "--top", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["framework"] == "torchtitan-eager" and out["global_batch"] == 4
    assert out["plans"][0]["plan"]["framework"] == "torchtitan-eager"
    assert out["from_script"]["not_modelled"] == []
