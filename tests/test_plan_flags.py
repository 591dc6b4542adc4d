"""Plan flags generated from the Plan fields (issue 31 item 2): one check per field for
flags, plan strings and plan files; one reader of a ``--plan`` value for every command."""
import json

import pytest

from partita.cli import main
from partita.errors import PartitaError
from partita.plan import Plan, plan_fields_of, validate

E = ["estimate", "--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "16"]
P = ["plan", "--model", "llama-7b", "--hardware", "h100-sxm", "--devices", "16", "--global-batch", "64", "--top", "1"]


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err.strip()


@pytest.mark.parametrize("flag, value, words", [
    ("--tp", "0", "tp must be from 1 to 16,777,216, got 0"),
    ("--mbs", "-1", "mbs must be from 1 to 16,777,216, got -1"),
    ("--zero", "7", "zero must be 0, 1, 2 or 3, got 7"),
    ("--recompute", "most", "recompute must be one of none, selective, full, got 'most'"),
    ("--fsdp-prefetch", "9", "fsdp_prefetch must be from 1 to 8, got 9"),
    ("--attention", "flash2", "attention must be fused or unfused, got 'flash2'"),
])
def test_a_flag_and_a_plan_string_are_refused_in_the_same_words(flag, value, words, capsys):
    name = words.split()[0]
    code, _, err = run(E + ["--global-batch", "64", flag, value], capsys)
    assert code == 2 and err.startswith("partita: error: estimate: argument")
    assert f"{flag}: {words.split(' ', 1)[1]}" in err and len(err.splitlines()) == 1
    with pytest.raises(PartitaError) as e:
        Plan.parse(f"{name}={value}", world_size=16)
    assert str(e.value) == f"plan: {words}"
    assert any(words in line for line in validate(Plan.from_dict({name: value})))  # a plan file: the same line


def test_flags_plan_string_json_and_file_give_one_plan(tmp_path, capsys):
    flags = run(E + ["--tp", "2", "--pp", "2", "--global-batch", "64", "--json"], capsys)
    text = run(E + ["--plan", "tp=2,pp=2,gbs=64", "--json"], capsys)
    as_json = run(E + ["--plan", json.dumps({"dp": 4, "tp": 2, "pp": 2, "gbs": 64}), "--json"], capsys)
    (tmp_path / "p.json").write_text(flags[1])
    from_file = run(E + ["--plan", str(tmp_path / "p.json"), "--json"], capsys)
    plans = [json.loads(out)["plan"] for code, out, _ in (flags, text, as_json, from_file)]
    assert all(code == 0 for code, _, _ in (flags, text, as_json, from_file))
    assert plans[0]["dp"] == 4 and all(p == plans[0] for p in plans)  # dp filled the devices the same way


def test_fields_without_flags_before_now_have_them(capsys):
    code, out, _ = run(E + ["--tp", "2", "--gbs", "64", "--zero", "3", "--dp-shard", "2", "--grad-accum-mode",
                            "unsharded", "--attention", "unfused", "--no-overlap-grad-reduce", "--json"], capsys)
    plan = json.loads(out)["plan"]
    assert code == 0 and plan["gbs"] == 64 and plan["dp_shard"] == 2 and plan["grad_accum_mode"] == "unsharded"
    assert plan["attention"] == "unfused" and plan["overlap_grad_reduce"] is False


def test_plan_beside_a_plan_flag_is_refused(capsys):
    code, _, err = run(E + ["--plan", "tp=2", "--attention", "unfused"], capsys)
    assert code == 2 and "drop --attention" in err


def test_export_takes_a_plan_string(capsys):
    code, out, err = run(["export", "--to", "megatron", "tp=2,pp=2,dp=2,gbs=16"], capsys)
    assert code == 0 and "--tensor-model-parallel-size 2" in out, err


def test_plan_compares_a_plan_given_as_fields(capsys):
    code, out, err = run(P + ["--plan", "tp=4,pp=2", "--json"], capsys)
    mine = json.loads(out)["from_plan"]
    assert code == 0 and mine["plan"]["tp"] == 4 and mine["plan"]["dp"] == 2, err
    assert mine["comparison"].startswith("your plan (dp2 tp4")


def test_train_plan_options_use_the_plan_check(capsys):
    code, _, err = run(["train", "--model", "tiny-llama", "--global-batch", "0"], capsys)
    assert code == 2 and "must be from 1 to 16,777,216, got 0" in err


def test_launcher_bridge_reads_plan_fields_by_flag():
    """What train/resolve.py's batch_flags can call: the plan fields a LaunchConfig sets."""
    from partita.train.config import LaunchConfig
    launch = LaunchConfig(global_batch=8, mbs=2, grad_dtype="bf16")
    assert plan_fields_of(launch, ("gbs", "seq_len", "mbs")) == {"gbs": 8, "mbs": 2}
    assert plan_fields_of(launch) == {"gbs": 8, "mbs": 2, "grad_dtype": "bf16"}


def test_sample_len_longer_than_the_sequence_is_one_line(capsys):
    code, out, err = run(E + ["--global-batch", "64", "--seq-len", "4096", "--sample-len", "99999"], capsys)
    assert code != 0 and not out
    assert "sample_len 99999 must be at most seq_len 4096" in err and len(err.splitlines()) == 1
    assert run(E + ["--global-batch", "64", "--seq-len", "4096", "--sample-len", "4096"], capsys)[0] == 0


def test_optimizer_offload_zero_its_default_is_taken_everywhere(tmp_path, capsys):
    """0 (nothing offloaded, the default) is inside the field's range "0 to 1"; the float check
    refused every number <= 0 before the field had bounds."""
    code, out, err = run(E + ["--global-batch", "64", "--optimizer-offload", "0", "--json"], capsys)
    assert code == 0, err
    assert Plan.parse("optimizer_offload=0", world_size=16).optimizer_offload == 0.0
    (tmp_path / "p.json").write_text(json.dumps({"dp": 16, "gbs": 64, "optimizer_offload": 0}))
    code, out, err = run(E + ["--plan", str(tmp_path / "p.json"), "--json"], capsys)
    assert code == 0, err
    for value in ("1.5", "-0.1"):  # outside: the same words from the flag, a plan string and the Python API
        code, _, err = run(E + ["--global-batch", "64", "--optimizer-offload", value], capsys)
        assert code == 2 and f"is the fraction of the optimizer states in host memory, from 0 to 1, got {value}" in err and len(err.splitlines()) == 1
        assert validate(Plan(optimizer_offload=float(value))) == \
            [f"optimizer_offload is the fraction of the optimizer states in host memory, from 0 to 1, got {float(value)}"]


def test_python_api_values_of_another_type_are_one_line_each():
    assert validate(Plan(optimizer_offload="0.5")) == ["optimizer_offload must be a number, got '0.5'"]
    assert validate(Plan(tp="2")) == ["tp must be an integer, got '2'"]


@pytest.mark.parametrize("given, canonical", [
    (["mlp"], "mlp"), ("mlp,mlp", "mlp"), ("layernorm,mlp", "layernorm,mlp"), ("mlp,layernorm", "layernorm,mlp"),
    ("mlp,,core_attn", "core_attn,mlp"), (["moe", "mlp", "MLP"], "mlp,moe"),
])
def test_recompute_modules_are_one_canonical_set(given, canonical):
    """A list (Python, a JSON plan file) or a string, repeats, blanks and order give one plan
    (Megatron-Core checks the modules as a set: transformer_config.py)."""
    from_python = Plan(recompute="selective", recompute_modules=given)
    from_file = Plan.from_dict({"recompute": "selective", "recompute_modules": given})
    assert from_python.recompute_modules == from_file.recompute_modules == canonical
    assert from_python == from_file and validate(from_python) == []


def test_unknown_recompute_modules_name_the_known_ones(capsys):
    known = "core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts"
    assert validate(Plan(recompute="selective", recompute_modules=["mlp", "attn"])) == \
        [f"recompute_modules must be comma-separated modules among {known} (Megatron-Core transformer_config.py), "
         "got 'attn'"]
    code, _, err = run(E + ["--global-batch", "64", "--recompute", "selective", "--recompute-modules", "mlp,attn"],
                       capsys)
    assert code == 2 and f"among {known}" in err and "got 'attn'" in err and len(err.splitlines()) == 1


def test_estimate_names_the_time_it_leaves_out_of_offload_and_module_recompute(capsys):
    """--optimizer-offload prices the device bytes only (no host step, no device-host copies): every
    estimate of such a plan says so, not only one read from a script (whose importer's note is not
    repeated). --recompute-modules is timed as the modules' forward (cost/compute.py
    module_recompute_forward): nothing to name."""
    from partita.cli.estimate import plan_time_notes
    from partita.imports.megatron import OFFLOAD_TIME_NOTE
    argv = E + ["--global-batch", "64", "--optimizer-offload", "0.5", "--recompute", "selective",
                "--recompute-modules", "mlp,core_attn"]
    code, out, _ = run(argv + ["--json"], capsys)
    notes = json.loads(out)["not_modelled"]
    assert code == 0 and len(notes) == 1
    assert notes[0].startswith("optimizer_offload=0.5: the optimizer step on the host")
    code, out, _ = run(argv, capsys)
    assert code == 0 and [l for l in out.splitlines() if l.startswith("not modelled: ")] == \
        [f"not modelled: {n}" for n in notes]
    code, out, _ = run(E + ["--global-batch", "64", "--json"], capsys)  # neither field: nothing to name
    assert code == 0 and json.loads(out)["not_modelled"] == []
    assert plan_time_notes(Plan(dp=16, gbs=64, optimizer_offload=1.0), (OFFLOAD_TIME_NOTE,)) == []


@pytest.mark.parametrize("module, words", [
    ("moe_act", "recompute_modules moe_act needs a mixture-of-experts model"),
    ("mla_up_proj", "recompute_modules mla_up_proj needs multi-latent attention"),
])
def test_recompute_modules_the_model_lacks_are_refused_by_validate(module, words):
    """Megatron-Core refuses moe_act without --moe-grouped-gemm and mla_up_proj without
    --multi-latent-attention (transformer_config.py); the estimate priced nothing for them."""
    from partita.spec.load import load_model
    plan = Plan(dp=8, gbs=8, recompute="selective", recompute_modules=module)
    errs = validate(plan, load_model("llama3-8b"))
    assert len(errs) == 1 and errs[0].startswith(words) and errs[0].endswith("llama3-8b is dense" if module == "moe_act"
                                                                              else "llama3-8b has none")
    assert validate(plan.with_(ep=8), load_model("deepseek-v3")) == []  # MoE with MLA: both accepted


@pytest.mark.parametrize("fields, words", [
    ({"optimizer_offload": 0.5}, "optimizer_offload=0.5 under framework megatron needs zero 1-3"),
    ({"moment_dtype": "bf16"}, "moment_dtype=bf16 under framework megatron needs zero 1-3"),
])
def test_megatron_precision_aware_optimizer_needs_the_distributed_optimizer(fields, words):
    """Megatron-Core: "--use-precision-aware-optimizer only supported with distributed optimizer"
    (megatron/core/optimizer/__init__.py get_megatron_optimizer); both fields need that flag."""
    errs = validate(Plan(dp=8, gbs=8, zero=0, **fields))
    assert len(errs) == 1 and errs[0].startswith(words)
    assert validate(Plan(dp=8, gbs=8, zero=1, **fields)) == []
    assert validate(Plan(dp=8, gbs=8, zero=0, framework="torchtitan", **fields)) == []  # not Megatron's rule


def test_a_module_list_of_separators_only_is_one_line(capsys):
    """--recompute-modules ",," used to fold to no list at all (op-level selective) without a word."""
    code, _, err = run(E + ["--global-batch", "64", "--recompute", "selective", "--recompute-modules", ",,"], capsys)
    assert code == 2 and "names no module" in err and len(err.splitlines()) == 1
