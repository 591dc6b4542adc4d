"""calibrate's clock (src/partita/calibrate/busy_clock.py) against the kernel's own accounting:
a thread that shares its CPU with a busy neighbour is timed at the CPU time the kernel
charged it (``time.thread_time``), not at the wall time the neighbour's slices stretched.

Before the busy clock, ``_time_calls`` (every GEMM, copy and optimizer rate calibrate fits)
read the wall clock: with one neighbour on the same CPU it reported about twice the CPU time,
so a calibration on a loaded machine fitted half the machine's speed."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from partita.calibrate import busy_clock
from partita.calibrate.busy_clock import seconds_per_call


def _spin(n: int = 200_000) -> int:
    """Pure CPU work: no sleep, no I/O (so busy time == CPU time, per the kernel)."""
    s = 0
    for i in range(n):
        s += i * i
    return s


def _with_neighbour_on_my_cpu(fn):
    """Run ``fn`` pinned to one CPU beside a CPU-bound process pinned to the same CPU."""
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    neighbour = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\n"
                                  "while True: pass"])
    try:
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.2)  # the neighbour is pinned and spinning (not a timing assertion)
        return fn()
    finally:
        os.sched_setaffinity(0, before)
        neighbour.kill()
        neighbour.wait(timeout=10)


def test_the_kernel_says_how_long_this_thread_waited():
    # the platform the suite runs on (Linux) has the file; the clock says which it uses
    assert os.path.exists(busy_clock.SCHEDSTAT)
    assert "run-queue" in busy_clock.SOURCE
    # no file: the wait reads 0 and the clock is the wall clock
    assert busy_clock.run_queue_wait_s("/nonexistent/schedstat") == 0.0


def test_busy_time_is_the_cpu_time_beside_a_neighbour():
    def measure():
        c0 = time.thread_time()
        busy, wall = busy_clock.busy_call(lambda: [_spin() for _ in range(5)])
        return busy, wall, time.thread_time() - c0
    busy, wall, cpu = _with_neighbour_on_my_cpu(measure)
    assert wall > 1.4 * cpu, (wall, cpu)  # the neighbour did take slices: the case is real
    assert abs(busy - cpu) < 0.15 * cpu, (busy, wall, cpu)


def test_calibrates_rates_are_timed_on_the_busy_clock():
    calls = []

    def fn():
        c0 = time.thread_time()
        _spin(20_000)
        calls.append(time.thread_time() - c0)

    samples = _with_neighbour_on_my_cpu(lambda: seconds_per_call(fn, repeats=3, min_time=0.1))
    cpu_per_call = sum(calls[1:]) / len(calls[1:])  # the first call is seconds_per_call's warm-up
    per_call = sum(samples) / len(samples)
    # the wall clock read ~2x here (the neighbour holds the CPU half the time)
    assert abs(per_call - cpu_per_call) < 0.2 * cpu_per_call, (samples, cpu_per_call)
