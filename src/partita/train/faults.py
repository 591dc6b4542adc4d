"""Fault injection, for the tests that check a failing or stuck job ends cleanly.

Environment variables read by the training processes (unset: no fault). Every injection
point in Partita is listed here, even the one that lives with the code it breaks:

``PARTITA_CRASH_RANK=R``
    rank R raises ``RuntimeError("injected crash on rank R")`` at the start of step
    ``PARTITA_CRASH_STEP`` (default 1), on the first attempt only
    (``TORCHELASTIC_RESTART_COUNT`` 0), so an elastic restart gets past it.
    Read by :func:`before_step` (the worker's step loop).
``PARTITA_CRASH_STEP=N``
    the step of ``PARTITA_CRASH_RANK``'s crash.
``PARTITA_CRASH_SIGNAL=KILL``
    with ``PARTITA_CRASH_RANK``: the rank SIGKILLs itself instead (no Python error, no
    cleanup, as when the kernel's OOM killer strikes).
``PARTITA_HANG_STEP=N``
    every rank sleeps for an hour at the start of step N; no collective fails, so only
    the launcher's stall watchdog (:func:`partita.train.supervise.run_watched`) can end the
    job. Read by :func:`before_step`.
``PARTITA_CRASH_IN_SAVE=N``
    every rank exits (code 3) inside the checkpoint save of step N, after writing its
    files and before the checkpoint is committed. Read in
    :func:`partita.runtime.checkpoint.save_checkpoint`, the code it interrupts.
``PARTITA_NAN_STEP=K``
    at step K, rank ``PARTITA_NAN_RANK`` (default 0) gets a NaN loss and a NaN in its
    first gradient after the backward, before the update - what a diverged step looks
    like to the non-finite guard. Installed by :func:`inject_nan` (called by
    :class:`partita.train.guard.StepGuard` only when the variable is set).
``PARTITA_NAN_RANK=R``
    the rank of ``PARTITA_NAN_STEP``'s NaN.
``PARTITA_STEP_SLEEP_S=S``
    every rank sleeps S seconds at the start of every step: a slow run that a test can
    signal or kill mid-way. Read by :func:`before_step`.
``PARTITA_FSIZE_STEP=N``
    from step N on, every rank's file-size limit (``RLIMIT_FSIZE``) is 64 KiB: the next
    checkpoint's writes fail with EFBIG, as on a full disk (Python ignores SIGXFSZ, so
    the write raises). Read by :func:`before_step`.
"""
from __future__ import annotations

import os
import signal
import time

CRASH_RANK = "PARTITA_CRASH_RANK"
CRASH_STEP = "PARTITA_CRASH_STEP"
CRASH_SIGNAL = "PARTITA_CRASH_SIGNAL"
HANG_STEP = "PARTITA_HANG_STEP"
CRASH_IN_SAVE = "PARTITA_CRASH_IN_SAVE"  # read by partita.runtime.checkpoint
NAN_STEP = "PARTITA_NAN_STEP"
NAN_RANK = "PARTITA_NAN_RANK"
STEP_SLEEP_S = "PARTITA_STEP_SLEEP_S"
FSIZE_STEP = "PARTITA_FSIZE_STEP"
FSIZE_LIMIT = 64 * 1024

HANG_S = 3600


def _first_attempt() -> bool:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0


def before_step(rank: int, step: int) -> None:
    """Crash or hang here if the environment asks for it at this rank and step."""
    if os.environ.get(CRASH_RANK) == str(rank) and step == int(os.environ.get(CRASH_STEP, "1")) and _first_attempt():
        if os.environ.get(CRASH_SIGNAL) == "KILL":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected crash on rank {rank}")
    if os.environ.get(HANG_STEP) == str(step):
        time.sleep(HANG_S)
    if os.environ.get(STEP_SLEEP_S):
        time.sleep(float(os.environ[STEP_SLEEP_S]))
    if os.environ.get(FSIZE_STEP) == str(step):
        import resource
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, hard))


def nan_loss(pm, rank: int, step: int, local: float) -> float:
    """``local`` (this rank's loss), or NaN with a NaN written into this rank's first
    gradient when the environment asks for it at this rank and step."""
    if os.environ.get(NAN_STEP) != str(step) or os.environ.get(NAN_RANK, "0") != str(rank):
        return local
    for p in pm.parameters():
        if p.grad is not None:
            grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            grad.view(-1)[0] = float("nan")
            break
    return float("nan")


def inject_nan(pm, rank: int, current_step) -> None:
    """When ``PARTITA_NAN_STEP`` is set, wrap ``pm``'s micro-batch loops (``_accumulate`` /
    ``_pipeline_step``) so that their result passes through :func:`nan_loss` at that step:
    the NaN gradient is written after the backward and before the data-parallel gradient
    reduction, as a real divergence would be. ``current_step()`` gives the step running.
    Touches nothing when the variable is unset."""
    if not os.environ.get(NAN_STEP):
        return
    for name in ("_accumulate", "_pipeline_step"):
        original = getattr(pm, name)

        def run(inputs, targets, *args, _original=original, **kwargs):  # args: e.g. packed rows' positions
            return nan_loss(pm, rank, current_step(), _original(inputs, targets, *args, **kwargs))
        setattr(pm, name, run)
