"""``partita import`` / ``estimate --from-script`` / ``plan --from-script`` (issue 14 item 2), in-process.

Oracles: the plan that ``partita export`` was given (export -> file -> import must give it back, up to
the closest equivalents docs/export.md lists), hand-written launch scripts whose plan is stated in
the test, and ``partita.estimate.estimate`` of the imported plan for the numbers the CLI prints.
"""
from __future__ import annotations

import json
import re

import pytest

from export_oracles.plans import MATRIX
from partita.cli import main
from partita.plan import Plan

#: a handful of plans per target: dense and MoE, zero 0-3, vpp, uneven split, cp, ep, fp16/fp32
CASES = ["8b-dp8-z0", "8b-dp8-z2-full", "8b-tp4-sp-z1-sel", "8b-tp2-pp2-fp16-full", "8b-pp4-vpp2", "8b-dp8-z1-fp32",
         "8b-cp2-tp2-pp2", "70b-tp8-pp4-vpp5", "70b-pp2-split", "405b-split-cp2", "8x22b-ep8-z1", "8b-dp64-z3-mbs2"]
BY_ID = {pid: (model, plan) for pid, model, plan in MATRIX}


def _expected(target: str, plan: Plan) -> dict:
    """The fields an export keeps (docs/export.md "Import"): MindSpeed ZeRO-2 runs as FSDP2 (read back 3),
    torchtitan ZeRO-1/2 as FSDP without reshard (read back 2), DeepSpeed selective -> full recompute and no
    sequence parallel, fp8 -> bf16 on torchtitan/DeepSpeed, an even split is not written out."""
    zero = {("mindspeed", 2): 3, ("torchtitan", 1): 2, ("torchtitan", 2): 2}.get((target, plan.zero), plan.zero)
    if target == "deepspeed" and zero == 0 and plan.pp > 1 and plan.dtype in ("bf16", "fp8"):
        zero = 1  # DeepSpeed's BF16_Optimizer for a bf16 PipelineModule without ZeRO (imports/deepspeed.py)
    uneven = plan.layer_split and len(set(plan.layer_split)) > 1
    return dict(dp=plan.dp, tp=plan.tp, pp=plan.pp, vpp=plan.vpp, cp=plan.cp, ep=plan.ep, zero=zero, mbs=plan.mbs,
                gbs=plan.gbs, seq_len=plan.seq_len,
                recompute="full" if target == "deepspeed" and plan.recompute == "selective" else plan.recompute,
                dtype="bf16" if target in ("torchtitan", "deepspeed") and plan.dtype == "fp8" else plan.dtype,
                layer_split=plan.layer_split if uneven or (plan.layer_split and target in ("megatron", "mindspeed"))
                else None,
                sp=plan.sp and plan.tp > 1 and target != "deepspeed")


def _export(tmp_path, target: str, pid: str, capsys) -> tuple[str, Plan, str] | None:
    """Export MATRIX plan ``pid`` with ``partita export``; None when the target refuses it (exit 2)."""
    model, plan = BY_ID[pid]
    plan_file = tmp_path / f"{pid}.plan.json"
    plan.to_json(plan_file)
    out = tmp_path / f"{pid}.{target}.{'json' if target == 'deepspeed' else 'sh'}"
    rc = main(["export", "--to", target, str(plan_file), "--model", model, "-o", str(out)])
    capsys.readouterr()
    return (str(out), plan, model) if rc == 0 else None


@pytest.mark.parametrize("target", ["megatron", "mindspeed", "deepspeed", "torchtitan"])
def test_export_then_import_cli_gives_the_plan_back(tmp_path, capsys, target):
    imported = 0
    for pid in CASES:
        exported = _export(tmp_path, target, pid, capsys)
        if exported is None:
            continue
        path, plan, model = exported
        back_file = tmp_path / f"{pid}.back.json"
        argv = ["import", path, "--devices", str(plan.world_size), "--model", model, "-o", str(back_file),
                "--seq-len", str(plan.seq_len)]
        assert main(argv) == 0, (pid, capsys.readouterr().err)
        detected = capsys.readouterr().out.splitlines()[0]
        assert f": {target} launch config, {plan.world_size} devices" in detected, (pid, detected)  # detection
        back = Plan.load(back_file)
        got = {k: getattr(back, k) for k in _expected(target, plan)}
        got["sp"] = back.sp and back.tp > 1
        assert got == _expected(target, plan), pid
        imported += 1
    assert imported >= {"deepspeed": 3}.get(target, 8), f"only {imported} of the cases exported to {target}"


@pytest.mark.parametrize("zero, offload", [(2, 1.0), (3, 1.0), (3, 0.4)])
def test_optimizer_offload_survives_export_then_import(tmp_path, capsys, zero, offload):
    # export/deepspeed.py writes offload_optimizer {"device": "cpu"} (a "ratio" below 1, ZeRO-3 only); DeepSpeed
    # runs that as ZeRO-Offload of that share (runtime/zero/offload_config.py, ratio default 1.0), so import
    # reads the same fraction back (it was "not modelled" and lost before)
    plan = Plan(dp=8, zero=zero, mbs=1, gbs=8, seq_len=2048, dtype="bf16", optimizer_offload=offload)
    plan_file, out, back = tmp_path / "p.json", tmp_path / "ds.json", tmp_path / "back.json"
    plan.to_json(plan_file)
    assert main(["export", "--to", "deepspeed", str(plan_file), "--model", "llama3-8b", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert main(["import", str(out), "--devices", "8", "-o", str(back)]) == 0, capsys.readouterr().err
    got = Plan.load(back)
    assert (got.zero, got.optimizer_offload) == (zero, offload)
    assert "offload_optimizer" not in capsys.readouterr().out  # no longer listed as not modelled


MEGATRON_SCRIPT = """#!/bin/bash
# a Megatron-LM example-style launcher: flags in variables and a bash array
GPUS_PER_NODE=8
NNODES=4
TP=4
DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank 0"
GPT_ARGS=(
    --tensor-model-parallel-size ${TP}   # within a node
    --pipeline-model-parallel-size 2
    --sequence-parallel
    --micro-batch-size 1
    --global-batch-size 64
    --seq-length 4096
    --use-distributed-optimizer
    --overlap-grad-reduce
    --bf16
    --recompute-granularity full
)
torchrun $DISTRIBUTED_ARGS pretrain_gpt.py \\
    ${GPT_ARGS[@]} \\
    --num-layers 32 --hidden-size 4096
"""
MEGATRON_PLAN = dict(dp=4, tp=4, pp=2, vpp=1, cp=1, sp=True, zero=1, mbs=1, gbs=64, seq_len=4096, recompute="full",
                     dtype="bf16", overlap_grad_reduce=True, overlap_param_gather=False)


def test_megatron_script_with_variables_and_world_size_from_torchrun(tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text(MEGATRON_SCRIPT)
    assert main(["import", str(script), "--json"]) == 0  # no --devices: 8 per node x 4 nodes from torchrun
    plan = json.loads(capsys.readouterr().out)
    assert {k: plan[k] for k in MEGATRON_PLAN} == MEGATRON_PLAN


def test_torchtitan_toml_equals_its_overrides(tmp_path, capsys):
    toml = tmp_path / "train.toml"
    toml.write_text("[parallelism]\ntensor_parallel_degree = 2\ndata_parallel_shard_degree = 4\n"
                    "enable_sequence_parallel = true\nfsdp_reshard_after_forward = \"default\"\n"
                    "[training]\nlocal_batch_size = 2\nglobal_batch_size = 64\nseq_len = 4096\n"
                    "[activation_checkpoint]\nmode = \"full\"\n")
    overrides = tmp_path / "overrides.txt"
    overrides.write_text("--parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 4 "
                         "--training.local_batch_size 2 --training.global_batch_size 64 --training.seq_len 4096 "
                         "activation_checkpoint:full\n")
    plans = []
    for path in (toml, overrides):
        assert main(["import", str(path), "--json"]) == 0
        plans.append(json.loads(capsys.readouterr().out))
    assert plans[0] == plans[1]
    assert (plans[0]["dp"], plans[0]["tp"], plans[0]["zero"], plans[0]["mbs"], plans[0]["recompute"]) == (4, 2, 3, 2, "full")


@pytest.mark.parametrize("content, args, message", [
    (None, [], "no such file"),
    ("DIR", [], "is a directory"),
    (b"\xff\xfe\x00binary", [], "not a UTF-8 text file"),
    ("", [], "not a recognised launch config"),
    ("echo hello world\n", [], "not a recognised launch config"),
    ('{"train_batch_size": 64, "zero_optimization": {', ["--devices", "8"], "is not valid JSON"),
    ('{"train_batch_size": 64, "zero_optimization": {"stage": 1}}', [], "pass --devices"),
    ("pretrain_gpt.py --tensor-model-parallel-size x", ["--devices", "8"], "invalid int value"),
    ("pretrain_gpt.py --tensor-model-parallel-size 3 --global-batch-size 8", ["--devices", "8"], "not a multiple"),
    ("pretrain_gpt.py --micro-batch-size 3 --global-batch-size 8", ["--devices", "8"], "invalid plan"),
    ("echo hello", ["--from", "megatron", "--devices", "8"], "does not look like a megatron"),
    ("--parallelism.tensor_parallel_degree two", ["--devices", "8"], "cannot read it as torchtitan"),
    ("[parallelism\n", ["--from", "torchtitan"], "not valid TOML"),
])
def test_bad_files_one_line_exit_2(tmp_path, capsys, content, args, message):
    path = tmp_path / ("train.toml" if "TOML" in message else "cfg")
    if content == "DIR":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    assert main(["import", str(path), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("partita: error: ") and message in err, err


def test_estimate_from_script_equals_estimate_plan(tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text(MEGATRON_SCRIPT)
    assert main(["import", str(script), "-o", str(tmp_path / "plan.json")]) == 0
    common = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "32", "--json"]
    results = []
    for source in (["--from-script", str(script)], ["--plan", str(tmp_path / "plan.json")]):
        capsys.readouterr()
        assert main(["estimate", *source, *common]) == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[0]["step_time_s"] == results[1]["step_time_s"]
    assert results[0]["plan"] == results[1]["plan"]
    assert main(["estimate", "--from-script", str(script), "--tp", "2", *common]) == 2  # the script sets the plan
    assert "drop --tp" in capsys.readouterr().err


def test_plan_from_script_compares_with_the_best(tmp_path, capsys):
    from partita.estimate import estimate
    from partita.spec.hardware import make_cluster
    from partita.spec.load import load_model
    script = tmp_path / "run.sh"
    script.write_text(MEGATRON_SCRIPT)
    argv = ["plan", "--from-script", str(script), "--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "32",
            "--top", "2"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["global_batch"], out["seq_len"]) == (64, 4096)  # the search runs at the script's batch and length
    mine = estimate(load_model("llama3-8b"), make_cluster("h100-sxm", 32, None, {}), Plan.from_dict(
        {k: v for k, v in out["from_script"]["plan"].items()}))
    best = out["plans"][0]["step_time_s"]
    line = out["from_script"]["comparison"]
    m = re.fullmatch(r"your plan \((.+?)\): ([0-9.]+) s/step; best \((.+?)\): ([0-9.]+) s/step \((\d+)% faster\): "
                     r"best differs in .+; your plan's largest extra is .+", line)
    assert m, line
    assert m.group(1) == mine.plan.summary() and float(m.group(2)) == float(f"{mine.step_time_s:.3g}")
    assert float(m.group(4)) == float(f"{best:.3g}")
    assert int(m.group(5)) == round(100 * (mine.step_time_s / best - 1))


def test_plan_from_script_text_ends_with_the_comparison(tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text(MEGATRON_SCRIPT)
    argv = ["plan", "--from-script", str(script), "--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "32",
            "--top", "2"]
    assert main([*argv, "--json"]) == 0
    line = json.loads(capsys.readouterr().out)["from_script"]["comparison"]
    assert main(argv) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.rstrip().splitlines()[-1] == line


def test_plan_from_script_that_does_not_fit(tmp_path, capsys):
    script = tmp_path / "run.sh"  # llama3-70b without any model parallelism: ~1 TiB of weights+optimizer per device
    script.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 1 "
                      "--micro-batch-size 1 --global-batch-size 64 --seq-length 4096 --bf16\n")
    assert main(["plan", "--from-script", str(script), "--model", "llama3-70b", "--hardware", "h100-sxm",
                 "--devices", "64", "--top", "1", "--json"]) == 0
    line = json.loads(capsys.readouterr().out)["from_script"]["comparison"]
    assert re.match(r"your plan \(dp64 tp1 pp1 z0 mbs1x1\): DOES NOT FIT \(P\(fit\) < 0.05\): peak [0-9.]+ GiB", line), line
    assert "; best (" in line and "it differs in" in line


def test_torchtitan_unset_shard_degree_fills_the_devices(tmp_path, capsys):
    # torchtitan 0.3.0 config/configs.py: data_parallel_shard_degree: int = -1 (ParallelDims fills the world)
    path = tmp_path / "overrides.txt"
    path.write_text("--parallelism.tensor_parallel_degree 2 --training.local_batch_size 2 --training.global_batch_size 64\n")
    assert main(["import", str(path), "--devices", "16", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["dp"], plan["tp"], plan["zero"]) == (8, 2, 3)
    assert main(["import", str(path)]) == 2
    assert "pass --devices" in capsys.readouterr().err


def test_import_help_names_every_reader(capsys):
    # the readers partita.imports holds: the --from choices (export/registry.py importable_names) and the
    # script dialects read under them (imports/megatron_deepspeed.py, dschat.py, swift.py, openrlhf.py, flagscale.py)
    from partita.export.registry import importable_names
    main(["import", "--help"])
    text = " ".join(capsys.readouterr().out.split()).lower().replace("- ", "-")
    names = [n.replace("llamafactory", "llama-factory") for n in importable_names()]
    names += ["megatron-deepspeed", "deepspeed-chat", "ms-swift", "openrlhf", "flagscale", "ds_config.json", "toml"]
    assert [n for n in names if n not in text] == []
