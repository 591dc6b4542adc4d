"""``partita plan`` keeps what the user's script chose (issue 33: a layout that ran must not be ruled
out): Megatron's ``--optimizer-cpu-offload`` / ``--optimizer-offload-fraction`` (plan
``optimizer_offload``), ``--use-precision-aware-optimizer --exp-avg-dtype`` (``moment_dtype``) and
``--recompute-modules`` (``recompute_modules``) are carried by every candidate of ``plan --from-script``
and of the ``--optimizer-offload`` / ``--moment-dtype`` / ``--recompute-modules`` flags, and ``plan``
names what the estimate leaves untimed for its plans as ``estimate`` does.

Oracles, none of them the search itself: the launch scripts' own flags (real scripts under
tests/data/launch_configs, each citing the repository@commit it follows), ``partita estimate`` of the
same script or plan (a cross-command check: before, ``plan --from-script`` priced its candidates without
the script's offload and module list), and Megatron-LM's rules (megatron/core/optimizer/__init__.py:
the precision-aware optimizer and CPU offload need the distributed optimizer; arguments.py: the modules
are read with ``--recompute-granularity selective`` only). In-process CLI calls, small searches.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from partita.cli import main

DATA = Path(__file__).parent / "data" / "launch_configs"
#: alibaba/Pai-Megatron-Patch@a098ca5acbdeaf7172ce0393fa309b39a77506db:examples/moonlight/run_mcore_moonlight.sh
#: (trimmed; the .expected.json beside it): Moonlight-16B-A3B on 8 GPUs, ep 8, optimizer offload 0.5
MOONLIGHT = DATA / "pai" / "moonlight_optimizer_offload_fraction.sh"
MOONLIGHT_ARGS = ["--args", "dsw A3B 1 32 4096 1 1 1 8 false 0.5", "--hardware", "h100-sxm", "--devices", "8"]
#: NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553:tests/functional_tests/test_cases/mixtral/
#: deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release/model_config.yaml (as a script): 64 GPUs,
#: --recompute-granularity selective --recompute-modules mla_up_proj moe_act
PROXY = DATA / "megatron" / "deepseek_v3_proxy_layout.sh"
PROXY_MODULES = {"mla_up_proj", "moe_act"}  # the script's --recompute-modules


def _json(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_every_proposal_carries_the_scripts_offload(capsys):
    out = _json(capsys, ["plan", "--from-script", str(MOONLIGHT), *MOONLIGHT_ARGS, "--top", "3"])
    assert out["from_script"]["plan"]["optimizer_offload"] == 0.5  # --optimizer-offload-fraction 0.5 in the file
    assert len(out["plans"]) == 3
    for proposal in out["plans"]:
        assert proposal["plan"].get("optimizer_offload") == 0.5, proposal["plan"]
        assert proposal["plan"]["zero"] >= 1  # Megatron's CPU offload runs in the distributed optimizer


def test_the_scripts_layout_is_priced_as_estimate_prices_the_script(capsys):
    """The search fixed to the script's layout proposes it, with the memory ``estimate --from-script``
    gives the script, part by part (before: the optimizer part without the offload, 2x larger). The
    step times differ only where the search proposes the overlap knobs the script leaves off."""
    est = _json(capsys, ["estimate", "--from-script", str(MOONLIGHT), *MOONLIGHT_ARGS])
    layout = ["--tp", "1", "--pp", "1", "--ep", "8", "--mbs", "1", "--zero", "1", "--recompute", "none"]
    plan = _json(capsys, ["plan", "--from-script", str(MOONLIGHT), *MOONLIGHT_ARGS, *layout, "--top", "1"])
    mine = plan["plans"][0]
    knobs = ("tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather")
    assert {k: v for k, v in mine["plan"].items() if k not in knobs} == \
        {k: v for k, v in est["plan"].items() if k not in knobs}
    assert mine["memory"] == est["memory"] and mine["peak_memory_gib"] == est["peak_memory_gib"]
    assert {k: v for k, v in mine["time"].items() if k != "dp gradient sync"} == \
        {k: v for k, v in est["time"].items() if k != "dp gradient sync"}
    assert mine["p_fit"] == est["p_fit"]


def test_plan_names_the_untimed_host_step_as_estimate_does(capsys, tmp_path):
    out = _json(capsys, ["plan", "--from-script", str(MOONLIGHT), *MOONLIGHT_ARGS, "--top", "2"])
    best = out["plans"][0]
    plan_file = tmp_path / "best.json"
    plan_file.write_text(json.dumps(best["plan"]))
    est = _json(capsys, ["estimate", "--plan", str(plan_file), "--hardware", "h100-sxm", "--devices", "8",
                         "--model", str(_script_model(capsys, tmp_path))])
    assert best["not_modelled"] == est["not_modelled"] and len(est["not_modelled"]) == 1
    assert "host" in est["not_modelled"][0]
    capsys.readouterr()
    assert main(["plan", "--from-script", str(MOONLIGHT), *MOONLIGHT_ARGS, "--top", "2"]) == 0
    text = capsys.readouterr().out
    assert f"plan 1, not modelled: {best['not_modelled'][0]}" in text.splitlines()


def _script_model(capsys, tmp_path) -> Path:
    """The Moonlight model the script defines, as a model file (``partita import --json``'s "model")."""
    out = _json(capsys, ["import", str(MOONLIGHT), "--args", MOONLIGHT_ARGS[1]])
    path = tmp_path / "moonlight.json"
    path.write_text(json.dumps(out["model"]))
    return path


def test_selective_proposals_carry_the_scripts_modules(capsys, tmp_path):
    """With selective recompute fixed, every proposal recomputes the script's modules, and its
    memory is the estimate of that plan with the modules written out (before: priced as Partita's
    op-level selective, another activation figure)."""
    out = _json(capsys, ["plan", "--from-script", str(PROXY), "--hardware", "h100-sxm", "--recompute", "selective",
                         "--top", "2"])
    assert set(out["from_script"]["plan"]["recompute_modules"].split(",")) == PROXY_MODULES
    for proposal in out["plans"]:
        assert proposal["plan"]["recompute"] == "selective" and not proposal["plan"].get("recompute_layers")
        assert set(proposal["plan"]["recompute_modules"].split(",")) == PROXY_MODULES
    best = dict(out["plans"][0]["plan"], recompute_modules=",".join(sorted(PROXY_MODULES)))
    plan_file = tmp_path / "best.json"
    plan_file.write_text(json.dumps(best))
    model = tmp_path / "proxy.json"
    model.write_text(json.dumps(_json(capsys, ["import", str(PROXY)])["model"]))
    est = _json(capsys, ["estimate", "--plan", str(plan_file), "--hardware", "h100-sxm", "--devices", "64",
                         "--model", str(model)])
    assert est["memory"]["activations"] == out["plans"][0]["memory"]["activations"]
    assert est["peak_memory_gib"] == out["plans"][0]["peak_memory_gib"]
    assert est["step_time_s"] == out["plans"][0]["step_time_s"]  # the modules' recompute timed alike
    assert est["not_modelled"] == out["plans"][0]["not_modelled"]  # and what is left untimed named alike


def test_modules_leave_candidates_without_selective_recompute(capsys):
    """Free recompute: the proposals with recompute none or full run without the module list
    (Megatron reads it with selective granularity only), so each is a valid, exportable plan."""
    from partita.plan import Plan, validate
    out = _json(capsys, ["plan", "--from-script", str(PROXY), "--hardware", "h100-sxm", "--top", "3"])
    assert any(p["plan"]["recompute"] != "selective" for p in out["plans"])
    for proposal in out["plans"]:
        plan = proposal["plan"]
        assert bool(plan.get("recompute_modules")) == (plan["recompute"] == "selective")
        assert not [e for e in validate(Plan.from_dict(plan)) if "recompute_modules" in e]


def test_moment_dtype_flag_without_data_parallelism_takes_the_distributed_optimizer(capsys):
    """``--moment-dtype bf16`` on tp 8 x 8 GPUs (dp 1): Megatron raises without the distributed
    optimizer, so the plan is zero 1 (zero 0 before), and its optimizer memory is that of the
    same plan estimated with the flag."""
    common = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "8"]
    out = _json(capsys, ["plan", *common, "--tp", "8", "--moment-dtype", "bf16", "--top", "1"])
    best = out["plans"][0]
    assert best["plan"]["dp"] == 1 and best["plan"]["zero"] == 1 and best["plan"]["moment_dtype"] == "bf16"
    p = best["plan"]
    est = _json(capsys, ["estimate", *common, "--tp", "8", "--pp", str(p["pp"]), "--mbs", str(p["mbs"]),
                         "--global-batch", str(p["gbs"]), "--zero", "1", "--recompute", p["recompute"],
                         "--moment-dtype", "bf16"])
    assert est["memory"]["optimizer"] == best["memory"]["optimizer"]
    fp32 = _json(capsys, ["plan", *common, "--tp", "8", "--top", "1"])["plans"][0]
    assert fp32["memory"]["optimizer"] > best["memory"]["optimizer"]  # the moments really are narrower


@pytest.mark.parametrize("flags,words", [
    (["--recompute-modules", "core_attn", "--recompute", "full"], "needs recompute selective"),
    (["--recompute-modules", "core_attn", "--no-recompute"], "needs recompute selective"),
    (["--optimizer-offload", "1", "--zero", "0"], "distributed optimizer"),
    (["--moment-dtype", "bf16", "--zero", "0"], "distributed optimizer"),
    (["--recompute-modules", "moe_act"], "mixture-of-experts"),
    (["--optimizer-offload", "1.5"], "from 0 to 1"),
])
def test_bad_choice_flags_are_one_line_errors(capsys, flags, words):
    capsys.readouterr()
    assert main(["plan", "--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "8", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("partita") and words in err, err
