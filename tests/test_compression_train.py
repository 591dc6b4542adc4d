"""Issue 17 through `partita train`: a PowerSGD run whose rank is killed mid-run restarts from
its checkpoint with the PowerSGD state and ends with the losses of an uninterrupted run."""
import json
import math
import sys

import pytest

PLAN = "dp=2,zero=0,grad_compression=powersgd,powersgd_rank=2,gbs=4,mbs=2,seq_len=32"
COMMON = ["--model", "tiny-llama", "--json", "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.1",
          "--plan", PLAN, "--nproc", "2", "--steps", "8"]


def _losses(path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in (json.loads(l) for l in path.read_text().splitlines()) if "event" not in r}


def _train_cmd(tmp, *args) -> list[str]:
    return [sys.executable, "-m", "partita", "train", *COMMON, "--run-dir", str(tmp), *args]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Every launch of this module - independent of each other, each its own run directory -
    started together (tests/conftest.py run_together): name -> (CompletedProcess, folder).

    - ``whole`` / ``killed``: the PowerSGD run uninterrupted (run dir ``a``), and with rank 1
      SIGKILLed at step 5 and restarted once from its checkpoint every 3 steps (``b``);
    - ``flags``: ``partita train --grad-compression powersgd --powersgd-rank 2`` on a plan
      without compression;
    - ``profile``: ``partita profile --grad-dtype bf16`` over a plan with fp32 reduction (its
      run directory goes under runs/ of the working directory, ``profile``'s folder)."""
    from conftest import run_together
    tmp = tmp_path_factory.mktemp("compression-train")
    for d in ("a", "b", "flags", "profile"):
        (tmp / d).mkdir()
    cmds = {
        "whole": (_train_cmd(tmp / "a"), {}),
        "killed": (_train_cmd(tmp / "b", "--checkpoint-dir", str(tmp / "b"), "--checkpoint-every", "3",
                              "--max-restarts", "1"),
                   {"PARTITA_CRASH_RANK": "1", "PARTITA_CRASH_STEP": "5", "PARTITA_CRASH_SIGNAL": "KILL"}),
        "flags": ([sys.executable, "-m", "partita", "train", "--model", "tiny-llama", "--json", "--optimizer", "sgd",
                   "--lr", "0.1", "--plan", "dp=2,zero=0,gbs=4,mbs=2,seq_len=32", "--nproc", "2", "--steps", "4",
                   "--run-dir", str(tmp / "flags" / "run"), "--checkpoint-dir", str(tmp / "flags" / "ckpt"),
                   "--grad-compression", "powersgd", "--powersgd-rank", "2", "--timeout-s", "120"], {}),
        "profile": ([sys.executable, "-m", "partita", "profile", "--model", "tiny-llama", "--plan",
                     "dp=2,zero=0,dtype=bf16,gbs=4,mbs=1,seq_len=16", "--nproc", "2", "--steps", "3", "--json",
                     "--grad-dtype", "bf16", "--timeout-s", "120"], {}),
    }
    procs = run_together([cmd for cmd, _ in cmds.values()], timeout=600,
                         envs=[{"OMP_NUM_THREADS": "1", **env} for _, env in cmds.values()], cwd=tmp / "profile")
    return {name: (proc, tmp) for name, proc in zip(cmds, procs)}


def test_killed_powersgd_run_resumes_with_its_state(runs):
    whole, tmp_path = runs["whole"]  # the uninterrupted run (a) and the killed one (b): independent launches
    proc, _ = runs["killed"]
    assert whole.returncode == 0, whole.stderr[-4000:]
    assert proc.returncode == 0, proc.stderr[-4000:]
    ref = _losses(tmp_path / "a" / "metrics.jsonl")
    assert "resumed from" in proc.stderr
    got = _losses(tmp_path / "b" / "metrics.jsonl")
    assert sorted(got) == list(range(8))
    # steps 4-7 ran after the restart, with PowerSGD compressing since step 2
    assert max(abs(got[s] - ref[s]) for s in range(8)) <= 1e-5
    assert abs(got[7] - got[6]) > 0  # a real run, not a constant


def test_train_flags_override_the_plan_and_apply_powersgd(runs):
    """`partita train --grad-compression powersgd --powersgd-rank 2` on a plan without
    compression: the run's plan.json carries the flags, and the checkpoint holds PowerSGD's
    state as torch's PowerSGDState wrote it (error feedback, P and Q per parameter, iteration
    4 after 4 steps) - which a run that ignored the flags would not have."""
    import torch.distributed.checkpoint as dcp
    proc, tmp = runs["flags"]
    tmp_path = tmp / "flags"
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "--grad-compression powersgd overrides the plan's grad_compression=none" in proc.stderr
    saved = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert (saved["grad_compression"], saved["powersgd_rank"]) == ("powersgd", 2)
    meta = dcp.FileSystemReader(str(tmp_path / "ckpt" / "step_00000003")).read_metadata().state_dict_metadata
    from partita.runtime.equivalence import make_model
    shapes = {name: tuple(p.shape) for name, p in make_model("tiny-llama", 0).named_parameters()}
    for rank in (0, 1):
        mine = f"compression.powersgd.rank{rank}."
        factors = {k[len(mine) + 2:]: tuple(meta[k].size) for k in meta if k.startswith(mine + "p.")}
        assert factors and set(factors) <= set(shapes)
        for name, size in factors.items():  # torch's factors: P is n x r, Q is m x r, flattened
            n = shapes[name][0]
            m = math.prod(shapes[name]) // n
            assert size == (n * 2,) and tuple(meta[mine + "q." + name].size) == (m * 2,), name
            assert tuple(meta[mine + "error." + name].size) == (n * m,), name


def test_profile_grad_dtype_flag_halves_the_measured_bytes(runs):
    """`partita profile --grad-dtype bf16` over a plan with fp32 reduction: the bytes the
    collective counter saw are half the uncompressed fp32 gradients (a run that ignored the
    flag would send them all)."""
    proc, _ = runs["profile"]
    assert proc.returncode == 0, proc.stderr[-4000:]
    section = json.loads(proc.stdout)["dp_bytes"]
    assert section["knob"] == "bf16"
    assert section["measured_gradient_bytes"] == pytest.approx(section["predicted_fp32_bytes"] / 2, rel=0.01)


def test_knob_flag_that_breaks_the_plan_is_one_line(tmp_path):
    from partita.errors import PartitaError
    from partita.train.config import LaunchConfig, TrainConfig
    from partita.train.resolve import prepare_run
    launch = LaunchConfig(plan="dp=2,zero=1", nproc=2, run_dir=str(tmp_path / "run"), grad_compression="powersgd")
    with pytest.raises(PartitaError, match="grad_compression=powersgd needs zero 0"):
        prepare_run(TrainConfig(model="tiny-llama"), launch, say=print)
