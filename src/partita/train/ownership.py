"""One job, one owner: the training processes never outlive the ``partita train`` that
started them, and two jobs never write one checkpoint directory.

torchrun starts every worker in a session of its own (``start_new_session=True`` in
``torch.distributed.elastic.multiprocessing.subprocess_handler``), so a signal to the
launcher's process group - ``kill -9 -PGID``, a closed terminal - never reaches them.
Three mechanisms, each enough on its own for the common case:

- **parent-death signal** (Linux ``prctl(PR_SET_PDEATHSIG)``, prctl(2)): torchrun is
  started with SIGKILL as its parent-death signal (the launcher's child), each worker
  sets the same for itself (torchrun's child) - when the parent dies the kernel kills
  the child. It is inherited across ``exec`` and checked right after being set
  (``getppid()`` already changed: the parent died before);
- **heartbeat**: each worker watches the launcher's pid (``PARTITA_LAUNCHER_PID``, with
  its start time from ``/proc/<pid>/stat`` so a reused pid does not count as alive)
  twice a second and ``os._exit``\\ s when it is gone - this also covers platforms
  without prctl and torchrun being killed by something that spares the workers;
- **lock**: the launcher holds ``fcntl.flock`` on ``<checkpoint dir>/.partita-lock``
  for the job's life (torchrun inherits the descriptor, so the lock is free only when
  both are gone); a second job on that directory is refused with one line. The nodes of
  one multi-node job (same rendezvous id and endpoint) share it: each takes it shared, so
  a run and checkpoint directory on a cluster's shared filesystem serves the whole job.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from ..errors import PartitaError

LAUNCHER_PID = "PARTITA_LAUNCHER_PID"
LAUNCHER_START = "PARTITA_LAUNCHER_START"
LOCK_FILE = ".partita-lock"
STOP_FILE = "stop-requested"  # in the run dir: the launcher asks the workers to stop cleanly


def stop_requested(run_dir: Path, wait_s: float = 1.0) -> bool:
    """Whether a SIGINT / SIGTERM that reached a worker is the launcher's clean-stop request
    (it writes ``<run dir>/stop-requested`` before passing the signal on) rather than
    torchrun tearing the job down after a failure. Waits up to ``wait_s`` for the file: a
    scheduler signalling every process at once may reach a worker before the launcher."""
    deadline = time.monotonic() + wait_s
    while not (run_dir / STOP_FILE).exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only;
    False elsewhere). Safe in a ``preexec_fn``: no Python objects are allocated beyond ctypes."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def process_start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks since boot), or None
    when the process does not exist (or not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def launcher_env() -> dict[str, str]:
    """What the workers need to watch this (the launcher's) process."""
    pid = os.getpid()
    return {LAUNCHER_PID: str(pid), LAUNCHER_START: process_start_time(pid) or ""}


def _alive(pid: int, start: str) -> bool:
    if start:
        return process_start_time(pid) == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch_launcher(interval_s: float = 0.5) -> threading.Thread | None:
    """Worker side: the parent-death signal against torchrun, and a daemon thread that ends
    this process (``os._exit(1)``) once the launcher named in the environment is gone."""
    parent = os.getppid()
    set_parent_death_signal()
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
    pid = os.environ.get(LAUNCHER_PID)
    if not pid:
        return None
    start = os.environ.get(LAUNCHER_START, "")

    def watch() -> None:
        while _alive(int(pid), start):
            time.sleep(interval_s)
        os._exit(1)
    thread = threading.Thread(target=watch, name="partita-launcher-watch", daemon=True)
    thread.start()
    return thread


class JobLock:
    """``flock`` on ``<directory>/.partita-lock`` for the life of a job; the file holds the
    owner's pid (for the refusal message only: the lock itself is the kernel's).

    A multi-node job (``job`` given: the rendezvous id and endpoint) takes the lock shared,
    so every node of the job may use one run and checkpoint directory on a shared
    filesystem, and writes its key into the file; a launcher whose key differs from the
    holder's - a second job - is refused in one line. A short exclusive lock on
    ``.partita-lock.meta`` makes take-and-write one step between the nodes."""

    def __init__(self, directory: str | Path, job: str | None = None):
        import fcntl
        self.path = Path(directory) / LOCK_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        meta = os.open(self.path.with_name(LOCK_FILE + ".meta"), os.O_RDWR | os.O_CREAT, 0o644) if job else -1
        try:
            if meta >= 0:
                fcntl.flock(meta, fcntl.LOCK_EX)  # held for microseconds: take, read and write the key
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.ftruncate(self.fd, 0)
                owner = f"{os.getpid()}" + (f" {socket.gethostname()} job {job}" if job else "")
                os.pwrite(self.fd, f"{owner}\n".encode(), 0)
                if job:
                    fcntl.flock(self.fd, fcntl.LOCK_SH)  # the other nodes of this job join it
            except BlockingIOError:
                owner = os.pread(self.fd, 512, 0).decode(errors="replace").strip() or "?"
                if not (job and owner.endswith(f" job {job}")):
                    self._refuse(owner)
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    self._refuse(owner)
        finally:
            if meta >= 0:
                os.close(meta)

    def _refuse(self, owner: str) -> None:
        os.close(self.fd)
        self.fd = -1
        pid, _, rest = owner.partition(" ")
        where = f" on {rest}" if rest else ""
        raise PartitaError(f"another partita train job (pid {pid}{where}) is using {self.path.parent}; "
                           "wait for it to end or stop it first")

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the last descriptor releases the flock
            self.fd = -1
