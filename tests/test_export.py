"""Issue 14: every export of a 31-plan matrix is accepted by the target's own parser with the
same degrees, batch and recompute, or refused with its exact reason.

Oracles (tests/export_oracles/): torchtitan 0.3.0's ConfigManager (tyro) + Trainer.Config checks
+ ParallelDims.build_mesh + its stage splitter; DeepSpeed 0.19's DeepSpeedConfig with the plan's
world size; Megatron-LM core_v0.16.1's option table (dumped from its real parser; the real
parse_args/validate_args run is tests/export_oracles/megatron_real_check.py, which needs a
Megatron-LM checkout) plus the validate_args rules the exporter relies on; MindSpeed-LLM's own
flag declarations on top.
"""
import math
import shlex
from types import SimpleNamespace

import pytest

from export_oracles import deepspeed_oracle, megatron_oracle, torchtitan_oracle
from export_oracles.plans import MATRIX
from partita.errors import PartitaError
from partita.plan import Plan
from partita.export import export
from partita.spec.load import load_model

IDS = [row[0] for row in MATRIX]
MEGATRON_FSDP_PP = ("zero={z} with pp=2: Megatron-FSDP with pipeline parallelism is not a standard Megatron-LM path; "
                    "re-plan with --zero 1 (distributed optimizer) or --pp 1")
FSDP2 = "zero={z} with {w}: --use-torch-fsdp2 is not supported with {w} (Megatron validate_args); re-plan with --zero 1"
MS_Z2 = ("zero=2: MindSpeed-LLM has no ZeRO-2 (its distributed optimizer is ZeRO-1, torch FSDP2 is ZeRO-3); re-plan with "
         "--zero 1 or --zero 3, or plan with --framework mindspeed")
NO_FP8 = "dtype=fp8: Ascend 910B/910C have no fp8 matrix units (fp8 arrives with Ascend 950); re-plan with --dtype bf16"
DS_VPP = "vpp > 1: DeepSpeed pipelines have no interleaved schedule; re-plan with --vpp 1"
DS_SPLIT = ("an uneven layer split cannot be expressed in DeepSpeed's PipelineModule (no explicit boundary list); "
            "re-plan with an even split or export to megatron")
DS_EP = "ep > 1: expert parallelism lives in DeepSpeed-MoE layer code, not in ds_config; export to megatron or torchtitan"
DS_ZPP = ("zero={z} with pp=2: DeepSpeed's pipeline engine asserts ZeRO-2 and ZeRO-3 are incompatible with pipeline "
          "parallelism; re-plan with --zero 1 or --pp 1")
TT_FP16 = ("dtype=fp16: torchtitan 0.3.0 accepts --training.mixed_precision_param bfloat16 or float32 only "
           "(config/configs.py TrainingConfig); re-plan with --dtype bf16")
REFUSED = {
    "megatron": {"8b-pp2-z2": MEGATRON_FSDP_PP.format(z=2), "8b-pp2-z3-full": MEGATRON_FSDP_PP.format(z=3)},
    "mindspeed": {"8b-dp8-z3-fp16-full": FSDP2.format(z=3, w="fp16"), "8b-dp8-z1-fp8": NO_FP8, "8b-tp2-z3-fp8": NO_FP8,
                  "8b-dp8-z2-full": MS_Z2, "8b-pp2-z2": MS_Z2, "8b-pp2-z3-full": FSDP2.format(z=3, w="pp=2"),
                  "8x22b-tp2-ep4-z3": FSDP2.format(z=3, w="ep=4"),
                  # the first stage: DeepSeek-V3's 3 dense layers alone (transformer_block.py validate_args' rule)
                  "dsv3-split-ep64": "layer_split 3,4,4,4,4,4,4,4,4,4,4,4,4,4,4,2: the first pipeline stage holds only "
                                     "the 3 dense layers (first-k-dense-replace), which MindSpeed-LLM does not allow; "
                                     "re-plan with a first stage of more layers, or plan with --framework mindspeed"},
    "deepspeed": {"8b-pp4-vpp2": DS_VPP, "8b-pp4-vpp4-z0": DS_VPP, "8b-pp2-vpp2-zb": DS_VPP,
                  "8b-cp2-tp2-pp2": "cp > 1: ring context parallelism is not a ds_config option (Ulysses is a "
                                    "different algorithm); export to megatron or torchtitan",
                  "8b-pp2-z2": DS_ZPP.format(z=2), "8b-pp2-z3-full": DS_ZPP.format(z=3),
                  "70b-tp8-pp4-vpp5": DS_VPP, "70b-pp2-split": DS_SPLIT, "405b-split-cp2": DS_SPLIT,
                  "405b-split-mid": DS_SPLIT, "8x22b-pp4-ep8-full": DS_EP, "8x22b-ep8-z0": DS_EP, "8x22b-ep8-z1": DS_EP,
                  "8x22b-tp2-ep4-z3": DS_EP, "8x22b-tp4-ep8-etp4": DS_EP, "8x7b-pp4-vpp4-ep4": DS_VPP, "dsv3-split-ep64": DS_SPLIT,
                  "dsv3-ep8-z1-sel": DS_SPLIT, "405b-auto-pp16": DS_SPLIT, "dsv3-auto-pp8-vpp2": DS_SPLIT,
                  "8b-pp4-vpp2-full-rl2": DS_VPP, "8x7b-pp4-ep4-full-rl3": DS_EP},
    "torchtitan": {"8b-dp8-z3-fp16-full": TT_FP16, "8b-dp8-z0-fp16": TT_FP16, "8b-tp2-pp2-fp16-full": TT_FP16,
                   "175b-pp12-fp16": TT_FP16,
                   "405b-split-mid": "layer_split 7,8,8,8,8,8,8,7,9,8,8,8,8,8,8,7: torchtitan expresses uneven splits "
                                     "only as lighter first/last stages (pipeline_parallel_first/last_stage_less_layers); "
                                     "export to megatron (pipeline layout)",
                   "8x22b-ep8-z0": "zero=0 with ep=8: torchtitan builds the expert mesh from the FSDP axis (efsdp = "
                                   "dp_shard*cp*tp/ep = 1*1*1/8, distributed/parallel_dims.py) which is not whole; "
                                   "re-plan with --zero 1 or more (dp_shard = dp) or export to megatron"},
}


def _cases(target):
    return [pytest.param(pid, model, plan, id=pid) for pid, model, plan in MATRIX if pid not in REFUSED[target]]


def _refusals(target):
    return [pytest.param(pid, model, plan, REFUSED[target][pid], id=pid)
            for pid, model, plan in MATRIX if pid in REFUSED[target]]


def _args(text: str) -> tuple[list[str], dict]:
    env = dict(l[len("# export "):].split("=", 1) for l in text.splitlines() if l.startswith("# export "))
    body = "\n".join(l for l in text.splitlines() if not l.startswith("#"))
    return shlex.split(body.replace("\\\n", " ")), env


@pytest.mark.parametrize("target", ["megatron", "mindspeed", "deepspeed", "torchtitan"])
def test_refusals_give_the_exact_reason(target):
    for pid, model, plan, message in [p.values for p in _refusals(target)]:
        with pytest.raises(PartitaError) as err:
            export(target, plan, load_model(model))
        assert str(err.value) == message, pid


# ---------------------------------------------------------------------------- Megatron / MindSpeed
def _layout_stages(layout: str) -> list[int]:
    """Decoder layers per virtual stage of ``--pipeline-model-parallel-layout`` (E/t*n/L per stage)."""
    return [int(s.split("t*")[1].rstrip("L")) if "t*" in s else 0 for s in layout.split("|")]


def _noop(ns) -> set[int]:
    """MindSpeed-LLM's --noop-layers (identity layers padding the stages), empty for Megatron."""
    return set(map(int, ns.noop_layers.split(","))) if getattr(ns, "noop_layers", None) else set()


def _stage_layers_of(ns) -> list[int]:
    """Decoder layers per virtual stage as the parsed flags place them: Megatron's layout, else
    ``num_layers`` split evenly over pp x vpp chunks (vpp from --num-layers-per-virtual-pipeline-stage,
    Megatron's interleaving) less each chunk's noop layers (MindSpeed-LLM's padding)."""
    if ns.pipeline_model_parallel_layout:
        return _layout_stages(ns.pipeline_model_parallel_layout)
    pp, nlpvs = ns.pipeline_model_parallel_size, ns.num_layers_per_virtual_pipeline_stage
    chunks = pp * ((ns.num_layers // pp) // nlpvs if nlpvs else 1)
    if getattr(ns, "schedules_method", None) == "dualpipev":  # MindSpeed: 2 pp equal chunks, in layer order
        chunks = 2 * pp
    per, noop = ns.num_layers // chunks, _noop(ns)
    return [sum(i not in noop for i in range(c * per, (c + 1) * per)) for c in range(chunks)]


def _check_megatron_namespace(ns, env, plan, model):
    assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size, ns.context_parallel_size,
            ns.expert_model_parallel_size) == (plan.tp, plan.pp, plan.cp, plan.ep)
    assert (ns.micro_batch_size, ns.global_batch_size, ns.seq_length) == (plan.mbs, plan.gbs, plan.seq_len)
    assert ns.num_layers - len(_noop(ns)) == model.layers and ns.hidden_size == model.hidden
    assert ns.sequence_parallel == (plan.sp and plan.tp > 1)
    # expert tensor parallel: written whenever ep or etp > 1 (Megatron's default, None, means etp = tp);
    # parallel_state.py raises unless etp*ep*pp divides the world size (the expert grid etp x ep x edp x pp)
    assert ns.expert_tensor_parallel_size == (plan.etp if plan.ep > 1 or plan.etp > 1 else None)
    etp = ns.expert_tensor_parallel_size or ns.tensor_model_parallel_size
    assert plan.world_size % (etp * ns.expert_model_parallel_size * ns.pipeline_model_parallel_size) == 0
    if plan.layer_split:
        assert _stage_layers_of(ns) == list(plan.layer_split)
    elif model.layers % (plan.pp * plan.vpp):
        # the automatic split: every layer placed once, and with the embedding and the
        # loss counted as a layer on the first and last stage (Megatron's account-for-
        # embedding/loss semantics) the stages differ by at most one layer, the heavier
        # ones in the middle
        stages = _stage_layers_of(ns)
        units = [n + (i == 0) + (i == len(stages) - 1) for i, n in enumerate(stages)]
        assert sum(stages) == model.layers and len(stages) == plan.pp * plan.vpp
        assert max(units) - min(units) <= 1 and min(stages[1:-1]) >= 1
        assert units[0] <= units[1] and units[-1] <= units[-2]
    elif plan.schedule == "dualpipev":  # MindSpeed's DualPipeV: its own 2 pp chunks, no vpp flag
        assert ns.schedules_method == "dualpipev" and ns.num_layers_per_virtual_pipeline_stage is None
        assert _stage_layers_of(ns) == list(plan.stage_layers(model.layers))
    elif plan.vpp > 1:
        assert ns.num_layers_per_virtual_pipeline_stage == model.layers // (plan.pp * plan.vpp)
        assert _stage_layers_of(ns) == list(plan.stage_layers(model.layers))
    else:
        assert ns.pipeline_model_parallel_layout is None and ns.num_layers_per_virtual_pipeline_stage is None
    assert ns.recompute_granularity == (None if plan.recompute == "none" else plan.recompute)
    if plan.recompute == "full":  # block: the first N layers of each chunk; uniform 1: every layer on its own
        assert (ns.recompute_method, ns.recompute_num_layers) == (
            ("block", plan.recompute_layers) if plan.recompute_layers else ("uniform", 1))
    assert (ns.bf16, ns.fp16, ns.fp8 is not None) == (plan.dtype in ("bf16", "fp8"), plan.dtype == "fp16",
                                                      plan.dtype == "fp8")
    # validate_args core_v0.16.1 l.597-601: overlap-param-gather needs the distributed optimizer
    # (or Megatron-FSDP) and overlap-grad-reduce
    if ns.overlap_param_gather:
        assert ns.use_distributed_optimizer and ns.overlap_grad_reduce
    # l.928-952: tp or cp > 1 without FSDP requires CUDA_DEVICE_MAX_CONNECTIONS=1; FSDP asserts it is not 1
    fsdp = getattr(ns, "use_megatron_fsdp", False) or ns.use_torch_fsdp2
    assert env.get("CUDA_DEVICE_MAX_CONNECTIONS") == ("1" if (plan.tp > 1 or plan.cp > 1) and not fsdp else None)


@pytest.mark.parametrize("pid,model_name,plan", _cases("megatron"))
def test_megatron_export_parses_with_megatrons_option_table(pid, model_name, plan):
    model = load_model(model_name)
    args, env = _args(export("megatron", plan, model).text)
    ns = megatron_oracle.megatron_parser().parse_args(args)  # SystemExit on an unknown flag or bad value
    megatron_oracle.optimizer_and_recompute_validate(ns)  # validate_args / Optimizer- / TransformerConfig rules
    _check_megatron_namespace(ns, env, plan, model)
    assert ns.use_distributed_optimizer == (plan.zero >= 1)
    assert ns.use_megatron_fsdp == (plan.zero >= 2)
    assert ns.attention_backend == ("unfused" if plan.attention == "unfused" else None)
    if plan.zero >= 2:  # validate_args l.690: Megatron-FSDP only supports fsdp_dtensor
        assert ns.ckpt_format == "fsdp_dtensor"
        assert ns.data_parallel_sharding_strategy == {2: "optim_grads", 3: "optim_grads_params"}[plan.zero]


@pytest.mark.parametrize("pid,model_name,plan", _cases("mindspeed"))
def test_mindspeed_export_parses_with_mindspeeds_flags(pid, model_name, plan):
    model = load_model(model_name)
    args, env = _args(export("mindspeed", plan, model).text)
    ns = megatron_oracle.mindspeed_parser().parse_args(args)
    megatron_oracle.mindspeed_validate(ns)  # MindSpeed-LLM's own validate_args rules
    _check_megatron_namespace(ns, env, plan, model)
    assert ns.use_distributed_optimizer == (plan.zero == 1)
    if plan.zero >= 2:  # validate_args l.605-621: FSDP2 needs torch_dist/torch_dcp, untied embeddings
        assert ns.use_torch_fsdp2 and ns.ckpt_format == "torch_dist" and ns.untie_embeddings_and_output_weights
        assert not ns.gradient_accumulation_fusion
    assert ns.use_flash_attn == (plan.attention != "unfused") and ns.use_fused_rmsnorm == (model.norm == "rmsnorm")
    assert ns.use_ascend_mc2 == (plan.tp > 1 and plan.sp)
    if plan.cp > 1:
        assert ns.context_parallel_algo == "megatron_cp_algo"  # ring attention, as the cost model assumes
    if model.moe and model.moe.first_dense_layers:
        assert (ns.first_k_dense_replace, ns.moe_layer_freq) == (model.moe.first_dense_layers, model.moe.layer_freq)


def test_every_published_layout_exports_and_parses(published_csv):
    from published_runs import load_cases
    cases, _ = load_cases(published_csv)
    parser = megatron_oracle.megatron_parser()
    for case in cases:
        try:
            text = export("megatron", case.plan, case.model).text
        except PartitaError as e:
            assert str(e).startswith(f"zero={case.plan.zero} with pp="), str(e)
            continue
        ns = parser.parse_args(_args(text)[0])
        assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size) == (case.plan.tp, case.plan.pp)


# ---------------------------------------------------------------------------- DeepSpeed
@pytest.mark.parametrize("pid,model_name,plan", _cases("deepspeed"))
def test_deepspeed_config_loads_in_deepspeedconfig(pid, model_name, plan):
    out = export("deepspeed", plan, load_model(model_name))
    cfg = deepspeed_oracle.load(out.data, plan.world_size, plan.dp)
    ds_world = plan.world_size // plan.pp  # DeepSpeed's batch world: AutoTP ranks count, pipeline stages do not
    assert cfg.world_size == ds_world
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == \
        (plan.mbs * plan.grad_accum * ds_world, plan.mbs, plan.grad_accum)
    assert cfg.zero_optimization_stage == plan.zero
    assert (cfg.bfloat16_config.enabled, cfg.float16_config.enabled) == (plan.dtype in ("bf16", "fp8"),
                                                                         plan.dtype == "fp16")
    assert cfg.tensor_parallel_config.autotp_size == (plan.tp if plan.tp > 1 else 0)
    # AutoTP: DeepSpeed's batch counts every rank, the tp group reads the same samples: the warning says so
    assert any(f"train_batch_size {cfg.train_batch_size} counts every AutoTP rank" in w and f"{plan.gbs} sequences"
               in w for w in out.warnings) == (plan.tp > 1)
    assert cfg.pipeline["stages"] == (plan.pp if plan.pp > 1 else "auto")
    assert ("activation_checkpointing" in out.data) == (plan.recompute != "none")
    if plan.pp > 1:
        assert any(f"PipelineModule(num_stages={plan.pp}" in w for w in out.warnings)
    assert any(w.startswith(f"etp={plan.etp}: ds_config has no expert tensor parallel") for w in out.warnings) == \
        (plan.etp > 1)


def test_deepspeed_oracle_rejects_a_wrong_batch():
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        deepspeed_oracle.load({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
                               "gradient_accumulation_steps": 2}, 32, 8)


# ---------------------------------------------------------------------------- torchtitan
def _titan_stage_layers(par, layers: int) -> list[int]:
    """torchtitan's own stage count and layer-to-stage assignment for these settings."""
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part, _get_pipeline_metadata
    stages, n, first, last = _get_pipeline_metadata(SimpleNamespace(pp=par.pipeline_parallel_degree), par,
                                                     SimpleNamespace(layers=[None] * layers))
    parts = _generate_llm_fqn_per_model_part(stages, n, first, last)
    return [sum(m.startswith("layers.") for m in part) for part in parts]


@pytest.mark.parametrize("pid,model_name,plan", _cases("torchtitan"))
def test_torchtitan_export_parses_with_configmanager(pid, model_name, plan):
    model = load_model(model_name)
    out = export("torchtitan", plan, model)
    cfg = torchtitan_oracle.parse(out.data["flags"])  # tyro + Trainer.Config.__post_init__
    par, train = cfg.parallelism, cfg.training
    assert par.data_parallel_replicate_degree * par.data_parallel_shard_degree == plan.dp
    assert par.data_parallel_shard_degree == (plan.dp if plan.zero else 1)
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree,
            par.expert_parallel_degree) == (plan.tp, plan.pp, plan.cp, plan.ep)
    assert par.enable_sequence_parallel == plan.sp
    assert (train.global_batch_size, train.seq_len) == (plan.gbs, plan.seq_len)
    mbs = par.pipeline_parallel_microbatch_size if plan.pp > 1 else train.local_batch_size
    assert mbs == plan.mbs
    assert train.mixed_precision_param == ("float32" if plan.dtype == "fp32" else "bfloat16")
    ac = type(cfg.activation_checkpoint).__qualname__ if cfg.activation_checkpoint is not None else None
    assert ac == {"none": None, "selective": "SelectiveAC.Config", "full": "FullAC.Config"}[plan.recompute]
    if plan.pp > 1:
        assert _titan_stage_layers(par, model.layers) == list(plan.stage_layers(model.layers))
        assert math.prod([plan.pp, plan.vpp]) == len(plan.stage_layers(model.layers))
    torchtitan_oracle.build_mesh(par, plan.world_size)
    # torchtitan 0.3.0's ParallelismConfig has no expert tensor parallel field: etp > 1 is a warning
    assert not hasattr(par, "expert_tensor_parallel_degree")
    assert any(w.startswith(f"etp={plan.etp}: torchtitan 0.3.0 has no expert tensor parallel option")
               for w in out.warnings) == (plan.etp > 1)


def test_torchtitan_oracle_rejects_what_torchtitan_rejects():
    with pytest.raises(SystemExit):  # tyro: a boolean takes no value
        torchtitan_oracle.parse(["--parallelism.enable_sequence_parallel", "True"])
    with pytest.raises(SystemExit):  # tyro: Literal["bfloat16", "float32"]
        torchtitan_oracle.parse(["--training.mixed_precision_param", "float16"])
    with pytest.raises(SystemExit):  # Trainer.Config: CUDA graphs with pp
        torchtitan_oracle.parse(["--parallelism.pipeline_parallel_degree", "2"])
    with pytest.raises(ValueError, match="unflatten"):  # zero 0 with ep: no whole expert mesh
        par = torchtitan_oracle.parse(["--parallelism.data_parallel_replicate_degree", "8",
                                       "--parallelism.data_parallel_shard_degree", "1",
                                       "--parallelism.expert_parallel_degree", "8"]).parallelism
        torchtitan_oracle.build_mesh(par, 8)


def test_export_cli(tmp_path, capsys):
    from partita.cli import main
    plan = MATRIX[19][2]  # 70b tp8 pp4 vpp5
    path = tmp_path / "plan.json"
    plan.to_json(path)
    assert main(["export", "--to", "megatron", str(path), "--model", "llama3-70b", "-o", str(tmp_path / "args.txt")]) == 0
    args = (tmp_path / "args.txt").read_text()
    assert "--num-layers-per-virtual-pipeline-stage 4" in args
    # a megatron plan's selective is priced as Megatron-Core's default module, core_attn (cost/frameworks.py
    # selective_modules): the export writes that list and has no difference to warn about
    assert plan.recompute == "selective" and "--recompute-modules core_attn \\\n" in args
    assert "partita: warning: recompute=selective" not in capsys.readouterr().err


# ---------------------------------------------------------------------------- import round trip
def _expected(target, plan, model):
    """The plan fields an export keeps for ``target`` (the closest equivalents the warnings name)."""
    if not plan.layer_split and model.layers % (plan.pp * plan.vpp):
        plan = plan.with_(layer_split=plan.stage_layers(model.layers))  # the automatic split, written out
    zero = plan.zero
    if target == "torchtitan" and zero in (1, 2):
        zero = 2  # FSDP without resharding after forward
    dtype = "bf16" if target in ("torchtitan", "deepspeed") and plan.dtype == "fp8" else plan.dtype
    if target == "deepspeed" and zero == 0 and plan.pp > 1 and dtype == "bf16":
        zero = 1  # a bf16 PipelineModule without ZeRO gets DeepSpeed's BF16_Optimizer (partitioned, imports/deepspeed.py)
    recompute = "full" if target == "deepspeed" and plan.recompute == "selective" else plan.recompute
    split = plan.layer_split if target in ("megatron", "mindspeed") or (plan.layer_split and len(
        set(plan.layer_split)) > 1) else None
    etp = plan.etp if target in ("megatron", "mindspeed") else 1  # torchtitan/DeepSpeed: no etp (warned)
    # torchtitan 0.3.0 / ds_config have no per-layer count (warned): they recompute every layer
    rc_layers = plan.recompute_layers if target in ("megatron", "mindspeed") else 0
    return dict(dp=plan.dp, tp=plan.tp, pp=plan.pp, vpp=plan.vpp, cp=plan.cp, ep=plan.ep, etp=etp, zero=zero,
                recompute_layers=rc_layers,
                mbs=plan.mbs, gbs=plan.gbs, seq_len=plan.seq_len, recompute=recompute, dtype=dtype, layer_split=split,
                sp=plan.sp and plan.tp > 1 and target != "deepspeed")  # AutoTP: no sequence parallel


@pytest.mark.parametrize("target", ["megatron", "mindspeed", "deepspeed", "torchtitan"])
def test_export_then_import_gives_the_plan_back(target):
    from partita.imports import deepspeed, megatron, shell, torchtitan
    for pid, model_name, plan in [p.values for p in _cases(target)]:
        model = load_model(model_name)
        out = export(target, plan, model)
        if target in ("megatron", "mindspeed"):
            back = megatron.plan_from_megatron(shell.argv_from_script(
                "torchrun --nproc-per-node 8 pretrain_gpt.py \\\n" + out.text),
                                                plan.world_size)
        elif target == "deepspeed":
            back = deepspeed.plan_from_ds_config(out.data, plan.world_size, seq_len=plan.seq_len)
        else:
            back = torchtitan.plan_from_torchtitan(shell.argv_from_script(out.text), model.layers)
        got = {k: getattr(back, k) for k in _expected(target, plan, model)}
        got["sp"] = back.sp and back.tp > 1
        assert got == _expected(target, plan, model), pid


def test_megatron_hsdp_zero1_sets_optimizer_instances():
    """dp_shard < dp with zero 1 (InternLM's "ZeRO-1 within groups of N", Megatron's optimizer
    instances) is emitted as --num-distributed-optimizer-instances dp/dp_shard, which the option
    table parses; with zero 3 the HSDP grouping is not expressible and says so."""
    model = load_model("llama3-8b")
    plan = Plan(dp=16, zero=1, dp_shard=4, mbs=1, gbs=64, seq_len=4096)
    args, _ = _args(export("megatron", plan, model).text)
    ns = megatron_oracle.megatron_parser().parse_args(args)
    assert ns.use_distributed_optimizer and ns.num_distributed_optimizer_instances == 4
    flat = Plan(dp=16, zero=1, mbs=1, gbs=64, seq_len=4096)
    assert megatron_oracle.megatron_parser().parse_args(
        _args(export("megatron", flat, model).text)[0]).num_distributed_optimizer_instances == 1
    z3 = export("megatron", Plan(dp=16, zero=3, dp_shard=4, mbs=1, gbs=64, seq_len=4096), model)
    assert any("dp_shard=4" in w for w in z3.warnings)


def test_weight_storage_knobs_reach_the_targets_that_run_them():
    """fp8_param_gather goes out as Megatron's --fp8-param-gather (its option table accepts it and
    the namespace carries it); reuse_fp32_param as MindSpeed's --reuse-fp32-param, and a Megatron
    export of it warns that Megatron has no such flag (its memory would be 2 bytes/param above plan)."""
    model = load_model("llama2-7b")
    fp8 = Plan(dp=8, zero=1, dtype="fp8", fp8_param_gather=True, gbs=64)
    ns = megatron_oracle.megatron_parser().parse_args(_args(export("megatron", fp8, model).text)[0])
    assert ns.fp8_param_gather and ns.fp8 == "hybrid"
    reuse = Plan(dp=8, zero=1, reuse_fp32_param=True, gbs=64)
    out = export("mindspeed", reuse, model)
    ns = megatron_oracle.mindspeed_parser().parse_args(_args(out.text)[0])
    assert ns.reuse_fp32_param and ns.bf16
    assert not any("reuse_fp32_param" in w for w in out.warnings)
    meg = export("megatron", reuse, model)
    assert "--reuse-fp32-param" not in _args(meg.text)[0]
    assert any(w.startswith("reuse_fp32_param is MindSpeed's") for w in meg.warnings)
