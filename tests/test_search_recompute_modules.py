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

from partita.cli import main
from partita.search.recompute_modules import candidate_lists
from partita.spec.load import load_model

#: transformer_config.py l.1945-1957 (the modules of architectures Partita models)
MEGATRON_ALLOWED = {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"}
#: Llama-3-8B at 16K tokens on 8 H100s with tp 2, dp 4, ZeRO 1 fixed: it needs recompute to fit
FIXED = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "8", "--seq-len", "16384",
         "--global-batch", "64", "--tp", "2", "--cp", "1", "--pp", "1", "--zero", "1", "--top", "3"]


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
