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

import math
from pathlib import Path

import pytest
from test_serve_published import _bench

from partita.serve.queueing import held_prefill_wait

ROOT = Path(__file__).resolve().parents[1]
GPUSTACK_MINDIE_QUEUE_DELAY_US = 5000  # ascend_mindie.py: max_queue_delay_microseconds: int = 5000
MINDIE_QUEUE_DELAY_RANGE_US = (500, 1_000_000)  # schedule_config.cpp CheckMaxMinValue(..., 1000000U, 500U)


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


# --- prefills in forwards of their own (MindIE's "Standard" template) -------------------------
GPUSTACK_MINDIE_MAX_PREFILL_BATCH = 50  # ascend_mindie.py: max_prefill_batch_size: int = 50
GPUSTACK_MINDIE_MAX_SEQ_LEN_CAP = 8192  # ascend_mindie.py: "if max_seq_len > 8192: max_seq_len = 8192";
#                                          schedule_config["maxPrefillTokens"] = max_seq_len


def replay_refill(seqs: int, output_len: float, cap: int, forward, steps: int, seed: int) -> float:
    """MindIE's loop in a burst, replayed: each decode step every running sequence ends with
    chance 1 / output_len (exponential lengths); the freed slots are refilled by prefill
    forwards of at most ``cap`` prompts before the next decode step. Returns prefill seconds
    per admitted prompt."""
    import random
    rng = random.Random(seed)
    spent, admitted = 0.0, 0
    for _ in range(steps):
        freed = sum(rng.random() < 1 / output_len for _ in range(seqs))
        while freed:
            k = min(freed, cap)
            spent += forward(k)
            admitted += k
            freed -= k
    return spent / admitted


def test_refill_share_is_linearity_of_expectation_for_a_linear_forward():
    """T_p(k) = a + b k, no cap binding: E[T_p(K); K >= 1] = a P(K >= 1) + b E[K]."""
    from partita.serve.queueing import refill_prefill_share
    a, b, n, out = 0.031, 0.002, 200, 202.0
    p = 1 / out
    expected = (a * (1 - (1 - p) ** n) + b * n * p) / (n * p)
    assert refill_prefill_share(lambda k: a + b * k, n, out, 50) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("n,out", [(2000, 2.0), (8, 1.0), (8, 0.5)])
def test_refill_share_at_the_edges_is_still_linearity_of_expectation(n, out):
    """A large batch ((1 - p)^n underflows a float) and one-token outputs (every sequence
    ends each step, K = n): the same closed form as above, no cap binding."""
    from partita.serve.queueing import refill_prefill_share
    a, b = 0.031, 0.002
    p = 1 / max(out, 1.0)
    expected = (a * (1 - (1 - p) ** n) + b * n * p) / (n * p)
    assert refill_prefill_share(lambda k: a + b * k, n, out, 10 ** 6) == pytest.approx(expected, rel=1e-9)


def test_queueing_formulas_refuse_an_empty_batch_in_one_line():
    from partita.serve.queueing import backlog_tpot, refill_prefill_share
    with pytest.raises(ValueError, match="seqs >= 1"):
        refill_prefill_share(lambda k: 1.0, 0, 5.0, 50)
    with pytest.raises(ValueError, match="max_prompts >= 1"):
        refill_prefill_share(lambda k: 1.0, 8, 5.0, 0)
    with pytest.raises(ValueError, match="prompts >= 1"):
        backlog_tpot(0, 8, 5, 0.01, 0.05, 4)


def test_backlog_tpot_of_one_token_outputs_is_the_decode_step():
    """With every output one token long no request has a TPOT (vllm bench serve averages over
    O_i > 1), so nothing waits in one: the decode step alone, not a division by zero."""
    from partita.serve.queueing import backlog_tpot
    assert backlog_tpot(100, 10, 1, 0.01, 0.05, 4, spread="exponential") == 0.01


@pytest.mark.parametrize("seqs,out,cap", [(8, 5.0, 2), (6, 3.0, 50), (10, 20.0, 1)])
def test_refill_share_is_the_loop_replayed(seqs, out, cap):
    from partita.serve.queueing import refill_prefill_share
    forward = lambda k: 0.04 + 0.003 * k ** 1.5  # any increasing forward time
    sim = replay_refill(seqs, out, cap, forward, steps=20000, seed=7)
    assert refill_prefill_share(forward, seqs, out, cap) == pytest.approx(sim, rel=0.03)


def test_the_bench_prefills_mindie_prompts_in_forwards_capped_as_gpustack_configures(bench):
    assert bench.separate_prefill("MindIE 2.1RC1") == (GPUSTACK_MINDIE_MAX_PREFILL_BATCH, GPUSTACK_MINDIE_MAX_SEQ_LEN_CAP)
    for engine in ("vLLM-Ascend v0.9.1", "vLLM v0.6.0", "SGLang v0.3.0", "TensorRT-LLM v0.6.1"):
        assert bench.separate_prefill(engine) is None


def test_a_burst_fills_each_forward_to_the_first_cap_reached_and_a_closed_loop_prefills_alone(bench):
    """maxPrefillBatchSize and maxPrefillTokens: "whichever reaches its value first completes
    the batch" - in a burst (every prompt waiting; MindIE prefills what its KV cache holds
    before decoding) 128-token prompts go 50 a forward (not 8192 // 128 = 64), 2000-token 4,
    217-token 37, whatever the length law; at 4 in flight a prompt mostly has a forward to
    itself (two of four sequences end in the same step with chance ~ 6 / 202^2)."""
    from partita.models.registry import resolve_model
    from partita.serve import latency
    from partita.serve.workload import Layout
    from partita.spec.hardware import load_device
    model, device, layout = resolve_model("qwen3-30b-a3b").spec(), load_device("ascend-910b3"), Layout(2, 1, 1)
    caps = bench.separate_prefill("MindIE 2.1RC1")
    for prompt_len, per_forward in ((128, 50), (2000, 4), (217, 37), (32000, 1)):
        forward = latency.batch_prefill_time(model, device, layout, prompt_len, per_forward, 8, "megatron")
        for lengths in ("fixed", "exponential"):
            rec = {"prompt_len": str(prompt_len), "output_len": "100", "lengths": lengths, "scenario": "saturated"}
            share = bench.separate_prefill_share(model, device, layout, rec, 200, 8, "megatron", caps)
            assert share == pytest.approx(forward / per_forward)
    rec = {"prompt_len": "217", "output_len": "202", "lengths": "", "scenario": "concurrency"}
    alone = latency.batch_prefill_time(model, device, layout, 217, 1, 8, "megatron")
    share = bench.separate_prefill_share(model, device, layout, rec, 4, 8, "megatron", caps)
    assert share == pytest.approx(alone, rel=0.01) and share <= alone  # two in one forward share its weight read


# --- a burst prefilled whole before it decodes (MindIE, KV cache holding every prompt) --------
def replay_backlog(prompts, seqs, out, t_dec, forward, per_forward, spread, seed):
    """The burst replayed: prefill forwards of ``per_forward`` prompts one after another (each
    prompt's first token at its forward's end), then decode steps of ``t_dec`` over at most
    ``seqs`` sequences, first come first served; lengths fixed or geometric with mean ``out``.
    Returns ``vllm bench serve``'s mean TPOT, (e2e - TTFT) / (O_i - 1) over O_i > 1."""
    import random
    rng = random.Random(seed)
    if spread == "fixed":
        lengths = [out] * prompts
    else:
        lengths = [1 + int(math.log(1 - rng.random()) / math.log(1 - 1 / out)) for _ in range(prompts)]
    first = [math.ceil((i + 1) / per_forward) * forward for i in range(prompts)]
    now = math.ceil(prompts / per_forward) * forward
    left = [n - 1 for n in lengths]
    queue = [i for i in range(prompts) if left[i] > 0]
    running, end = [], {}
    while queue or running:
        while queue and len(running) < seqs:
            running.append(queue.pop(0))
        now += t_dec
        for i in running:
            left[i] -= 1
            if left[i] == 0:
                end[i] = now
        running = [i for i in running if left[i] > 0]
    tpots = [(end[i] - first[i]) / (lengths[i] - 1) for i in range(prompts) if lengths[i] > 1]
    return sum(tpots) / len(tpots)


@pytest.mark.parametrize("args", [(1000, 200, 4, 0.041, 0.13, 50), (200, 50, 10, 0.02, 0.1, 8)])
def test_backlog_tpot_with_fixed_lengths_is_the_burst_replayed(args):
    from partita.serve.queueing import backlog_tpot
    assert backlog_tpot(*args, spread="fixed") == pytest.approx(replay_backlog(*args, "fixed", 0), rel=1e-9)


def test_backlog_tpot_with_a_chat_spread_is_the_burst_replayed():
    """The ShareGPT burst's shape (1000 prompts, 200 decode slots, mean 202 tokens, 37 prompts a
    forward): the closed form takes the full batch's completion rate for the slots' release;
    the replay draws every length (mean over seeds)."""
    from partita.serve.queueing import backlog_tpot
    args = (1000, 200, 202, 0.043, 0.37, 37)
    replayed = sum(replay_backlog(*args, "exponential", seed) for seed in range(3)) / 3
    assert backlog_tpot(*args, spread="exponential") == pytest.approx(replayed, rel=0.05)


def test_only_the_bursts_mindies_kv_cache_holds_whole_are_priced_as_prefilled_first(bench):
    """The backlog term applies where the KV cache holds every prompt of the burst (ShareGPT's
    1000 x 419 tokens, 1000 x 132), not to the 2K / 4K / 32K bursts, which it holds in part."""
    rows = [r for r in bench.load_rows() if r["engine"].startswith("MindIE") and r["scenario"] == "saturated"
            and r["metric"] == "tpot_s"]
    calls = []
    saved = bench.prefilled_burst_tpot
    bench.prefilled_burst_tpot = lambda *a, **kw: calls.append(a[3]["prompt_len"]) or saved(*a, **kw)
    try:
        for r in rows:
            bench.predict(r)
    finally:
        bench.prefilled_burst_tpot = saved
    assert sorted(calls) == ["128", "217"]
