"""Pipeline-schedule formulas: how many micro-batches each rank holds, and the bubble.

Notation: ``p`` pipeline ranks, ``v`` model chunks per rank, ``m`` micro-batches.

DualPipeV (``schedule="dualpipev"``) [DeepSeek-V3 technical report, arXiv:2412.19437,
sec. 3.2.1 and Table 2; deepseek-ai/DualPipe README ("DualPipeV", the "cut-in-half"
DualPipe); torch ``ScheduleDualPipeV``, torch/distributed/pipelining/schedules.py, 2.13]:
the layers are cut into ``2p`` chunks, rank ``r`` holds chunks ``r`` and ``2p-1-r`` (a V:
micro-batches go down the ranks and come back up, so rank 0 computes the loss), and in the
steady state every rank runs the forward of one micro-batch's chunk together with the
backward of another's (``OVERLAP_F_B`` in torch's order), which hides one's MoE all-to-all
(dispatch/combine) under the other's compute. Warm-up and cool-down split backward into
input and weight gradients (zero-bubble style) to fill gaps. Table 2 (with its ``PP`` the
number of chunks, ``2p`` here) gives, per chunk times ``F`` (forward), ``B`` (full backward),
``W`` (weight backward), ``F&B`` (an overlapped pair):

* bubble ``(PP/2 - 1)(F&B + B - 3W) = (p - 1)(F&B + B - 3W)``;
* activations ``PP + 1 = 2p + 1`` chunk micro-batches per rank (every rank, not only the first);
* parameters per rank as 1F1B on ``p`` ranks (the "2x" is against 1F1B on ``2p`` devices).

tests/test_dualpipev.py simulates torch's own per-rank action list with these durations:
the bubble matches the slowest rank's idle time exactly when ``W = F = B/2`` (the model's
shares below) and ``F&B >= B``, for p 2-8 and odd and even m; the peak in-flight chunks is
``2p + 1`` on every rank; the overlapped pairs per rank are counted as in
:func:`fb_overlap_share`. MindSpeed's dualpipev page (docs/features/dualpipev.md) writes
``(PP - 1)(F&B + B - W) - F``, which torch's order does not reproduce; we use DeepSeek's.
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
    * DualPipeV: ``2p + 1`` chunks on every rank (module docstring), at most ``2 m``.
    """
    if p == 1:
        return 1
    if schedule == "dualpipev":
        return min(2 * m, 2 * p + 1)
    if schedule == "gpipe":
        return m * v
    if v == 1:
        return min(m, p - rank)
    return min(m * v, 2 * (p - rank - 1) + (v - 1) * p + 1)


def pipeline_time(stage_times: list[float], m: int, v: int, schedule: str, send: float = 0.0) -> float:
    """Time for ``m`` micro-batches through stages with per-micro-batch times ``stage_times``.

    With uniform stages, 1F1B and GPipe take ``(m + p - 1) t`` and interleaving divides
    the fill/drain by ``v``: ``(m + (p - 1)/v) t`` [Narayanan et al. SC'21 eq. 1-2].
    For uneven stages the slowest stage sets the steady state and the fill/drain walks
    through every stage once: ``m * max(t) + (sum(t) - max(t)) / v`` (the AMP cost,
    Li et al. 2022, generalised to interleaving). A zero-bubble schedule fills most of
    the bubble with weight-gradient work; we charge a third of the 1F1B bubble (ZB-H1,
    Qi et al. 2023, Table 3 reports bubble rates of ~1/3 of 1F1B's).

    DualPipeV: with a rank's per-micro-batch time ``t = 2 (F + B)`` (two chunks) and the
    step model's shares ``B = 2F`` (backward twice the forward), ``W = B/2 = F`` (the weight
    and input gradients are one GEMM each), ``F&B = F + B`` (the overlap hides
    communication, already taken out of ``t`` by :func:`fb_overlap_share`; the two chunks'
    compute still adds up): ``(p-1)(F&B + B - 3W) = (p-1)(F + 2B - 3F) = (p-1) 2F = (p-1) t/3``,
    and for uneven stages ``(sum(t) - max(t)) / 3``, the 1F1B fill/drain divided by 3.

    With ``send > 0`` (a framework whose sends do not block the sender,
    :data:`ASYNC_P2P_FRAMEWORKS`, under 1F1B or interleaved 1F1B; ``stage_times`` then hold
    each stage's two sends, ``2 send``) the steady state runs at :func:`async_p2p_period`
    instead of the slowest stage's time; the fill/drain is unchanged.
    """
    if not stage_times:
        return 0.0
    if send > 0 and schedule in ASYNC_P2P_SCHEDULES and len(stage_times) > 1:
        return m * async_p2p_period(stage_times, send) + (sum(stage_times) - max(stage_times)) / v
    return pipeline_time_of(sum(stage_times), max(stage_times), m, v, schedule)


#: Frameworks whose pipeline is torch.distributed.pipelining's schedules (Partita's runtime,
#: torchtitan): an op's sends are fired right after it, in one batch with the receive the
#: rank's next op needs, and waited with it (torch 2.13 torch/distributed/pipelining/
#: schedules.py, ``Schedule1F1B._step_microbatches``: ``_batch_p2p(fwd_sends + bwd_recvs)``
#: before a backward, ``bwd_sends + fwd_recvs`` before a forward), so a transfer delays its
#: receiver, and the sender only by what its own next receive waits for anyway. On this
#: machine (gloo) pp=2's step is the last stage's busy time plus the fill and drain
#: (docs/accuracy.md). Megatron's schedules keep each send exposed (blocking
#: ``send_forward_recv_backward`` pairs on NCCL, not measured here).
ASYNC_P2P_FRAMEWORKS = frozenset({"partita", "torchtitan", "torchtitan-eager", "torchtitan-eager-loss"})
#: (the same frameworks run DualPipeV as torch's ScheduleDualPipeV: :data:`SEQUENTIAL_PAIRS` is this set)
#: the schedules :func:`async_p2p_period` is derived for (zero-bubble and DualPipeV keep their forms)
ASYNC_P2P_SCHEDULES = frozenset({"1f1b", "interleaved-1f1b"})


def async_p2p_period(stage_times: list[float], send: float) -> float:
    """Steady-state time per micro-batch of 1F1B when a send only delays its receiver.

    ``stage_times`` hold each stage's compute ``t_s`` plus its two sends (``2 c``, ``c =
    send``). Derivation (max-plus, 1F1B on two adjacent stages ``s``, ``s + 1``): stage ``s``
    runs ``F_s(i + 1)`` then ``B_s(i)``; the chain ``F_s(i) -> c -> F_{s+1}(i) -> B_{s+1}(i) -> c
    -> B_s(i) -> F_s(i + 2)`` closes after two micro-batches, so it bounds the period by
    ``(t_s + t_{s+1} + 2c) / 2``; each stage alone bounds it by its ``t_s``. The period is the
    largest cycle mean: ``max(max_s t_s, max_s (t_s + t_{s+1}) / 2 + c)``. Uniform stages give
    ``t + c`` (one transfer per micro-batch, where a blocking send exposes ``2c``); a stage
    slower than its neighbours by ``2c`` hides its sends entirely. Checked against an
    event-driven run of the 1F1B order with a transfer latency on every cross-rank dependency
    (tests/test_async_p2p_pipeline.py: p 2-8, vpp 1-2, within a few per cent where the
    blocking form is 5-15 % over), and on this machine's pp=2 runs (docs/accuracy.md,
    calibrated loop: the last stage's busy time plus the fill/drain is the measured step)."""
    own = [t - 2 * send for t in stage_times]
    pairs = [(a + b) / 2 + send for a, b in zip(own, own[1:])]
    return max(max(own), *pairs) if pairs else max(own)


def hidden_send_bound(framework: str, schedule: str, pp: int, send: float) -> float:
    """The most per micro-batch :func:`async_p2p_period` can take off the slowest stage's time
    (its two sends, ``2 send``; 0 where sends block): what a lower bound built on the slowest
    stage (``pipeline_time_of``) subtracts per micro-batch to stay below :func:`pipeline_time`."""
    if pp > 1 and framework in ASYNC_P2P_FRAMEWORKS and schedule in ASYNC_P2P_SCHEDULES:
        return 2 * send
    return 0.0


def pipeline_time_of(total: float, slowest: float, m: int, v: int, schedule: str) -> float:
    """:func:`pipeline_time` from the sum and the maximum of the stage times (all it uses)."""
    bubble = (total - slowest) / v
    if schedule == "zero-bubble":
        bubble /= 3
    elif schedule == "dualpipev":
        bubble = (total - slowest) / DUALPIPEV_BUBBLE_DIVISOR
    return m * slowest + bubble


def bubble_fraction(p: int, v: int, m: int) -> float:
    """Idle fraction of a uniform pipeline, ``(p - 1) / (v m + p - 1)``."""
    return (p - 1) / (v * m + p - 1) if p > 1 else 0.0


#: DualPipeV's bubble over the 1F1B fill/drain ``sum(t) - max(t)``: ``(p-1) t/3`` against
#: ``(p-1) t`` (:func:`pipeline_time`'s derivation from DeepSeek-V3 Table 2)
DUALPIPEV_BUBBLE_DIVISOR = 3


def fb_overlap_pairs(p: int, m: int) -> int:
    """Overlapped forward+backward pairs (``OVERLAP_F_B``) on DualPipeV's least-overlapped
    rank, rank 0: torch's ScheduleDualPipeV order runs ``m - 2p + r + 1`` main steps of two
    pairs (less one on the last rank) and ``p - r - 1`` pairs in its step 5, so rank ``r``
    has ``2m - 3p + 1 + r`` (``- 1`` on rank ``p - 1``), fewest at ``r = 0``."""
    return max(0, 2 * m - 3 * p + 1)


#: frameworks that run DualPipeV as torch's ``ScheduleDualPipeV`` with no overlap callback: its
#: ``OVERLAP_F_B`` pair's forward and backward run one after the other (torch 2.13
#: schedules.py ``_PipelineScheduleRuntime``; torchtitan 0.3.0 distributed/pipeline_parallel.py
#: registers none; Partita's runtime neither), so nothing is hidden - the bubble still applies
SEQUENTIAL_PAIRS = ASYNC_P2P_FRAMEWORKS


def fb_overlap_share(schedule: str, p: int, m: int, framework: str = "") -> float:
    """Share of a rank's chunk passes (``2m`` forwards and ``2m`` backwards per step) that run
    inside an overlapped forward+backward pair, whose MoE all-to-all hides under the other
    pass's compute: ``2 pairs / 4m`` = ``(2m - 3p + 1) / (2m)`` with DualPipeV (0 for every
    other schedule). DeepSeek-V3 sec. 3.2.1: in a pair, "both all-to-all and PP
    communication can be fully hidden"; MindSpeed's ``--moe-fb-overlap``
    (docs/features/megatron_moe/megatron-moe-fb-overlap.md) states the same for its steady
    (1F1B) phase, 100 % of the A2A hidden, and 50 % in warm-up/cool-down from a layer's own
    shared-expert and weight-gradient work, which we do not credit (torch's order has none).
    The share assumes the partner pass's compute is at least the all-to-all it hides (the
    caller bounds the hidden time by the layer's compute). 0 under a ``framework`` of
    :data:`SEQUENTIAL_PAIRS`."""
    if schedule != "dualpipev" or p < 2 or m <= 0 or framework in SEQUENTIAL_PAIRS:
        return 0.0
    return fb_overlap_pairs(p, m) / (2 * m)


def hide_all_to_all(terms: tuple, times: tuple, share: float) -> tuple[tuple, tuple]:
    """Per-kind stage terms (:class:`.step.TermsByKind` and its :class:`.step.TimesByKind`)
    with ``share`` of each kind's ``ep_all_to_all`` hidden behind the overlapped pass, at
    most ``share`` of its compute: the all-to-all of a pass in an overlapped pair costs
    ``max(0, a2a - compute)`` instead of ``a2a`` (:func:`fb_overlap_share`)."""
    if share <= 0.0:
        return terms, times
    new = []
    for kind in terms:
        hidden = share * min(kind.ep_all_to_all, kind.compute)
        new.append(kind._replace(ep_all_to_all=kind.ep_all_to_all - hidden) if hidden else kind)
    return type(terms)(*new), type(times)(*(t.time for t in new))
