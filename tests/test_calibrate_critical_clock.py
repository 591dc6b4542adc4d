"""The busy clock of an interval several ranks share (``critical_busy_s``,
src/partita/calibrate/busy_clock.py), against the kernel's own accounting: two threads that
compute in turn (lock-step, as tensor-parallel ranks do between collectives), each on a CPU a
spinning neighbour shares, are timed at the CPU time the kernel charged them (``time.thread_time``)
- the interval's time with no neighbours - not at their wall time, and not at the old clock
(smallest rank's wall less its own run-queue wait), which keeps the peer's queueing a rank
slept through."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from partita.calibrate.busy_clock import critical_busy_s, mark, since


def _spin(n: int) -> int:
    """Pure CPU work: no sleep, no I/O."""
    s = 0
    for i in range(n):
        s += i * i
    return s


def test_one_rank_is_its_wall_time_less_its_wait():
    assert critical_busy_s([[5.0, 3.0, 1.5]]) == pytest.approx(3.5)


def test_lock_step_ranks_each_half_served():
    # each rank ran 1 s, queued 1 s, slept 2 s while the peer (served half its runnable
    # time: rho 0.5) did the peer's 1 s of work stretched to 2: unloaded 1 + 2 * 0.5 = 2 s
    assert critical_busy_s([[4.0, 1.0, 1.0], [4.0, 1.0, 1.0]]) == pytest.approx(2.0)


def test_without_schedstat_it_is_the_wall_clock():
    # no /proc/thread-self/schedstat: run and wait read 0, the interval is its wall time
    assert critical_busy_s([[2.5, 0.0, 0.0], [2.5, 0.0, 0.0]]) == pytest.approx(2.5)


def test_an_interval_needs_a_rank():
    with pytest.raises(ValueError, match="at least one rank"):
        critical_busy_s([])


def _neighbours(cpus: set[int]) -> list[subprocess.Popen]:
    """One CPU-bound process pinned to each of ``cpus``."""
    return [subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{c}}})\nwhile True: pass"])
            for c in cpus]


def _lock_step(cpus: list[int], phases: int = 3, n: int = 150_000) -> tuple[list[list[float]], float]:
    """Two threads, pinned to ``cpus[0]`` and ``cpus[-1]``, compute ``n`` iterations in turn
    ``phases`` times each; both intervals end when the last phase does. Returns each thread's
    ``[wall, run, wait]`` and their CPU time together (the kernel's: the unloaded interval)."""
    go = [threading.Semaphore(1), threading.Semaphore(0)]
    start, out, cpu = threading.Barrier(2), [None, None], [0.0, 0.0]

    def rank(r: int) -> None:
        os.sched_setaffinity(0, {cpus[0] if r == 0 else cpus[-1]})  # this thread only (Linux)
        start.wait()
        t0, c0 = mark(), time.thread_time()
        for _ in range(phases):
            go[r].acquire()
            _spin(n)
            go[1 - r].release()
        if r == 0:
            go[0].acquire()  # rank 0 waits for rank 1's last phase: one interval for both
        out[r], cpu[r] = since(t0), time.thread_time() - c0

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return out, sum(cpu)


def test_lock_step_ranks_beside_neighbours_read_their_cpu_time():
    cpus = sorted(os.sched_getaffinity(0))[:2]
    spinners = _neighbours(set(cpus))
    try:
        time.sleep(0.2)  # the neighbours are pinned and spinning (not a timing assertion)
        ranks, cpu = _lock_step(cpus)
    finally:
        for p in spinners:
            p.kill()
            p.wait(timeout=10)
    walls = [r[0] for r in ranks]
    old = min(wall - wait for wall, _, wait in ranks)  # the clock before: smallest rank's wall less its wait
    new = critical_busy_s(ranks)
    assert min(walls) > 1.4 * cpu, (walls, cpu)  # the neighbours did take slices: the case is real
    assert abs(new - cpu) < 0.2 * cpu, (new, old, walls, cpu)
    assert abs(new - cpu) < abs(old - cpu), (new, old, cpu)  # the peer's queueing is no longer kept


def test_the_run_share_is_read_over_the_window():
    # rank 0 ran 1 s and was blocked 2 s; rank 1 ran 1 s and queued 2 s. Over the interval
    # alone rank 1 ran a third of its runnable time: rank 0 -> 1 + 2 / 3, rank 1 (never
    # blocked) -> 1. Over the window both ranks ran half of theirs: rank 0 -> 1 + 2 * 0.5
    interval = [[3.0, 1.0, 0.0], [3.0, 1.0, 2.0]]
    assert critical_busy_s(interval) == pytest.approx((1 + 2 / 3 + 1) / 2)
    window = [[30.0, 10.0, 10.0], [30.0, 10.0, 10.0]]
    assert critical_busy_s(interval, window) == pytest.approx((1 + 2 * 0.5 + 1) / 2)
