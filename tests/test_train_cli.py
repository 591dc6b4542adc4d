"""`partita train`: same losses under different plans, early one-line errors, no hang on a crash."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")


def train_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "partita", "train", "--steps", "5", "--json", *args]


def train(*args, env=None, timeout=600):
    return subprocess.run(train_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def losses(proc):
    """The step records' losses (not the eval records nor the final summary)."""
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return [r["loss"] for r in records if "event" not in r]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Runs without --run-dir go to runs/<timestamp> in the working directory: a temp one."""
    monkeypatch.chdir(tmp_path)


SAME_LOSSES = [("tiny-llama", "dp=2,tp=2", 4), ("tiny-moe", "dp=2,ep=2", 2)]


@pytest.fixture(scope="module")
def same_losses_runs(tmp_path_factory) -> dict:
    """Each case's parallel run and its one-process run: four independent runs, started
    together (tests/conftest.py run_together), each in its own run directory."""
    from conftest import run_together
    cmds = []
    for model, plan, nproc in SAME_LOSSES:
        tmp = tmp_path_factory.mktemp(f"same-{model}")
        cmds += [train_cmd("--model", model, "--plan", plan, "--nproc", str(nproc), "--run-dir", str(tmp / "parallel")),
                 train_cmd("--model", model, "--plan", "dp=1", "--nproc", "1", "--run-dir", str(tmp / "single"))]
    procs = run_together(cmds, timeout=600)
    return {case: (procs[2 * i], procs[2 * i + 1]) for i, case in enumerate(SAME_LOSSES)}


@pytest.mark.parametrize("model,plan,nproc", SAME_LOSSES)
def test_same_losses_as_one_process(model, plan, nproc, same_losses_runs):
    parallel, single = map(losses, same_losses_runs[(model, plan, nproc)])
    assert len(parallel) == len(single) == 5
    for a, b in zip(parallel, single):
        assert a == pytest.approx(b, rel=1e-5)


@pytest.mark.parametrize("plan,nproc,needle", [
    ("dp=3", 4, "must equal the device count 4"),
    ("tp=3", 3, "attention heads (4) must be divisible by tp=3"),
    ("pp=7", 7, "4 layers cannot be split over pp*vpp = 7*1 = 7 stages"),
])
@pytest.mark.timeout(60)  # in-process: a plan check that went on to launch would otherwise hold the session
def test_bad_plan_fails_before_launch(plan, nproc, needle, capfd):
    # in-process (the launcher's own main); capfd reads file descriptors 1 and 2, so a
    # torchrun or worker started from here would show its output there too
    from partita.cli.main import main
    code = main(train_cmd("--model", "tiny-llama", "--plan", plan, "--nproc", str(nproc))[3:])
    err = capfd.readouterr().err
    assert code == 2
    # one line and nothing from torchrun or a worker: refused before any process started
    assert needle in err and len(err.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def failing_runs(tmp_path_factory) -> dict:
    """The crashing and the hung job below: independent launches (each its own run directory),
    started together (tests/conftest.py run_together); a job that did not end in 240 s
    is killed and comes back as a ``TimedOut`` (failing the test that reads it)."""
    from conftest import run_together
    tmp = tmp_path_factory.mktemp("failing")
    crash, hung = run_together([
        train_cmd("--model", "tiny-llama", "--plan", "dp=2", "--nproc", "2", "--timeout-s", "60",
                  "--run-dir", str(tmp / "crash")),
        # every rank stops making progress at step 2 (no collective fails, so no process-group
        # timeout fires): the launcher's watchdog ends the job 2 x --timeout-s after step 1.
        # --timeout-s is also the process group's start-up and collective timeout: 20 s, not 5,
        # as the two ranks import torch beside the other job's (load 15-50 on 2 cores) and can
        # reach init_process_group seconds apart; the watchdog still fires 40 s after step 1
        train_cmd("--model", "tiny-llama", "--plan", "dp=2", "--nproc", "2", "--steps", "4", "--timeout-s", "20",
                  "--run-dir", str(tmp / "hung"))],
        timeout=240, envs=[{"PARTITA_CRASH_RANK": "1"}, {"PARTITA_HANG_STEP": "2"}])
    return {"crash": crash, "hung": hung}


def test_crashing_rank_ends_the_job_with_its_error(failing_runs):
    proc = failing_runs["crash"]
    assert proc.returncode != 0
    assert "injected crash on rank 1" in proc.stderr


def test_hung_job_is_stopped_with_a_clear_error(failing_runs):
    proc = failing_runs["hung"]
    assert proc.returncode == 1
    assert "no training step finished in" in proc.stderr and "hung" in proc.stderr


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
    from partita.train.resolve import prepare_run
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


def _bad_inputs(tmp):
    """Files a careless user passes (issue 16), written into ``tmp``."""
    import numpy as np
    np.save(tmp / "float.npy", np.linspace(0, 1, 100))
    np.save(tmp / "neg.npy", -np.ones(100, dtype=np.int64))
    np.save(tmp / "empty.npy", np.array([], dtype=np.int64))
    np.save(tmp / "twod.npy", np.ones((10, 10), dtype=np.int64))
    np.save(tmp / "big.npy", np.full(100, 10 ** 6, dtype=np.int64))
    (tmp / "garbage.npy").write_bytes(b"\x93NUMPYgarbage" * 10)
    (tmp / "tok.json").write_text('{"not": "a tokenizer"}')
    (tmp / "text.txt").write_text("some text " * 100)
    (tmp / "afile").write_text("x")


@pytest.mark.parametrize("args,needle", [
    ("--data float.npy", "token ids must be integers, got dtype float64"),
    ("--data neg.npy", "token id -1 is negative"),
    ("--data empty.npy", "holds 0 token(s)"),
    ("--data twod.npy", "must be a 1-D array, got shape (10, 10)"),
    ("--data big.npy", "token id 1000000 >= the model's vocabulary 256"),
    ("--data garbage.npy", "not a readable .npy array"),
    ("--data text.txt --tokenizer tok.json", "--tokenizer tok.json is not a Hugging Face tokenizer.json"),
    ("--run-dir afile", "--run-dir afile is a file"),
    ("--checkpoint-dir afile", "--checkpoint-dir afile is a file"),
    ("--run-dir /proc/partita-x", "cannot create the directory"),
    ("--lr nan", "--lr: must be a finite number in [0, 10], got nan"),
    ("--lr -1", "--lr: must be a finite number in [0, 10], got -1"),
    ("--lr 0", "--lr must be a finite number > 0"),
    ("--timeout-s 0", "--timeout-s: must be from 1 to"),
    ("--seed 99999999999999999999", "--seed: must be from 0 to 2,147,483,647"),
    ("--max-grad-norm -1", "--max-grad-norm: must be a finite number in [0,"),
    ("--resume", "--resume needs --checkpoint-dir"),
    ("--global-batch 16 --plan gbs=8", "--global-batch 16 conflicts with gbs=8 in --plan"),
    ("--seq-len 32 --plan seq_len=64", "--seq-len 32 conflicts with seq_len=64"),
    ("--save-hf out", "--save-hf writes Hugging Face models"),
])
def test_bad_train_input_is_one_line_before_any_worker(tmp_path, capsys, args, needle):
    # in-process: the launcher refuses before torchrun (no process is started)
    from partita.cli.main import main
    _bad_inputs(tmp_path)
    code = main(["train", "--model", "tiny-llama", "--steps", "1", *args.split()])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("partita: error:"), err
    assert needle in err[0], err[0]
    assert not (tmp_path / "runs").exists()  # nothing was started, no run directory made


def test_batch_flags_fill_the_plan_and_the_run_dir_defaults_to_runs_timestamp(tmp_path):
    from partita.train.config import LaunchConfig, TrainConfig
    from partita.train.resolve import prepare_run
    config = TrainConfig(model="tiny-llama")
    run = prepare_run(config, LaunchConfig(plan="dp=2", nproc=2, global_batch=4, seq_len=32, mbs=2), say=print)
    assert (run.plan.gbs, run.plan.seq_len, run.plan.mbs, run.plan.dp) == (4, 32, 2, 2)
    assert run.run_dir.parent == Path("runs") and (tmp_path / run.run_dir / "plan.json").is_file()


def test_version(capsys):
    import partita
    from partita.cli.main import main
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"partita {partita.__version__}"


DONE_WHEN = ["--steps", "4", "--seed", "0", "--device", "cpu", "--optimizer", "sgd", "--momentum", "0.9",
             "--no-progress"]


def test_hf_model_and_auto_plan_from_the_command_line(together):
    """Issue #13's command shape: `--model hf-llama` with pp=2 and `--plan "auto,gbs=8,mbs=1"` on
    4 processes (it prints the chosen plan and the runner-up) train like one process. Each
    parallel run and its one-process reference are started together (four independent runs)."""
    hf_pp, hf_one, auto, one = together([
        train_cmd("--model", "hf-llama", "--plan", "pp=2,gbs=8,mbs=1", "--nproc", "2", *DONE_WHEN, "--run-dir", "hf_pp"),
        train_cmd("--model", "hf-llama", "--plan", "gbs=8,mbs=1", "--nproc", "1", *DONE_WHEN, "--run-dir", "hf_one"),
        train_cmd("--model", "tiny-llama", "--plan", "auto,gbs=8,mbs=1", "--nproc", "4", *DONE_WHEN, "--run-dir", "auto"),
        train_cmd("--model", "tiny-llama", "--plan", "gbs=8,mbs=1", "--nproc", "1", *DONE_WHEN, "--run-dir", "one")],
        timeout=600)
    hf_pp, hf_one, one = losses(hf_pp), losses(hf_one), losses(one)
    assert len(hf_pp) == len(hf_one) == len(one) == 4
    assert hf_pp == pytest.approx(hf_one, rel=1e-5)
    assert losses(auto) == pytest.approx(one, rel=1e-5)
    assert "auto plan on" in auto.stderr and "runner-up:" in auto.stderr, auto.stderr[-2000:]
    summary = [json.loads(line) for line in auto.stdout.splitlines() if '"summary"' in line][-1]
    chosen = json.loads((Path(summary["run_dir"]) / "plan.json").read_text())
    assert chosen["gbs"] == 8 and chosen["mbs"] == 1 and chosen["dp"] * chosen["tp"] * chosen["pp"] * chosen["cp"] == 4
