"""Pipeline-schedule formulas: how many micro-batches each rank holds, and the bubble.

Notation: ``p`` pipeline ranks, ``v`` model chunks per rank, ``m`` micro-batches.
"""
from __future__ import annotations


def in_flight_chunks(schedule: str, p: int, v: int, m: int, rank: int) -> int:
    """Model-chunk activations pipeline rank ``rank`` holds at its peak.

    * GPipe: all ``m`` forward passes finish before any backward: ``m * v``.
    * 1F1B [Narayanan et al. SC'21 sec. 2.2]: rank ``i`` runs ``p - i`` warm-up
      forwards before its first backward, so it holds ``min(m, p - i)`` micro-batches.
    * Interleaved 1F1B: Megatron's warm-up count for rank ``i`` is
      ``2 (p - i - 1) + (v - 1) p`` chunk forwards, plus the one in progress; for rank 0
      that is ``v p + p - 1`` chunks = ``p (1 + (p-1)/(p v))`` micro-batches of its
      layers, the factor in Korthikanti et al. 2022 sec. 4.2.3.
    * Zero-bubble (ZB-H1) keeps the 1F1B activation footprint [Qi et al. 2023].
    """
    if p == 1:
        return 1
    if schedule == "gpipe":
        return m * v
    if v == 1:
        return min(m, p - rank)
    return min(m * v, 2 * (p - rank - 1) + (v - 1) * p + 1)


def pipeline_time(stage_times: list[float], m: int, v: int, schedule: str) -> float:
    """Time for ``m`` micro-batches through stages with per-micro-batch times ``stage_times``.

    With uniform stages, 1F1B and GPipe take ``(m + p - 1) t`` and interleaving divides
    the fill/drain by ``v``: ``(m + (p - 1)/v) t`` [Narayanan et al. SC'21 eq. 1-2].
    For uneven stages the slowest stage sets the steady state and the fill/drain walks
    through every stage once: ``m * max(t) + (sum(t) - max(t)) / v`` (the AMP cost,
    Li et al. 2022, generalised to interleaving). A zero-bubble schedule fills most of
    the bubble with weight-gradient work; we charge a third of the 1F1B bubble (ZB-H1,
    Qi et al. 2023, Table 3 reports bubble rates of ~1/3 of 1F1B's).
    """
    if not stage_times:
        return 0.0
    return pipeline_time_of(sum(stage_times), max(stage_times), m, v, schedule)


def pipeline_time_of(total: float, slowest: float, m: int, v: int, schedule: str) -> float:
    """:func:`pipeline_time` from the sum and the maximum of the stage times (all it uses)."""
    bubble = (total - slowest) / v
    if schedule == "zero-bubble":
        bubble /= 3
    return m * slowest + bubble


def bubble_fraction(p: int, v: int, m: int) -> float:
    """Idle fraction of a uniform pipeline, ``(p - 1) / (v m + p - 1)``."""
    return (p - 1) / (v * m + p - 1) if p > 1 else 0.0
