"""Every plan shape the search returns on the four benchmark scenarios runs (issue 13).

The search (``partita.search.search_plans``, the scenarios of ``bench/search_speed.py``)
is asked for its top plans; each plan is reduced to its *shape* - which of dp, tp, pp,
cp, ep are above 1, ZeRO stage, recompute mode, virtual stages, sequence parallel, HSDP,
schedule, gradient accumulation (and its mode under ZeRO-2/3), an uneven or empty-ended
layer split - and every distinct shape is scaled down to the matching tiny reference
model (tiny-llama for the dense scenarios, tiny-moe for the MoE ones): every degree
above 1 becomes 2, so the same axes are split and the same code paths run, on at most 8
processes. When dp, tp, pp and cp are all above 1 (16 processes at 2 each) dp is dropped
to 1: the data-parallel group is then the cp group (ZeRO shards over dp x cp), and ep is
carved out of cp (Megatron-Core's MoE parallel folding). Each scaled plan trains one
step (fp32, SGD with momentum 0.9) and every rank compares its loss and its own slice of
every parameter and momentum buffer after the update with single-process training of
the same model on the same data (partita.runtime.equivalence). One torchrun per world
size runs all of its cases (with the other test files' equivalence cases: tests/conftest.py)."""
from __future__ import annotations


import pytest

pytest.importorskip("torch")

#: (model preset, hardware, devices, global batch, sequence length): bench/search_speed.py
SCENARIOS = [
    ("gpt3-175b", "h100-sxm", 1024, 1536, 2048),
    ("llama-65b", "ascend-910b2", 512, 2048, 2048),
    ("deepseek-v3", "h800", 2048, 15360, 4096),
    ("mixtral-8x22b", "ascend-910b2", 256, 1024, 4096),
]
TOP = 10  # plans per scenario (the search's default shows 5)
TINY_LAYERS = 4  # tiny-llama and tiny-moe
AXES = ("dp", "tp", "pp", "cp", "ep")


def split_kind(plan) -> str:
    """``uniform``, ``uneven`` or ``empty-first`` / ``empty-last`` / ``empty-ends`` (a
    virtual stage with no decoder layer: only the embedding or the output layer)."""
    split = plan.layer_split
    if not split or len(set(split)) == 1:
        return "uniform"
    ends = ("first" if split[0] == 0 else "") + ("last" if split[-1] == 0 else "")
    return {"": "uneven", "first": "empty-first", "last": "empty-last", "firstlast": "empty-ends"}[ends]


def shape_of(plan, moe: bool) -> tuple:
    """What decides which runtime code a plan exercises (degrees only as 'above 1')."""
    axes = tuple(a for a in AXES if getattr(plan, a) > 1)
    accum = plan.grad_accum > 1
    return ("moe" if moe else "dense", axes, plan.zero, plan.recompute, plan.vpp > 1, plan.sp and plan.tp > 1,
            0 < plan.dp_shard < plan.dp, plan.schedule, accum,
            plan.grad_accum_mode if accum and plan.zero >= 2 else "-", split_kind(plan), plan.recompute_layers > 0)


def tiny_split(kind: str, chunks: int) -> str | None:
    """A layer split of the tiny model's 4 layers over ``chunks`` virtual stages of the same kind."""
    if kind == "uniform":
        return None
    if kind == "uneven":
        return "1/3" if chunks == 2 else None  # 4 chunks of 4 layers: uneven only with an empty one
    empty = {"empty-first": [0], "empty-last": [chunks - 1], "empty-ends": [0, chunks - 1]}[kind]
    sizes = [0 if i in empty else 1 for i in range(chunks)]
    full = [i for i in range(chunks) if i not in empty]
    for k in range(TINY_LAYERS - len(full)):
        sizes[full[k % len(full)]] += 1
    return "/".join(map(str, sizes))


def scaled_case(plan, moe: bool) -> tuple[int, str]:
    """(world size, equivalence case) of ``plan`` scaled to the tiny model (module docstring)."""
    deg = {a: 2 if getattr(plan, a) > 1 else 1 for a in AXES}
    hsdp = 0 < plan.dp_shard < plan.dp
    if hsdp:
        deg["dp"] = 4  # shard in pairs, replicate across two of them
    if deg["dp"] * deg["tp"] * deg["pp"] * deg["cp"] > 8:
        deg["dp"], hsdp = 1, False
    vpp = 2 if plan.vpp > 1 else 1
    accum = 2 if plan.grad_accum > 1 else 1  # interleaved 1F1B needs a multiple of pp = 2
    if plan.schedule == "dualpipev":
        accum = 2 * deg["pp"]  # DualPipeV needs at least 2 pp micro-batches (torch's ScheduleDualPipeV)
    items = [f"{a}={deg[a]}" for a in AXES] + [
        f"vpp={vpp}", f"zero={plan.zero}", f"recompute={plan.recompute}", f"schedule={plan.schedule}",
        f"sp={'true' if plan.sp and deg['tp'] > 1 else 'false'}", f"grad_accum_mode={plan.grad_accum_mode}",
        f"mbs=1,gbs={deg['dp'] * accum},seq_len=16"]
    if plan.recompute_layers:  # partial full recompute: the first layer of each chunk
        items.append("recompute_layers=1")
    if hsdp:
        items.append("dp_shard=2")
    split = tiny_split(split_kind(plan), deg["pp"] * vpp)
    if split:
        items.append(f"layer_split={split}")
    world = deg["dp"] * deg["tp"] * deg["pp"] * deg["cp"]
    return world, ("tiny-moe:" if moe else "tiny-llama:") + ",".join(items)


def searched_shapes() -> dict[tuple, tuple[str, tuple[int, str]]]:
    """Distinct shape -> (the first plan seen with it, its scaled (world, case))."""
    from partita.search import search_plans
    from partita.spec.hardware import make_cluster
    from partita.spec.load import load_model
    shapes: dict[tuple, tuple[str, tuple[int, str]]] = {}
    for name, hardware, devices, gbs, seq_len in SCENARIOS:
        model = load_model(name)
        result = search_plans(model, make_cluster(hardware, devices), gbs, seq_len, top=TOP)
        assert result.plans, f"{name}: the search found no plan"
        for est in result.plans:
            key = shape_of(est.plan, bool(model.moe))
            shapes.setdefault(key, (f"{name}: {est.plan.summary()}", scaled_case(est.plan, bool(model.moe))))
    return shapes


SHAPES = searched_shapes()
BY_WORLD: dict[int, list[str]] = {}
for _origin, (_world, _case) in SHAPES.values():
    if _case not in BY_WORLD.setdefault(_world, []):
        BY_WORLD[_world].append(_case)
CASES = {case: origin for origin, (_, case) in SHAPES.values()}
#: MoE under tp without ep (not among today's top plans): the routed experts, whole on
#: every tp rank, keep their states sharded over dp x cp x tp as the planner counts them;
#: run in the same 4-process torchrun
MOE_TP = ["tiny-moe:dp=2,tp=2,zero=3,gbs=4,mbs=1,seq_len=16", "tiny-moe:dp=2,tp=2,zero=1,gbs=4,mbs=1,seq_len=16"]
BY_WORLD.setdefault(4, []).extend(MOE_TP)


#: (world, steps, case) for the session's shared torchruns (tests/conftest.py ``equivalence``): one step
EQUIVALENCE_CASES = [(world, 1, case) for world, cases in sorted(BY_WORLD.items()) for case in cases]


@pytest.fixture(scope="module")
def results(equivalence):
    return {case: equivalence["results"][(world, steps, case)] for world, steps, case in EQUIVALENCE_CASES}


def test_walk_covers_the_shapes_large_runs_use():
    """The walk is not vacuous: the search's top plans on these scenarios use pipelines
    with virtual stages, ZeRO-1 and ZeRO-3, tensor + sequence parallel, and MoE plans with
    ep together with cp and pp (the shapes the runtime once refused)."""
    keys = list(SHAPES)
    assert len(keys) >= 6
    assert any(k[0] == "moe" and {"ep", "cp", "pp"} <= set(k[1]) for k in keys)
    assert any(k[4] for k in keys) and any(k[5] for k in keys)
    assert {1, 3} <= {k[2] for k in keys}
    assert max(BY_WORLD) <= 8


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_searched_shape_trains_like_one_process(results, case):
    r = results[case]
    assert len(r["losses"]) == 1, CASES[case]
    # fp32 SGD + momentum, as tests/test_runtime_equivalence.py: only the order of float32
    # sums differs (losses within 1e-6 relative, parameters and momentum within 1e-6)
    assert r["loss_rel_diff"] <= 1e-6, (CASES[case], r)
    assert r["param_abs_diff"] <= 1e-6 and r["params_compared_rank0"] > 0, (CASES[case], r)
    assert r["state_abs_diff"] <= 1e-6, (CASES[case], r)


@pytest.mark.parametrize("case", MOE_TP)
def test_moe_under_tp_holds_what_the_planner_counts(results, case):
    """tiny-moe with tp = 2 and no ep trains like one process, and between micro-batches
    holds the gradient bytes the planner's memory model counts (experts sharded over
    dp x tp under ZeRO-3: 330,880 bytes; before, the runtime replicated them over tp,
    holding tp times the planned expert bytes), within 10 %."""
    from partita.cost.memory import estimate_rank_memory
    from partita.models import build_named_model
    from partita.plan import Plan
    from partita.runtime.auto import model_spec_of
    from partita.spec.hardware import make_cluster
    r = results[case]
    assert r["loss_rel_diff"] <= 1e-6 and r["param_abs_diff"] <= 1e-6 and r["state_abs_diff"] <= 1e-6, r
    plan = Plan.parse(case.split(":", 1)[1], world_size=4, defaults={"dtype": "fp32"})
    spec = model_spec_of(build_named_model("tiny-moe"))
    planned = estimate_rank_memory(spec, make_cluster("cpu", 4).device, plan, 0).parts["gradients"]
    held = r["grad_bytes_between_micro_batches_max"]
    assert abs(held - planned) <= 0.1 * planned, (held, planned)

