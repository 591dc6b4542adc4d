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
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line)["loss"] for line in proc.stdout.splitlines() if line.startswith("{")]


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
