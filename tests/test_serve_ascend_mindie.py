"""MindIE's hold on a waiting prompt (serve/queueing.py ``held_prefill_wait``; the bench's
``QUEUE_DELAY_S``), checked against the engine's own scheduling rule and configuration, not
against the closed form under test:

* Ascend/MindIE-LLM ``src/scheduler/scheduler.cpp`` (v3.0.0, 8b4871ad): with mixed prefill and
  decode and ``supportSelectBatch`` off, ``DecidePDPriority`` runs a decode step while
  ``!ShouldImmediatePrefill()``, and ``ShouldImmediatePrefill`` is true once the oldest waiting
  request is ``maxQueueDelayMicroseconds`` old (the early trigger on ``maxPrefillBatchSize``
  waiting prompts applies only to a delay above the 5000 us default). The oracle below replays
  that rule step by step for arrivals spread over a decode step;
* GPUStack's MindIE backend (gpustack/worker/backends/ascend_mindie.py at 7b50d506, the
  GPUStack 910B page's engine) writes ``maxQueueDelayMicroseconds`` 5000, MindIE's default
  (``scheduler.h`` ``defaultMaxQueueDelayMicroseconds = 5000``; the service docs' range
  [500, 1000000] us);
* GPUStack's MindIE run at 4 requests in flight quotes "Mean TTFT (ms): 112.38"."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from partita.serve.queueing import held_prefill_wait

ROOT = Path(__file__).resolve().parents[1]
GPUSTACK_MINDIE_QUEUE_DELAY_US = 5000  # ascend_mindie.py: max_queue_delay_microseconds: int = 5000
MINDIE_QUEUE_DELAY_RANGE_US = (500, 1_000_000)  # schedule_config.cpp CheckMaxMinValue(..., 1000000U, 500U)


def _bench():
    spec = importlib.util.spec_from_file_location("serve_published", ROOT / "bench" / "serve_published.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["serve_published"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench():
    return _bench()


def replay_scheduler(step: float, delay: float, arrivals: int = 20000) -> float:
    """Mean wait from arrival to prefill start under MindIE's rule, replayed: decode steps end
    at ``step, 2 step, ...``; at each end the scheduler prefills iff the prompt has waited at
    least ``delay``, else runs another decode step. Arrivals spread evenly over one step."""
    total = 0.0
    for i in range(arrivals):
        arrival = (i + 0.5) / arrivals * step  # within the decode step in flight (0, step)
        boundary = step
        while boundary - arrival < delay:  # !ShouldImmediatePrefill(): one more decode step
            boundary += step
        total += boundary - arrival
    return total / arrivals


@pytest.mark.parametrize("step,delay", [(0.023, 0.005), (0.012, 0.005), (0.004, 0.005), (0.010, 0.030),
                                        (0.010, 0.0), (0.050, 0.050)])
def test_held_wait_is_the_scheduler_rule_replayed(step, delay):
    assert held_prefill_wait(step, delay) == pytest.approx(replay_scheduler(step, delay), rel=1e-3)


def test_no_hold_is_the_plain_residual_of_the_step_in_flight():
    assert held_prefill_wait(0.02, 0.0) == pytest.approx(0.01)


def test_the_bench_holds_mindie_prompts_for_gpustacks_configured_delay(bench):
    delay_us = bench.queue_delay("MindIE 2.1RC1") * 1e6
    assert delay_us == pytest.approx(GPUSTACK_MINDIE_QUEUE_DELAY_US)
    assert MINDIE_QUEUE_DELAY_RANGE_US[0] <= delay_us <= MINDIE_QUEUE_DELAY_RANGE_US[1]
    for engine in ("vLLM-Ascend v0.9.1", "vLLM v0.6.0", "SGLang v0.3.0", "TensorRT-LLM v0.6.1"):
        assert bench.queue_delay(engine) == 0.0


def test_the_mindie_row_moves_by_the_hold_and_no_other_row_moves(bench):
    rows = bench.load_rows()
    held = [bench.predict(r) for r in rows]
    saved = dict(bench.QUEUE_DELAY_S)
    bench.QUEUE_DELAY_S.clear()
    try:
        plain = [bench.predict(r) for r in rows]
    finally:
        bench.QUEUE_DELAY_S.update(saved)
    moved = [(r, h - p) for r, h, p in zip(rows, held, plain) if h != p]
    assert [(r["engine"], r["scenario"], r["metric"]) for r, _ in moved] == [("MindIE 2.1RC1", "concurrency", "ttft_s")]
    row, shift = moved[0]
    assert shift == pytest.approx(GPUSTACK_MINDIE_QUEUE_DELAY_US * 1e-6)
    assert "Mean TTFT (ms): 112.38" in row["quote"] and math.isclose(float(row["value"]), 0.11238)
