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
