"""Plan search: pruning, constraints, why-not explanations and impossible cases."""
import functools
import json
from dataclasses import replace

import pytest

from partita.estimate import estimate
from partita.plan import Plan, validate
from partita.search import SearchSpace, search_plans
from partita.cost.step import step_time_lower_bound
from partita.search.explain import why_not
from partita.search.layouts import cheap_bound, layouts_by_bound
from partita.search.space import best_split
from partita.spec.hardware import make_cluster
from partita.spec.load import load_model

from brute_force_search import brute_force


def main(argv: list[str]) -> int:
    """The `partita` command line (imported on use: the CLI module is the one user of it here)."""
    from partita.cli import main as cli_main
    return cli_main(argv)


@pytest.fixture(scope="module")
def llama13_result():
    return search_plans(load_model("llama-13b"), make_cluster("a100-40gb", 64), 512, 2048, top=0)


def test_no_returned_plan_exceeds_memory(llama13_result):
    r = llama13_result
    assert r.plans
    for est in r.plans:  # kept: P(fit) >= min_p_fit (issue 33), i.e. at most the admission limit
        assert est.peak_memory_gib <= r.admission_limit_gib and est.p_fit >= r.min_p_fit
        assert not validate(est.plan, r.model, 64)
    keys = [e.step_time_s / e.p_fit for e in r.plans]  # ranked by risk-adjusted step time
    assert keys == sorted(keys)


def test_rejected_attempts_really_did_not_fit(llama13_result):
    r = llama13_result
    rejected = [a for a in r.attempts if not a.fits]
    assert rejected  # llama-13b on 40 GB parts: some layouts must not fit
    # Independent of the engine's own `fits` and its stored peaks: the limit is the
    # device file's usable memory (no headroom by default), a plan is rejected only when its
    # P(fit) is below 5 % (issue 33), and each rejected plan's peak is recomputed from
    # scratch by the public estimator.
    limit = r.cluster.device.usable_gib
    assert r.memory_limit_gib == limit
    for a in rejected:
        est = estimate(r.model, r.cluster, a.plan)
        peak = est.peak_memory_gib
        assert peak > r.admission_limit_gib > limit and est.p_fit < 0.05, a.plan.summary()
        assert peak == a.peak_gib  # the search reports the peak the estimator computes
    for a in r.attempts:
        if a.fits:
            assert estimate(r.model, r.cluster, a.plan).p_fit >= 0.05, a.plan.summary()


def test_fixed_degree_is_honoured():
    r = search_plans(load_model("llama-13b"), make_cluster("a100-80gb", 64), 512, 2048, SearchSpace(tp=4, pp=2))
    assert r.plans and all(e.plan.tp == 4 and e.plan.pp == 2 for e in r.plans)


def test_why_not_names_memory_or_slowdown(llama13_result):
    lines = why_not(llama13_result)
    assert any(line.startswith("tp=") for line in lines)
    assert all(("GiB >" in line) or ("step time" in line) for line in lines)


def test_published_layout_reachable_and_not_better_than_best():
    # GPT-3 175B, Megatron-LM paper: tp8 pp12 on 1536 A100; the search must reach it and not rank it above its best
    model, cluster = load_model("gpt3-175b"), make_cluster("a100-80gb", 384)
    r = search_plans(model, cluster, 1536, 2048, top=0)
    published = [a for a in r.attempts if (a.plan.tp, a.plan.pp, a.plan.vpp, a.plan.mbs) == (8, 12, 1, 1)]
    assert published
    best = r.best
    fitting = [a.estimate for a in published if a.estimate]
    assert fitting and best.step_time_s <= min(e.step_time_s for e in fitting)


def test_best_split_lightens_the_last_stage():
    # a last stage carrying the output layer worth 2 layers: the optimum max stage cost is
    # T* = 9 (T = 8 holds only 8+8+8+6 = 30 layers); capacities at T = 9 are (9, 9, 9, 7)
    # = 34 >= 32, and the 2 surplus layers come off the stages with the most load, ties
    # by position: the first two -> (8, 8, 9, 7)
    assert best_split(32, 4, 0.0, 2.0) == (8, 8, 9, 7)
    # 30 even layers: T* = 8 (capacities 32; T = 7 holds 28), the surplus of 2 comes off
    # the first two stages (all tie at 8)
    assert best_split(30, 4, 0.0, 0.0) == (7, 7, 8, 8)


def test_nothing_fits_says_smallest_memory(capsys):
    code = main(["plan", "--model", "llama3-405b", "--hardware", "a100-40gb", "--devices", "8", "--global-batch", "8"])
    err = capsys.readouterr().err
    assert code == 2 and "no plan fits: the smallest any plan reaches is" in err and len(err.strip().splitlines()) == 1


def test_impossible_fixed_degree(capsys):
    code = main(["plan", "--model", "llama-13b", "--hardware", "a100-80gb", "--devices", "64", "--global-batch", "512",
                 "--tp", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "partita: error:" in err


def test_plan_json_has_search_fields(capsys):
    code = main(["plan", "--model", "llama-7b", "--hardware", "a100-80gb", "--devices", "16", "--global-batch", "64",
                 "--json", "--top", "2"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["candidates_evaluated"] > 10 and data["search_time_s"] > 0
    # every layout is either evaluated or ruled out by a stated bound; llama-7b on 16 GPUs has > 100
    assert data["candidates_evaluated"] + data["candidates_pruned_by_memory"] + data["candidates_bounded_by_time"] > 100
    assert len(data["plans"]) == 2 and "step_time_s" in data["plans"][0]
    assert data["plans"][0]["plan"]["format"] == "partita.plan/1"


def test_plan_export_with_nothing_expressible_is_a_clear_error(capsys):
    # every plan the search may return has vpp=2 (fixed), and DeepSpeed's pipeline engine
    # has no interleaved schedule
    code = main(["plan", "--model", "llama-13b", "--hardware", "a100-80gb", "--devices", "64", "--global-batch", "512",
                 "--pp", "2", "--vpp", "2", "--export", "deepspeed"])
    err = capsys.readouterr().err
    assert code == 2 and "can be expressed in deepspeed" in err and "vpp > 1" in err


def _deepspeed_can_run(plan) -> bool:
    """What a ds_config + DeepSpeed's engines can run, from DeepSpeed's documentation, not
    from the exporter: no interleaved pipeline, expert or ring-context parallelism in the
    config, even PipelineModule partitions, and ZeRO-2/3 only without pipeline stages
    (deepspeed/runtime/pipe/engine.py asserts it)."""
    return (plan.vpp == 1 and plan.ep == 1 and plan.cp == 1 and not plan.layer_split
            and not (plan.pp > 1 and plan.zero >= 2))


def test_plan_export_falls_back_and_says_so(capsys):
    # GPT-3 175B on 1024 H100: the fastest plan interleaves its pipeline (vpp > 1), which
    # DeepSpeed cannot run; the export must take the fastest plan DeepSpeed can run from
    # the full ranking, say so, and write that plan's batch and ZeRO stage
    model, cluster = load_model("gpt3-175b"), make_cluster("h100-sxm", 1024)
    ranking = search_plans(model, cluster, 1536, 2048, top=0).plans
    assert not _deepspeed_can_run(ranking[0].plan)
    index, fallback = next((i, e.plan) for i, e in enumerate(ranking) if _deepspeed_can_run(e.plan))
    code = main(["plan", "--model", "gpt3-175b", "--hardware", "h100-sxm", "--devices", "1024", "--global-batch", "1536",
                 "--export", "deepspeed", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    note = data["export"]["note"]
    assert note.startswith("deepspeed cannot express plan 1 (vpp > 1")
    # numbered in the ranking as printed (after the gradient-knob re-ranking), then the rest of the search's
    assert f", {fallback.summary()}," in note and int(note.split("exported plan ")[1].split(",")[0]) >= index + 1
    ds = json.loads(data["export"]["text"])
    # DeepSpeed counts AutoTP ranks in its batch arithmetic (world / pp ranks, not dp): 1536 x tp
    assert ds["train_batch_size"] == fallback.mbs * fallback.grad_accum * (fallback.world_size // fallback.pp)
    assert fallback.gbs == 1536
    assert ds["train_micro_batch_size_per_gpu"] == fallback.mbs
    assert ds["gradient_accumulation_steps"] == fallback.grad_accum
    assert ds["zero_optimization"]["stage"] == fallback.zero


def _small(name: str, layers: int):
    """A preset cut to a few layers: real layer shapes, a space small enough to enumerate."""
    return replace(load_model(name), layers=layers, name=f"{name}-{layers}-layers")


# Small scenarios the brute force enumerates in seconds, each binding a different part of
# the space: memory forcing tp / ZeRO-2 (70B layers on 4 x 40 GB), uneven and interleaved
# pipelines over 2-device nodes (6 layers: splits with empty end stages), context
# parallelism (16k tokens), dense on 8-device nodes, and expert parallelism (MoE).
BRUTE_FORCE_SCENARIOS = {
    "70b-4x40gb": (("llama3-70b", 4), "a100-40gb", 4, None, 8, 4096),
    "65b-2-per-node": (("llama-65b", 6), "a100-40gb", 8, 2, 16, 2048),
    "65b-8x40gb": (("llama-65b", 6), "a100-40gb", 8, None, 8, 2048),
    "70b-16k-tokens": (("llama3-70b", 3), "h100-sxm", 8, None, 4, 16384),
    "moe-8x80gb": (("mixtral-8x22b", 4), "a100-80gb", 8, None, 8, 4096),
}


@functools.cache
def _searched(name: str):
    """(bounded search, brute force) of one scenario, computed once for the tests below."""
    (model_name, layers), hardware, devices, per_node, gbs, seq = BRUTE_FORCE_SCENARIOS[name]
    model, cluster = _small(model_name, layers), make_cluster(hardware, devices, per_node)
    return (search_plans(model, cluster, gbs, seq, top=5, risk=False),  # the limit alone, as the oracle reads it
            brute_force(model, cluster, gbs, seq, **SearchSpace().options))


@pytest.mark.parametrize("name", BRUTE_FORCE_SCENARIOS)
def test_search_matches_brute_force(name):
    """The branch and bound against tests/brute_force_search.py, an enumeration of every
    valid plan that shares nothing with the engine but plan validation and the public
    estimator: the same best step time (the same plan or a tie), the same top-5 layouts,
    and every plan the engine estimated is one the brute force found fitting, at the
    same step time."""
    bounded, oracle = _searched(name)
    assert oracle.fitting and bounded.best is not None
    assert bounded.memory_limit_gib == oracle.limit_gib
    best_time = oracle.fitting[0].step_time_s
    assert bounded.best.step_time_s == best_time
    assert bounded.best.plan in {e.plan for e in oracle.fitting if e.step_time_s == best_time}
    # top-5: the engine may list two plans of one layout (a ZeRO <= 2 and a ZeRO-3
    # setting); the distinct layouts it lists are the oracle's fastest layouts, in order
    mine, seen = [], set()
    for est in bounded.plans:
        key = (est.plan.tp, est.plan.cp, est.plan.pp, est.plan.dp, est.plan.ep, est.plan.mbs, est.plan.vpp,
               est.plan.schedule)
        if key not in seen:
            seen.add(key)
            mine.append(est.step_time_s)
    assert len(mine) >= 3
    assert mine == [e.step_time_s for e in oracle.per_layout_best()[:len(mine)]]
    # a plan without a layer split runs its automatic one (Plan.stage_layers): compare them written out
    def written(plan):
        return plan if plan.layer_split else plan.with_(layer_split=plan.stage_layers(bounded.model.layers))
    oracle_times = {written(e.plan): e.step_time_s for e in oracle.fitting}
    estimated = [a.estimate for a in bounded.attempts if a.estimate and a.plan.tp <= bounded.cluster.devices_per_node]
    assert estimated and all(oracle_times.get(written(e.plan)) == e.step_time_s for e in estimated)


@pytest.mark.parametrize("name", BRUTE_FORCE_SCENARIOS)
def test_why_not_structural_alternatives_match_brute_force(name):
    """For every "why not" value of a structural knob (tp, pp, vpp, cp, ep, mbs), the best
    plan the search found with that value is the brute force's best with that value.
    (For recompute and zero the engine by design reports the best setting it happened to
    estimate, not the best plan with that value, so those are only checked not to beat
    the brute force's optimum.) Partial recompute (``recompute_layers``) is only searched
    for the ranking, not for the "why not" values: the search's best of a value lies
    between the brute force's best and its best without a partial plan."""
    bounded, oracle = _searched(name)
    per_node = bounded.cluster.devices_per_node
    checked = exact = 0
    for knob, values in bounded.alternatives.items():
        for value in values:
            found = [a.estimate.step_time_s for a in bounded.attempts if a.estimate and getattr(a.plan, knob) == value
                     and a.plan.tp <= per_node]
            every = [e.step_time_s for e in oracle.fitting if getattr(e.plan, knob) == value]
            if knob in ("recompute", "zero"):
                assert not found or (every and min(found) >= every[0]), (knob, value)
                continue
            whole = [e.step_time_s for e in oracle.fitting if getattr(e.plan, knob) == value
                     and not e.plan.recompute_layers]
            assert bool(found) == bool(every), (knob, value)
            if every:
                assert every[0] <= min(found) <= (whole[0] if whole else float("inf")), (knob, value)
                exact += min(found) == every[0]
                checked += 1
    assert checked >= 4 and exact >= checked - 1


@pytest.mark.parametrize("name, hardware, devices, gbs, seq", [
    ("llama-65b", "ascend-910b2", 512, 2048, 2048),  # uneven min-max splits (80 layers), interleaving
    ("mixtral-8x22b", "ascend-910b2", 256, 1024, 4096),  # MoE: ep, cp, uneven interleaved splits
])
def test_queue_key_never_above_exact_bound(name, hardware, devices, gbs, seq):
    """The search files layouts under a cheap bound and computes the exact one only when a
    layout comes up; the order is only exact if the cheap bound is never above the exact
    one, for every layout of a whole space (a cost-model change can break this)."""
    model, cluster = load_model(name), make_cluster(hardware, devices)
    queue = layouts_by_bound(model, cluster, gbs, seq, SearchSpace(), True, [])
    assert len(queue.layouts) > 400
    for lay in queue.layouts:
        exact = step_time_lower_bound(model, cluster, lay.plan)
        assert lay.key == cheap_bound(model, cluster, lay.plan) <= exact, lay.plan.summary()
    bounds = [lay.bound for lay in queue]  # iterating refines every layout, in order
    assert bounds == sorted(bounds) and len(bounds) == len(queue.layouts)


def test_uneven_layers_get_the_automatic_split():
    """Layers that do not divide into pp*vpp stages need no explicit split: the plan gets
    Megatron's account-for-embedding-and-loss split - 126 layers + embedding + loss = 128
    units over 16 stages is 8 each, so the end stages hold 7 layers - in the estimate and
    its JSON; an explicit split still wins; a count no split can place is refused."""
    model, cluster = load_model("llama3-405b"), make_cluster("h100-sxm", 1024)
    plan = Plan(dp=8, tp=8, pp=16, sp=True, zero=1, mbs=1, gbs=1024, seq_len=8192)
    est = estimate(model, cluster, plan)
    assert est.plan.layer_split == (7,) + (8,) * 14 + (7,)
    assert est.to_dict()["plan"]["layer_split"] == [7] + [8] * 14 + [7]
    assert len(est.time.stages) == 16 and est.step_time_s > 0
    mine = (8,) * 15 + (6,)
    assert estimate(model, cluster, replace(plan, layer_split=mine)).plan.layer_split == mine
    # DeepSeek-V3: 61 + 2 = 63 units over 8 x 2 virtual stages: 15 of 4 and one of 3; the
    # lighter ends (2 and 3 layers) carry the embedding and the loss
    dsv3 = load_model("deepseek-v3")
    est = estimate(dsv3, make_cluster("h800", 256), Plan(dp=16, tp=2, pp=8, vpp=2, ep=8, sp=True, zero=1, mbs=1,
                                                         gbs=512, seq_len=4096, schedule="interleaved-1f1b"))
    assert est.plan.layer_split == (2,) + (4,) * 14 + (3,)
    assert validate(Plan(dp=1, pp=128, gbs=128), model, 128) == []  # 128 units: one each, empty ends
    errs = validate(Plan(dp=1, pp=256, gbs=256), model, 256)
    assert errs == ["126 layers cannot be split over pp*vpp = 256*1 = 256 stages with at least one layer in every "
                    "middle stage; use fewer stages"]


def test_tp_not_dividing_kv_heads_is_refused_with_the_estimates_reason():
    """Llama-3 70B has 8 KV heads: tp=16 would split a KV head, which no runtime does (and
    KV replication is not modelled), so the estimate and the search refuse it alike, and
    a search fixed to it says why instead of "no layout divides the devices"."""
    from partita.errors import PartitaError
    from partita.search.engine import infeasible_message
    model, cluster = load_model("llama3-70b"), make_cluster("h100-sxm", 64)
    reason = "KV heads (8) must be divisible by tp=16"
    with pytest.raises(PartitaError, match=r"KV heads \(8\) must be divisible by tp=16"):
        estimate(model, cluster, Plan(dp=4, tp=16, sp=True, mbs=1, gbs=64))
    result = search_plans(model, cluster, 64, 8192, SearchSpace(tp=16))
    assert not result.plans and not result.attempts
    assert any(reason in line for line in result.invalid)
    with pytest.raises(PartitaError) as err:
        infeasible_message(result)
    assert reason in str(err.value)
    # the unconstrained search never proposes it
    assert all(a.plan.tp <= 8 for a in search_plans(model, cluster, 64, 8192).attempts)


@pytest.mark.parametrize("name, devices, gbs, seq", [
    ("llama3-405b", 1024, 1024, 8192),  # 126 layers: + embedding + loss = 128
    ("deepseek-v3", 1024, 4096, 4096),  # 61 layers: neither 61 nor 63 has an even factor
    ("qwen3-235b-a22b", 512, 1024, 4096),  # 94 layers: + 2 = 96
])
def test_realistic_uneven_layer_counts_get_uneven_pipelines(name, devices, gbs, seq):
    """Issue 12: layer counts that do not divide by pp x vpp are searched with uneven
    splits - min-max at vpp 1, Megatron's embedding-and-loss-aware split interleaved -
    for real models, not only the tiny ones whose every split is tried. Checked on the
    search's layouts at pp 8: each split covers every layer once, over pp x vpp stages."""
    model, cluster = load_model(name), make_cluster("h100-sxm", devices)
    queue = layouts_by_bound(model, cluster, gbs, seq, SearchSpace(pp=8), True, [])
    uneven = {lay.plan.vpp for lay in queue.layouts
              if lay.plan.layer_split and len(set(lay.plan.layer_split)) > 1}
    assert 1 in uneven and any(v > 1 for v in uneven), uneven
    for lay in queue.layouts:
        stages = lay.plan.stage_layers(model.layers)
        assert sum(stages) == model.layers and len(stages) == 8 * lay.plan.vpp
        assert max(stages) - min(stages[1:-1] or stages) <= 2  # balanced: no stage far above another


def test_why_not_names_gradient_knobs_that_differ(llama13_result):
    """Issue 17's knobs (bf16 reduction, PowerSGD, bucket size, FSDP prefetch) re-rank the
    search's best plans; when the best plan carries one and an alternative does not, its
    why-not line names both settings, so the difference is not read as the other knob's."""
    r = llama13_result
    best = r.plans[0]
    knobbed = estimate(r.model, r.cluster, replace(best.plan, grad_dtype="bf16", ddp_bucket_mb=50))
    knobbed.memory_limit = r.memory_limit_gib
    plain = why_not(r)
    r2 = replace(r, plans=[knobbed] + r.plans[1:])
    lines = why_not(r2)
    assert lines and all("gradient knobs" not in line for line in plain)
    slower = [line for line in lines if "step time" in line]
    assert slower and all(line.endswith("gradient knobs: none vs the best plan's grad_dtype=bf16, ddp_bucket_mb=50")
                          for line in slower)


def test_why_not_says_why_the_partial_recompute_count():
    """Llama-3-70B on 32 A100-80GB (seq 8192, batch 64): the best plan recomputes only its first N
    layers (``recompute_layers``, partial_recompute on by default). The why-not lines say why
    that N: the public estimator puts N - 1 above the memory limit and every layer (N = 0)
    slower, with the numbers the lines print. (16 H100 did, until the memory
    intervals were held out: their confident limit, usable / 1.35, now leaves full recompute.)"""
    model, cluster = load_model("llama3-70b"), make_cluster("a100-80gb", 32)
    result = search_plans(model, cluster, 64, 8192)
    best = result.best
    n = best.plan.recompute_layers
    assert best.plan.recompute == "full" and 1 < n < max(best.plan.stage_layers(model.layers))
    lines = [line for line in why_not(result) if line.startswith("recompute_layers=")]
    assert len(lines) == 2
    fewer = estimate(model, cluster, best.plan.with_(recompute_layers=n - 1))
    every = estimate(model, cluster, best.plan.with_(recompute_layers=0))
    # N is solved at P(fit) = 1 (partita.uncertainty): the confident limit, below the memory limit
    assert fewer.peak_memory_gib > result.confident_limit_gib >= every.peak_memory_gib
    assert result.confident_limit_gib <= result.memory_limit_gib
    assert every.step_time_s > best.step_time_s
    assert lines[0].startswith(f"recompute_layers={n - 1} ({fewer.plan.summary()}): ")
    assert (f"needs {fewer.peak_memory_gib:.1f} GiB, over the {result.confident_limit_gib:.1f} GiB that fit "
            "with P(fit) 1") in lines[0]
    assert lines[1].startswith(f"recompute_layers=0 ({every.plan.summary()}): ")
    assert f"({every.step_time_s:.2f} s vs {best.step_time_s:.2f} s)" in lines[1]


def test_why_not_a_faster_plan_names_its_risk():
    """Ranking is step time / P(fit) (partita.uncertainty.risk_adjusted): an alternative that
    is faster but riskier is explained by the numbers that ranked it lower - its P(fit), peak
    and risk-adjusted time, computed here from its own estimate - not by "the largest increase"
    of a plan that has none. Llama-3-70B on 24 H100, batch 48: such alternatives exist."""
    from partita import uncertainty as unc
    model, cluster = load_model("llama3-70b"), make_cluster("h100-sxm", 24)
    result = search_plans(model, cluster, 48, 4096)
    best = result.best
    faster = [line for line in why_not(result) if " but P(fit) " in line]
    assert faster
    for line in faster:  # "-8% step time (3.92 s vs 4.28 s) but P(fit) 0.79 vs 1.00 (...): step time / P(fit) 4.97 s vs 4.28 s"
        step, best_step = (float(x) for x in line.split("step time (")[1].split(")")[0].replace(" s", "").split(" vs "))
        assert step < best_step
        p_alt = float(line.split("but P(fit) ")[1].split(" vs ")[0])
        key_alt, key_best = (float(x) for x in line.rsplit("P(fit) ", 1)[1].replace(" s", "").split(" vs "))
        assert key_alt == pytest.approx(step / p_alt, rel=0.02, abs=0.01) and key_alt >= key_best
        assert key_best == pytest.approx(unc.risk_adjusted(best.step_time_s, best.p_fit), abs=0.006)
