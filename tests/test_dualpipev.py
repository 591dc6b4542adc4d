"""DualPipeV as a plan schedule: its constraints, its V placement, and its bubble, in-flight
activations and overlapped pairs pinned against torch's own ``ScheduleDualPipeV`` action list
(torch/distributed/pipelining/schedules.py), replayed here with per-action durations and the
pipeline's data dependencies (the oracle is torch's order, not our formulas)."""
from __future__ import annotations

import types

import pytest
from torch.distributed.pipelining.schedules import (BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, FULL_BACKWARD,
                                                    OVERLAP_F_B, ScheduleDualPipeV)
from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

from partita.cost.pipeline import fb_overlap_pairs, fb_overlap_share, in_flight_chunks, pipeline_time
from partita.cost.placement import rank_shapes
from partita.errors import PartitaError
from partita.estimate import estimate
from partita.plan import Plan, chunk_ranks, validate
from partita.spec.hardware import make_cluster
from partita.spec.load import load_model

CASES = [(2, 4), (2, 5), (3, 6), (3, 7), (4, 8), (4, 13), (8, 16), (8, 21)]


def torch_order(p: int, m: int) -> dict[int, list]:
    """torch's per-rank action list for ``p`` ranks and ``m`` micro-batches (the method reads
    only the group size and the micro-batch count, so no process group is needed)."""
    fake = types.SimpleNamespace(pp_group_size=p, _n_microbatches=m)
    return {r: ScheduleDualPipeV._calculate_single_rank_operations(fake, r) for r in range(p)}


def _key(a) -> tuple:
    kind = {FORWARD: "F", BACKWARD_WEIGHT: "W"}.get(a.computation_type, "B")
    return kind, a.stage_index, a.microbatch_index


def replay(p: int, m: int, f: float, b: float, w: float, fb: float) -> tuple[float, list[float]]:
    """Run torch's order with durations (forward ``f``, full backward ``b``, input backward
    ``b - w``, weight backward ``w``, an overlapped pair ``fb``); every action starts when its
    rank is free and its inputs exist (forward of stage s after stage s-1's; backward of s
    after its forward and stage s+1's backward; weight after input backward). Returns the
    makespan and each rank's idle time."""
    order, stages = torch_order(p, m), 2 * p
    dur = {FORWARD: f, FULL_BACKWARD: b, BACKWARD_INPUT: b - w, BACKWARD_WEIGHT: w}
    done: dict[tuple, float] = {}

    def ready_at(a) -> float | None:
        kind, s, i = _key(a)
        need = ([("F", s - 1, i)] if kind == "F" and s else [("B", s, i)] if kind == "W" else
                [("F", s, i)] + ([("B", s + 1, i)] if s < stages - 1 else []) if kind == "B" else [])
        return None if any(n not in done for n in need) else max([done[n] for n in need], default=0.0)

    clock, pos, busy = [0.0] * p, [0] * p, [0.0] * p
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while pos[r] < len(order[r]):
                a = order[r][pos[r]]
                subs = a.sub_actions if a.computation_type == OVERLAP_F_B else (a,)
                starts = [ready_at(x) for x in subs]
                if None in starts:
                    break
                d = fb if a.computation_type == OVERLAP_F_B else dur[a.computation_type]
                clock[r] = max([clock[r]] + starts) + d
                busy[r] += d
                for x in subs:
                    done[_key(x)] = clock[r]
                pos[r] += 1
                moved = True
    assert pos == [len(order[r]) for r in range(p)], "torch's order did not complete"
    span = max(clock)
    return span, [span - x for x in busy]


@pytest.mark.parametrize("p,m", CASES)
def test_bubble_is_deepseeks_formula_on_torchs_order(p: int, m: int) -> None:
    for f, fb in ((1.0, 3.0), (1.0, 2.5), (2.0, 6.0), (1.0, 2.0)):  # W = F = B/2; F&B from B to F+B
        b, w = 2 * f, f
        _, idle = replay(p, m, f, b, w, fb)
        assert max(idle) == pytest.approx((p - 1) * (fb + b - 3 * w))  # DeepSeek-V3 Table 2, PP = 2p chunks


@pytest.mark.parametrize("p,m", CASES)
def test_pipeline_time_equals_the_replayed_step(p: int, m: int) -> None:
    # no overlap gain in compute (F&B = F + B): the cost model's closed form is the replay's makespan
    f = 0.25
    span, _ = replay(p, m, f, 2 * f, f, 3 * f)
    t = 2 * (f + 2 * f)  # one micro-batch through the rank's two chunks
    assert pipeline_time([t] * p, m, 2, "dualpipev") == pytest.approx(span)
    assert pipeline_time([t] * p, m, 2, "interleaved-1f1b") > span  # (p-1) t/2 against (p-1) t/3


@pytest.mark.parametrize("p,m", CASES)
def test_in_flight_and_overlapped_pairs_from_torchs_order(p: int, m: int) -> None:
    order = torch_order(p, m)
    for r in range(p):
        held = peak = 0
        for a in order[r]:
            for x in (a.sub_actions if a.computation_type == OVERLAP_F_B else (a,)):
                held += x.computation_type == FORWARD
                held -= x.computation_type in (FULL_BACKWARD, BACKWARD_INPUT)
                peak = max(peak, held)
        assert peak == in_flight_chunks("dualpipev", p, 2, m, r)
    pairs = [sum(a.computation_type == OVERLAP_F_B for a in order[r]) for r in range(p)]
    assert min(pairs) == fb_overlap_pairs(p, m)
    assert fb_overlap_share("dualpipev", p, m) == pytest.approx(min(pairs) / (2 * m))
    assert fb_overlap_share("interleaved-1f1b", p, m) == 0.0


def test_v_placement_is_torchs_mapping() -> None:
    for p in (2, 3, 4, 8):
        mapping = generate_stage_to_rank_mapping(p, 2 * p, style="v")
        assert chunk_ranks(p, 2, "dualpipev") == tuple(mapping[j] for j in range(2 * p))


def test_rank_zero_holds_both_ends() -> None:
    model = load_model("mixtral-8x7b")
    plan = Plan(dp=2, pp=4, vpp=2, ep=2, gbs=16, schedule="dualpipev")
    shapes = rank_shapes(model, plan)
    assert shapes[0].first and shapes[0].last and not any(s.first or s.last for s in shapes[1:])
    assert [s.n_layers for s in shapes] == [8, 8, 8, 8]


@pytest.mark.parametrize("fields,needle", [
    ({"pp": 1, "vpp": 2}, "needs pp >= 2"),
    ({"pp": 2, "vpp": 3}, "needs vpp=2"),
    ({"pp": 4, "vpp": 2, "gbs": 6}, "at least 2*pp = 8 micro-batches"),
])
def test_constraints_one_line_each(fields: dict, needle: str) -> None:
    errs = validate(Plan(schedule="dualpipev", **fields))
    assert any(needle in e for e in errs), errs
    assert all("\n" not in e for e in errs)


def test_odd_micro_batch_count_is_valid_as_in_torch() -> None:
    assert validate(Plan(pp=2, vpp=2, gbs=5, schedule="dualpipev")) == []
    assert Plan.from_dict({"pp": 2, "gbs": 8, "schedule": "dualpipev"}).vpp == 2  # the V's two chunks implied


def test_all_to_all_hidden_by_the_overlapped_share() -> None:
    model, cluster = load_model("mixtral-8x7b"), make_cluster("h100-sxm", 64)
    base = Plan(dp=8, tp=2, pp=4, vpp=2, ep=8, gbs=256, seq_len=4096)
    inter = estimate(model, cluster, base.with_(schedule="interleaved-1f1b"))
    dual = estimate(model, cluster, base.with_(schedule="dualpipev"))
    order = torch_order(4, 32)  # the share from torch's own order, not from the code under test
    share = min(sum(a.computation_type == OVERLAP_F_B for a in order[r]) for r in range(4)) / (2 * 32)
    a2a = "ep all-to-all"
    assert dual.time.parts[a2a] == pytest.approx(inter.time.parts[a2a] * (1 - share), rel=1e-9)
    assert dual.step_time_s < inter.step_time_s


def test_no_all_to_all_hidden_where_torch_runs_the_pairs_in_turn() -> None:
    # torchtitan and Partita's runtime run torch's ScheduleDualPipeV with no OVERLAP_F_B callback
    import inspect

    from torch.distributed.pipelining import schedules
    assert "OVERLAP_F_B" in inspect.getsource(schedules._PipelineScheduleRuntime)  # the pair is a runtime action
    model, cluster = load_model("mixtral-8x7b"), make_cluster("h100-sxm", 64)
    base = Plan(dp=8, tp=2, pp=4, vpp=2, ep=8, gbs=256, seq_len=4096, framework="torchtitan")
    inter = estimate(model, cluster, base.with_(schedule="interleaved-1f1b"))
    dual = estimate(model, cluster, base.with_(schedule="dualpipev"))
    assert fb_overlap_share("dualpipev", 4, 32, "torchtitan") == 0.0
    assert dual.time.parts["ep all-to-all"] == pytest.approx(inter.time.parts["ep all-to-all"], rel=1e-12)


def test_plan_cli_schedule_dualpipev_searches_v_pipelines_only(capsys) -> None:
    import json

    from partita.cli.main import main
    argv = ["--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--devices", "64", "--global-batch", "256",
            "--seq-len", "4096"]
    assert main(["plan", *argv, "--schedule", "dualpipev", "--top", "3", "--json"]) == 0
    plans = [Plan.from_dict(row["plan"]) for row in json.loads(capsys.readouterr().out)["plans"]]
    assert plans and all(p.schedule == "dualpipev" and p.vpp == 2 and p.pp >= 2 for p in plans)
    assert all(validate(p) == [] for p in plans)
    assert main(["estimate", *argv, "--pp", "4", "--tp", "2", "--ep", "8", "--schedule", "dualpipev"]) == 0
    out = capsys.readouterr().out
    assert "pp4-dualpipev" in out


@pytest.mark.parametrize("flags,says", [
    (["plan", "--pp", "1"], "--schedule dualpipev needs --pp >= 2"),
    (["plan", "--pp", "2", "--vpp", "3"], "--vpp must be 2 or left out"),
    (["plan", "--pp", "4", "--dp", "4", "--global-batch", "8"], "at least 2*pp = 8 micro-batches"),
    (["estimate", "--pp", "1"], "schedule dualpipev needs pp >= 2"),
])
def test_dualpipev_flags_it_cannot_run_end_in_one_line_naming_the_constraint(capsys, flags, says) -> None:
    """Before, the plan cases fell through to the search, which never enumerates such a
    structure and explained the failure with another candidate's reason (a tp=16 KV-head one)."""
    from partita.cli.main import main
    argv = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "16", "--global-batch", "64",
            "--seq-len", "4096", "--schedule", "dualpipev"]
    assert main([flags[0], *argv, *flags[1:]]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and "KV heads" not in err and err.count("needs") <= 1


# ------------------------------------------------- one placement, read by the runtime, the cost model and the search
def test_runtime_eval_order_is_the_plans_placement() -> None:
    """The pipeline's forward-only eval order (runtime/pipeline.py) is built from the plan's
    placement, not a V of its own: each rank runs, for every micro-batch, exactly the chunks
    torch's own V mapping gives it, in layer order; given another placement it follows that."""
    from partita.runtime.pipeline import forward_only_order
    for p, m in ((2, 4), (3, 7), (4, 8)):
        mapping = generate_stage_to_rank_mapping(p, 2 * p, style="v")  # torch's, the oracle
        order = forward_only_order(chunk_ranks(p, 2, "dualpipev"), m)
        assert sorted(order) == list(range(p))
        for r, actions in order.items():
            mine = sorted(j for j in range(2 * p) if mapping[j] == r)
            assert [(a.stage_index, a.microbatch_index) for a in actions] == [(j, i) for j in mine for i in range(m)]
            assert all(a.computation_type == FORWARD for a in actions)
    assert [a.stage_index for a in forward_only_order((0, 1, 0, 1), 1)[0]] == [0, 2]  # Megatron's j mod pp


def test_rank_layers_follow_the_placement_given() -> None:
    """placement.all_rank_layers takes the chunk placement, not a V flag: 8 layers in 4
    chunks of 2 (hand-counted), interleaved and in a V."""
    from partita.cost.placement import all_rank_layers
    assert all_rank_layers(8, 2, (2, 2, 2, 2), (0, 1, 0, 1)) == ((0, 1, 4, 5), (2, 3, 6, 7))
    assert all_rank_layers(8, 2, (2, 2, 2, 2), (0, 1, 1, 0)) == ((0, 1, 6, 7), (2, 3, 4, 5))
    with pytest.raises(PartitaError, match="does not place"):
        all_rank_layers(8, 2, (2, 2, 2, 2), (0, 1))


def test_a_schedule_is_priced_as_it_places_its_chunks(monkeypatch) -> None:
    """A schedule whose placement differs (here zero-bubble made to place its chunks in a
    reversed V: chunk 0 and the last on rank 3) is priced so: the embedding and the output
    layer on the rank that holds the first and last chunk. With the old ``v_shape`` flag
    anything but dualpipev was priced as Megatron's j mod pp, ends on ranks 0 and pp-1."""
    from partita.cost import placement
    reversed_v = (3, 2, 1, 0, 0, 1, 2, 3)
    monkeypatch.setattr(placement, "chunk_ranks", lambda pp, vpp, schedule: reversed_v)
    placement._placement.cache_clear()
    try:
        model = load_model("mixtral-8x7b")
        shapes = rank_shapes(model, Plan(dp=2, pp=4, vpp=2, ep=2, gbs=16, schedule="zero-bubble"))
        assert shapes[3].first and shapes[3].last and not any(s.first or s.last for s in shapes[:3])
        assert [s.n_layers for s in shapes] == [8, 8, 8, 8]
    finally:
        placement._placement.cache_clear()


def test_dualpipev_limits_come_from_the_framework_table() -> None:
    """MindSpeed runs no DualPipeV with cp > 1 (docs/features/dualpipev.md) or etp > 1
    (--moe-fb-overlap needs expert tp 1): the capability table says so, as for every other
    limit, so another framework's entry can carry the same limits by its fields alone."""
    import dataclasses

    from partita.search.capabilities import CAPABILITIES, layout_problem
    model, mindspeed = load_model("mixtral-8x7b"), CAPABILITIES["mindspeed"]
    base = Plan(dp=4, tp=2, pp=2, vpp=2, ep=4, gbs=64, seq_len=4096, schedule="dualpipev")
    assert layout_problem(mindspeed, base, model) is None
    cp = base.with_(cp=2, dp=2, ep=2)
    etp = base.with_(etp=2)
    assert "DualPipeV with context parallelism (cp > 1): use cp 1, or another schedule" in layout_problem(
        mindspeed, cp, model)  # the line names what is right, not only what is wrong
    assert "DualPipeV with expert tensor parallelism (etp > 1): use etp 1" in layout_problem(mindspeed, etp, model)
    other = dataclasses.replace(CAPABILITIES["torchtitan"], name="other", dualpipev_cp=False, dualpipev_etp=False)
    assert "other cannot run DualPipeV with context parallelism" in layout_problem(other, cp, model)
    lifted = dataclasses.replace(mindspeed, dualpipev_cp=True, dualpipev_etp=True)
    assert layout_problem(lifted, cp, model) is None and layout_problem(lifted, etp, model) is None
