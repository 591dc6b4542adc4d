"""The nodes of one multi-node job (issue 34): who has joined, where rank 0 ran, how the job ended.

torch's c10d rendezvous numbers the nodes in the order they join, not by ``--node-rank``:
global rank 0 - the rank that prints the run and writes ``metrics.jsonl`` - lands on any
node. So the rank-0 worker writes ``<run dir>/rank0.json`` (its host, its launcher, the
job key, and at the end its exit code); every node's launcher reads it when its torchrun
ends and says in one line where the job's log is and how the job ended. While torchrun
waits for the other nodes, the launcher reads the rendezvous' own state from its store
(c10d backend key ``torch.rendezvous.<id>``) and says how many nodes have joined, the
endpoint and the time left, instead of staying silent until the join timeout.
"""
from __future__ import annotations

import json
import os
import pickle
import socket
import threading
import time
from base64 import b64decode
from pathlib import Path
from typing import Callable

RANK0_FILE = "rank0.json"
JOB_KEY = "PARTITA_JOB_KEY"


def mark_rank0(run_dir: Path, exit_code: int | None = None) -> None:
    """Rank 0's worker: record where it runs (at start) and its exit code (at the end)."""
    from .ownership import LAUNCHER_PID
    data = {"host": socket.gethostname(), "launcher_pid": os.environ.get(LAUNCHER_PID, ""),
            "job": os.environ.get(JOB_KEY, ""), "exit": exit_code}
    tmp = run_dir / f".{RANK0_FILE}.{os.getpid()}"
    try:
        tmp.write_text(json.dumps(data) + "\n")
        os.replace(tmp, run_dir / RANK0_FILE)
    except OSError:
        pass


def job_end_line(run_dir: Path, code: int) -> tuple[int, str]:
    """A launcher's last line after its torchrun ended, and its exit code: the job's (rank 0's
    when it reported one and this node saw no failure of its own)."""
    from .ownership import launcher_env
    try:
        rank0 = json.loads((run_dir / RANK0_FILE).read_text())
    except (OSError, ValueError):
        rank0 = None
    if isinstance(rank0, dict) and rank0.get("job") == os.environ.get(JOB_KEY, rank0.get("job")):
        if code == 0 and isinstance(rank0.get("exit"), int):
            code = rank0["exit"]
        here = (rank0.get("host") == socket.gethostname() and rank0.get("launcher_pid") == launcher_env()[
            "PARTITA_LAUNCHER_PID"])
        where = "this node (the lines above)" if here else f"node {rank0.get('host')} (its launcher's output)"
        return code, (f"partita: job ended with exit status {code}; rank 0 ran on {where}; "
                      f"metrics in {run_dir / 'metrics.jsonl'}")
    return code, (f"partita: job ended with exit status {code} on this node; rank 0 left no record in {run_dir} "
                  "(run directory not shared, or the job never started); its log is on the node that ran it")


def joined_nodes(endpoint: str, rdzv_id: str) -> int | None:
    """How many nodes have joined the c10d rendezvous ``rdzv_id`` at ``endpoint`` (None: unknown)."""
    from datetime import timedelta

    host, _, port = endpoint.rpartition(":")
    try:  # a plain connect first: a TCPStore client to a port nobody holds logs a C++ stack trace
        socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
    except (OSError, ValueError):
        return None
    try:
        from torch.distributed import TCPStore
        store = TCPStore(host.strip("[]"), int(port), is_master=False, timeout=timedelta(seconds=2))
        key = f"torch.rendezvous.{rdzv_id}"
        if not store.check([key]):
            return 0
        state = pickle.loads(b64decode(store.get(key)))
        return len(state.participants) + len(getattr(state, "wait_list", ()))
    except Exception:  # the store not up yet, another torch's layout: the count is only a courtesy
        return None


def watch_rendezvous(torchrun_pid: int, launch, timeout_s: float, say: Callable[[str], None],
                     first_s: float = 3.0, every_s: float = 10.0) -> threading.Thread:
    """Until torchrun starts its workers (the rendezvous is complete), say every ``every_s``
    seconds how many of the nodes have joined, the endpoint and the time left."""
    from .supervise import _descendants
    start = time.monotonic()

    def watch() -> None:
        wait = first_s
        while True:
            time.sleep(wait)
            wait = every_s
            try:
                os.kill(torchrun_pid, 0)
            except ProcessLookupError:
                return
            if _descendants(torchrun_pid):
                return
            n = joined_nodes(launch.rdzv_endpoint, launch.rdzv_id)
            left = max(0, timeout_s - (time.monotonic() - start))
            joined = (f"{n} of {launch.nnodes} joined the rendezvous {launch.rdzv_id} at {launch.rdzv_endpoint}"
                      if n is not None else f"0 of {launch.nnodes} joined: no rendezvous answers at "
                                            f"{launch.rdzv_endpoint} yet (rendezvous {launch.rdzv_id})")
            say(f"partita: waiting for the other nodes: {joined}; {left:.0f} s left before it times out")
    thread = threading.Thread(target=watch, name="partita-rendezvous-watch", daemon=True)
    thread.start()
    return thread
