"""Issue 7: exported configs parse back (by the target's own classes where they install on
CPU, otherwise by a parser declaring the target's flags) into the same plan."""
import json
import shlex
import subprocess
import sys

import pytest

from partita.errors import PartitaError
from partita.export import export
from partita.export.deepspeed import TOP_LEVEL_KEYS
from partita.export.megatron import megatron_parser, mindspeed_parser, plan_from_megatron
from partita.export.torchtitan import PARALLELISM_FIELDS, TRAINING_FIELDS
from partita.plan import Plan
from partita.spec.model import load_model
from partita.validation.published import load_cases

PLANS = [
    ("llama3-70b", Plan(dp=4, tp=8, pp=4, vpp=5, sp=True, zero=1, mbs=1, gbs=128, seq_len=8192, recompute="selective",
                        schedule="interleaved-1f1b")),
    ("gpt3-175b", Plan(dp=16, tp=8, pp=12, sp=True, zero=1, mbs=1, gbs=1536, seq_len=2048, recompute="full", dtype="fp16")),
    ("llama3-405b", Plan(dp=8, tp=8, pp=16, cp=2, sp=True, zero=1, mbs=1, gbs=1024, seq_len=8192,
                         layer_split=(7,) + (8,) * 14 + (7,))),
    ("mixtral-8x22b", Plan(dp=8, tp=1, pp=4, ep=8, zero=1, mbs=1, gbs=256, seq_len=4096, recompute="full")),
    ("deepseek-v3", Plan(dp=64, tp=1, pp=16, ep=64, zero=1, mbs=1, gbs=4096, seq_len=4096,
                         layer_split=(3,) + (4,) * 14 + (2,))),
    ("llama3-8b", Plan(dp=64, zero=3, mbs=2, gbs=128, seq_len=8192, recompute="none", dtype="bf16")),
]
FIELDS = ("tp", "pp", "vpp", "cp", "ep", "sp", "zero", "mbs", "gbs", "seq_len", "recompute", "dtype")


def _args(text: str) -> list[str]:
    body = "\n".join(l for l in text.splitlines() if not l.startswith("#"))
    return shlex.split(body.replace("\\\n", " "))


@pytest.mark.parametrize("name,plan", PLANS, ids=[p[0] for p in PLANS])
def test_megatron_round_trip(name, plan):
    model = load_model(name)
    out = export("megatron", plan, model)
    ns = megatron_parser().parse_args(_args(out.text))  # SystemExit on any unknown or malformed flag
    back = plan_from_megatron(ns, plan.world_size, model.layers)
    for f in FIELDS:
        assert back[f] == getattr(plan, f), f
    if plan.layer_split:
        assert back["layer_split"] == plan.layer_split
    assert ns.num_layers == model.layers and ns.hidden_size == model.hidden
    assert "--checkpoint-activations" not in out.text and "--recompute-activations" not in out.text


@pytest.mark.parametrize("name,plan", [p for p in PLANS if p[1].zero <= 1 and p[1].dtype != "fp8"],
                         ids=[p[0] for p in PLANS if p[1].zero <= 1 and p[1].dtype != "fp8"])
def test_mindspeed_round_trip(name, plan):
    model = load_model(name)
    ns = mindspeed_parser().parse_args(_args(export("mindspeed", plan, model).text))
    back = plan_from_megatron(ns, plan.world_size, model.layers)
    for f in FIELDS:
        assert back[f] == getattr(plan, f), f
    assert ns.use_flash_attn and ns.use_fused_rmsnorm == (model.norm == "rmsnorm")
    assert ns.use_ascend_mc2 == (plan.tp > 1 and plan.sp)
    if plan.cp > 1:
        assert ns.context_parallel_algo == "megatron_cp_algo"  # ring attention, as the cost model assumes


def test_mindspeed_refuses_what_ascend_cannot_do():
    with pytest.raises(PartitaError, match="fp8"):
        export("mindspeed", Plan(dp=8, dtype="fp8", gbs=8), load_model("llama3-8b"))
    with pytest.raises(PartitaError, match="zero=3"):
        export("mindspeed", Plan(dp=8, zero=3, gbs=8), load_model("llama3-8b"))


def test_every_published_layout_exports_and_parses(published_csv):
    cases, _ = load_cases(published_csv)
    parser = megatron_parser()
    for case in cases:
        ns = parser.parse_args(_args(export("megatron", case.plan, case.model).text))
        assert ns.tensor_model_parallel_size == case.plan.tp
        assert ns.pipeline_model_parallel_size == case.plan.pp


def _ds_plan(ds: dict, world: int) -> dict:
    return {"mbs": ds["train_micro_batch_size_per_gpu"], "gbs": ds["train_batch_size"],
            "dp": ds["train_batch_size"] // (ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"]),
            "zero": ds["zero_optimization"]["stage"], "dtype": "bf16" if ds.get("bf16", {}).get("enabled") else
            "fp16" if ds.get("fp16", {}).get("enabled") else "fp32",
            "recompute": "full" if "activation_checkpointing" in ds else "none"}


@pytest.mark.parametrize("plan", [Plan(dp=8, zero=z, mbs=2, gbs=64, dtype=d, recompute=r)
                                  for z, d, r in ((0, "bf16", "none"), (1, "fp16", "full"), (2, "bf16", "none"),
                                                  (3, "bf16", "full"))])
def test_deepspeed_config_round_trip(plan):
    out = export("deepspeed", plan)
    ds = json.loads(out.text)
    assert set(ds) <= TOP_LEVEL_KEYS
    back = _ds_plan(ds, plan.world_size)
    for f in ("mbs", "gbs", "dp", "zero", "dtype", "recompute"):
        assert back[f] == getattr(plan, f), f


def test_deepspeed_validates_with_deepspeeds_own_config_class():
    pytest.importorskip("deepspeed")
    plan = Plan(dp=1, zero=3, mbs=2, gbs=8, dtype="bf16", recompute="full")  # one process: world size 1
    ds = json.loads(export("deepspeed", plan).text)
    code = ("import json, sys; from deepspeed.runtime.config import DeepSpeedConfig; "
            "c = DeepSpeedConfig(json.loads(sys.argv[1])); "
            "print(c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps, "
            "c.zero_optimization_stage, c.bfloat16_config.enabled)")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(ds)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-5:] == ["8", "2", "4", "3", "True"]


@pytest.mark.parametrize("plan,needle", [(Plan(dp=2, tp=4, gbs=8), "tp=4"), (Plan(dp=2, pp=2, vpp=2, gbs=8), "vpp"),
                                         (Plan(dp=2, pp=2, gbs=8, layer_split=(3, 5)), "uneven")])
def test_deepspeed_refuses_what_it_cannot_express(plan, needle):
    with pytest.raises(PartitaError, match=needle):
        export("deepspeed", plan)


def _titan_back(text: str) -> tuple[dict, str]:
    sections: dict = {"parallelism": {}, "training": {}}
    ac = None
    tokens = _args(text)
    i = 0
    while i < len(tokens):
        if tokens[i].startswith("activation_checkpoint:"):
            ac = tokens[i].split(":", 1)[1]
            i += 1
            continue
        section, field = tokens[i][2:].split(".", 1)
        sections[section][field] = tokens[i + 1]
        i += 2
    return sections, ac


@pytest.mark.parametrize("name,plan", PLANS[:2] + PLANS[3:], ids=[p[0] for p in PLANS[:2] + PLANS[3:]])
def test_torchtitan_round_trip(name, plan):
    out = export("torchtitan", plan)
    sections, ac = _titan_back(out.text)
    par, train = sections["parallelism"], sections["training"]
    assert set(par) <= PARALLELISM_FIELDS and set(train) <= TRAINING_FIELDS
    dp = int(par["data_parallel_replicate_degree"]) * int(par["data_parallel_shard_degree"])
    assert (dp, int(par["tensor_parallel_degree"]), int(par["pipeline_parallel_degree"]),
            int(par["context_parallel_degree"]), int(par["expert_parallel_degree"])) == \
        (plan.dp, plan.tp, plan.pp, plan.cp, plan.ep)
    assert par["enable_sequence_parallel"] == str(plan.sp)
    assert int(train["global_batch_size"]) == plan.gbs and int(train["seq_len"]) == plan.seq_len
    mbs = int(par.get("pipeline_parallel_microbatch_size", train["local_batch_size"]))
    assert mbs == plan.mbs
    assert ac == plan.recompute


def test_torchtitan_fields_accepted_by_torchtitan():
    config = pytest.importorskip("torchtitan.config")
    for name, plan in PLANS[:2]:
        sections, _ = _titan_back(export("torchtitan", plan).text)
        # constructing torchtitan's own dataclasses raises TypeError on any field it does not have
        par = config.ParallelismConfig(**{k: _typed(v) for k, v in sections["parallelism"].items()})
        train = config.TrainingConfig(**{k: _typed(v) for k, v in sections["training"].items()})
        assert par.tensor_parallel_degree == plan.tp and par.pipeline_parallel_degree == plan.pp
        assert train.global_batch_size == plan.gbs and train.seq_len == plan.seq_len


def _typed(v: str):
    if v in ("True", "False"):
        return v == "True"
    try:
        return int(v)
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return v


def test_export_cli(tmp_path, capsys):
    from partita.cli import main
    path = tmp_path / "plan.json"
    PLANS[0][1].to_json(path)
    assert main(["export", "--to", "megatron", str(path), "--model", "llama3-70b", "-o", str(tmp_path / "args.txt")]) == 0
    assert "--num-layers-per-virtual-pipeline-stage 4" in (tmp_path / "args.txt").read_text()
    err = capsys.readouterr().err
    assert "partita: warning: recompute=selective" in err
    assert main(["export", "--to", "deepspeed", str(path)]) == 2
    assert "tp=8" in capsys.readouterr().err
