"""A clock that stops while this thread waits for a CPU: wall time minus run-queue wait.

On a machine other processes share (two cores, several jobs), a timed step is the work it did,
the time it waited on its peers (collectives, the pipeline's bubble), and the time it was
runnable but the scheduler ran someone else. Only the last moves with the neighbours' load.
Linux counts it per thread: ``/proc/thread-self/schedstat`` holds three numbers, the second
"time spent waiting on a runqueue" in nanoseconds (Documentation/scheduler/sched-stats.rst,
``/proc/<pid>/schedstat``). Subtracting it keeps the time the thread ran *and* the time it
slept waiting for a peer (a blocked ``recv`` is not on a run queue), so a pipeline's bubble
still counts while a neighbour's time slice does not.

``partita calibrate`` (:mod:`.measure`), the training worker's per-step record
(``step_busy_s``) and ``bench/predict_vs_measure.py`` all time with this one clock, so the
rates calibrate fits and the steps the loop measures are read alike.

An interval several ranks share (a collective, a training step) is read by
:func:`critical_busy_s` from every rank's ``[wall, run, wait]`` (:func:`mark` / :func:`since`):
a rank's own wait is not the whole story, since it also *sleeps* through the queueing of the
ranks it waits for (a lock-step pair each half-served by the CPU: wall 4x the work, wall less
own wait still 3x, ``critical_busy_s`` 1x: tests/test_calibrate_critical_clock.py).

What it cannot remove: the scheduling latency of gloo's helper threads on the path of every
collective (each hop main -> gloo run loop -> TCP loop -> the peer's wakes a thread that
waits for a CPU; their own run-queue wait is not usable, since a TCP loop thread also wakes
~90 times a second when idle), and contention for caches and memory bandwidth that slows
``run`` itself. Where the file does not exist (not Linux, or a kernel without
``CONFIG_SCHED_INFO``), run and wait read 0 and the clock is the wall clock: :data:`SOURCE`
says which.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence

SCHEDSTAT = "/proc/thread-self/schedstat"


def run_queue_wait_s(path: str = SCHEDSTAT) -> float:
    """Seconds this thread has waited on a run queue since it started (0.0 where the kernel
    does not say: the caller's clock falls back to the wall clock)."""
    try:
        with open(path) as f:
            return int(f.read().split()[1]) * 1e-9
    except (OSError, IndexError, ValueError):
        return 0.0


def thread_schedstat_s(path: str = SCHEDSTAT) -> tuple[float, float]:
    """``(seconds run, seconds waited on a run queue)`` of this thread ((0.0, 0.0) where absent)."""
    try:
        with open(path) as f:
            fields = f.read().split()
        return int(fields[0]) * 1e-9, int(fields[1]) * 1e-9
    except (OSError, IndexError, ValueError):
        return 0.0, 0.0


def _available(path: str = SCHEDSTAT) -> bool:
    try:
        with open(path) as f:
            int(f.read().split()[1])
        return True
    except (OSError, IndexError, ValueError):
        return False


#: What :func:`busy_clock` measures on this machine (recorded in the calibrated file).
SOURCE = ("wall clock minus run-queue wait (/proc/thread-self/schedstat); collective intervals: "
          "each rank's run time plus its blocked time times the other ranks' run share (critical_busy_s)"
          if _available()
          else "wall clock (no /proc/thread-self/schedstat on this platform: timings carry the machine's load)")


def busy_clock() -> float:
    """Seconds on a clock that advances with the wall clock except while this thread is
    runnable but not running; only differences of two readings on one thread mean anything."""
    return time.perf_counter() - run_queue_wait_s()


def busy_call(fn) -> tuple[float, float]:
    """``(busy seconds, wall seconds)`` of one call of ``fn`` on this thread."""
    q0, t0 = run_queue_wait_s(), time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    return wall - (run_queue_wait_s() - q0), wall


def seconds_per_call(fn: Callable[[], object], repeats: int, min_time: float = 0.05) -> list[float]:
    """Busy seconds per call of ``fn`` in each of ``repeats`` repeats, after one warm-up call
    (time-based: no collectives in ``fn``). The loop stops on the wall clock (one read per call,
    cheap); the run-queue wait is read once at each end of a repeat, so the file read is not
    inside the calls timed. Every rate ``partita calibrate`` measures is timed here."""
    fn()
    out = []
    for _ in range(repeats):
        n, q0, t0 = 0, run_queue_wait_s(), time.perf_counter()
        while True:
            fn()
            n += 1
            if time.perf_counter() - t0 >= min_time:
                break
        busy = time.perf_counter() - t0 - (run_queue_wait_s() - q0)
        out.append(max(busy, 1e-9) / n)
    return out


def mark() -> tuple[float, float, float]:
    """``(wall, run, wait)`` seconds now on this thread: the start of an interval for :func:`since`."""
    run, wait = thread_schedstat_s()
    return time.perf_counter(), run, wait


def since(start: tuple[float, float, float]) -> list[float]:
    """``[wall, run, wait]`` seconds of this thread since ``start`` (:func:`mark`): one rank's
    share of :func:`critical_busy_s`."""
    now = mark()
    return [b - a for a, b in zip(start, now)]


def critical_busy_s(ranks: Sequence[Sequence[float]], window: Sequence[Sequence[float]] | None = None) -> float:
    """A collective interval's time without the neighbours' load, from every rank's
    ``[wall, run, wait]`` (:func:`since`): the mean over ranks of ``run + sleep * rho``.

    On rank r the wall time is ``run + wait + sleep``: on a CPU, on a run queue, or blocked
    (``sleep = wall - run - wait``: a collective's ``wait()``, a pipeline ``recv``). Unloaded,
    ``run`` is the same work and ``wait`` is ~0; ``sleep`` is time r waits for work done
    elsewhere (the peer's compute: a pipeline's bubble, a slower rank; gloo's transfers). Under
    load that work is itself stretched by the queueing of the ranks doing it: if the others'
    queueing is spread evenly over their runnable time, a second of their work takes ``1 /
    rho`` seconds, ``rho = sum(run) / sum(run + wait)`` over the other ranks (the share of
    their runnable time they ran). So r's unloaded time is ``run_r + sleep_r * rho_others``
    (with one rank: ``wall - wait``, the thread's busy clock). Each rank estimates the same
    interval; the mean of the estimates is the figure.

    What it assumes: the others' queueing falls evenly over what r waits for (a rank that is
    queued only while r computes is over-corrected, one queued only while r waits is
    under-corrected); gloo's helper threads are not counted: their run-queue wait is not
    the path's (an idle gloo TCP loop thread woke 181 times in 2 s and waited 0.18 s on this
    VM), yet their wake-up latency is on it, so collective-heavy intervals keep part of the
    load (tiny-llama-sized tp=2 steps read +64..+85 % at load 15-110 against the same step at
    real-time priority, dp=2 -2..+8 %, pp=2 +15 %). Caches and memory bandwidth shared with
    neighbours slow ``run`` itself (the main thread's CPU time +5..+30 % under that load).

    ``window``: every rank's ``[wall, run, wait]`` over a longer stretch the interval is part of
    (all repeats of one calibrated collective and size): ``rho`` is read there. A repeat of a
    small collective lasts a few milliseconds, a scheduler slice or two, so its own ``rho`` is
    0 or 1 by chance (calibrate's collective fits spread 86-711 % over repeats with it)."""
    if not ranks:
        raise ValueError("critical_busy_s needs at least one rank's [wall, run, wait]")
    window = ranks if window is None else window
    estimates = []
    for r, (wall, run, wait) in enumerate(ranks):
        others = [x for i, x in enumerate(window) if i != r]
        runnable = sum(o[1] + o[2] for o in others)
        rho = sum(o[1] for o in others) / runnable if runnable > 0 else 1.0
        estimates.append(run + max(wall - run - wait, 0.0) * rho)
    return sum(estimates) / len(estimates)
