"""Waiting for the first token and the decode batch at an arrival rate.

Requests arrive as a Poisson stream of rate ``lambda`` spread evenly over the replicas that
take them. Three documented approximations:

1. **Prefill queue** - M/D/1: prompts of one length take the same prefill time ``S``; the mean
   wait in queue is the Pollaczek-Khinchine mean-value formula for deterministic service
   (Kleinrock 1975, *Queueing Systems* vol. 1, sec. 5.5-5.6, eq. 5.87 with ``C_s^2 = 0``)::

       W = rho S / (2 (1 - rho)),   rho = lambda_r S

   A replica that also decodes first finishes the decode step in flight: on average half of
   one, ``t_dec / 2`` (the mean residual of a deterministic step).
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

Known gaps: the spread of prompt and output lengths (an M/G/1 term ``C_s^2``), chunked
prefill's finer interleaving with decode steps, and preemption when the KV pool runs out are not modelled; the
KV pool bounds ``N`` instead (:mod:`.memory`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable


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
              max_seqs: float, share: float | None = None) -> Operating:
    """The steady state of a replica that prefills and decodes, at ``rate`` requests/s.
    ``share``: the replica time one prompt takes when the engine packs prompts into chunks
    (:func:`partita.serve.latency.prefill_share`; default ``prefill``): it sets the load
    ``rho``, while a prompt's own latency and the M/D/1 wait stay ``prefill``."""
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
    ttft = prefill + md1_wait(rho, prefill) + step / 2
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
