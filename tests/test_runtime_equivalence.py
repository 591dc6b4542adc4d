"""Each plan trains like single-process training of the same model and data (issue 4,
issue 13 item 7): 3 steps of SGD with momentum 0.9 (AdamW for the cases marked
``@adamw``); every rank compares its per-step losses, its own parameters and its own
optimizer state (momentum buffers, Adam moments), slice by slice, with a single-process
reference run. The runs also measure, inside a hook between micro-batches, the gradient
bytes each rank really holds (issue 13 item 4) and how much optimizer state it keeps.
One torchrun per world size runs all its cases in the same process group (with the other
test files' equivalence cases: tests/conftest.py), so start-up is paid once."""

import pytest

torch = pytest.importorskip("torch")

S = "gbs=4,mbs=1,seq_len=16"
S8 = "gbs=8,mbs=1,seq_len=16"  # dp=2: 4 micro-batches of accumulation per replica
AUTO = "tiny-llama:auto,gbs=8,mbs=1,seq_len=16,dtype=fp32"  # parallelize(model, "auto,..."): searched plan
CASES = {
    2: [
        "tiny-llama:dp=2,zero=0," + S8,
        "tiny-llama:dp=2,zero=1," + S8,
        "tiny-llama:dp=2,zero=2," + S8,
        "tiny-llama:dp=2,zero=3," + S8,
        "tiny-llama:dp=2,zero=3,grad_accum_mode=unsharded," + S8,
        "tiny-llama@adamw:dp=2,zero=0," + S,
        "tiny-llama@adamw:dp=2,zero=1," + S,
        "tiny-llama@adamw:dp=2,zero=2," + S,
        "tiny-llama@adamw:dp=2,zero=3," + S,
        "tiny-llama:tp=2,sp=true,gbs=2,mbs=1,seq_len=16",
        "tiny-llama:tp=2,sp=false,gbs=2,mbs=1,seq_len=16",
        "tiny-llama:pp=2,schedule=1f1b," + S,
        "tiny-llama:pp=2,schedule=gpipe," + S,
        "tiny-llama:pp=2,vpp=2," + S,
        "tiny-llama:pp=2,vpp=2,schedule=zero-bubble," + S,
        "tiny-moe:dp=2,ep=2,zero=1," + S,
        "tiny-moe:dp=2,ep=2,zero=3," + S,  # experts sharded by FSDP over their edp group (size 1)
        "tiny-moe:pp=2," + S,  # MoE aux losses of stage 0 reach the backward (moe_aux.py)
        "tiny-moe:pp=2,vpp=2,recompute=full," + S,
        "tiny-llama:dp=2,recompute=full," + S,
        "tiny-llama:dp=2,recompute=selective," + S,
        "tiny-llama:dp=2,zero=3,dtype=bf16," + S,
        "tiny-llama:cp=2," + S,  # context parallel: load-balanced chunks, K/V all-gathered
        "tiny-llama:cp=2,zero=3," + S,
    ],
    4: [
        "tiny-llama:dp=2,tp=2," + S,
        "tiny-llama:dp=2,tp=2,zero=3," + S,
        "tiny-llama:pp=2,tp=2," + S,
        "tiny-llama:pp=2,dp=2," + S8,
        "tiny-llama:pp=2,dp=2,zero=3," + S8,  # sharded accumulation inside the pipeline schedule
        "tiny-moe:ep=2,tp=2," + S,
        "tiny-moe:ep=2,pp=2," + S,
        "tiny-moe:ep=2,tp=2,sp=false,zero=3," + S,
        "tiny-moe:dp=4,ep=2,zero=3," + S8,  # edp groups of 2: experts sharded and reduced over them
        "tiny-moe@adamw:dp=4,ep=2,zero=1," + S8,
        "tiny-llama:cp=2,tp=2," + S,
        "tiny-llama:cp=2,dp=2,zero=2," + S,
        "tiny-llama:cp=2,pp=2," + S,
        "tiny-llama:dp=4,zero=3,dp_shard=2," + S8,  # HSDP: shard in pairs, replicate across them
        "tiny-llama@adamw:dp=4,zero=2,dp_shard=2," + S8,
        AUTO,
    ],
    8: ["tiny-llama:pp=2,dp=2,tp=2," + S8],
}
ALL = [c for cs in CASES.values() for c in cs]

#: (loss relative, parameter absolute, optimizer-state absolute) differences asserted.
#: fp32 with SGD + momentum: the parallel run sums the same gradients in another order,
#: so only float32 rounding separates the two (measured <= 1e-7; asserted 1e-6).
#: AdamW (lr 1e-3, eps 1e-6): its update m / (sqrt(v) + eps) has size ~lr for every element
#: whose gradient is above eps, whatever that gradient's size, so float32 rounding in a
#: gradient element that is a near-cancelling sum is magnified up to lr / eps times in its
#: update: parameters after 3 steps within 2e-5 (measured <= 1.5e-6 after 5; with torch's default
#: eps 1e-8 the MoE case measured 8e-5, which is why the check uses 1e-6); losses and
#: moments as for SGD.
#: bf16 against an fp32 reference: bf16 keeps 8 significant bits (unit roundoff 2^-8 =
#: 3.9e-3) per value; the loss averages thousands of token losses, so its error is ~100x
#: smaller; 3 steps of lr 0.1 with momentum 0.9 on clipped (norm <= 1) gradients move a
#: weight by at most 0.1 * (1 + 1.9 + 2.71) = 0.56, bounding the bf16-induced weight error to a few 1e-3.
TOLERANCE = {"fp32": (1e-6, 1e-6, 1e-6), "adamw": (1e-6, 2e-5, 1e-6), "bf16": (1e-3, 5e-3, 5e-3)}


#: (world, steps, case) for the session's shared torchruns (tests/conftest.py ``equivalence``)
#: 3 steps: the momentum buffers (and Adam's moments) of the last update carry two earlier
#: gradients, every micro-batch and schedule path runs each step, and a step of a tp case
#: costs about as much as the case's set-up (measured: 5 steps 9 CPU-s, 3 steps 6, 2 steps 4
#: for tiny-llama dp=2,tp=2), so steps 4 and 5 re-ran the same code for 40 % of the time
STEPS = 3
EQUIVALENCE_CASES = [(world, STEPS, case) for world, cases in CASES.items() for case in cases]


@pytest.fixture(scope="module")
def results(equivalence):
    """Each case's result, and ``stdout{world}``: what the world's torchrun printed."""
    merged = {case: equivalence["results"][(world, steps, case)] for world, steps, case in EQUIVALENCE_CASES}
    return dict(merged, **{f"stdout{world}": equivalence["stdout"][world] for world in CASES})


def _tolerance(case: str) -> tuple[float, float, float]:
    return TOLERANCE["bf16" if "dtype=bf16" in case else "adamw" if "@adamw" in case else "fp32"]


@pytest.mark.parametrize("case", ALL)
def test_matches_single_process(results, case):
    r = results[case]
    loss_tol, param_tol, state_tol = _tolerance(case)
    assert len(r["losses"]) == STEPS
    assert r["losses"][0] != r["losses"][-1]  # it trained
    assert r["loss_rel_diff"] <= loss_tol, r
    assert r["param_abs_diff"] <= param_tol, r
    assert r["params_compared_rank0"] > 0
    assert r["state_compared_rank0"] > 0 or "zero=1" in case  # a ZeRO-1 rank may own none of some stage
    assert r["state_abs_diff"] <= state_tol, r


PLAIN_DP = [c for c in ALL if c.split(":")[1].startswith("dp=2,zero=")]


@pytest.mark.parametrize("case", [c for c in PLAIN_DP if "zero=2" in c or "zero=3" in c])
def test_gradients_held_between_micro_batches(results, case):
    """Sharded accumulation holds 1/dp of the gradients between micro-batches (what the
    planner counts for ZeRO-2/3); unsharded accumulation holds all of them (the
    measurement tells the two apart)."""
    r = results[case]
    if r["grad_accum"] == 1:
        pytest.fail("case needs gradient accumulation")
    held, full = r["grad_bytes_between_micro_batches_max"], r["model_param_bytes"]
    expected = full if "grad_accum_mode=unsharded" in case else full / r["dp"]
    assert abs(held - expected) <= 0.1 * expected, (held, expected)


@pytest.mark.parametrize("case", PLAIN_DP)
def test_optimizer_state_is_sharded_over_dp(results, case):
    """ZeRO-1/2/3 ranks keep optimizer state for 1/dp of the parameters (ZeRO-1 owns whole
    tensors, greedy by size: within 10%); zero 0 keeps all of it."""
    r = results[case]
    expected = 1.0 if "zero=0" in case else 1 / r["dp"]
    assert abs(r["state_fraction_max"] - expected) <= 0.1 * expected, r["state_fraction_max"]


HSDP = [c for c in ALL if "dp_shard=" in c]


@pytest.mark.parametrize("case", HSDP)
def test_hsdp_holds_one_shard_group_share(results, case):
    """HSDP with dp_shard=K keeps optimizer state and, between micro-batches, gradients for
    1/K of the parameters (sharded in the group of K, replicated across groups)."""
    r = results[case]
    k = int(case.split("dp_shard=")[1].split(",")[0])
    assert abs(r["state_fraction_max"] - 1 / k) <= 0.1 / k, r["state_fraction_max"]
    held, expected = r["grad_bytes_between_micro_batches_max"], r["model_param_bytes"] / k
    assert abs(held - expected) <= 0.1 * expected, (held, expected)


def test_auto_plan_is_the_searched_best_and_printed(results):
    """``parallelize(model, "auto,gbs=8,mbs=1,...")`` on 4 processes runs the plan the
    planner's search ranks first for 4 CPU devices, prints it with the runner-up, and
    trains like one process."""
    from partita.models import build_named_model
    from partita.runtime.auto import choose_plan
    plan, report = choose_plan(build_named_model("tiny-llama"), 4, AUTO.split(":", 1)[1], "cpu")
    r = results[AUTO]
    assert r["plan"] == plan.summary()
    assert report.splitlines()[0] in results["stdout4"] and "runner-up: " in results["stdout4"]
    assert r["loss_rel_diff"] <= TOLERANCE["fp32"][0] and r["param_abs_diff"] <= TOLERANCE["fp32"][1], r


@pytest.mark.parametrize("case", ["tiny-llama:dp=2,zero=3," + S8, "tiny-llama:dp=2,zero=3,grad_accum_mode=unsharded," + S8])
def test_zero3_accumulation_holds_what_the_planner_counts(results, case):
    """Issue 13 done-when: a ZeRO-3 plan with gradient accumulation 4 holds, between
    micro-batches, the gradient bytes the planner's memory model counts for that plan
    (``estimate_rank_memory(...).parts["gradients"]``, on the built model's spec), within
    10 %, measured on gloo inside the micro-batch hook. Measured: 361,600 bytes sharded
    and 723,200 unsharded, equal to the planner's figures."""
    from partita.cost.memory import estimate_rank_memory
    from partita.models import build_named_model
    from partita.plan import Plan
    from partita.runtime.auto import model_spec_of
    from partita.spec.hardware import make_cluster
    r = results[case]
    assert r["grad_accum"] == 4
    plan = Plan.parse(case.split(":", 1)[1], world_size=2, defaults={"dtype": "fp32"})
    spec = model_spec_of(build_named_model("tiny-llama"))
    planned = estimate_rank_memory(spec, make_cluster("cpu", 2).device, plan, 0).parts["gradients"]
    held = r["grad_bytes_between_micro_batches_max"]
    assert abs(held - planned) <= 0.1 * planned, (held, planned)


def _planned_gradient_bytes(case: str, world: int) -> float:
    """The planner's gradient bytes on rank 0 for ``case``'s plan on the built model's spec."""
    from partita.cost.memory import estimate_rank_memory
    from partita.models import build_named_model
    from partita.runtime.auto import model_spec_of
    from partita.spec.hardware import make_cluster
    model_part, text = case.split(":", 1)
    plan = Plan.parse(text, world_size=world, defaults={"dtype": "fp32"})
    spec = model_spec_of(build_named_model(model_part.split("@")[0]))
    return estimate_rank_memory(spec, make_cluster("cpu", world).device, plan, 0).parts["gradients"]


from partita.plan import Plan  # noqa: E402  (planning code: no torch)

HELD_VS_PLANNER = [(w, c) for w, cs in CASES.items() for c in cs
                   if any(f"zero={z}" in c for z in (2, 3)) and "pp=" not in c and not c.split(":")[1].startswith("auto")
                   and Plan.parse(c.split(":", 1)[1], world_size=w).grad_accum > 1]


@pytest.mark.parametrize("world,case", HELD_VS_PLANNER, ids=[c for _, c in HELD_VS_PLANNER])
def test_gradients_held_match_the_planner(results, world, case):
    """Every ZeRO-2/3 case with accumulation holds, between micro-batches, the gradient
    bytes the planner's memory model counts for its plan, within 10 %: sharded and
    unsharded accumulation, HSDP, cp, tp, and MoE with ep and tp (experts sharded over
    their expert-data-parallel group with its tp peers, shared experts tp-split, as the
    planner and Megatron-Core count them). Measured: equal to the planned bytes in every case."""
    held, planned = results[case]["grad_bytes_between_micro_batches_max"], _planned_gradient_bytes(case, world)
    assert abs(held - planned) <= 0.1 * planned, (held, planned)
