"""The finite-burst throughput (:func:`partita.serve.queueing.burst_rate`) against a
step-by-step simulation of an FCFS engine written here (the oracle): ``M`` requests queued at
once, at most ``n`` decoding, every step costs ``t(b)`` for the ``b`` sequences in it and
gives each one token, a slot frees when its request has its last token."""
from __future__ import annotations

import math
import random

import pytest

from partita.serve.queueing import burst_rate, colocated_rate, drain_time


def _simulate(lengths: list[int], slots: int, t, share: float) -> float:
    """Requests/s of the FCFS engine above (prefill: ``share`` seconds per prompt, added)."""
    queue, running, clock = list(lengths), [], len(lengths) * share
    while queue or running:
        while queue and len(running) < slots:
            running.append(queue.pop(0))
        clock += t(len(running))
        running = [r - 1 for r in running if r > 1]
    return len(lengths) / clock


def _linear(a: float, c: float):
    return lambda b: a + c * b


def test_fixed_lengths_run_in_waves_exactly():
    t = _linear(0.02, 1e-4)
    for prompts, slots in ((1000, 256), (984, 822), (100, 100), (500, 79)):
        sim = _simulate([50] * prompts, slots, t, 0.003)
        assert burst_rate(prompts, slots, 50, t, 0.003, "fixed") == pytest.approx(sim, rel=1e-12)


@pytest.mark.parametrize("prompts,slots", [(5000, 1132), (984, 822), (200, 200), (1000, 256)])
def test_exponential_lengths_match_the_simulated_mean(prompts, slots):
    """Geometric lengths (an EOS with chance 1/O per token), mean over seeded draws: the closed
    form (memoryless drain, the integral) within 6 %."""
    mean_len, t, share = 60, _linear(0.03, 8e-5), 0.002
    rng = random.Random(7)
    sims = []
    for _ in range(6):
        lengths = [1 + int(math.log(1 - rng.random()) / math.log(1 - 1 / mean_len)) for _ in range(prompts)]
        sims.append(_simulate(lengths, slots, t, share))
    sim = sum(sims) / len(sims)
    assert burst_rate(prompts, slots, mean_len, t, share, "exponential") == pytest.approx(sim, rel=0.06)


def test_a_burst_is_slower_than_the_steady_state_by_the_drain():
    """Against queueing approximation 3 (the steady state): a long burst approaches it, a burst
    no larger than the batch falls well below it; with t = a + c b the drain integral is
    O (a ln n + c (n - 1)) (written out here)."""
    t, O, share, n = _linear(0.03, 8e-5), 200, 0.002, 800
    steady = colocated_rate(n, O, t(n), share)
    assert burst_rate(10 ** 7, n, O, t, share) == pytest.approx(steady, rel=1e-3)
    assert burst_rate(n, n, O, t, share) < 0.6 * steady
    assert drain_time(n, O, t) == pytest.approx(O * (0.03 * math.log(n) + 8e-5 * (n - 1)), rel=1e-3)


def test_an_unknown_length_law_is_refused():
    with pytest.raises(ValueError, match="spread must be one of"):
        burst_rate(10, 5, 10, _linear(0.01, 0.0), 0.0, "lognormal")
