"""``partita plan`` offers Megatron's ``--recompute-modules`` lists as candidates (search/recompute_modules.py).

Oracles from outside the search: Megatron-Core's own rules for the lists (NVIDIA/Megatron-LM@d98e8a64dd
megatron/core/transformer/transformer_config.py l.1943-1973: the allowed modules; moe_act only with grouped
GEMM, i.e. a MoE model; mla_up_proj only with multi-latent attention), ``partita estimate`` of the proposed
plan (a cross-command check: the ranking shows what estimate says of the plan), and ``partita export --to
megatron`` of it (the flags Megatron reads). In-process CLI calls, small fixed-layout searches.
"""
from __future__ import annotations

import json

import pytest

from partita import uncertainty as unc
from partita.cli import main
from partita.estimate import estimate
from partita.plan import Plan
from partita.search.recompute_modules import candidate_lists
from partita.spec.hardware import make_cluster
from partita.spec.load import load_model

#: transformer_config.py l.1945-1957 (the modules of architectures Partita models)
MEGATRON_ALLOWED = {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"}
#: Llama-3-8B at 16K tokens on 8 H100s with tp 2, dp 4, ZeRO 1 fixed: it needs recompute to fit
FIXED = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "8", "--seq-len", "16384",
         "--global-batch", "64", "--tp", "2", "--cp", "1", "--pp", "1", "--zero", "1", "--top", "3"]


#: Mixtral-8x7B at 8K tokens on 16 H100s capped at 60 GiB: free layout search (the module-list plan that
#: wins is of a layout whose plans without a list rank below the search's best 5)
CAPPED_MOE = ["--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--devices", "16", "--seq-len", "8192",
              "--global-batch", "128", "--max-memory-gib", "60", "--top", "5"]


def _json(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", ["llama3-8b", "mixtral-8x7b", "deepseek-v3"])
def test_the_lists_are_ones_megatron_accepts_for_the_model(name):
    model = load_model(name)
    lists = [set(modules.split(",")) for modules in candidate_lists(model)]
    assert lists and all(mods <= MEGATRON_ALLOWED for mods in lists)
    used = set().union(*lists)
    assert ("moe_act" in used) == bool(model.moe)  # grouped-GEMM experts: MoE models only
    assert ("mla_up_proj" in used) == bool(model.mla)
    assert ("shared_experts" in used) == bool(model.moe and model.moe.shared_experts)


def test_a_module_list_is_proposed_and_priced_as_estimate_prices_it(capsys, tmp_path):
    out = _json(capsys, ["plan", *FIXED])
    lists = [p for p in out["plans"] if p["plan"].get("recompute_modules")]
    assert lists, [p["plan"] for p in out["plans"]]  # before: every selective candidate ran core_attn only
    proposal = lists[0]
    assert proposal["plan"]["recompute"] == "selective"
    assert proposal["plan"]["recompute_modules"] in candidate_lists(load_model("llama3-8b"))
    assert proposal["p_fit"] >= out["plans"][0]["min_p_fit"]
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(proposal["plan"]))
    est = _json(capsys, ["estimate", "--plan", str(plan_file), "--model", "llama3-8b", "--hardware", "h100-sxm",
                         "--devices", "8"])
    assert est["step_time_s"] == proposal["step_time_s"] and est["peak_memory_gib"] == proposal["peak_memory_gib"]
    assert any(line.startswith("recompute selective --recompute-modules") for line in out["why_not"])
    capsys.readouterr()
    assert main(["export", str(plan_file), "--to", "megatron", "--model", "llama3-8b", "--hardware", "h100-sxm",
                 "--devices", "8"]) == 0
    text = capsys.readouterr().out
    words = text.split()
    assert "--recompute-granularity" in words and words[words.index("--recompute-granularity") + 1] == "selective"
    at = words.index("--recompute-modules")
    assert set(proposal["plan"]["recompute_modules"].split(",")) == set(words[at + 1:at + 1 + len(
        proposal["plan"]["recompute_modules"].split(","))])


def test_recompute_full_gets_no_selective_list_plans(capsys):
    """--recompute full fixes the setting: no plan of the ranking recomputes selectively (the
    post-pass added list variants before)."""
    out = _json(capsys, ["plan", *FIXED, "--recompute", "full"])
    assert out["plans"] and all(p["plan"].get("recompute", "none") == "full" for p in out["plans"])


def test_mindspeed_dualpipev_without_ep_refuses_moe_act_beside_mc2():
    """DualPipeV keeps grouped GEMM only through --moe-fb-overlap, which the export writes with ep > 1
    (export/megatron.py _dualpipev_args): at ep 1 a moe_act list beside MC2 is one the export refuses."""
    from partita.search.recompute_modules import framework_refuses
    model = load_model("mixtral-8x7b")
    plan = Plan(tp=2, sp=True, pp=2, vpp=2, schedule="dualpipev", ep=1, dp=1, mbs=1, gbs=8, seq_len=4096,
                framework="mindspeed", recompute="selective", recompute_modules="core_attn,layernorm,moe_act")
    assert framework_refuses(plan, model)
    assert not framework_refuses(plan.with_(ep=2, dp=2, gbs=16), model)


def test_no_module_lists_and_a_users_list_keep_the_search_as_it_was(capsys):
    plain = _json(capsys, ["plan", *FIXED, "--no-module-lists"])
    assert not any(p["plan"].get("recompute_modules") for p in plain["plans"])
    assert not any("--recompute-modules" in line for line in plain["why_not"])
    mine = _json(capsys, ["plan", *FIXED, "--recompute-modules", "core_attn"])
    assert {p["plan"].get("recompute_modules") for p in mine["plans"] if p["plan"]["recompute"] == "selective"} \
        <= {"core_attn"}


def test_op_level_frameworks_get_no_module_lists(capsys):
    fsdp = [("3" if word == "1" and FIXED[i - 1] == "--zero" else word) for i, word in enumerate(FIXED)]
    out = _json(capsys, ["plan", *fsdp, "--framework", "torchtitan"])  # torchtitan shards with FSDP2 (zero 3)
    assert any(p["plan"]["recompute"] != "none" for p in out["plans"])
    assert not any(p["plan"].get("recompute_modules") for p in out["plans"])
    assert not any("--recompute-modules" in line for line in out["why_not"])


def _export_flags(capsys, tmp_path, plan: dict, model: str, devices: str) -> list[str]:
    """``partita export --to megatron`` of ``plan``: the launch words."""
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    capsys.readouterr()
    assert main(["export", str(plan_file), "--to", "megatron", "--model", model, "--hardware", "h100-sxm",
                 "--devices", devices]) == 0, capsys.readouterr().err
    return capsys.readouterr().out.split()


def test_only_a_module_list_fits_and_the_search_finds_it(capsys, tmp_path):
    """Memory-tight: recompute fixed to selective and 60 GiB, the fixed layout fits only with a module
    list (Megatron's default core_attn leaves it at 79 GiB). Before, the lists were tried only on the
    plans the search had ranked - none here, so `partita plan` said no plan fits."""
    out = _json(capsys, ["plan", *FIXED, "--recompute", "selective", "--max-memory-gib", "60"])
    best = out["plans"][0]
    assert best["plan"]["recompute"] == "selective"
    assert best["plan"]["recompute_modules"] in candidate_lists(load_model("llama3-8b"))
    assert best["p_fit"] >= best["min_p_fit"]
    # the oracle: the public estimator says the same plan with the framework's default list cannot fit
    model, cluster = load_model("llama3-8b"), make_cluster("h100-sxm", 8)
    limit = unc.MemoryLimit.of(cluster.device, None, 60.0)
    default = estimate(model, cluster, Plan.from_dict({**best["plan"], "recompute_modules": ""}))
    default.memory_limit, default.min_p_fit = limit, best["min_p_fit"]
    assert default.p_fit < best["min_p_fit"], default.peak_memory_gib
    listed = estimate(model, cluster, Plan.from_dict(best["plan"]))
    assert listed.step_time_s == best["step_time_s"] and listed.peak_memory_gib == best["peak_memory_gib"]
    assert listed.peak_memory_gib < default.peak_memory_gib
    # the table names the list (it is not the framework's default)
    capsys.readouterr()
    assert main(["plan", *FIXED, "--recompute", "selective", "--max-memory-gib", "60"]) == 0
    assert f"selective:{best['plan']['recompute_modules']}" in capsys.readouterr().out.replace("\n", "")
    words = _export_flags(capsys, tmp_path, best["plan"], "llama3-8b", "8")
    assert words[words.index("--recompute-granularity") + 1] == "selective"
    at = words.index("--recompute-modules")
    modules = best["plan"]["recompute_modules"].split(",")
    assert set(words[at + 1:at + 1 + len(modules)]) == set(modules)


def test_a_layout_outside_the_best_five_wins_with_a_list(capsys):
    """Free search: the best plan runs a module list on a layout none of whose plans without a list is
    among the best five; the old approach (every list on those five, re-estimated here by the public
    estimator) is beaten by the search's own ranking key (step time over P(fit))."""
    new = _json(capsys, ["plan", *CAPPED_MOE])
    old = _json(capsys, ["plan", *CAPPED_MOE, "--no-module-lists"])
    model, cluster = load_model("mixtral-8x7b"), make_cluster("h100-sxm", 16)
    limit = unc.MemoryLimit.of(cluster.device, None, 60.0)

    def key(entry: dict) -> float:
        return unc.risk_adjusted(entry["step_time_s"], entry["p_fit"])

    old_keys = [key(p) for p in old["plans"]]
    for entry in old["plans"][:5]:
        if entry["plan"]["recompute"] == "none":
            continue
        for modules in candidate_lists(model):
            plan = Plan.from_dict({**entry["plan"], "recompute": "selective", "recompute_layers": 0,
                                   "recompute_modules": modules})
            est = estimate(model, cluster, plan)
            est.memory_limit, est.min_p_fit = limit, old["plans"][0]["min_p_fit"]
            if est.p_fit >= est.min_p_fit:
                old_keys.append(unc.risk_adjusted(est.step_time_s, est.p_fit))
    best = new["plans"][0]
    assert best["plan"].get("recompute_modules")
    assert key(best) < min(old_keys)

    def layout(plan: dict) -> tuple:
        return tuple(plan.get(k) for k in ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "schedule"))

    assert layout(best["plan"]) not in {layout(p["plan"]) for p in old["plans"][:5]}


@pytest.mark.parametrize("scenario", [(("llama3-70b", 4), "a100-40gb", 4, 8, 4096),
                                      (("llama3-70b", 3), "h100-sxm", 8, 4, 16384)])
def test_lists_in_the_search_match_a_brute_force_with_lists(scenario):
    """The branch and bound with module lists against tests/brute_force_search.py's enumeration (every
    valid selective plan of the space, each also with every list of candidate_lists, estimated by the
    public estimator), recompute fixed to selective (the lists' own ground: no partial plan competes),
    at three memory caps drawn from the enumeration's own peaks: the same best step time, and every plan
    the search estimated is one the enumeration found fitting, at the same step time. Three small
    layer counts keep the enumeration under a second."""
    from dataclasses import replace

    from brute_force_search import plans

    from partita.plan import validate
    from partita.search import search_plans
    from partita.search.space import SearchSpace
    (name, layers), hardware, devices, gbs, seq = scenario
    model, cluster = replace(load_model(name), layers=layers, name=f"{name}-{layers}"), make_cluster(hardware, devices)
    every = []
    for plan in plans(model, cluster, gbs, seq, "bf16", False, **SearchSpace().options):
        if plan.recompute == "selective":
            every += [estimate(model, cluster, p) for p in
                      [plan] + [plan.with_(recompute_modules=m) for m in candidate_lists(model)] if not validate(p, model)]
    peaks = sorted(e.peak_memory_gib for e in every)
    listed_best = 0
    for cap in (peaks[len(peaks) // 100], peaks[len(peaks) // 10], peaks[len(peaks) * 3 // 10]):
        fitting = sorted((e for e in every if e.peak_memory_gib <= cap), key=lambda e: e.step_time_s)
        found = search_plans(model, cluster, gbs, seq, SearchSpace(module_lists=True, recompute="selective",
                                                                   max_memory_gib=cap), top=5, risk=False)
        assert found.best is not None and found.best.step_time_s == fitting[0].step_time_s, cap
        listed_best += bool(fitting[0].plan.recompute_modules)

        def written(plan):
            return plan if plan.layer_split else plan.with_(layer_split=plan.stage_layers(model.layers))
        times = {written(e.plan): e.step_time_s for e in fitting}
        estimated = [a.estimate for a in found.attempts if a.estimate and a.plan.tp <= cluster.devices_per_node]
        assert estimated and all(times.get(written(e.plan)) == e.step_time_s for e in estimated)
    assert listed_best  # the lists decide at least one cap: the comparison exercises them


def test_export_constants_agree():
    """search/ keeps its own copy of the export's MindSpeed module list and fp8 recipes (no import of export/)."""
    from partita.export.megatron import FP8_RECIPES, MINDSPEED_RECOMPUTE_MODULES
    from partita.search.recompute_modules import MEGATRON_FP8_RECIPES, MINDSPEED_MODULES
    assert MINDSPEED_MODULES == set(MINDSPEED_RECOMPUTE_MODULES) and MEGATRON_FP8_RECIPES == set(FP8_RECIPES)


def test_mindspeed_list_plans_are_ones_its_export_writes(capsys, tmp_path):
    """Under --framework mindspeed the lists the search proposes are ones `partita export --to mindspeed`
    writes: MindSpeed-LLM refuses grouped GEMM (moe_act's kernel) beside --use-ascend-mc2 (tp > 1 with
    sp in a MoE model) unless DualPipeV's --moe-fb-overlap keeps it. Before, a capped Mixtral-8x7B search
    ranked tp 8 + sp 1F1B with moe_act, which the export refuses."""
    base = ["--model", "mixtral-8x7b", "--hardware", "ascend-910b2", "--devices", "32", "--global-batch", "128",
            "--framework", "mindspeed", "--top", "5"]
    listed = 0
    for extra in (["--seq-len", "8192", "--max-memory-gib", "50"], ["--seq-len", "16384"]):
        out = _json(capsys, ["plan", *base, *extra])
        for entry in out["plans"]:
            if not entry["plan"].get("recompute_modules"):
                continue
            listed += 1
            plan_file = tmp_path / "plan.json"
            plan_file.write_text(json.dumps(entry["plan"]))
            capsys.readouterr()
            assert main(["export", str(plan_file), "--to", "mindspeed", "--model", "mixtral-8x7b", "--hardware",
                         "ascend-910b2", "--devices", "32"]) == 0, capsys.readouterr().err
            words = capsys.readouterr().out.split()
            at = words.index("--recompute-modules")
            assert set(entry["plan"]["recompute_modules"].split(",")) <= set(words[at + 1:])
    assert listed  # a list plan was proposed and exported
