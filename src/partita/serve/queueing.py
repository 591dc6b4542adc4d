"""Waiting for the first token and the decode batch at an arrival rate.

Requests arrive as a Poisson stream of rate ``lambda`` spread evenly over the replicas that
take them. Three documented approximations:

1. **Prefill queue** - M/D/1: prompts of one length take the same prefill time ``S``; the mean
   wait in queue is the Pollaczek-Khinchine mean-value formula for deterministic service
   (Kleinrock 1975, *Queueing Systems* vol. 1, sec. 5.5-5.6, eq. 5.87 with ``C_s^2 = 0``)::

       W = rho S / (2 (1 - rho)),   rho = lambda_r S

   A replica that also decodes first finishes the decode step in flight: on average half of
   one, ``t_dec / 2`` (the mean residual of a deterministic step). An engine that schedules
   once per window of ``k`` decode steps (vLLM 0.6's multi-step scheduling,
   ``--num-scheduler-steps k``: ``SchedulerConfig.num_scheduler_steps``, "maximum number of
   forward steps per scheduler call") admits a new prompt only at a window's end: the
   residual is that of the window, ``k t_dec / 2``.
2. **Decode batch** - Little's law (Little 1961): ``N = lambda_r x O x TPOT`` sequences decode
   at once.
3. **Prefill and decode on one replica** (continuous batching, Yu et al. OSDI'22 Orca; vLLM,
   Kwon et al. 2023) share its time: prefills take the fraction ``rho`` of it and decode steps
   the rest, so ``TPOT = t_dec(N) / (1 - rho)``. With (2) the rate a replica sustains with
   ``N`` sequences in decode is explicit::

       lambda_r(N) = N / (O t_dec(N) + N S)

   and at a given rate ``N`` is found by bisection (``lambda_r(N)`` increases with ``N``).

With chunked prefill the engine packs waiting prompts into one forward of up to ``C`` tokens
(:data:`partita.serve.latency.CHUNK_TOKENS`), so the replica time a prompt takes is its share
of that forward (:func:`partita.serve.latency.prefill_share`), ``S_c <= S``: ``rho`` and
``lambda_r(N)`` use ``S_c``; a prompt's own prefill latency stays ``S``.

**A finite burst** (a benchmark that sends ``M`` prompts at once and divides the tokens by
the time the last one finishes: ``vllm bench serve`` / ``sglang.bench_serving`` at rate
``inf``) is not the steady state (3) describes: it ends in a *drain*, when the queue is empty
and the batch shrinks as requests finish while every step still reads the weights
(:func:`burst_rate`). With FCFS admission up to ``n`` sequences and output lengths of mean
``O``:

* fixed lengths (the benchmarks' ``random`` datasets): requests run in ``ceil(M / n)`` waves
  of ``O`` steps, the last one with the remainder ``M - (w - 1) n``;
* lengths with the spread of a chat trace (ShareGPT): modelled as exponential with mean ``O``
  (the maximum-entropy law for a positive length of known mean; an EOS drawn with a constant
  chance per token). While prompts wait the batch stays full and ``M - n`` requests finish in
  ``(M - n) O / n`` steps; then the ``n`` left drain, and since an exponential's residual is
  again exponential with mean ``O`` (memorylessness), ``E[b_k] = n e^(-k/O)`` sequences remain
  after ``k`` more steps, for ``O ln n`` steps::

      T_drain = sum_k t_dec(n e^(-k/O))  ~  O integral_0^(ln n) t_dec(n e^(-u)) du

  Every prompt still costs its prefill share ``S_c``: ``T = M S_c + (M - n)^+ O t_dec(n) / n
  + T_drain`` and the published rate is ``M O / T``. With ``t_dec(b) = a + c b`` the drain
  costs ``O a (ln n - 1)`` more than the steady state would: the weights read once per step
  for steps that carry few tokens.

The *mean TPOT* such a benchmark reports (``vllm bench serve``: per request ``(e2e - TTFT) /
(O_i - 1)``, averaged over requests) differs from the steady state's when the whole burst
fits the batch (``M <= n``): every prompt is admitted at once and the engine spends its first
``K_A = M P / (C - b_A)`` steps prefilling the backlog: the step's token budget ``C``
(vLLM's ``max_num_batched_tokens``, SGLang's ``chunked_prefill_size``; Agrawal et al. 2024,
Sarathi-Serve sec. 4) less one token for each of the ``b_A`` sequences decoding beside it,
``b_A = min(M / 2, O C / P)`` (half the burst on average, or as many as live ``O`` steps when
``C / P`` prompts start each step); each step costs ``t_A = (C - b_A) / P x S_c + t_dec(b_A)``.
The request admitted at ``x = i / M`` of the
backlog gets its first token at step ``x K_A`` and lives through the ``(1 - x) K_A`` steps
left in it, then through steps at ``t_B = t_dec(M a_i)``, ``a_i`` the share of the burst
still decoding, averaged over its ``d_i = O_i - 1`` steps (with fixed lengths those started
within ``d_i`` steps of it, ``min(1, d_i / K_A)``; with exponential ones
``O (1 - e^(-d_i / O)) / d_i``): ``TPOT_i = t_B + (t_A - t_B)
min(1, (1 - x) K_A / d_i)`` (:func:`burst_tpot`). Short requests spend their whole
decode in the backlog, so the mean over requests leans on ``t_A``; with ``M > n`` prompts
keep arriving at the batch as slots free and the steady state holds.

Known gaps: the spread of prompt and output lengths in the steady state (an M/G/1 term
``C_s^2``), chunked prefill's finer interleaving with decode steps, and preemption when the KV
pool runs out are not modelled; the KV pool bounds ``N`` instead (:mod:`.memory`).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


def md1_wait(rho: float, service: float) -> float:
    """Mean wait in queue of an M/D/1 server (inf at or beyond saturation)."""
    if rho >= 1:
        return math.inf
    return rho * service / (2 * (1 - rho))


def md1_max_load(wait_budget: float, service: float) -> float:
    """The largest ``rho`` whose M/D/1 wait is at most ``wait_budget`` (inverse of :func:`md1_wait`)."""
    if wait_budget <= 0:
        return 0.0
    return 2 * wait_budget / (service + 2 * wait_budget)


def held_prefill_wait(step: float, max_delay: float) -> float:
    """Mean seconds from a prompt's arrival to the start of its prefill on a replica that is
    decoding in steps of ``step`` seconds, when the scheduler (deciding at each step's end)
    runs a prefill only once the oldest waiting request has queued ``max_delay`` seconds and
    otherwise runs one more decode step.

    This is MindIE's mixed prefill/decode scheduling with ``supportSelectBatch`` off:
    ``Scheduler::DecidePDPriority`` picks ``DECODE_FIRST`` while ``!ShouldImmediatePrefill()``,
    which is true only when ``now - waiting_.Front()->arriveTime >= maxQueueDelayMicroseconds``
    (or, for a delay above the 5000 us default, once ``maxPrefillBatchSize`` prompts wait) -
    Ascend/MindIE-LLM ``src/scheduler/scheduler.cpp`` at v3.0.0 (8b4871ad), the same at the
    first public sync 40fb063; the service docs (``service_parameter_configuration.md``):
    "the longest a request waits in the queue before maxBatchSize, maxPrefillBatchSize or
    maxPrefillTokens is reached", default 5000 us.

    Derivation: the arrival falls uniformly within a step, so the residual ``r ~ U(0, t)``
    ends the step in flight; ``k = max(0, ceil((D - r) / t))`` more steps follow before the
    prompt's age reaches ``D``. For ``D = q t + f`` (``0 <= f < t``) ``k = q + 1`` when
    ``r < f`` and ``q`` otherwise, so ``E[k] = q + f / t = D / t`` and the mean wait is
    ``t / 2 + t E[k] = t / 2 + D`` for every ``D >= 0`` (``D = 0``: the plain step residual)."""
    return step / 2 + max_delay


def refill_prefill_share(batch_prefill: Callable[[int], float], seqs: int, output_len: float,
                         max_prompts: int) -> float:
    """Replica seconds per admitted prompt when the engine runs prefills as forwards of their
    own (no chunking beside the decodes) and a prompt is there for each slot as it frees - a
    closed loop, whose client sends the next request when one ends: a batch of ``seqs``
    sequences whose output lengths are exponential with mean ``output_len`` (the chat-trace
    law of :func:`burst_rate`) ends ``K ~ Binomial(seqs, 1 / output_len)`` of them a step, and
    when ``K >= 1`` the next forward prefills those ``K`` prompts (in forwards of at most
    ``max_prompts``), so a step carries ``E[T_p(K); K >= 1]`` of prefill for
    ``E[K] = seqs / output_len`` prompts::

        share = sum_k P(K = k) T_p(k) / E[K]

    ``T_p(k)`` = ``batch_prefill(k)`` for ``k <= max_prompts``, whole forwards of
    ``max_prompts`` plus the remainder beyond. MindIE's "Standard" template ("Prefill
    requests and Decode requests each form their own batch", service_parameter_configuration.md)
    runs a prefill once the oldest waiting prompt is ``maxQueueDelayMicroseconds`` old
    (:func:`held_prefill_wait`), a forward taking at most ``maxPrefillBatchSize`` prompts and
    ``maxPrefillTokens`` tokens ("whichever is reached first completes the batch"); each such
    forward reads the weights again, so with one prompt it costs nearly a full weight read where
    a chunked-prefill engine folds the prompt into a decode step. (In a burst every prompt waits
    from the start and MindIE prefills all its KV cache holds first, in full forwards: not this.)"""
    if seqs < 1 or max_prompts < 1:
        raise ValueError(f"refill_prefill_share needs seqs >= 1 and max_prompts >= 1, got {seqs} and {max_prompts}")

    def t_p(k: int) -> float:
        full, rest = divmod(k, max_prompts)
        return full * batch_prefill(max_prompts) + (batch_prefill(rest) if rest else 0.0)

    p = 1.0 / max(output_len, 1.0)
    if p >= 1.0:  # every sequence ends each step: K = seqs always
        return t_p(seqs) / seqs
    mean, log_p, log_q = seqs * p, math.log(p), math.log1p(-p)
    total = 0.0
    for k in range(1, seqs + 1):  # P(K = k) in log space: (1 - p)^seqs underflows for large batches
        prob = math.exp(math.lgamma(seqs + 1) - math.lgamma(k + 1) - math.lgamma(seqs - k + 1)
                        + k * log_p + (seqs - k) * log_q)
        total += prob * t_p(k)
        if k > mean and prob < 1e-12:
            break
    return total / mean


def backlog_tpot(prompts: int, seqs: int, output_len: int, t_dec: float, forward: float, per_forward: int,
                 spread: str = "exponential") -> float:
    """Mean TPOT over a burst's requests when the engine prefills the whole burst first and
    then decodes at most ``seqs`` sequences a step, first come first served - MindIE with every
    prompt waiting and its KV cache holding them all (``PREFILL_FIRST`` while a prompt waits;
    ``maxBatchSize`` the decode batch). ``vllm bench serve``'s TPOT is ``(e2e - TTFT) / (O_i -
    1)`` over the requests with ``O_i > 1``, so a request prefilled early that waits, first
    token in hand, for a decode slot counts that wait in its TPOT.

    Prompt ``i`` (1-based) gets its first token at the end of forward ``ceil(i / k)`` (``k`` =
    ``per_forward`` prompts a forward of ``forward`` seconds); the prefill phase lasts ``T0 =
    ceil(M / k) forward``. Its decoding starts at ``T0`` for the first ``seqs``; after them, with
    fixed lengths, in waves of ``seqs`` every ``O - 1`` steps, and with exponential lengths
    (mean ``O``; the chat-trace law of :func:`burst_rate`) when the ``(i - seqs)``-th request
    ends, at the full batch's completion rate ``seqs / O`` a step. With ``t`` = ``t_dec`` and
    ``w_i`` = start - first token::

        TPOT = t + mean_i(w_i) E[1 / (O_i - 1) | O_i > 1]

    (lengths drawn independently of the position: geometric with mean ``O`` for exponential)."""
    if spread not in SPREADS:
        raise ValueError(f"spread must be one of {SPREADS}, got {spread!r}")
    if prompts < 1 or seqs < 1:
        raise ValueError(f"backlog_tpot needs prompts >= 1 and seqs >= 1, got {prompts} and {seqs}")
    k = max(1, per_forward)
    t0 = math.ceil(prompts / k) * forward
    if spread == "fixed":
        inv = 1.0 / max(output_len - 1, 1)
    else:
        p = 1.0 / max(output_len, 1.0)
        if p >= 1.0:  # every output one token long: no request has a TPOT to wait in
            return t_dec
        # E[1 / (O - 1) | O > 1] for P(O = j) = p q^(j-1): sum_{m>=1} p q^m / m / q = -p ln(p) / q
        inv = -p * math.log(p) / (1 - p)
    wait = 0.0
    for i in range(1, prompts + 1):
        first = math.ceil(i / k) * forward
        if spread == "fixed":
            start = t0 + (i - 1) // seqs * max(output_len - 1, 1) * t_dec
        else:
            start = t0 + max(0, i - seqs) * output_len * t_dec / seqs
        wait += start - first
    return t_dec + wait / prompts * inv


@dataclass(frozen=True)
class Operating:
    """A replica's steady state at one rate: decoding sequences, TTFT and TPOT (seconds)."""

    seqs: float
    ttft: float
    tpot: float
    stable: bool

    def meets(self, ttft_target: float | None, tpot_target: float | None) -> bool:
        return self.stable and (ttft_target is None or self.ttft <= ttft_target) and (
            tpot_target is None or self.tpot <= tpot_target)


UNSTABLE = Operating(math.inf, math.inf, math.inf, False)


def colocated_rate(seqs: float, output_len: int, t_dec: float, prefill: float) -> float:
    """Requests/s a replica sustains with ``seqs`` sequences in decode (approximation 3)."""
    return seqs / (output_len * t_dec + seqs * prefill)


def colocated(rate: float, output_len: int, prefill: float, t_dec: Callable[[float], float],
              max_seqs: float, share: float | None = None, window: int = 1) -> Operating:
    """The steady state of a replica that prefills and decodes, at ``rate`` requests/s.
    ``share``: the replica time one prompt takes when the engine packs prompts into chunks
    (:func:`partita.serve.latency.prefill_share`; default ``prefill``): it sets the load
    ``rho``, while a prompt's own latency and the M/D/1 wait stay ``prefill``. ``window``: the
    decode steps the engine runs per scheduler call (approximation 1)."""
    share = prefill if share is None else share
    rho = rate * share
    if rho >= 1 or rate >= colocated_rate(max_seqs, output_len, t_dec(max_seqs), share):
        return UNSTABLE
    lo, hi = 0.0, float(max_seqs)
    for _ in range(40):
        mid = (lo + hi) / 2
        if colocated_rate(max(mid, 1e-9), output_len, t_dec(max(mid, 1.0)), share) < rate:
            lo = mid
        else:
            hi = mid
    seqs, step = hi, t_dec(max(hi, 1.0))
    ttft = prefill + md1_wait(rho, prefill) + window * step / 2
    return Operating(seqs, ttft, step / (1 - rho), True)


def decode_only(rate: float, output_len: int, t_dec: Callable[[float], float], max_seqs: float) -> tuple[float, float]:
    """(sequences, TPOT) of a decode-only replica at ``rate`` (inf, inf beyond its capacity)."""
    if rate >= max_seqs / (output_len * t_dec(max_seqs)):
        return math.inf, math.inf
    lo, hi = 0.0, float(max_seqs)
    for _ in range(40):
        mid = (lo + hi) / 2
        if max(mid, 1e-9) / (output_len * t_dec(max(mid, 1.0))) < rate:
            lo = mid
        else:
            hi = mid
    return hi, t_dec(max(hi, 1.0))


#: output-length laws :func:`burst_rate` knows: every request the same length (``random``
#: datasets), or a chat trace's spread modelled as exponential (module docstring)
SPREADS = ("fixed", "exponential")
DRAIN_POINTS = 32  # midpoint rule over u in [0, ln n] (t_dec is smooth and monotone in the batch)


def drain_time(seqs: float, output_len: float, t_dec: Callable[[float], float]) -> float:
    """Seconds to finish ``seqs`` in-flight sequences whose residual lengths are exponential
    with mean ``output_len``: ``O integral_0^(ln n) t_dec(n e^(-u)) du`` (module docstring)."""
    if seqs <= 1:
        return output_len * t_dec(1.0)
    top = math.log(seqs)
    du = top / DRAIN_POINTS
    return output_len * du * sum(t_dec(max(1.0, seqs * math.exp(-(i + 0.5) * du))) for i in range(DRAIN_POINTS))


def burst_rate(prompts: int, seqs: float, output_len: int, t_dec: Callable[[float], float], share: float,
               spread: str = "exponential") -> float:
    """Requests/s a benchmark measures when it sends ``prompts`` requests at once to a replica
    that runs at most ``seqs`` of them (total requests over the time the last one finishes;
    module docstring, "A finite burst")."""
    if spread not in SPREADS:
        raise ValueError(f"spread must be one of {SPREADS}, got {spread!r}")
    n = max(1.0, min(float(seqs), float(prompts)))
    if spread == "fixed":
        waves = math.ceil(prompts / n)
        last = prompts - (waves - 1) * n
        decode = (waves - 1) * output_len * t_dec(n) + output_len * t_dec(last)
    else:
        decode = max(0.0, prompts - n) * output_len * t_dec(n) / n + drain_time(n, output_len, t_dec)
    return prompts / (prompts * share + decode)


BURST_POINTS = 16  # midpoints over the backlog position x and over the output-length quantiles


def _decode_lengths(output_len: float, spread: str) -> list[float]:
    """Decode steps ``O_i - 1`` at the midpoint quantiles of the length law (at least 1: a
    one-token request has no TPOT and the benchmarks leave it out)."""
    if spread == "fixed":
        return [max(1.0, output_len - 1)]
    return [max(1.0, -output_len * math.log(1 - (j + 0.5) / BURST_POINTS) - 1) for j in range(BURST_POINTS)]


def burst_tpot(prompts: int, seqs: float, output_len: int, t_dec: Callable[[float], float], share: float,
               prompt_len: int, chunk_tokens: int, spread: str = "exponential") -> float:
    """Mean TPOT over the requests of a burst of ``prompts`` sent at once (module docstring,
    "The mean TPOT"); the steady state's ``t_dec(n) / (1 - rho)`` when the burst exceeds the
    batch ``seqs``."""
    if spread not in SPREADS:
        raise ValueError(f"spread must be one of {SPREADS}, got {spread!r}")
    if prompts > seqs:
        rate = colocated_rate(seqs, output_len, t_dec(seqs), share)
        return t_dec(seqs) / (1 - rate * share)
    per_chunk = chunk_tokens // prompt_len if prompt_len <= chunk_tokens else chunk_tokens / prompt_len
    running = max(1.0, min(prompts / 2, per_chunk * output_len))  # decoding beside the backlog
    budget = max(chunk_tokens - running, chunk_tokens / 2)
    steps_a = prompts * prompt_len / budget
    t_a = budget / prompt_len * share + t_dec(running)
    total = 0.0
    for d in _decode_lengths(output_len, spread):
        if spread == "fixed":  # the others started within d steps of it are still decoding
            alive = min(1.0, d / steps_a)
        else:
            alive = min(1.0, output_len * (1 - math.exp(-d / output_len)) / d)
        t_b = t_dec(max(1.0, prompts * alive))  # the batch it shares after the backlog, on average
        total += sum(t_b + (t_a - t_b) * min(1.0, (1 - (i + 0.5) / BURST_POINTS) * steps_a / d)
                     for i in range(BURST_POINTS))
    return total / (BURST_POINTS * len(_decode_lengths(output_len, spread)))
