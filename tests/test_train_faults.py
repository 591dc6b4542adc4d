"""Issue 21: faults injected into `partita train` runs as an operator meets them.

Every scenario either continues with the losses of one uninterrupted run (the oracle,
from the last good checkpoint on) or stops with exit != 0 and the exact one-line error.
tiny-llama, dp=2 on 2 gloo ranks, AdamW with a cosine schedule, a checkpoint every 2
steps; every process has a timeout, and every run uses its own TMPDIR so that a
``torchelastic_*`` directory left behind is seen.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

STEPS = 8
COMMON = ["--model", "tiny-llama", "--json", "--plan", "dp=2", "--nproc", "2", "--optimizer", "adamw",
          "--lr", "0.01", "--lr-schedule", "cosine", "--warmup-steps", "2", "--timeout-s", "120"]
TIMEOUT = 300


def _env(tmp: Path, extra: dict | None) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1", **(extra or {})}


def _no_temp_litter(tmp: Path) -> None:
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("torchelastic_")]


def _cmd(*args, steps=STEPS) -> list[str]:
    return [sys.executable, "-m", "partita", "train", *COMMON, "--steps", str(steps), *args]


def train(tmp: Path, *args, env=None, steps=STEPS) -> subprocess.CompletedProcess:
    proc = subprocess.run(_cmd(*args, steps=steps), capture_output=True, text=True, timeout=TIMEOUT,
                          env=_env(tmp / "tmp", env))
    _no_temp_litter(tmp / "tmp")
    return proc


def start(tmp: Path, *args, env=None, steps=STEPS, **popen) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "partita", "train", *COMMON, "--steps", str(steps), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(tmp / "tmp", env), **popen)


def losses(proc) -> dict[int, float]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["step"]: r["loss"] for r in map(json.loads, (l for l in proc.stdout.splitlines() if l.startswith("{")))}


def errors(proc) -> list[str]:
    return [l for l in proc.stderr.splitlines() if l.startswith("partita: error:")]


def logged_steps(metrics: Path) -> list[int]:
    if not metrics.exists():
        return []
    out = []
    for line in metrics.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "event" not in rec and "step" in rec:
            out.append(rec["step"])
    return out


def wait_for_steps(metrics: Path, n: int, proc: subprocess.Popen, timeout_s: float = 400) -> None:
    deadline = time.monotonic() + timeout_s
    while len(logged_steps(metrics)) < n:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run never got going"
        time.sleep(0.1)


def job_pids(marker: str) -> list[int]:
    """Processes whose command line holds ``marker`` (the run's unique directory)."""
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker in cmdline.read_bytes().decode(errors="replace"):
                out.append(int(cmdline.parent.name))
        except OSError:
            continue
    return [p for p in out if p != os.getpid()]


#: the scenarios whose one run depends on nothing else: name -> (train args, extra env). Their
#: runs and the baseline are started together (tests/conftest.py run_together), each with its
#: own folder and TMPDIR: on the 2-core CI machine a 2-rank run leaves a core idle during its
#: start-up, which the next run then uses (each run still checks its own TMPDIR for litter).
SCENARIOS = {
    "baseline": (lambda d: ["--checkpoint-dir", str(d / "ckpt"), "--checkpoint-every", "2", "--keep", "0"], None),
    "killed-rank": (lambda d: ["--run-dir", str(d / "run")],
                    {"PARTITA_CRASH_RANK": "1", "PARTITA_CRASH_STEP": "2", "PARTITA_CRASH_SIGNAL": "KILL"}),
    "nan-stops": (lambda d: ["--checkpoint-dir", str(d / "ckpt"), "--checkpoint-every", "2"],
                  {"PARTITA_NAN_STEP": "4"}),
    "nan-skipped": (lambda d: ["--run-dir", str(d / "run"), "--skip-nonfinite", "1"],
                    {"PARTITA_NAN_STEP": "4", "PARTITA_NAN_RANK": "1"}),
    "write-fails": (lambda d: ["--checkpoint-dir", str(d / "ckpt"), "--checkpoint-every", "2"],
                    {"PARTITA_FSIZE_STEP": "2"}),
}


@pytest.fixture(scope="module")
def scenario_runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """name -> (the finished run, its folder) for every entry of SCENARIOS, started together."""
    from conftest import run_together
    dirs = {name: tmp_path_factory.mktemp(name) for name in SCENARIOS}
    cmds = [_cmd(*args(dirs[name])) for name, (args, _) in SCENARIOS.items()]
    envs = [_env(dirs[name] / "tmp", env) for name, (_, env) in SCENARIOS.items()]
    procs = run_together(cmds, timeout=2 * TIMEOUT, envs=envs)
    for name in SCENARIOS:
        _no_temp_litter(dirs[name] / "tmp")
    return {name: (proc, dirs[name]) for name, proc in zip(SCENARIOS, procs)}


@pytest.fixture(scope="module")
def baseline(scenario_runs):
    """One uninterrupted run: its losses are the oracle; its checkpoints (steps 1, 3, 5, 7)
    are copied by the scenarios that damage them."""
    proc, tmp = scenario_runs["baseline"]
    got = losses(proc)
    assert sorted(got) == list(range(STEPS))
    assert f"run dir {tmp / 'ckpt'}" in proc.stderr  # --json: the run dir is said on stderr
    assert sorted(p.name for p in (tmp / "ckpt").glob("step_*")) == [f"step_{s:08d}" for s in (1, 3, 5, 7)]
    return got, tmp / "ckpt"


def _copy(ckpt: Path, dst: Path, keep_steps=(1, 3, 5, 7)) -> Path:
    shutil.copytree(ckpt, dst, ignore=shutil.ignore_patterns(".partita-lock"))
    for s in (1, 3, 5, 7):
        if s not in keep_steps:
            shutil.rmtree(dst / f"step_{s:08d}")
    return dst


def _overwrite_tensor_bytes(path: Path) -> None:
    """Bytes in the middle of a .distcp (tensor data; the zip structure stays intact)."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = bytes(64)
    path.write_bytes(bytes(data))


def _damage_three(d: Path) -> None:
    """Step 7 with overwritten tensor bytes, step 5 truncated, step 3 missing a file, and a
    metrics line torn by a crash mid-write."""
    _overwrite_tensor_bytes(d / "step_00000007" / "__1_0.distcp")
    size = (d / "step_00000005" / "__0_0.distcp").stat().st_size
    os.truncate(d / "step_00000005" / "__0_0.distcp", size // 2)
    (d / "step_00000003" / "__1_0.distcp").unlink()
    with open(d / "metrics.jsonl", "a") as f:
        f.write('{"step": 8, "loss": 5.1, "l')  # a crash mid-write


def _damage_all(d: Path) -> None:
    """Only steps 5 and 7 kept, both damaged."""
    (d / "step_00000007" / ".metadata").write_bytes(os.urandom(300))
    os.truncate(d / "step_00000005" / "__1_0.distcp", 100)


#: resumes from a copy of the baseline's checkpoints: name -> (steps kept, damage, extra train args,
#: whether the run gets its own TMPDIR checked for litter as ``train`` does)
RESUMES = {
    "damaged": ((1, 3, 5, 7), _damage_three, [], True),
    "no-good": ((5, 7), _damage_all, [], True),
    "other-model": ((7,), None, ["--model", "tiny-moe"], False),
    "other-gbs": ((7,), None, ["--plan", "dp=2,gbs=16"], True),
}


@pytest.fixture(scope="module")
def resume_runs(baseline, tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """name -> (the finished ``--resume`` run, its checkpoint copy) for every entry of RESUMES:
    each on its own copy of the baseline's checkpoints, damaged as the entry says, the runs
    started together (tests/conftest.py run_together; one job per checkpoint directory)."""
    from conftest import run_together
    _, ckpt = baseline
    dirs, cmds, envs = {}, [], []
    for name, (keep, damage, extra, own_tmp) in RESUMES.items():
        tmp = tmp_path_factory.mktemp(name)
        d = dirs[name] = _copy(ckpt, tmp / "ckpt", keep_steps=keep)
        if damage:
            damage(d)
        if own_tmp:
            cmds.append(_cmd("--checkpoint-dir", str(d), "--resume", *extra))
            envs.append(_env(tmp / "tmp", None))
        else:  # as a user would type it: no --steps, the environment as it is
            cmds.append([sys.executable, "-m", "partita", "train", *COMMON, *extra, "--checkpoint-dir", str(d), "--resume"])
            envs.append({})
    procs = run_together(cmds, timeout=2 * TIMEOUT, envs=envs)
    for name, (_, _, _, own_tmp) in RESUMES.items():
        if own_tmp:
            _no_temp_litter(dirs[name].parent / "tmp")
    return {name: (proc, dirs[name]) for name, proc in zip(RESUMES, procs)}


def test_damaged_checkpoints_fall_back_with_exact_losses_and_torn_metrics_line(baseline, resume_runs):
    oracle, _ = baseline
    proc, d = resume_runs["damaged"]  # _damage_three
    got = losses(proc)
    assert sorted(got) == list(range(2, STEPS))
    for step, loss in got.items():
        assert loss == oracle[step], step  # bit-exact from the fallback checkpoint on
    warnings = [l for l in proc.stderr.splitlines() if l.startswith("partita: warning:")]
    assert len(warnings) == 3, proc.stderr
    assert "step_00000007 is damaged: __1_0.distcp: checksum mismatch" in warnings[0]
    assert "step_00000005 is damaged: __0_0.distcp: " in warnings[1] and "truncated" in warnings[1]
    assert "step_00000003 is damaged: __1_0.distcp: missing" in warnings[2]
    assert sorted(p.name for p in d.iterdir() if p.name.startswith("corrupt-")) == \
        ["corrupt-step_00000003", "corrupt-step_00000005", "corrupt-step_00000007"]
    assert "dropped its last line, not JSON (torn by a crash mid-write?)" in proc.stderr
    assert logged_steps(d / "metrics.jsonl") == list(range(STEPS))  # every step once, the torn line gone


def test_no_good_checkpoint_is_one_line_exit_2(resume_runs):
    proc, d = resume_runs["no-good"]  # _damage_all
    assert proc.returncode == 2
    assert errors(proc) == [f"partita: error: no usable checkpoint in {d}: every checkpoint there is damaged "
                            "(2 renamed corrupt-* now); resume is impossible, start without --resume or restore a copy"]
    assert "step_00000007 is damaged: .metadata: 300 bytes, manifest says" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_resume_under_another_model_or_global_batch_is_refused(resume_runs):
    other, d = resume_runs["other-model"]
    assert other.returncode == 2
    assert errors(other) == [f"partita: error: cannot resume from {d}: it holds model tiny-llama, this run trains "
                             "tiny-moe (start a new run or pass --model tiny-llama)"]
    gbs, d2 = resume_runs["other-gbs"]
    assert gbs.returncode == 2
    assert errors(gbs) == [f"partita: error: cannot resume from {d2}: it was trained with global batch 8, this run "
                           "uses 16: the data position (step x global batch) and the schedule would not continue; "
                           "resume with gbs=8 in --plan (or no --plan) or start a new run"]
    for copy in (d, d2):
        assert sorted(p.name for p in copy.glob("step_*")) == ["step_00000007"]  # nothing renamed or deleted


def test_sigterm_saves_the_step_reached_and_resume_continues_exactly(baseline, tmp_path):
    oracle, _ = baseline
    d = tmp_path / "ckpt"
    proc = start(tmp_path, "--checkpoint-dir", str(d), "--checkpoint-every", "100",
                 env={"PARTITA_STEP_SLEEP_S": "1"})
    try:
        wait_for_steps(d / "metrics.jsonl", 2, proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-3000:]
    reached = logged_steps(d / "metrics.jsonl")[-1]
    assert reached < STEPS - 1
    assert f"partita: stopped by SIGTERM after step {reached}; checkpoint {d / f'step_{reached:08d}'} holds it " \
           "(--resume continues)" in err
    assert "Traceback" not in err
    assert [p.name for p in d.glob("step_*")] == [f"step_{reached:08d}"]
    resumed = train(tmp_path, "--checkpoint-dir", str(d), "--resume")
    got = losses(resumed)
    assert sorted(got) == list(range(reached + 1, STEPS))
    for step, loss in got.items():
        assert loss == oracle[step], step


def test_sigint_stops_every_rank_with_130_and_no_traceback(tmp_path):
    run = tmp_path / "run"
    proc = start(tmp_path, "--run-dir", str(run), env={"PARTITA_STEP_SLEEP_S": "1"})
    try:
        wait_for_steps(run / "metrics.jsonl", 1, proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert [l for l in err.splitlines() if "stopped by SIGINT after step" in l]
    assert job_pids(str(run)) == []


def test_kill_9_of_the_launchers_process_group_takes_the_workers_down(tmp_path):
    run = tmp_path / "ckpt"
    proc = start(tmp_path, "--checkpoint-dir", str(run), "--checkpoint-every", "2",
                 env={"PARTITA_HANG_STEP": "2"}, start_new_session=True)  # busy until killed
    try:
        wait_for_steps(run / "metrics.jsonl", 2, proc)
        second = start(tmp_path, "--checkpoint-dir", str(run))  # one job per checkpoint dir
        _, err2 = second.communicate(timeout=TIMEOUT)
        assert second.returncode == 2
        assert [l for l in err2.splitlines() if l.startswith("partita: error:")] == \
            [f"partita: error: another partita train job (pid {proc.pid}) is using {run}; "
             "wait for it to end or stop it first"]
        workers = [p for p in job_pids(str(run)) if p != proc.pid]
        assert len(workers) >= 3  # torchrun and its two workers
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60  # a hang guard: SIGKILL of the group ends them at once
        while job_pids(str(run)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert job_pids(str(run)) == []  # nothing of the job outlives its launcher
    finally:
        for pid in job_pids(str(run)):
            os.kill(pid, signal.SIGKILL)
    steps_then = logged_steps(run / "metrics.jsonl")
    time.sleep(2)
    assert logged_steps(run / "metrics.jsonl") == steps_then  # nobody is training any more


def test_killed_rank_is_named_as_the_one_that_died(scenario_runs):
    proc, tmp_path = scenario_runs["killed-rank"]  # rank 1 SIGKILLed at step 2 (SCENARIOS)
    assert proc.returncode == 1
    assert errors(proc) == ["partita: error: rank 1 died (killed by SIGKILL: out of memory, or killed from "
                            "outside?); the other ranks stopped because they lost it"]
    assert not (tmp_path / "run" / "torchelastic").exists()


def test_nan_at_step_k_stops_before_saving_it(scenario_runs):
    proc, tmp_path = scenario_runs["nan-stops"]  # a NaN at step 4, checkpoints every 2 steps (SCENARIOS)
    d = tmp_path / "ckpt"
    assert proc.returncode == 2
    assert errors(proc) == ["partita: error: step 4: not finite: loss nan, gradient norm nan; stopped before the "
                            "optimizer update (--skip-nonfinite 0 allows 0 such step(s)); newest checkpoint of "
                            "this run: step_00000003"]
    assert "NaN" not in proc.stdout and "nan" not in proc.stdout
    assert sorted(p.name for p in d.iterdir() if p.name.startswith("step_")) == ["step_00000001", "step_00000003"]


def test_nan_skipped_with_skip_nonfinite(baseline, scenario_runs):
    oracle, _ = baseline
    proc, tmp_path = scenario_runs["nan-skipped"]  # rank 1's NaN at step 4, --skip-nonfinite 1 (SCENARIOS)
    got = losses(proc)
    assert sorted(got) == [0, 1, 2, 3, 5, 6, 7]  # step 4 reported, not printed as a loss
    assert all(got[s] == oracle[s] for s in range(4))
    assert got[5] != oracle[5]  # step 4's batch made no update
    reason = "loss nan, gradient norm nan"  # rank 1's NaN gradient reaches rank 0 through the dp all-reduce
    assert f"partita: warning: step 4: not finite: {reason}; skipped without an update " \
           "(1 of --skip-nonfinite 1)" in proc.stderr
    records = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {"event": "skipped_nonfinite", "step": 4, "reason": reason} in records


def test_a_checkpoint_write_that_fails_is_one_line_and_earlier_ones_stay(scenario_runs):
    proc, tmp_path = scenario_runs["write-fails"]  # a file-size limit from step 2 on (SCENARIOS)
    d = tmp_path / "ckpt"
    assert proc.returncode == 2
    [line] = errors(proc)
    assert line.startswith(f"partita: error: could not write checkpoint {d / 'step_00000003.partial'} "
                           "(earlier checkpoints are intact): rank "), line
    assert "File too large" in line
    from partita.runtime.checkpoint import scan_checkpoints
    assert [(f.step, f.kind) for f in scan_checkpoints(d)] == [(-1, "partial"), (1, "verified")]


def test_bad_values_and_a_busy_rendezvous_port_are_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = train(tmp_path, "--rdzv-endpoint", f"127.0.0.1:{port}")
    assert proc.returncode == 2  # the line below (not a rendezvous timeout) says the port was seen busy
    assert errors(proc) == [f"partita: error: rendezvous endpoint 127.0.0.1:{port} is in use by another process; "
                            "pick a free port for --rdzv-endpoint"]
    clip = train(tmp_path, "--max-grad-norm", "-1")
    assert clip.returncode == 2
    assert errors(clip) == ["partita: error: train: argument --max-grad-norm: must be a finite number in [0, 1e+06], "
                            "got -1 (see partita train --help)"]  # at parse time, with the range (issue 16)


GUARD_ORACLE = '''
import math, os, sys, torch, torch.distributed as dist
from partita.models.llama import build_model
from partita.plan import Plan
from partita.runtime.parallelize import parallelize
from partita.train.data import synthetic_batch
from partita.train.guard import StepGuard
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
os.environ["PARTITA_NAN_STEP"] = "3"  # read when the guard is installed; fires at step 3 only
plan = Plan.parse("dp=1", world_size=1, defaults={"gbs": 4, "seq_len": 32, "mbs": 1, "dtype": "fp32"})
def make():
    return parallelize(build_model("tiny-llama", seed=0), plan, device_type="cpu", max_grad_norm=0.05,
                       make_optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=False))
plain, pm = make(), make()
guard = StepGuard(pm, 0)
vocab = build_model("tiny-llama").cfg.vocab
for step in range(3):
    x, y = synthetic_batch(step, plan.gbs, plan.seq_len, vocab, 0)
    guard.step = step
    assert plain.train_step(x, y) == pm.train_step(x, y), step
    assert guard.grad_norm > 0.05 and not guard.nonfinite  # the clipping path ran
assert all(torch.equal(p, q) for p, q in zip(plain.parameters(), pm.parameters()))
before = [p.detach().clone() for p in pm.parameters()]
guard.step = 3
assert math.isnan(pm.train_step(x, y)) and guard.nonfinite and guard.bad_loss and guard.bad_norm
assert all(torch.equal(p, q) for p, q in zip(before, pm.parameters()))  # no update
assert {float(s["step"]) for s in pm.optimizer.state.values()} == {3.0}  # AdamW's count not advanced
print("guard ok")
'''


def test_guard_steps_exactly_as_the_runtime_and_skips_without_an_update(tmp_path):
    """The guarded step (the runtime's update gate installed) against the runtime's own, with clipping active: bit-equal losses and parameters; a NaN step
    leaves parameters and AdamW's step count untouched."""
    proc = subprocess.run([sys.executable, "-c", GUARD_ORACLE, str(tmp_path / "store")], capture_output=True,
                          text=True, timeout=TIMEOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0 and "guard ok" in proc.stdout, proc.stderr[-3000:]
