"""Issue 32 items 4 and 6: ``partita plan --framework T`` proposes only plans T runs, and each
of them goes through ``partita export --to T`` and the target's OWN parser and validation
(tests/export_oracles: Megatron-LM core_v0.16.1's option table plus the validate_args rules,
MindSpeed-LLM's flags and validate_args rules, DeepSpeed 0.19's DeepSpeedConfig, torchtitan
0.3.0's ConfigManager + Trainer.Config + build_mesh + stage splitter), on the default scenario,
DeepSeek-V3 and Mixtral; ``partita plan --export`` writes plan 1 as printed (after the
gradient-knob re-ranking); ``--from-script`` implies the file's framework.
"""
import json
import shlex

import pytest

from export_oracles import deepspeed_oracle, megatron_oracle, torchtitan_oracle
from partita.cli import main
from partita.export import export
from partita.plan import Plan
from partita.spec.load import load_model
from test_export import _args, _check_megatron_namespace, _titan_stage_layers

TARGETS = ("megatron", "mindspeed", "deepspeed", "torchtitan")
#: (id, model for `export --model`, plan arguments): the default scenario (no arguments: LLaMA-65B
#: on 512 Ascend 910B), DeepSeek-V3 (MLA, 3 dense layers first, 256 experts) and Mixtral on 910B
SCENARIOS = [
    ("default", "llama-65b", []),
    ("deepseek-v3", "deepseek-v3", ["--model", "deepseek-v3", "--hardware", "h200", "--devices", "512",
                                    "--global-batch", "2048", "--seq-len", "4096"]),
    ("mixtral", "mixtral-8x7b", ["--model", "mixtral-8x7b", "--hardware", "ascend-910b2", "--devices", "32",
                                 "--global-batch", "128", "--seq-len", "4096"]),
]


def accept(target: str, text: str, plan: Plan, model) -> None:
    """The target's own parser and validation on an export (raises as the target does)."""
    if target in ("megatron", "mindspeed"):
        args, env = _args(text)
        if target == "megatron":
            ns = megatron_oracle.megatron_parser().parse_args(args)
        else:
            ns = megatron_oracle.mindspeed_parser().parse_args(args)
            megatron_oracle.mindspeed_validate(ns)
        _check_megatron_namespace(ns, env, plan, model)
    elif target == "deepspeed":
        cfg = deepspeed_oracle.load(json.loads(text), plan.world_size, plan.dp)
        assert (cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (plan.mbs, plan.grad_accum)
        assert cfg.zero_optimization_stage == plan.zero
    else:
        body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
        cfg = torchtitan_oracle.parse(shlex.split(body.replace("\\\n", " ")))
        torchtitan_oracle.build_mesh(cfg.parallelism, plan.world_size)
        assert cfg.parallelism.data_parallel_shard_degree == (plan.dp if plan.zero else 1)
        if plan.pp > 1:
            assert _titan_stage_layers(cfg.parallelism, model.layers) == list(plan.stage_layers(model.layers))


def _plan_json(capsys, argv: list[str]) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("sid,model_name,argv", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_plan_framework_then_export_passes_the_targets_checks(capsys, tmp_path, target, sid, model_name, argv):
    """Every plan shown by ``plan --framework T`` (top 3) exports to T through ``partita export``
    and passes T's own checks; plan 1 is estimated as T runs it."""
    data = _plan_json(capsys, [*argv, "--framework", target, "--top", "3"])
    assert data["framework"] == target and data["plans"]
    model = load_model(model_name)
    for row in data["plans"]:
        plan = Plan.from_dict(row["plan"])
        assert plan.framework == target
        path = tmp_path / "plan.json"
        path.write_text(json.dumps(row["plan"]))
        out = tmp_path / "out.txt"
        assert main(["export", "--to", target, str(path), "--model", model_name, "-o", str(out)]) == 0, plan.summary()
        assert NOT_RUN not in capsys.readouterr().err  # a plan the search proposed for T is one T runs
        accept(target, out.read_text(), plan, model)


NOT_RUN = "will not run this plan as estimated"


@pytest.mark.parametrize("target,fields,reason", [
    ("deepspeed", "tp=2,pp=2,dp=2,gbs=16,mbs=1", "deepspeed cannot run tp and pp together"),
    ("torchtitan", "tp=2,dp=4,gbs=16,mbs=1,zero=2", "torchtitan has no ZeRO-2"),
])
def test_export_of_a_plan_the_framework_does_not_run_says_so_first(target, fields, reason):
    """The exporters write their closest equivalent of a plan they can express (Megatron and
    MindSpeed refuse the rest in one line), but one the search's table
    (search/capabilities.py) says the target does not run is flagged first, with the reason
    the search gives; the same plan for a framework that runs it is not flagged."""
    plan, model = Plan.parse(fields), load_model("llama3-8b")
    warnings = export(target, plan, model).warnings
    assert warnings[0].startswith(reason) and NOT_RUN in warnings[0]
    assert not any(NOT_RUN in w for w in export("megatron", plan.with_(zero=1), model).warnings)


def test_plan_export_writes_plan_1_as_printed(capsys):
    """LLaMA-7B on 512 910B: the bf16 gradient reduction re-ranks the layouts (plan 1 reduces in
    bf16); ``--export`` writes that plan 1 - the export of plans[0] of the same --json output,
    byte for byte, with no fallback note - and Megatron's parser reads --grad-reduce-in-bf16."""
    data = _plan_json(capsys, ["--model", "llama-7b", "--devices", "512", "--global-batch", "512",
                               "--export", "megatron", "--top", "3"])
    first = Plan.from_dict(data["plans"][0]["plan"])
    assert first.grad_dtype == "bf16"  # the knob re-ranking moved it to the top
    assert data["export"]["note"] is None
    model = load_model("llama-7b")
    assert data["export"]["text"] == export("megatron", first, model).text
    ns = megatron_oracle.megatron_parser().parse_args(_args(data["export"]["text"])[0])
    assert ns.grad_reduce_in_bf16


@pytest.mark.parametrize("target", TARGETS)
def test_plan_framework_export_is_plan_1(capsys, target):
    """``plan --framework T --export T``: plan 1 itself, never a fallback."""
    data = _plan_json(capsys, ["--framework", target, "--export", target, "--top", "1"])
    assert data["export"]["note"] is None
    plan = Plan.from_dict(data["plans"][0]["plan"])
    model = load_model("llama-65b")
    assert data["export"]["text"] == export(target, plan, model).text
    accept(target, data["export"]["text"], plan, model)


def test_from_script_implies_the_files_framework(capsys, tmp_path):
    """A ds_config.json: the search runs as DeepSpeed runs (no interleaving, ep, cp, sequence
    parallel) and its plans go through DeepSpeedConfig."""
    cfg = {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
           "bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(cfg))
    data = _plan_json(capsys, ["--model", "llama-13b", "--hardware", "a100-80gb", "--devices", "64",
                               "--from-script", str(path), "--seq-len", "2048", "--top", "3"])
    assert data["framework"] == "deepspeed"
    model = load_model("llama-13b")
    for row in data["plans"]:
        plan = Plan.from_dict(row["plan"])
        accept("deepspeed", export("deepspeed", plan, model).text, plan, model)
