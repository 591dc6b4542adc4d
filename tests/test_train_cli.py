"""`partita train`: same losses under different plans, early one-line errors, no hang on a crash."""
import json
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")


def train(*args, env=None, timeout=600):
    cmd = [sys.executable, "-m", "partita", "train", "--steps", "5", "--json", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def losses(proc):
    """The step records' losses (not the eval records nor the final summary)."""
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return [r["loss"] for r in records if "event" not in r]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Runs without --run-dir go to runs/<timestamp> in the working directory: a temp one."""
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("model,plan,nproc", [("tiny-llama", "dp=2,tp=2", 4), ("tiny-moe", "dp=2,ep=2", 2)])
def test_same_losses_as_one_process(model, plan, nproc):
    parallel = losses(train("--model", model, "--plan", plan, "--nproc", str(nproc)))
    single = losses(train("--model", model, "--plan", "dp=1", "--nproc", "1"))
    assert len(parallel) == len(single) == 5
    for a, b in zip(parallel, single):
        assert a == pytest.approx(b, rel=1e-5)


@pytest.mark.parametrize("plan,nproc,needle", [
    ("dp=3", 4, "must equal the device count 4"),
    ("tp=3", 3, "attention heads (4) must be divisible by tp=3"),
    ("pp=3", 3, "layers (4) must be divisible by pp*vpp"),
])
def test_bad_plan_fails_before_launch(plan, nproc, needle):
    t0 = time.time()
    proc = train("--model", "tiny-llama", "--plan", plan, "--nproc", str(nproc), timeout=60)
    assert proc.returncode == 2
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert time.time() - t0 < 20  # no process group was started


def test_crashing_rank_ends_the_job_with_its_error():
    t0 = time.time()
    proc = train("--model", "tiny-llama", "--plan", "dp=2", "--nproc", "2", "--timeout-s", "60",
                 env={"PARTITA_CRASH_RANK": "1"}, timeout=240)
    assert proc.returncode != 0
    assert "injected crash on rank 1" in proc.stderr
    assert time.time() - t0 < 200


def test_hung_job_is_stopped_with_a_clear_error():
    # every rank stops making progress at step 2 (no collective fails, so no process-group
    # timeout fires): the launcher's watchdog ends the job 2 x --timeout-s after step 1
    t0 = time.time()
    proc = train("--model", "tiny-llama", "--plan", "dp=2", "--nproc", "2", "--steps", "4", "--timeout-s", "5",
                 env={"PARTITA_HANG_STEP": "2"}, timeout=240)
    assert proc.returncode == 1
    assert "no training step finished in" in proc.stderr and "hung" in proc.stderr
    assert time.time() - t0 < 90


def test_train_flags_are_the_config_fields():
    # every TrainConfig / LaunchConfig field offered on `partita train` is a flag with the
    # field's default; derived fields (progress, the prediction) are not flags
    import dataclasses

    from partita.cli import build_parser
    from partita.train.config import LaunchConfig, TrainConfig
    args = build_parser().parse_args(["train", "--model", "tiny-llama"])
    for cls in (TrainConfig, LaunchConfig):
        for f in dataclasses.fields(cls):
            offered = "train" in f.metadata["commands"]
            assert hasattr(args, f.name) == offered, f.name
            if offered and f.name != "model":
                assert getattr(args, f.name) == f.default, f.name
    assert not hasattr(args, "profile_dir") and not hasattr(args, "predicted_step_s")
    prof = build_parser().parse_args(["profile", "--model", "tiny-llama", "--profile-dir", "x", "--lr", "0.1"])
    assert (prof.profile_dir, prof.lr, prof.steps) == ("x", 0.1, 5)


def test_a_new_field_becomes_a_flag():
    # adding an option is one field: its flag, type, choices, default and --no- form follow
    import argparse
    from dataclasses import dataclass

    from partita.cli.common import add_config_arguments, config_from_args
    from partita.train.config import option

    @dataclass(frozen=True)
    class Extra:
        model: str = option(help="m")
        weight_decay: float = option(0.0, "AdamW weight decay")
        skip_nonfinite: bool = option(True, "skip a step whose loss is not finite")
        kind: str = option("a", "k", choices=("a", "b"))
        hidden: int = option(3, "not a flag", commands=())

    p = argparse.ArgumentParser()
    add_config_arguments(p, Extra, "train")
    cfg = config_from_args(Extra, p.parse_args(["--model", "x", "--weight-decay", "0.1", "--no-skip-nonfinite"]))
    assert cfg == Extra(model="x", weight_decay=0.1, skip_nonfinite=False, kind="a", hidden=3)
    with pytest.raises(SystemExit):
        p.parse_args(["--model", "x", "--kind", "c"])
    with pytest.raises(SystemExit):
        p.parse_args([])  # --model is required: the field has no default


def test_run_dir_holds_plan_and_config_and_the_worker_gets_only_it(tmp_path):
    # the launcher's preparation (no processes started): train.json is the config the
    # worker will read, with the values the launcher derives filled in
    from partita.plan import Plan
    from partita.train.config import LaunchConfig, TrainConfig
    from partita.train.launch import prepare_run
    config = TrainConfig(model="tiny-llama", steps=7, lr=0.01, optimizer="sgd", momentum=0.9, json=True)
    launch = LaunchConfig(plan="dp=2", nproc=2, hardware="cpu", run_dir=str(tmp_path / "run"))
    run = prepare_run(config, launch, say=print)
    assert run.command[-3:] == ["-m", "partita.train.worker", str(tmp_path / "run")]
    saved = TrainConfig.load(tmp_path / "run")
    assert saved == run.config
    assert (saved.steps, saved.lr, saved.optimizer, saved.momentum, saved.progress) == (7, 0.01, "sgd", 0.9, False)
    assert saved.predicted_step_s > 0 and saved.peak_flops > 0 and saved.model_flops_per_token > 0
    assert Plan.load(tmp_path / "run" / "plan.json") == run.plan and run.plan.dp == 2
    (tmp_path / "run" / "train.json").write_text(json.dumps({**saved.to_dict(), "bogus": 1}))
    from partita.errors import PartitaError
    with pytest.raises(PartitaError, match="unknown option"):
        TrainConfig.load(tmp_path / "run")
