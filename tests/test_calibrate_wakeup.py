"""Collectives timed as a training step runs them (issue 33 item 7): after compute, from the
last rank's arrival.

Oracles: the trimming is checked on a hand-written case (two ranks arriving 30 ms apart); the
latency calibrate measures for a gloo all-reduce with compute before every call is checked
against a direct timing written here, in this file, of the very same calls (a wrapper around the
all-reduce: each rank's wall time from the later rank's arrival to its return, and its CPU time
from ``time.thread_time``): calibrate's figure lies between the two; and
the wake-up record's arithmetic against the ring all-reduce's ``2(n-1)`` latency steps
(Thakur, Rabenseifner & Gropp 2005, sec. 4). Nothing is asserted about how fast anything is.

This file is also the two ranks' worker (``python tests/test_calibrate_wakeup.py RANK STORE OUT``).
"""
import json
import os
import statistics
import subprocess
import sys
import time

import pytest

from partita.calibrate.hardware_file import wakeup_term
from partita.calibrate.measure import trim_to_last_arrival

SIZE, REPEATS, ITERS = 4096, 3, 10


def test_each_call_starts_when_the_last_rank_arrives():
    # rank 0 enters at 10.000 s and leaves 35 ms later; rank 1 enters 30 ms later, leaves 5 ms
    # after it: the call after the later arrival lasts 5 ms on both
    per_rank = [[[10.000, 0.035, 0.002, 0.001]], [[10.030, 0.005, 0.001, 0.003]]]
    (r0,), (r1,) = trim_to_last_arrival(per_rank)
    assert r0 == pytest.approx([0.005, 0.002, 0.001])
    assert r1 == pytest.approx([0.005, 0.001, 0.003])
    # run and wait never exceed what is left of the call
    (r0,), _ = trim_to_last_arrival([[[0.0, 0.031, 0.020, 0.010]], [[0.030, 0.001, 0.0, 0.0]]])
    assert r0[0] == pytest.approx(0.001) and r0[1] + r0[2] <= r0[0] + 1e-12


def test_the_wakeup_record_is_per_ring_step():
    w = {"bytes": SIZE, "group": 2, "back_to_back": [1e-3, 2e-3, 3e-3], "after_compute": [3e-3, 3e-3, 5e-3]}
    rec = wakeup_term(w)
    # ring all-reduce on 2 ranks: 2 (2 - 1) = 2 latency steps; per repeat (cold - hot) / 2
    assert rec["samples"] == pytest.approx([1000.0, 500.0, 1000.0])
    assert rec["value"] == pytest.approx(1000.0)
    assert rec["back_to_back_us"] == pytest.approx(2000.0) and rec["after_compute_us"] == pytest.approx(3000.0)


def _worker(rank: int, store: str, out: str) -> None:
    """Calibrate's figure per repeat, and the same calls timed directly by a wrapper around the
    all-reduce: entry and exit on the wall clock, the thread's CPU time (``time.thread_time``)."""
    import torch
    import torch.distributed as dist
    from partita.calibrate.measure import _gap, measure_collective
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    x = torch.zeros(SIZE // 4)
    gap = _gap(torch.device("cpu"), lambda: None)
    calls: list[list[float]] = []

    def op() -> None:
        enter, cpu = time.perf_counter(), time.thread_time()
        dist.all_reduce(x)
        calls.append([enter, time.perf_counter(), time.thread_time() - cpu])
    calibrated, wall, cpu = [], [], []
    for _ in range(REPEATS):
        calls.clear()
        calibrated += measure_collective(op, torch.device("cpu"), lambda: None, 1, ITERS, gap)
        got = [None, None]
        dist.all_gather_object(got, calls[1:])  # the first call is calibrate's warm-up
        last = [max(c[i][0] for c in got) for i in range(ITERS)]
        # each rank's wall time from the later arrival to its return, and its CPU time in the call
        wall.append(statistics.mean(c[i][1] - last[i] for c in got for i in range(ITERS)))
        cpu.append(statistics.mean(c[i][2] for c in got for i in range(ITERS)))
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"calibrated": calibrated, "wall": wall, "cpu": cpu}, f)
    dist.destroy_process_group()


def test_calibrated_latency_lies_between_the_calls_cpu_and_wall_time(tmp_path):
    out, store = tmp_path / "out.json", tmp_path / "store"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(store), str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in (0, 1)]
    try:
        logs = [p.communicate(timeout=240)[0].decode()[-2000:] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), logs
    got = json.loads(out.read_text())
    assert len(got["calibrated"]) == REPEATS
    for cal, wall, cpu in zip(got["calibrated"], got["wall"], got["cpu"]):
        # calibrate's clock takes run-queue waits from the wall time and shrinks the blocked time
        # by the peer's run share, never adds: at most the calls' wall time after the later
        # arrival (plus its own clock reads). Without the trimming it would hold the ranks' skew
        # (their 2 ms of compute end apart under load) and read above it. It keeps every
        # rank's time on a CPU: at least the calls' CPU time (less the early rank's posting).
        assert 0.8 * cpu <= cal <= 1.1 * wall + 1e-4, got

if __name__ == "__main__":
    _worker(int(sys.argv[1]), sys.argv[2], sys.argv[3])
