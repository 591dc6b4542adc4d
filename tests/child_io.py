"""Reading a forked test child's output with a hang bound: one definition for the tests that
fork a CLI case (tests/test_fuzz_properties.py, tests/test_bad_input.py)."""
from __future__ import annotations

import os
import select
import signal
import time


def read_child(pid: int, read_fd: int, hang_s: float) -> bytes | None:
    """Everything forked child ``pid`` writes to the pipe ``read_fd`` until it closes it, then
    the child reaped; None when that takes over ``hang_s`` seconds (the child is killed: a
    hang). Used by the fuzz tests' :func:`run_cli`, their ``train`` server (whose source
    includes this function's) and the bad-input tests' ``run_case``."""
    chunks, deadline = [], time.monotonic() + hang_s
    with os.fdopen(read_fd, "rb") as r:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return None
            chunk = os.read(r.fileno(), 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    os.waitpid(pid, 0)
    return b"".join(chunks)
