"""Issue 17 through `partita train`: a PowerSGD run whose rank is killed mid-run restarts from
its checkpoint with the PowerSGD state and ends with the losses of an uninterrupted run."""
import json
import os
import subprocess
import sys

import pytest

PLAN = "dp=2,zero=0,grad_compression=powersgd,powersgd_rank=2,gbs=4,mbs=2,seq_len=32"
COMMON = ["--model", "tiny-llama", "--json", "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.1",
          "--plan", PLAN, "--nproc", "2", "--steps", "8"]


def _train(tmp, *args, env=None):
    cmd = [sys.executable, "-m", "partita", "train", *COMMON, "--run-dir", str(tmp), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _losses(path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in (json.loads(l) for l in path.read_text().splitlines()) if "event" not in r}


def test_killed_powersgd_run_resumes_with_its_state(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _train(tmp_path / "a")
    ref = _losses(tmp_path / "a" / "metrics.jsonl")
    proc = _train(tmp_path / "b", "--checkpoint-dir", str(tmp_path / "b"), "--checkpoint-every", "3",
                  "--max-restarts", "1",
                  env={"PARTITA_CRASH_RANK": "1", "PARTITA_CRASH_STEP": "5", "PARTITA_CRASH_SIGNAL": "KILL"})
    assert "resumed from" in proc.stderr
    got = _losses(tmp_path / "b" / "metrics.jsonl")
    assert sorted(got) == list(range(8))
    # steps 4-7 ran after the restart, with PowerSGD compressing since step 2
    assert max(abs(got[s] - ref[s]) for s in range(8)) <= 1e-5
    assert abs(got[7] - got[6]) > 0  # a real run, not a constant
