"""The finite-burst throughput (:func:`partita.serve.queueing.burst_rate`) against a
step-by-step simulation of an FCFS engine written here (the oracle): ``M`` requests queued at
once, at most ``n`` decoding, every step costs ``t(b)`` for the ``b`` sequences in it and
gives each one token, a slot frees when its request has its last token."""
from __future__ import annotations

import math
import random

import pytest

from partita.serve.queueing import burst_rate, burst_tpot, colocated_rate, drain_time


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


def _simulate_tpot(lengths: list[int], prompt_len: int, chunk: int, t, share: float) -> float:
    """Mean TPOT over requests (``(last - first token) / (O_i - 1)``, one-token requests left
    out, as ``vllm bench serve`` averages it) of an engine that admits every prompt at once and
    each step decodes its running sequences, then prefills up to ``chunk - b`` prompt tokens
    FCFS; a step costs ``t(b)`` plus ``share`` per prompt's worth of prefill tokens."""
    pending, nxt, clock = [prompt_len] * len(lengths), 0, 0.0
    first, last, left, running = [0.0] * len(lengths), [0.0] * len(lengths), list(lengths), []
    while nxt < len(lengths) or running:
        budget, tokens, started = max(chunk - len(running), 0), 0, []
        while nxt < len(lengths) and budget > 0:
            take = min(budget, pending[nxt])
            pending[nxt], budget, tokens = pending[nxt] - take, budget - take, tokens + take
            if not pending[nxt]:
                started.append(nxt)
                nxt += 1
        clock += (t(len(running)) if running else 0.0) + tokens / prompt_len * share
        for r in running:
            left[r], last[r] = left[r] - 1, clock
        for r in started:
            first[r] = last[r] = clock
            left[r] -= 1
        running = [r for r in running + started if left[r] > 0]
    per = [(last[i] - first[i]) / (n - 1) for i, n in enumerate(lengths) if n > 1]
    return sum(per) / len(per)


@pytest.mark.parametrize("prompts,prompt_len,out,spread", [(400, 216, 197, "exponential"), (400, 128, 4, "fixed"),
                                                           (200, 2000, 100, "fixed"), (300, 500, 200, "exponential")])
def test_burst_tpot_matches_a_chunked_prefill_simulation(prompts, prompt_len, out, spread):
    """A burst the batch holds: the backlog's prefill chunks ride in the first steps, and the
    mean over requests leans on the short ones that decode only beside them - within 10 %
    (the closed form takes the decoding batch beside the backlog at its mean; the ramp of a
    backlog only a few steps long is what it misses most)."""
    t, share = _linear(0.03, 5e-5), 0.004 * prompt_len / 216
    rng = random.Random(3)
    lengths = ([out] * prompts if spread == "fixed" else
               [1 + int(math.log(1 - rng.random()) / math.log(1 - 1 / out)) for _ in range(prompts)])
    sim = _simulate_tpot(lengths, prompt_len, 8192, t, share)
    got = burst_tpot(prompts, prompts, out, t, share, prompt_len, 8192, spread)
    assert got == pytest.approx(sim, rel=0.10)
    steady = t(prompts) / (1 - colocated_rate(prompts, out, t(prompts), share) * share)
    if out <= 4:  # four-token requests: the steady state's t_dec / (1 - rho) is 2x the simulated mean
        assert steady > 1.5 * sim and abs(got / sim - 1) < abs(steady / sim - 1) / 5


def test_burst_tpot_is_the_steady_state_when_prompts_outnumber_the_batch():
    t, share = _linear(0.03, 5e-5), 0.004
    steady = t(256) / (1 - colocated_rate(256, 200, t(256), share) * share)
    assert burst_tpot(1000, 256, 200, t, share, 216, 8192) == pytest.approx(steady)


def test_a_scheduler_window_adds_its_mean_residual_to_the_first_token():
    """vLLM 0.6 multi-step (``--num-scheduler-steps k``): a prompt arriving at a random time
    is admitted at the next window boundary; the mean wait, simulated over Poisson arrivals
    against a periodic window of ``k`` steps, is ``k t / 2`` - and only the TTFT moves."""
    from partita.serve.queueing import colocated
    t = _linear(0.014, 2e-5)
    one = colocated(4.0, 194, 0.017, t, 1000.0, 0.013)
    ten = colocated(4.0, 194, 0.017, t, 1000.0, 0.013, window=10)
    step = t(one.seqs)
    assert (ten.seqs, ten.tpot) == (one.seqs, one.tpot)
    assert ten.ttft - one.ttft == pytest.approx(9 * step / 2, rel=1e-9)
    rng, window, clock, waits = random.Random(5), 10 * step, 0.0, []
    for _ in range(20000):
        clock += rng.expovariate(4.0)
        waits.append(math.ceil(clock / window) * window - clock)
    assert sum(waits) / len(waits) == pytest.approx(window / 2, rel=0.03)


def test_a_pipeline_holds_a_prompt_for_its_slowest_stage_only():
    """search.prefill_occupancy against vLLM's contiguous stage split written out here
    (``get_pp_indices``: the first ``layers % pp`` stages one layer longer): 80 layers over 2
    stages hold a prompt 40/80 of its share, over 3 stages 27/80; one stage all of it."""
    from partita.models.registry import resolve_model
    from partita.serve import latency
    from partita.serve.search import prefill_occupancy
    from partita.serve.workload import Layout
    from partita.spec.hardware import load_device
    model, device = resolve_model("llama3-70b").spec(), load_device("a100-80gb")
    for pp, longest in ((1, 80), (2, 40), (3, 27), (4, 20)):
        lay = Layout(4, pp, 1)
        share = latency.prefill_share(model, device, lay, 213, 8)
        assert prefill_occupancy(model, device, lay, 213, 8) == pytest.approx(share * longest / 80, rel=1e-12)
