"""Supervise a prepared training run: start torchrun, watch it, pass signals on, name the cause.

:func:`partita.train.resolve.prepare_run` has validated the plan and written the run
directory; this module runs what it prepared. torchrun stops every rank when one fails; the
workers' process groups carry a timeout so a lost peer ends in an error rather than a hang,
and :func:`run_watched` stops a job that logs no step for twice that timeout. torchrun dies
with the launcher (parent-death signal, :mod:`.ownership`); a Ctrl-C reaches the launcher
only, which passes exactly one signal on. At the end :func:`root_cause` turns torchrun's
stderr into the one line that says why a job failed.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, NamedTuple

from .config import LaunchConfig


TORCHRUN_LOGS = "torchelastic"


def torchrun_command(launch: LaunchConfig, run_dir: Path, timeout_s: int = 300) -> list[str]:
    """torchrun (standalone, or c10d rendezvous across nodes) starting one worker per process.
    Its log directory is ``<run dir>/torchelastic`` (removed after the job,
    :func:`remove_torchrun_logs`) - by default torchrun makes a ``torchelastic_*`` one in
    the temp dir and leaves it there. ``timeout_s`` bounds the rendezvous (join) and the
    workers' graceful shutdown after a signal (long enough for the checkpoint of the step
    reached)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={launch.nproc}",
           f"--log-dir={torchrun_log_dir(run_dir, launch.nnodes)}", f"--shutdown-timeout={timeout_s}"]
    if launch.nnodes > 1 or launch.rdzv_endpoint:
        cmd += [f"--nnodes={launch.nnodes}", f"--node-rank={launch.node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={launch.rdzv_endpoint}", f"--rdzv-id={launch.rdzv_id}",
                f"--rdzv-conf=join_timeout={timeout_s},read_timeout={timeout_s}"]
    else:
        cmd += ["--standalone"]
    if launch.max_restarts:
        cmd += [f"--max-restarts={launch.max_restarts}"]
    return cmd + ["-m", "partita.train.worker", str(run_dir)]


class Outcome(NamedTuple):
    """How a watched job ended: torchrun's exit code, its stderr, the seconds it stalled
    (0: did not) and the signal (SIGINT / SIGTERM) that stopped the launcher (0: none)."""
    returncode: int
    stderr: str
    stalled: float
    signal: int


class _Stderr:
    """torchrun's stderr, read line by line as it comes: the workers' ``partita:`` notes and
    warnings (not errors: the launcher reports the one root cause at the end) are printed
    while the job runs; everything is kept for :func:`root_cause`."""

    def __init__(self, stream, say: Callable[[str], None]):
        self.lines: list[str] = []
        self.say = say
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            line = line.rstrip("\n")
            self.lines.append(line)
            if line.startswith("partita: ") and not line.startswith("partita: error:"):
                self.say(line)

    def text(self, wait_s: float) -> str:
        self.thread.join(timeout=wait_s)
        return "\n".join(self.lines)


def run_watched(cmd: list[str], env: dict, stdout, metrics: Path, stall_s: float, pass_fds: tuple = (),
                grace_s: float = 60.0, say: Callable[[str], None] | None = None,
                stop_file: Path | None = None, started: Callable[[int], None] | None = None) -> Outcome:
    """Run torchrun and watch it. torchrun gets a session of its own (a Ctrl-C in the
    terminal reaches only the launcher, which passes exactly one signal on) and SIGKILL as
    its parent-death signal (it dies with the launcher, whatever kills the launcher).
    SIGINT / SIGTERM to the launcher go to torchrun, which passes them to every worker:
    they stop after the step they agree on, save it, and exit; after ``grace_s`` whatever
    is left is killed. Training that stalls - once a first step is logged (rank 0 appends
    to ``metrics``), a gap of ``stall_s`` seconds without another - ends the job: the
    per-group collective timeout cannot catch every hang (DTensor's functional collectives
    wait outside it; a rank can spin). ``stop_file`` (``<run dir>/stop-requested``) is
    written before a signal is passed on: it tells the workers the stop is a clean one.
    ``started`` is called with torchrun's pid once it runs (multi-node: the waiting notes)."""
    from .ownership import set_parent_death_signal
    if stop_file is not None:
        stop_file.unlink(missing_ok=True)
    say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
    received: list[int] = []
    on_main = threading.current_thread() is threading.main_thread()
    proc = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=set_parent_death_signal, pass_fds=pass_fds)

    def on_signal(signum, frame):
        if not received:
            received.append(signum)
            if stop_file is not None:
                stop_file.write_text(f"{signum}\n")
            proc.send_signal(signum)
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)} if on_main else {}
    err = _Stderr(proc.stderr, say)
    if started is not None:
        started(proc.pid)
    try:
        stalled = _watch(proc, metrics, stall_s, received, grace_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if proc.poll() is None:
        _stop(proc)
    if stop_file is not None:
        stop_file.unlink(missing_ok=True)
    return Outcome(proc.returncode, err.text(wait_s=30), stalled, received[0] if received else 0)


def _watch(proc: subprocess.Popen, metrics: Path, stall_s: float, received: list[int], grace_s: float) -> float:
    """Poll until torchrun ends; returns the seconds training stalled when it had to be
    stopped for that (0 otherwise). After a forwarded signal, ``grace_s`` to end."""
    last_change, last_stat, signalled_at = None, None, None
    while proc.poll() is None:
        time.sleep(0.2)
        now = time.monotonic()
        if received:
            signalled_at = signalled_at or now
            if now - signalled_at > grace_s:
                _stop(proc)
            continue
        try:
            stat = metrics.stat()
            seen = (stat.st_size, stat.st_mtime_ns)
        except FileNotFoundError:
            continue
        if seen != last_stat:
            last_stat, last_change = seen, now
        elif last_change is not None and now - last_change > stall_s:
            _stop(proc)
            return now - last_change
    return 0.0


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM torchrun (it terminates its workers), then SIGKILL it and every process
    below it that is still there - torchrun starts each worker in a session of its own."""
    family = _descendants(proc.pid)
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pid in family:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def torchrun_log_dir(run_dir: Path, nnodes: int = 1) -> Path:
    """``<run dir>/torchelastic``; one folder per node launcher below it on several nodes (the
    run dir is shared: a node that ends first must not remove another node's logs)."""
    logs = run_dir / TORCHRUN_LOGS
    return logs / f"{socket.gethostname()}-{os.getpid()}" if nnodes > 1 else logs


def remove_torchrun_logs(run_dir: Path, nnodes: int = 1) -> None:
    shutil.rmtree(torchrun_log_dir(run_dir, nnodes), ignore_errors=True)
    try:
        (run_dir / TORCHRUN_LOGS).rmdir()  # the last node's launcher removes the shared folder
    except OSError:
        pass


PEER_LOSS = ("closed by peer", "reset by peer", "Read error", "Broken pipe", "Timed out", "timed out",
             "Connection refused", "SIGTERM", "Signal 15")


def _torchrun_failures(stderr: str) -> list[tuple[int, int]]:
    """(rank, exit code) of each failed worker in torchrun's summary, the "Root Cause"
    entry first (torchrun prints "rank : R (local_rank: L)" and "exitcode : C (pid: P)")."""
    import re
    entry = re.compile(r"rank\s*:\s*(\d+) \(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)", re.S)
    head, _, root = stderr.partition("Root Cause (first observed failure):")
    return [(int(r), int(c)) for r, c in entry.findall(root) + entry.findall(head)]


def root_cause(stderr: str) -> str:
    """The one line that says why the job failed: a worker's ``partita: error:`` line; else
    the error a rank raised before a signal ended it (gloo's teardown may abort a rank that
    is leaving with an exception: its Python error, not the SIGABRT, is the cause); else
    the rank that was killed by a signal (the others then fail with a lost-peer error -
    gloo's "Connection closed by peer" / "Read error" - which is not the cause); else the
    first error of a rank that is not such a lost-peer error; else torchrun's own."""
    import re
    lines = stderr.splitlines()
    for line in reversed(lines):
        if "partita: error:" in line:  # two ranks' lines may run together: the first one
            return "partita: error:" + line.split("partita: error:")[1].rstrip()
    failures = _torchrun_failures(stderr)
    pattern = re.compile(r"^(\[rank(\d+)\]:\s*)?[A-Za-z_.]*(Error|Exception|Interrupt): ")
    causes = [m for m in map(pattern.match, lines) if m and "ChildFailedError" not in m.string]
    primary = [m for m in causes if not any(p in m.string for p in PEER_LOSS)]
    for rank, code in failures:
        if code < 0 and -code not in (signal.SIGTERM, signal.SIGINT):
            own = [m for m in primary if m.group(2) == str(rank)]
            if own:  # it raised, then aborted on its way out (gloo's teardown): the error is the cause
                return f"rank {rank} failed: {own[0].string[own[0].end(1):]}"
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
            what = [ln.split("what():", 1)[1].strip() for ln in lines if "what():" in ln]
            why = f"C++ exception: {what[0]}" if what else "out of memory, or killed from outside?"
            return (f"rank {rank} died (killed by {name}: {why}); "
                    "the other ranks stopped because they lost it")
    if primary:
        m = primary[0]
        text = m.string[m.end(1):] if m.group(1) else m.string
        return f"rank {m.group(2)} failed: {text}" if m.group(2) else text
    if failures:
        rank, code = failures[0]
        return f"rank {rank} exited with code {code}" + (f": {causes[0].string}" if causes else "")
    if causes:
        return causes[0].string
    return lines[-1] if lines else "unknown error"
