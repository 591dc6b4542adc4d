"""Hugging Face models under the layouts the planner recommends for them: pipeline with
tensor (+ sequence) parallel, and context parallel - against single-process training of
the same transformers model (tiny random-init LlamaForCausalLM / Qwen2ForCausalLM /
MixtralForCausalLM of 2 layers, a 4-layer Llama for interleaved 1F1B; SGD with momentum
0.9, 3 steps; losses, every rank's parameter and momentum-buffer slices compared with the
reference's: partita.runtime.equivalence).

What each layout needs beyond the pieces it combines:
* pp with tp + sp: a later pipeline stage receives the previous stage's sequence shard, so
  its RoPE positions cover ``tp`` times the input's length (``HFStage.seq_shards``);
* cp: the stage feeds RoPE and the causal mask with the global positions of the rank's
  load-balanced chunks, and each attention layer all-gathers K/V over the cp group before
  transformers' own SDPA (runtime/context_parallel.py ``apply_cp_hf``).
The cases run in the session's shared 4-process torchrun (tests/conftest.py ``equivalence``)."""

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

S = "gbs=4,mbs=1,seq_len=16"
LLAMA4 = str(Path(__file__).resolve().parent / "data" / "hf_llama_4_layers")  # transformers' LlamaConfig, 4 layers
CASES = [
    "hf-llama:pp=2,tp=2,sp=false," + S,
    "hf-llama:pp=2,tp=2,sp=true," + S,  # a stage after the first: sequence-sharded input, full-length RoPE
    "hf-qwen2:pp=2,tp=2,sp=true," + S,
    "hf-qwen2:pp=2,tp=2,sp=false," + S,
    "hf-llama:cp=2,tp=2,sp=true," + S,  # K/V all-gathered over cp inside transformers' attention
    "hf-qwen2:cp=2,pp=2," + S,  # cp positions and mask on every pipeline stage
    "hf-llama:cp=2,dp=2,zero=3," + S,  # FSDP over the flattened dp x cp group
    "hf-mixtral:pp=2,tp=2,sp=false," + S,  # HF MoE: pp with tp, pp with ep, cp with ep
    "hf-mixtral:pp=2,ep=2," + S,
    "hf-mixtral:cp=2,ep=2," + S,
    "hf-mixtral:ep=2,tp=2,sp=false," + S,  # ep over dp with tp: the experts' states over edp x tp
    "hf-qwen3-moe:ep=2,tp=2,sp=false," + S,  # and Qwen3's per-head q/k norms under tp
    # interleaved 1F1B needs pp x vpp = 4 stages: a 4-layer Llama from a config.json (the registry's "hf-config"
    # kind: no safetensors, weights from the seed); the middle stages get a sequence shard and give one
    LLAMA4 + ":pp=2,vpp=2,tp=2,sp=true," + S,
    LLAMA4 + ":pp=2,vpp=2,cp=2," + S,
]
STEPS = 3

#: (world, steps, case) for the session's shared torchruns (tests/conftest.py ``equivalence``)
EQUIVALENCE_CASES = [(4, STEPS, case) for case in CASES]


@pytest.fixture(scope="module")
def results(equivalence):
    return {case: equivalence["results"][(4, STEPS, case)] for case in CASES}


@pytest.mark.parametrize("case", CASES)
def test_hf_layout_matches_single_process(results, case):
    """fp32 SGD + momentum: the parallel run sums the same gradients in another order, so
    only float32 rounding separates it from the reference (measured <= 1.1e-7 relative on
    the losses, <= 1.2e-7 on parameters, <= 3.4e-8 on momentum); asserted 1e-6, as
    tests/test_runtime_hf.py does. The momentum buffer after step 0 is that step's
    gradient, so the state check compares gradients too."""
    r = results[case]
    assert r["losses"][0] != r["losses"][-1]
    assert len(r["losses"]) == STEPS and r["params_compared_rank0"] > 0
    assert r["loss_rel_diff"] <= 1e-6 and r["param_abs_diff"] <= 1e-6, r
    assert r["state_abs_diff"] <= 1e-6 and r["state_compared_rank0"] > 0, r


def test_planned_hf_layouts_pass_the_runtime_check():
    """The layouts above pass ``runtime_check`` (before: HF models refused cp, pp with tp or
    ep, and MoE ep with tp); what still is refused is one line saying what to run instead."""
    from partita.errors import PartitaError
    from partita.models.registry import resolve_model
    from partita.plan import Plan
    from partita.runtime.parallelize import runtime_check
    models = {name: resolve_model(name).build(meta=True) for name in ("hf-llama", "hf-mixtral")}
    for plan in ("pp=4,tp=8", "pp=2,tp=4,cp=2,dp=2", "pp=4,tp=4,sp=true,dp=2,zero=1"):
        runtime_check(Plan.parse(plan + ",gbs=64,mbs=1,seq_len=64", world_size=32), models["hf-llama"])
    for plan, fix in (("dp=2,ep=2,tp=2", "sp=false"), ("dp=2,tp=2", "sp=false"), ("dp=4,ep=2,zero=3", "zero<=1")):
        with pytest.raises(PartitaError) as err:
            runtime_check(Plan.parse(plan + ",gbs=4,mbs=1,seq_len=16", world_size=4), models["hf-mixtral"])
        assert fix in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_auto_plan_skips_layouts_the_runtime_refuses_for_the_model():
    """``--plan auto`` / ``parallelize(model, "auto")`` on an HF MoE model with zero 3 fixed: the
    search's own fastest plan shards the experts over ep (which HF MoE models run with zero
    0/1 only), so the choice is the fastest plan ``runtime_check`` accepts, and the report
    says what was skipped and why."""
    from partita.errors import PartitaError
    from partita.models.registry import resolve_model
    from partita.runtime.auto import choose_plan, model_spec_of
    from partita.runtime.parallelize import runtime_check
    from partita.search import SearchSpace, search_plans
    from partita.spec.hardware import make_cluster
    model = resolve_model("hf-mixtral").build(meta=True)
    fastest = search_plans(model_spec_of(model), make_cluster("cpu", 4), 8, 16,
                           SearchSpace(fold_ep=False, zero=3, dtype="fp32"), top=1).best.plan
    with pytest.raises(PartitaError, match="run ep with zero 0/1"):
        runtime_check(fastest, model)  # what auto returned before: the launcher then refused it
    plan, report = choose_plan(model, 4, "auto,gbs=8,seq_len=16,zero=3,dtype=fp32", "cpu", hardware="cpu")
    runtime_check(plan, model)
    assert plan.zero == 3 and plan.ep == 1, plan
    assert f"e.g. {fastest.summary()}: HF MoE models" in report.splitlines()[-1], report
