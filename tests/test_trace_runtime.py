"""``parallelize(model, plan)`` on models Partita does not know (issue 19, item 3): a
transformers ViT, a diffusers UNet2DConditionModel and a diffusers DiT, tiny configs built
offline (examples/traced_models.py), trained with SGD + momentum on 2 gloo ranks against
the same model trained in one process on the whole batch (tests/trace_runtime_worker.py's
``run_case``, in the session's shared torchrun of each world size: tests/conftest.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).resolve().parent / "trace_runtime_worker.py"
sys.path.insert(0, str(WORKER.parents[1]))  # examples/
CASES = [f"{model}:{plan}" for model in ("tiny_vit", "tiny_unet", "tiny_dit")
         for plan in ("dp=2,zero=3,mbs=1,dtype=fp32", "dp=2,zero=3,mbs=1,recompute=full,dtype=fp32")] + \
        ["tiny_vit:dp=2,zero=0,mbs=2,recompute=full,dtype=fp32", "tiny_vit:tp=2,mbs=2,dtype=fp32",
         "tiny_vit:tp=2,mbs=1,recompute=full,dtype=fp32", "tiny_vit_tp_head:tp=2,mbs=2,dtype=fp32",
         "tiny_vit:pp=2,mbs=1,dtype=fp32",
         "tiny_dit:pp=2,mbs=2,recompute=full,dtype=fp32"] + \
        ["tiny_vit:auto,dtype=fp32", "tiny_unet:auto,dtype=fp32,recompute=full", "tiny_dit:auto,dtype=fp32,pp=2,mbs=1"]
#: what the search must pick where the case fixes it (the rest is the search's choice)
AUTO_PICKS = {"tiny_unet:auto,dtype=fp32,recompute=full": "rc-full", "tiny_dit:auto,dtype=fp32,pp=2,mbs=1": "pp2"}


#: pipeline combined with data parallel, ZeRO-3 or tensor parallel: 4 ranks, ordered (pp, dp, tp) -
#: ranks 0,1 stage 0 and ranks 2,3 stage 1
CASES_4 = ["tiny_vit:dp=2,pp=2,zero=0,mbs=1,dtype=fp32", "tiny_dit:dp=2,pp=2,zero=0,mbs=1,recompute=full,dtype=fp32",
           "tiny_vit:auto,dtype=fp32,pp=2,dp=2", "tiny_vit:pp=2,tp=2,mbs=1,dtype=fp32",
           "tiny_vit:dp=2,pp=2,zero=3,mbs=1,dtype=fp32", "tiny_dit:dp=2,pp=2,zero=3,mbs=1,recompute=full,dtype=fp32"]
#: at pp=2 x dp=2 the search picks ZeRO-1 for the ViT (fastest on the CPU hardware file): the
#: traced pipeline runs pp with any zero level
AUTO_PICKS["tiny_vit:auto,dtype=fp32,pp=2,dp=2"] = "z1"


#: every case runs in the session's shared torchrun of its world size (tests/conftest.py
#: ``equivalence``): tests/trace_runtime_worker.py's ``run_case`` in the processes the
#: equivalence cases already started, after them
EQUIVALENCE_CASES = [(2, 0, case, str(WORKER)) for case in CASES] + [(4, 0, case, str(WORKER)) for case in CASES_4]


@pytest.fixture(scope="module")
def results(equivalence):
    return {case: equivalence["results"][(2, 0, case, str(WORKER))] for case in CASES}


@pytest.fixture(scope="module")
def results_4(equivalence):
    return {case: equivalence["results"][(4, 0, case, str(WORKER))] for case in CASES_4}


@pytest.mark.timeout(650)
@pytest.mark.parametrize("case", CASES)
def test_traced_model_matches_single_process(results, case):
    _check_case(results[case], case)


@pytest.mark.timeout(650)
@pytest.mark.parametrize("case", CASES_4)
def test_traced_pipeline_with_dp_tp_zero_matches_single_process(results_4, case):
    _check_case(results_4[case], case)


def _check_case(r: dict, case: str) -> None:
    assert r["units"] >= 1
    assert r["losses"][0] != r["losses"][-1]
    for mine, ref in zip(r["losses"], r["reference"]):
        assert abs(mine - ref) <= 1e-5 * max(1.0, abs(ref)), r
    assert r["param_abs_diff"] <= 1e-5, r
    assert r["compared"] >= r["params"], r  # every parameter trained somewhere (pp: on its stage)
    assert AUTO_PICKS.get(case, "") in r["plan"], r


@pytest.mark.timeout(650)
@pytest.mark.parametrize("name", ["tiny_vit", "tiny_vit_tp_head"])
def test_tp_rank_holds_the_traced_split(results, name):
    """The parameters a tp=2 rank really holds equal what the trace says the TP plan splits
    (blocks' linear layers; with ``tiny_vit_tp_head`` also the classifier, outside the blocks)
    - the figure the cost model's weights term uses (cost/traced.py ``_stage_params``)."""
    from examples import traced_models
    from partita.tracing import trace
    model, inputs, plan = getattr(traced_models, name)()
    spec = trace(model, inputs, tp_plan=plan)
    split = sum(b.tp_params for b in spec.blocks) + spec.tp_other_params
    held = results[next(c for c in CASES if c.startswith(f"{name}:tp=2"))]["held"]
    assert held == spec.total_params - split // 2
    assert (spec.tp_other_params > 0) == (name == "tiny_vit_tp_head")


def _vit_stage_names(stage: int) -> set[str]:
    """What a stage of tiny_vit at pp=2 must hold, by hand: the stem (it runs on every stage),
    its own encoder layer, and on the last stage the final norm and the classifier."""
    from examples.traced_models import tiny_vit
    names = [n for n, _ in tiny_vit()[0].named_parameters()]
    return {n for n in names if n.startswith(("vit.embeddings.", f"vit.layers.{stage}."))
            or (stage == 1 and not n.startswith(("vit.embeddings.", "vit.layers.")))}


@pytest.mark.timeout(650)
def test_pipeline_stage_holds_only_its_own_parameters(results, results_4):
    """The parameter tensors each stage's module really holds (gathered from every rank): its
    blocks, the stem, the head on the last stage - and their elements, summed over a stage's
    ranks, are the stage's full size once per replica at zero 0 and once in all at zero 3
    (FSDP2 shards)."""
    from examples.traced_models import tiny_vit
    full = {n: p.numel() for n, p in tiny_vit()[0].named_parameters()}
    z0, z3 = results_4["tiny_vit:dp=2,pp=2,zero=0,mbs=1,dtype=fp32"], results_4["tiny_vit:dp=2,pp=2,zero=3,mbs=1,dtype=fp32"]
    for r in (results["tiny_vit:pp=2,mbs=1,dtype=fp32"], z0, z3, results_4["tiny_vit:pp=2,tp=2,mbs=1,dtype=fp32"]):
        assert [set(s["names"]) for s in r["stages"]] == [_vit_stage_names(0), _vit_stage_names(1)]
    for stage in (0, 1):
        size = sum(full[n] for n in _vit_stage_names(stage))
        assert size < sum(full.values()) - 1000  # the other stage's layer is not held
        assert results["tiny_vit:pp=2,mbs=1,dtype=fp32"]["stages"][stage]["numel"] == size
        assert z0["stages"][stage]["numel"] == 2 * size
        assert z3["stages"][stage]["numel"] == size
    # diffusers' DiT: the last stage also holds block 0's norm1.emb, which its head calls - and nothing else of block 0
    dit = results["tiny_dit:pp=2,mbs=2,recompute=full,dtype=fp32"]["stages"][1]["names"]
    block0 = {n for n in dit if n.startswith("transformer_blocks.0.")}
    assert block0 and all(n.startswith("transformer_blocks.0.norm1.emb.") for n in block0)


#: pipeline x data parallel cases whose stages' held elements the cost model must match
HELD_CASES = ["tiny_vit:dp=2,pp=2,zero=0,mbs=1,dtype=fp32", "tiny_vit:dp=2,pp=2,zero=3,mbs=1,dtype=fp32",
              "tiny_dit:dp=2,pp=2,zero=0,mbs=1,recompute=full,dtype=fp32",
              "tiny_dit:dp=2,pp=2,zero=3,mbs=1,recompute=full,dtype=fp32"]


@pytest.mark.timeout(650)
def test_pipeline_stage_parameters_match_the_cost_model(results_4):
    """The parameters the traced cost model puts on each pipeline stage (weights, gradients and
    Adam states each in proportion to them: cost/traced.py ``_outside_params``) equal the
    elements that stage's ranks really hold on gloo (tests/trace_runtime_worker.py gathers every
    rank's local tensors): the stage's size once per replica at zero 0, once in all at zero 3 -
    the stem on both stages, the head (and the DiT head's block-0 ``norm1.emb``) on the last."""
    from examples import traced_models
    from partita.cost.memory import model_state_bytes, state_shard
    from partita.cost.traced import traced_memory
    from partita.plan import Plan
    from partita.spec.hardware import make_cluster
    from partita.tracing import trace
    for case in HELD_CASES:
        name, text = case.split(":", 1)
        model, inputs = getattr(traced_models, name)(batch=2)[:2]
        spec = trace(model, inputs)
        plan = Plan.parse(text + ",gbs=4", 4)
        device = make_cluster("h100-sxm", devices=4).device
        per_param = model_state_bytes(plan, 1.0, state_shard(plan))
        measured = results_4[case]["stages"]
        for stage, mem in enumerate(traced_memory(spec, device, plan)):
            held = measured[stage]["numel"] / (plan.dp if plan.zero == 0 else 1)
            for part in ("weights", "gradients", "optimizer"):
                assert mem.parts[part] / per_param[part] == pytest.approx(held, rel=1e-9), (case, stage, part)
        assert measured[0]["numel"] != measured[1]["numel"], case  # the head is on the last stage only


#: pipeline cases without tp (torch's counter counts a DTensor op at its global shape, not a rank's share)
FLOP_CASES = ["tiny_vit:pp=2,mbs=1,dtype=fp32", "tiny_dit:pp=2,mbs=2,recompute=full,dtype=fp32"] + \
    [c for c in CASES_4 if "pp=2" in c and "auto" not in c and "tp=" not in c]


@pytest.mark.timeout(650)
def test_pipeline_stage_flops_match_torchs_count(results, results_4):
    """The FLOPs the traced cost model puts on each pipeline stage per step (the stem trained on
    the first and run forward again on the last, the head and the DiT's reuse of block 0's
    ``norm1.emb`` on the last, recompute's extra forward) equal torch ``FlopCounterMode``'s
    count of one real training step on every rank of that stage (tests/trace_runtime_worker.py)."""
    from examples import traced_models
    from partita.cost.traced import traced_step_time
    from partita.plan import Plan
    from partita.spec.hardware import make_cluster
    from partita.tracing import trace
    for case in FLOP_CASES:
        name, text = case.split(":", 1)
        model, inputs = getattr(traced_models, name)(batch=2)[:2]
        spec = trace(model, inputs)
        world = 4 if case in CASES_4 else 2
        plan = Plan.parse(text + ",gbs=4", world)
        step = traced_step_time(spec, make_cluster("h100-sxm", devices=world), plan)
        measured = (results_4 if world == 4 else results)[case]["stages"]
        for stage, st in enumerate(step.stages):
            assert measured[stage]["flops"] == [pytest.approx(st.flops * plan.grad_accum, rel=1e-9)] * (world // 2), case


@pytest.mark.timeout(60)
def test_traced_runtime_refuses_what_it_cannot_run():
    import torch.distributed as dist
    from examples.traced_models import tiny_vit
    from partita.errors import PartitaError
    from partita.plan import Plan
    from partita.runtime.traced import parallelize_traced, traced_units
    from partita.runtime.traced_pipeline import TracedPipeline
    assert not dist.is_initialized()
    with pytest.raises(PartitaError, match="not cp=2"):
        parallelize_traced(tiny_vit()[0], Plan(cp=2, seq_len=4))
    with pytest.raises(PartitaError, match="no repeated blocks"):
        traced_units(__import__("torch").nn.Linear(2, 2))
    with pytest.raises(PartitaError, match="pp=3 exceeds the 2 blocks"):
        TracedPipeline(tiny_vit()[0], Plan(pp=3), None, None)
    with pytest.raises(PartitaError, match="needs one example micro-batch to trace") as e:
        parallelize_traced(tiny_vit()[0], "auto")
    assert "\n" not in str(e.value)
    with pytest.raises(PartitaError, match="cannot fix seq_len"):
        parallelize_traced(tiny_vit()[0], "auto,seq_len=8")
