"""Expert tensor parallel ``etp`` (issue 12 item 2: MoE parallel folding), planning side.

Oracles from outside the cost model:

* Megatron-Core's expert rank generation, re-written here from its rules (``RankGenerator``
  with order ``tp-cp-ep-dp-pp`` and ``cp=1`` for the expert layers, i.e. ``tp-ep-dp-pp``;
  megatron/core/parallel_state.py ``initialize_model_parallel``): a rank's coordinates are
  its digits in the mixed radix (etp, ep, edp, pp), etp fastest; a group varies one digit;
* the expert shards each rank holds under those coordinates, enumerated and counted here
  (experts ``ep_i E/ep .. (ep_i+1) E/ep - 1``, FFN slice ``etp_i`` of ``etp``: w1/w3 by
  columns, w2 by rows), against the bytes the estimate reports;
* link spans of hand-placed ranks of small layouts;
* the token all-gather / reduce-scatter of Megatron's alltoall dispatcher, sized by hand;
* Megatron-LM's own option table for the export (tests/test_export.py holds the matrix rows).

No torch here except the last test (the runtime's refusal), which imports it on use.
"""
from __future__ import annotations

import math

import pytest

from partita.cost import comm
from partita.cost.compute import fp8_cast_elements, layer_forward
from partita.cost.memory import activation_bytes, estimate_memory, rank_shapes, shape_params
from partita.cost.shape import LayerShape, collective_spans, expert_dp_span, layer_shape, param_shape
from partita.cost.step import stage_terms
from partita.errors import PartitaError
from partita.estimate import estimate
from partita.plan import Plan, axis_ranks, expert_dp, validate
from partita.search import SearchSpace, search_plans
from partita.search.explain import why_not
from partita.spec.hardware import make_cluster
from partita.spec.load import load_model

MIXTRAL = "mixtral-8x22b"


def megatron_groups(order: list[tuple[str, int]], token: str) -> list[list[int]]:
    """The ``token`` groups of Megatron's RankGenerator for axes ``order`` (fastest first):
    rank = sum(coord_i * prod(sizes before i)); a group = the ranks equal in every other
    coordinate, in increasing rank order (so a member's index is its ``token`` coordinate)."""
    sizes = [n for _, n in order]
    groups: dict[tuple, list[int]] = {}
    for rank in range(math.prod(sizes)):
        coords, x = [], rank
        for n in sizes:
            coords.append(x % n)
            x //= n
        key = tuple(c for (name, _), c in zip(order, coords) if name != token)
        groups.setdefault(key, []).append(rank)
    return list(groups.values())


def expert_order(plan: Plan) -> list[tuple[str, int]]:
    edp = plan.tp * plan.cp * plan.dp // (plan.ep * plan.etp)
    return [("etp", plan.etp), ("ep", plan.ep), ("edp", edp), ("pp", plan.pp)]


def coords(plan: Plan, rank: int) -> dict[str, int]:
    """(etp, ep, edp, pp) coordinates of ``rank`` in Megatron's expert grid."""
    out, x = {}, rank
    for name, n in expert_order(plan):
        out[name] = x % n
        x //= n
    return out


# layouts with etp > 1 (and one folded etp 1, which Megatron places the same way)
LAYOUTS = [Plan(tp=4, dp=4, pp=2, ep=4, etp=2), Plan(tp=2, cp=2, dp=2, ep=2, etp=2),
           Plan(tp=8, dp=2, ep=2, etp=4), Plan(tp=4, dp=2, pp=2, ep=8, etp=1), Plan(tp=4, dp=4, ep=1, etp=4),
           Plan(tp=2, dp=8, ep=4, etp=2, pp=2)]


@pytest.mark.parametrize("plan", LAYOUTS, ids=lambda p: p.with_(gbs=p.dp).summary())
def test_expert_groups_are_megatrons(plan):
    assert not validate(plan.with_(gbs=plan.dp))
    order = expert_order(plan)
    for axis in ("etp", "ep", "edp"):
        expected = {r: g for g in megatron_groups(order, axis) for r in g}
        for rank in range(plan.world_size):
            assert axis_ranks(plan, axis, rank) == expected[rank], (axis, rank)
    # Megatron asserts the dense and the expert generators give the same pp groups
    dense = [("tp", plan.tp), ("cp", plan.cp), ("dp", plan.dp), ("pp", plan.pp)]
    assert sorted(megatron_groups(dense, "pp")) == sorted(megatron_groups(order, "pp"))
    assert {tuple(axis_ranks(plan, "pp", r)) for r in range(plan.world_size)} == \
        {tuple(g) for g in megatron_groups(order, "pp")}
    assert expert_dp(plan) == plan.tp * plan.cp * plan.dp // (plan.ep * plan.etp)


def _held_shards(plan: Plan, experts: int, rank: int) -> set[tuple[int, int]]:
    """(expert, FFN slice) pairs ``rank`` holds: its ep coordinate picks E/ep experts, its
    etp coordinate one of etp slices of each."""
    c = coords(plan, rank)
    per = experts // plan.ep
    return {(e, c["etp"]) for e in range(c["ep"] * per, (c["ep"] + 1) * per)}


@pytest.mark.parametrize("etp", [1, 2, 4])
def test_expert_parameters_per_rank_are_the_enumerated_shards(etp):
    model = load_model(MIXTRAL)
    mo = model.moe
    plan = Plan(tp=4, dp=4, ep=4 if etp < 4 else 2, etp=etp, sp=True, gbs=16, seq_len=4096)
    assert not validate(plan, model, 16)
    mats = 3 if model.gated else 2
    shard_params = mats * model.hidden * mo.expert_ffn_hidden / etp  # w1, w3 column slices + w2 row slice
    assert model.routed_expert_params() == mats * model.hidden * mo.expert_ffn_hidden  # bias-free experts
    holders: dict[tuple[int, int], int] = {}
    for rank in range(plan.world_size):
        held = _held_shards(plan, mo.num_experts, rank)
        for shard in held:
            holders[shard] = holders.get(shard, 0) + 1
        per_layer = len(held) * shard_params
        shape = rank_shapes(model, plan)[0]
        assert shape_params(model, shape, param_shape(plan))[1] == pytest.approx(shape.n_moe * per_layer, rel=1e-12)
    # every shard of every expert is held, each by the edp ranks of its expert data-parallel group
    assert set(holders) == {(e, s) for e in range(mo.num_experts) for s in range(etp)}
    assert set(holders.values()) == {expert_dp(plan)}


def test_memory_changes_by_exactly_the_expert_state_share():
    """zero 1, bf16 weights (2 B) and fp32 gradients (4 B) per held parameter: going from
    etp 1 to etp 2 at the same ep frees exactly the expert shards a rank no longer holds;
    the distributed optimizer's states (12 B) are spread over all tp*cp*dp ranks either way."""
    model = load_model(MIXTRAL)
    device = make_cluster("h100-sxm", 16).device
    base = Plan(tp=4, dp=4, ep=4, sp=True, zero=1, gbs=16, seq_len=4096)
    parts = {etp: estimate_memory(model, device, base.with_(etp=etp))[0].parts for etp in (1, 2)}
    freed = model.moe_layers * (len(_held_shards(base, 8, 0)) * 3 * model.hidden * model.moe.expert_ffn_hidden) / 2
    assert parts[1]["weights"] - parts[2]["weights"] == pytest.approx(2 * freed, rel=1e-9)
    assert parts[1]["gradients"] - parts[2]["gradients"] == pytest.approx(4 * freed, rel=1e-9)
    assert parts[1]["optimizer"] == pytest.approx(parts[2]["optimizer"], rel=1e-12)


def test_zero3_gathers_the_etp_shard_of_a_layer():
    """ZeRO-3 holds a middle pipeline rank's largest layer gathered, its gradients in the reduce
    dtype and the next layer prefetched: (2 w + g) x the layer's parameters (memory.py
    ``_zero3_gathered``); with etp 2 the layer's routed experts are half of E/ep experts,
    so the part drops by (2 x 2 + 4) x E p_e / (2 ep) bytes."""
    model = load_model(MIXTRAL)
    device = make_cluster("h100-sxm", 64).device
    plan = Plan(tp=4, dp=4, pp=4, ep=4, sp=True, zero=3, gbs=16, seq_len=4096)
    part = [estimate_memory(model, device, plan.with_(etp=etp))[1].parts["zero3 gathered layers"] for etp in (1, 2)]
    routed = model.moe.num_experts * 3 * model.hidden * model.moe.expert_ffn_hidden
    assert part[0] - part[1] == pytest.approx((2 * 2 + 4) * routed / (2 * 4), rel=1e-9)


def test_gathered_expert_inputs_are_saved_for_backward():
    """With etp the w1/w3 inputs a rank saves are the etp-gathered tokens (etp x its own
    top_k routed copies, h wide); its 1/etp of the intermediates of all of them is as much
    as before: the difference is exactly (etp - 1) x tokens/tp x top_k x h x 2 bytes."""
    model = load_model(MIXTRAL)
    plan = Plan(tp=4, dp=4, ep=4, sp=True, mbs=2, gbs=32, seq_len=4096)
    one = activation_bytes(model, layer_shape(plan), "none", True)
    for etp in (2, 4):
        got = activation_bytes(model, layer_shape(plan.with_(etp=etp)), "none", True) - one
        assert got == pytest.approx((etp - 1) * 2 * 4096 / 4 * model.moe.top_k * model.hidden * 2, rel=1e-12)


def test_expert_flops_stay_and_gemms_shrink_at_a_fixed_ep_times_etp():
    """etp gathers etp x the tokens and runs 1/etp of each FFN: the same FLOPs per rank.
    At a fixed ep x etp (the same expert memory) a larger etp means more local experts,
    hence smaller GEMMs and a lower efficiency on the device's GEMM-size curve."""
    model = load_model(MIXTRAL)
    device = make_cluster("h100-sxm", 16).device
    shape = LayerShape(tp=4, cp=1, ep=8, mbs=1, seq_len=4096, sp=True, dtype="bf16")
    base = layer_forward(model, device, shape, True)
    same_ep = layer_forward(model, device, shape._replace(etp=2), True)
    assert same_ep.gemm_flops == pytest.approx(base.gemm_flops, rel=1e-12)
    folded = layer_forward(model, device, shape._replace(ep=4, etp=2), True)
    assert folded.gemm_flops == pytest.approx(base.gemm_flops, rel=1e-12)
    assert folded.gemm_time > base.gemm_time * 1.0001


def test_fp8_casts_follow_the_etp_shards():
    """Each linear casts its input and weight to fp8: with etp a rank casts the etp-gathered
    routed inputs of w1/w3 ((mats - 1) h each, etp x its own top_k copies), its 1/etp of w2's
    input for all of them (as before), and 1/etp of its E/ep experts' weights."""
    model = load_model(MIXTRAL)
    mo, h = model.moe, model.hidden
    shape = LayerShape(tp=4, cp=1, ep=4, mbs=1, seq_len=4096, sp=True, dtype="fp8")
    tokens = 4096
    base = fp8_cast_elements(model, shape, True)
    got = fp8_cast_elements(model, shape._replace(etp=2), True) - base
    inputs = tokens / 4 * mo.top_k * 2 * h * (2 - 1)  # (mats - 1) = 2 gathered projections, one more etp share
    weights = 3 * h * mo.num_experts / 4 * mo.expert_ffn_hidden / 2  # half of each local expert no longer held
    assert got == pytest.approx(inputs - weights, rel=1e-12)


def test_the_etp_group_gets_its_own_communicator_buffers():
    """HCCL allocates 2 x HCCL_BUFFSIZE per communicator (the device's comm_buffer_mib_per_group):
    the etp group is one more communicator of each rank."""
    model = load_model(MIXTRAL)
    device = make_cluster("ascend-910b2", 16).device
    plan = Plan(tp=4, dp=4, ep=4, sp=True, zero=1, gbs=16, seq_len=4096)
    buffers = [estimate_memory(model, device, plan.with_(etp=etp))[0].parts["communication buffers"] for etp in (1, 2)]
    assert buffers[1] - buffers[0] == device.comm_buffer_mib_per_group * 2 ** 20 > 0


@pytest.mark.parametrize("dpn,etp_span,ep_span,edp_span", [(8, (2, 1), (4, 1), (1, 2)), (4, (2, 1), (2, 2), (1, 2)),
                                                          (2, (2, 1), (1, 4), (1, 2))])
def test_spans_of_hand_placed_ranks(dpn, etp_span, ep_span, edp_span):
    """tp4 dp4 ep4 etp2 (16 ranks): rank 0's etp group is {0, 1}, its ep group {0, 2, 4, 6},
    its expert data-parallel group {0, 8}; ``dpn`` devices per node, node = rank // dpn."""
    plan = Plan(tp=4, dp=4, ep=4, etp=2)
    assert axis_ranks(plan, "etp") == [0, 1] and axis_ranks(plan, "ep") == [0, 2, 4, 6]
    assert axis_ranks(plan, "edp") == [0, 8]
    spans = collective_spans(1, 4, 1, 4, 4, dpn, 2)
    assert (spans.etp, spans.ep) == (etp_span, ep_span)
    assert expert_dp_span(plan, dpn) == edp_span


@pytest.mark.parametrize("recompute,pairs", [("none", 2), ("full", 3)])
def test_etp_token_exchange_is_megatrons_gather_and_scatter(recompute, pairs):
    """Per MoE layer and micro-batch: an all-gather of the etp-gathered routed tokens and a
    reduce-scatter of the outputs forward, the reverse pair backward, one more forward pair
    under full recompute; ep=1 isolates it from the all-to-all, ep=2 adds the all-to-all over
    an ep group whose members sit etp apart."""
    model = load_model(MIXTRAL)
    cluster = make_cluster("h100-sxm", 16)
    dev = cluster.device
    plan = Plan(tp=4, dp=4, ep=1, etp=2, sp=True, mbs=1, gbs=16, seq_len=4096, recompute=recompute)
    gathered = 2 * 4096 / 4 * model.moe.top_k * model.hidden * 2  # etp x tokens/tp x top_k x h x bf16
    exchange = pairs * (comm.all_gather(dev, gathered, 2, 1) + comm.reduce_scatter(dev, gathered, 2, 1))
    assert exchange > 0
    assert stage_terms(model, cluster, plan)[0].moe.ep_all_to_all == pytest.approx(exchange, rel=1e-12)
    assert stage_terms(model, cluster, plan.with_(etp=1))[0].moe.ep_all_to_all == 0
    with_ep = plan.with_(ep=2)  # ep group {0, 2}: one node of 8
    a2a = 2 * pairs * comm.all_to_all(dev, gathered / 2, 2, 1)
    assert stage_terms(model, cluster, with_ep)[0].moe.ep_all_to_all == pytest.approx(a2a + exchange, rel=1e-12)
    assert estimate(model, cluster, plan).time.parts["ep all-to-all"] > 0


@pytest.mark.parametrize("plan,model,message", [
    (Plan(tp=4, dp=2, ep=8, etp=2), MIXTRAL, "etp=2 must divide tp*cp*dp/ep = 8/8 = 1"),
    (Plan(tp=2, dp=8, ep=4, etp=2, dp_shard=2), None, "ep*etp=4*2 must divide dp_shard*cp*tp = 2*1*2"),
    (Plan(tp=4, dp=2, etp=2), "llama3-8b", "etp=2 needs a mixture-of-experts model; llama3-8b is dense (use tp)"),
    (Plan(tp=2, dp=3, etp=3, gbs=3), "tiny-moe", "expert FFN size (64) must be divisible by etp=3"),
    (Plan(tp=1, etp=0), None, "etp must be from 1 to"),
])
def test_validation_names_the_violated_constraint(plan, model, message):
    errs = validate(plan, load_model(model) if model else None)
    assert any(message in e for e in errs), errs
    if model:
        with pytest.raises(PartitaError, match="invalid plan: .*" + message.split(" (")[0].replace("*", r"\*")):
            estimate(load_model(model), make_cluster("h100-sxm", plan.world_size), plan)


def test_plan_json_round_trip_and_text():
    plan = Plan(dp=4, tp=4, ep=4, etp=2, sp=True, gbs=16)
    assert plan.to_dict()["etp"] == 2 and Plan.from_dict(plan.to_dict()) == plan
    assert "etp" not in plan.with_(etp=1).to_dict()  # existing plans keep their JSON
    assert Plan.parse("tp=4,ep=4,etp=2", world_size=16).etp == 2
    assert "ep4 etp2" in plan.summary() and "etp" not in plan.with_(etp=1).summary()


def test_estimate_cli_takes_etp(capsys):
    from partita.cli import main
    argv = ["estimate", "--model", MIXTRAL, "--hardware", "h100-sxm", "--devices", "128", "--tp", "4", "--ep", "8",
            "--pp", "4", "--global-batch", "256", "--seq-len", "4096", "--json"]
    import json
    assert main(argv) == 0
    one = json.loads(capsys.readouterr().out)
    assert main(argv + ["--etp", "4"]) == 0
    four = json.loads(capsys.readouterr().out)
    assert one["plan"].get("etp", 1) == 1 and four["plan"]["etp"] == 4
    assert four["peak_memory_gib"] < one["peak_memory_gib"]


def test_search_picks_etp_where_expert_memory_binds():
    """Mixtral-8x22B has 8 experts, so ep stops at 8; on 64 H100 without a pipeline its
    expert weights and gradients (E p_e / 8 per rank at etp 1) push etp 1 to ZeRO-3 and
    full recompute, while etp = tp = 4 (Grok-1's and Llama-4's published ETP=4 layouts)
    fits with ZeRO-2 and no recompute: the search picks it and explains etp 1. The
    runtime's own search (fold_ep off) never proposes etp."""
    model, cluster = load_model(MIXTRAL), make_cluster("h100-sxm", 64)
    result = search_plans(model, cluster, 256, 4096, SearchSpace(tp=4, ep=8, pp=1), top=3)
    assert result.best is not None and result.best.plan.etp == 4, result.best.plan.summary() if result.best else None
    line = [text for text in why_not(result) if text.startswith("etp=1 ")]
    assert line and "step time" in line[0], why_not(result)
    runtime = search_plans(model, cluster, 256, 4096, SearchSpace(tp=4, ep=8, pp=1, fold_ep=False), top=3)
    assert runtime.plans and all(e.plan.etp == 1 for e in runtime.plans)
    assert runtime.best.step_time_s > result.best.step_time_s


def test_published_etp_layouts_are_in_the_search_space():
    """Every published run whose notes state an expert tensor parallel size (NVIDIA's Grok-1 and
    Llama-4 Maverick rows: ETP=4 with TP=4; DeepSeek-V3, Llama-4 on GB200: ETP=1) is a layout
    the search builds: its etp is among the structure's degrees
    (:func:`partita.search.layouts.expert_tensor_degrees`, the builder's own list) and the plan
    with it is valid."""
    import csv
    import re
    from pathlib import Path
    from partita.search.layouts import expert_tensor_degrees
    from published_runs import load_cases
    table = Path(__file__).resolve().parents[1] / "data" / "published_runs.csv"  # the 470-row table
    stated = {}
    with open(table) as f:
        for row in csv.DictReader(f):
            m = re.search(r"\bETP[ =](\d+)", row["notes"])
            if m and row["ep"]:
                stated[(row["model_name"], int(row["n_devices"]), int(row["tp"]), int(row["ep"]))] = int(m.group(1))
    assert any(etp > 1 for etp in stated.values())
    cases, _ = load_cases(table)
    checked = set()
    for case in cases:
        p = case.plan
        etp = stated.get((case.name, case.cluster.world_size, p.tp, p.ep))
        if etp is None:
            continue
        assert etp in expert_tensor_degrees(case.model, SearchSpace(), p.tp, p.dp * p.cp, p.ep), case.name
        assert not validate(p.with_(etp=etp), case.model, case.cluster.world_size), case.name
        checked.add((case.name, etp))
    assert {etp for _, etp in checked} >= {1, 4}, checked


def test_runtime_refuses_etp_with_what_is_missing():
    from partita.runtime.parallelize import runtime_check
    with pytest.raises(PartitaError, match=r"^plan not runnable: etp=2: expert tensor parallel is not implemented "
                                           r"by this runtime \(no etp mesh axis"):
        runtime_check(Plan(dp=2, tp=2, ep=2, etp=2), None)
