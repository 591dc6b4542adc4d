"""DualPipeV in and out: exports checked by each target's own parser and rules (tests/export_oracles:
MindSpeed-LLM's flag declarations and validate rules on Megatron's option table; torchtitan 0.3.0's
ConfigManager, stage splitter and rank-to-stage mapping; torch's own schedule registry), refusals in
one line where the target has no DualPipeV, and the MindSpeed import reading it back."""
from __future__ import annotations

import pytest
from torch.distributed.pipelining.schedules import ScheduleDualPipeV, get_schedule_class

from export_oracles import megatron_oracle, torchtitan_oracle
from partita.errors import PartitaError
from partita.export import export
from partita.imports.megatron import plan_from_megatron
from partita.plan import Plan, chunk_ranks
from partita.spec.load import load_model
from test_export import _args, _titan_stage_layers

MOE = Plan(dp=4, tp=2, pp=4, vpp=2, ep=4, gbs=64, seq_len=4096, schedule="dualpipev", zero=1, sp=True)


def _mindspeed(plan: Plan, model_name: str):
    out = export("mindspeed", plan, load_model(model_name))
    args, _ = _args(out.text)
    ns = megatron_oracle.mindspeed_parser().parse_args(args)
    megatron_oracle.mindspeed_validate(ns)  # MindSpeed's dualpipev / moe-fb-overlap rules
    return ns, out


def test_mindspeed_export_runs_dualpipev_with_its_all_to_all_overlap() -> None:
    ns, out = _mindspeed(MOE, "mixtral-8x7b")
    assert ns.schedules_method == "dualpipev" and ns.moe_fb_overlap and ns.moe_grouped_gemm
    assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size, ns.expert_model_parallel_size) == (2, 4, 4)
    assert ns.num_layers_per_virtual_pipeline_stage is None and not ns.overlap_grad_reduce
    assert not ns.moe_alltoall_overlap_comm and not ns.use_ascend_mc2
    assert any("without --overlap-grad-reduce" in w for w in out.warnings)
    back = plan_from_megatron(_args(out.text)[0], MOE.world_size)
    assert (back.schedule, back.vpp, back.pp) == ("dualpipev", 2, 4)


def test_mindspeed_pads_an_uneven_v_with_noop_layers() -> None:
    # DeepSeek-V3's 61 layers over 16 chunks: every chunk padded to 4 (64 layers, MindSpeed's own recipe)
    plan = Plan(dp=4, tp=1, pp=8, vpp=2, ep=32, gbs=1024, seq_len=4096, schedule="dualpipev", zero=1, etp=1)
    ns, out = _mindspeed(plan, "deepseek-v3")
    assert ns.num_layers == 64 and ns.num_layers % (2 * ns.pipeline_model_parallel_size) == 0
    back = plan_from_megatron(_args(out.text)[0], plan.world_size)
    assert back.stage_layers(61) == plan.stage_layers(61) and back.schedule == "dualpipev"


def test_torchtitan_export_names_torchs_schedule_and_the_v() -> None:
    plan, model = MOE.with_(zero=3, tp=2, ep=4, dp=4), load_model("mixtral-8x7b")
    flags = export("torchtitan", plan, model).data["flags"]
    cfg = torchtitan_oracle.parse(flags)  # tyro + Trainer.Config checks
    par = cfg.parallelism
    assert get_schedule_class(par.pipeline_parallel_schedule) is ScheduleDualPipeV
    assert _titan_stage_layers(par, model.layers) == list(plan.stage_layers(model.layers))
    from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping
    owner = chunk_ranks(plan.pp, 2, "dualpipev")
    for r in range(plan.pp):  # torchtitan's own placement is the plan's V
        stages = _get_pp_rank_to_stage_indices_mapping(r, plan.pp, par.pipeline_parallel_schedule, 2 * plan.pp)
        assert sorted(stages) == [j for j in range(2 * plan.pp) if owner[j] == r]
    torchtitan_oracle.build_mesh(par, plan.world_size)


@pytest.mark.parametrize("target,needle", [
    ("megatron", "schedule=dualpipev: Megatron-LM (core_v0.16.1) has no DualPipeV schedule"),
    ("deepspeed", "schedule=dualpipev: DeepSpeed pipelines run 1F1B only"),
])
def test_targets_without_dualpipev_refuse_in_one_line(target: str, needle: str) -> None:
    plan = MOE.with_(ep=1) if target == "deepspeed" else MOE
    with pytest.raises(PartitaError) as err:
        export(target, plan, load_model("mixtral-8x7b"))
    assert str(err.value).startswith(needle) and "\n" not in str(err.value)


def test_mindspeed_refuses_dualpipev_with_context_parallel() -> None:
    with pytest.raises(PartitaError) as err:
        export("mindspeed", MOE.with_(cp=2, dp=2), load_model("mixtral-8x7b"))
    assert str(err.value).startswith("schedule=dualpipev with cp=2") and "\n" not in str(err.value)
