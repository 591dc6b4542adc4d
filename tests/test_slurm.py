"""Multi-node jobs (issue 34): two `partita train` launchers as two nodes on this machine, and a
real two-node Slurm (tests/slurm/start_local_slurm.sh: Debian's slurm-wlm, two slurmd on
this host) running `partita train --scheduler slurm` and the exported sbatch script.

The Slurm is the one `.ci/run` started (``PARTITA_SLURM_DIR``: its ``env`` file names
``SLURM_CONF``), else one started here for the session (root and slurm-wlm + munge needed).
Without Slurm these tests fail, they do not skip: CI must run them. Every subprocess has a
timeout; no test asserts a wall-clock bound.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("--steps", "6", "--json", "--model", "tiny-llama", "--device", "cpu", "--timeout-s", "120")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def losses(text: str) -> dict[int, float]:
    records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return {r["step"]: r["loss"] for r in records if "event" not in r}


def partita(*args, env=None, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "partita", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd)


@pytest.fixture(scope="module")
def one_machine(tmp_path_factory):
    """The reference: dp=2 with two processes on one machine, uninterrupted."""
    run = tmp_path_factory.mktemp("one")
    proc = partita("train", *STEPS, "--plan", "dp=2", "--nproc", "2", "--run-dir", str(run))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return losses(proc.stdout)


# -- two launchers on this machine as two nodes (c10d rendezvous on 127.0.0.1) ----------------

def _node(args, node_rank, out):
    return subprocess.Popen([sys.executable, "-m", "partita", "train", *args, "--node-rank", str(node_rank)],
                            stdout=out, stderr=subprocess.STDOUT, text=True)


def test_two_local_nodes_share_one_run_dir_and_equal_one_machine(tmp_path, one_machine):
    """Node 1 starts first (c10d numbers the nodes by arrival: rank 0 may land on either);
    both launchers end 0 and say where rank 0 ran; the losses are the one-machine run's; a
    second job on the same directory is refused in one line while the first runs."""
    run = tmp_path / "shared"
    port = _free_port()
    args = [*STEPS, "--plan", "dp=2", "--nnodes", "2", "--nproc", "1", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", "job-a", "--run-dir", str(run), "--checkpoint-dir", str(run / "ckpt"),
            "--checkpoint-every", "2"]
    logs = [open(tmp_path / f"node{i}.log", "w+") for i in (0, 1)]
    first = _node(args, 1, logs[1])
    try:
        import time
        while not (run / "ckpt" / ".partita-lock").exists() and first.poll() is None:
            time.sleep(0.2)
        other = partita("train", *STEPS, "--plan", "dp=2", "--nnodes", "2", "--nproc", "1", "--rdzv-endpoint",
                        f"127.0.0.1:{_free_port()}", "--rdzv-id", "job-b", "--node-rank", "1", "--run-dir",
                        str(run), "--checkpoint-dir", str(run / "ckpt"), timeout=300)
        second = _node(args, 0, logs[0])
        codes = [second.wait(timeout=600), first.wait(timeout=600)]
    finally:
        for p in (first,):
            if p.poll() is None:
                p.kill()
    texts = []
    for log in logs:
        log.seek(0)
        texts.append(log.read())
    assert codes == [0, 0], texts
    assert other.returncode == 2
    refusal = [line for line in other.stderr.splitlines() if line.strip()]
    assert len(refusal) == 1 and refusal[0].startswith("partita: error: another partita train job"), other.stderr
    assert "job job-a@" in refusal[0]
    ran = [t for t in texts if losses(t)]
    assert len(ran) == 1  # rank 0's steps, on one node's output only
    assert losses(ran[0]) == pytest.approx(one_machine, rel=0, abs=1e-6)
    for text in texts:
        last = [line for line in text.splitlines() if line.startswith("partita: job ended")]
        assert len(last) == 1 and "exit status 0" in last[0] and str(run / "metrics.jsonl") in last[0], text[-2000:]
    assert sum("rank 0 ran on this node" in t for t in texts) == 1


def test_node_rank_outside_nnodes_is_one_line(tmp_path):
    proc = partita("train", "--model", "tiny-llama", "--plan", "dp=2", "--nnodes", "2", "--node-rank", "2",
                   "--rdzv-endpoint", "127.0.0.1:1", timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["partita: error: --node-rank 2 is outside --nnodes 2 "
                                                "(node ranks are 0..1)"]


# -- a real two-node Slurm ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """SLURM_CONF of a running two-node Slurm: CI's (PARTITA_SLURM_DIR), else started here."""
    started = None
    folder = os.environ.get("PARTITA_SLURM_DIR")
    if not folder:
        missing = [t for t in ("sbatch", "slurmctld", "slurmd", "munged") if not shutil.which(t)]
        if missing:
            pytest.fail(f"Slurm is not installed ({', '.join(missing)} missing): apt-get install -y slurm-wlm munge")
        if os.geteuid() != 0:
            pytest.fail("the local Slurm of these tests runs as root (SlurmUser=root); or set PARTITA_SLURM_DIR")
        folder = str(tmp_path_factory.mktemp("slurm"))
        proc = subprocess.run(["bash", str(ROOT / "tests/slurm/start_local_slurm.sh"), folder], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PARTITA_SLURM_PORT": str(_slurm_port())})
        started = folder
        if proc.returncode:
            subprocess.run(["bash", str(ROOT / "tests/slurm/stop_local_slurm.sh"), folder], timeout=60)
            pytest.fail(f"the local Slurm did not start: {proc.stderr[-3000:]}")
    conf = Path(folder) / "slurm.conf"
    assert conf.exists(), f"no Slurm config in {folder}"
    env = {"SLURM_CONF": str(conf), "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    env_all = {**os.environ, **env}
    env_all.pop("SLURM_JOB_ID", None)
    yield env_all
    queue = "" if _queue_empty(env_all) else _queued(env_all)
    if queue:
        subprocess.run(["scancel", "--user", str(os.getuid())], timeout=60, env=env_all)
    if started:
        subprocess.run(["bash", str(ROOT / "tests/slurm/stop_local_slurm.sh"), started], timeout=60)
    assert not queue, f"jobs left in the queue: {queue}"


def _slurm_port() -> int:
    """Three consecutive free ports (slurmctld, two slurmd)."""
    for _ in range(50):
        base = _free_port()
        if base > 65000:
            continue
        try:
            socks = []
            for p in (base, base + 1, base + 2):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    return 16817


def _queued(env) -> str:
    return subprocess.run(["squeue", "-h"], capture_output=True, text=True, timeout=60, env=env).stdout.strip()


def _queue_empty(env, tries: int = 120) -> bool:
    """Whether the queue empties: a job that ended may show as COMPLETING for a moment
    (bounded wait: ``tries`` x 0.5 s)."""
    import time
    for _ in range(tries):
        if not _queued(env):
            return True
        time.sleep(0.5)
    return False


def test_slurm_dp2_one_process_per_node_crash_and_resume_equal_one_machine(tmp_path, slurm, one_machine):
    """--scheduler slurm, two nodes x one process, run and checkpoint dir shared: rank 1 is
    killed (SIGKILL) at step 3; the job fails with that cause, and --resume through Slurm
    continues from the step-2 checkpoint; every loss equals the uninterrupted one-machine run."""
    run = tmp_path / "run"
    common = ("train", *STEPS, "--plan", "dp=2", "--nnodes", "2", "--nproc", "1", "--scheduler", "slurm",
              "--run-dir", str(run), "--checkpoint-dir", str(run / "ckpt"), "--checkpoint-every", "2")
    crash = {**slurm, "PARTITA_CRASH_RANK": "1", "PARTITA_CRASH_STEP": "3", "PARTITA_CRASH_SIGNAL": "KILL"}
    first = partita(*common, env=crash, cwd=tmp_path)
    assert first.returncode != 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert "partita: submitted Slurm job" in first.stderr
    before = losses(first.stdout)
    assert before and max(before) < 5, first.stdout
    assert before == pytest.approx({s: one_machine[s] for s in before}, rel=0, abs=1e-6)
    assert _queue_empty(slurm)

    resumed = partita(*common, "--resume", env=slurm, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    after = losses(resumed.stdout)
    assert min(after) == 2 and max(after) == 5, resumed.stdout
    assert after == pytest.approx({s: one_machine[s] for s in after}, rel=0, abs=1e-6)
    last = resumed.stderr.strip().splitlines()[-1]
    assert last.startswith("partita: Slurm job ") and "COMPLETED, exit status 0" in last
    assert _queue_empty(slurm)


def test_slurm_second_job_on_the_directory_is_refused_in_one_line(tmp_path, slurm):
    """Another job holds the checkpoint directory (its lock, keyed by its rendezvous): each
    node of the Slurm job is refused with the same one line, and the job fails."""
    from partita.train.ownership import JobLock
    run = tmp_path / "run"
    lock = JobLock(run / "ckpt", "other-job@host:1")
    try:
        proc = partita("train", *STEPS, "--plan", "dp=2", "--nnodes", "2", "--nproc", "1", "--scheduler", "slurm",
                       "--run-dir", str(run), "--checkpoint-dir", str(run / "ckpt"), env=slurm, cwd=tmp_path)
    finally:
        lock.release()
    assert proc.returncode != 0
    errors = {line for line in proc.stderr.splitlines() if line.startswith("partita: error:")}
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "another partita train job" in errors.pop()
    assert not losses(proc.stdout)
    assert _queue_empty(slurm)


def test_slurm_dry_run_and_detach(tmp_path, slurm):
    args = ("train", *STEPS, "--plan", "dp=2", "--nnodes", "2", "--nproc", "1", "--scheduler", "slurm",
            "--run-dir", str(tmp_path / "run"), "--partition", "ci", "--time", "00:10:00")
    dry = partita(*args, "--dry-run", env=slurm, cwd=tmp_path, timeout=300)
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH --nodes=2" in dry.stdout and "#SBATCH --partition=ci" in dry.stdout
    assert "#SBATCH --time=00:10:00" in dry.stdout and "srun " in dry.stdout
    assert _queue_empty(slurm)  # nothing submitted
    detached = partita(*args, "--detach", env=slurm, cwd=tmp_path, timeout=300)
    assert detached.returncode == 0, detached.stderr
    job = detached.stdout.strip()
    assert job.isdigit(), detached.stdout
    assert f"scancel {job}" in detached.stderr
    subprocess.run(["scancel", job], timeout=60, env=slurm, check=True)
    from partita.train.slurm import follow
    env_before = dict(os.environ)
    os.environ.update(slurm)
    try:
        code = follow(job, tmp_path / "run" / f"slurm-{job}.out", lambda msg: None)
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    assert code != 0  # cancelled: the job's state, not a success
    assert _queue_empty(slurm)


def _wait_for_job(job: str, env: dict, timeout_s: float) -> None:
    """Until ``job`` leaves the queue, looking every 0.5 s. Not ``sbatch --wait``: it looks
    after 2 s, 8 s, then every 32 s (sbatch.c ``_job_wait``, up to MinJobAge / 2), so a job of
    10 s was seen done after 42 s."""
    import time
    deadline = time.monotonic() + timeout_s
    while subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=60,
                         env=env).stdout.strip():
        assert time.monotonic() < deadline, f"Slurm job {job} still queued after {timeout_s} s"
        time.sleep(0.5)


def test_exported_sbatch_script_runs_to_completion(tmp_path, slurm):
    """`partita export --to slurm` (the script a user submits by hand) runs under sbatch."""
    from partita.plan import Plan
    Plan.parse("dp=2,gbs=8,mbs=1,seq_len=64,dtype=fp32").to_json(tmp_path / "plan.json")
    script = tmp_path / "job.sbatch"
    out = partita("export", str(tmp_path / "plan.json"), "--to", "slurm", "--hardware", "cpu", "--nodes", "2",
                  "--devices-per-node", "1", "--model", "tiny-llama", "-o", str(script), env=slurm, cwd=tmp_path,
                  timeout=300)
    assert out.returncode == 0, out.stderr
    sub = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True,
                         timeout=120, env=slurm, cwd=tmp_path)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    _wait_for_job(job, slurm, timeout_s=900)
    from partita.train.slurm import job_exit
    env_before = dict(os.environ)
    os.environ.update(slurm)
    try:
        state, code = job_exit(job)
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    assert (state, code) == ("COMPLETED", 0), "".join(p.read_text()[-3000:] for p in tmp_path.glob("*.out"))
    log = "".join(p.read_text() for p in tmp_path.glob("*.out"))
    assert "done: 10 steps" in log
    assert _queue_empty(slurm)


def test_slurm_ctrl_c_cancels_the_job(tmp_path, slurm):
    """SIGINT to the following launcher: scancel, wait until the job has left the queue, 130."""
    import signal
    import time
    proc = subprocess.Popen([sys.executable, "-m", "partita", "train", *STEPS, "--steps", "1000", "--plan", "dp=2",
                             "--nnodes", "2", "--nproc", "1", "--scheduler", "slurm", "--run-dir",
                             str(tmp_path / "run")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=slurm, cwd=tmp_path)
    lines: list[str] = []
    import threading
    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        for _ in range(1200):  # until the launcher follows the queued job (bounded: 600 s)
            if any("following" in line for line in lines) or proc.poll() is not None:
                break
            time.sleep(0.5)
        assert proc.poll() is None and _queued(slurm), "".join(lines)[-3000:]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=300)
        reader.join(timeout=60)
        err = "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "partita: cancelling Slurm job" in err
    assert _queue_empty(slurm)


def test_slurm_inside_an_allocation_runs_the_steps_there(tmp_path, slurm):
    """Under salloc (SLURM_JOB_ID set) the script runs here and its srun uses the allocation:
    rank 0's steps on the launcher's own stdout, no second job queued."""
    proc = subprocess.run(["salloc", "-N2", "--ntasks-per-node=1", sys.executable, "-m", "partita", "train", *STEPS,
                           "--steps", "3", "--plan", "dp=2", "--nnodes", "2", "--nproc", "1", "--scheduler", "slurm",
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=600,
                          env=slurm, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "partita: inside Slurm allocation" in proc.stderr
    assert sorted(losses(proc.stdout)) == [0, 1, 2]
    assert _queue_empty(slurm)
