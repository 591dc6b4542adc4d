"""Interleaved pipelines synchronise each model chunk's gradients on their own (cost/step.py
``_exposed_by_chunk``).

Oracle: Megatron-Core's interleaved schedule table (``get_schedule_table`` in
megatron/core/pipeline_parallel/schedules.py, NVIDIA/Megatron-LM 00611e6eeb), rebuilt here
from its docstring's worked example (PP2, N3, M5, VP2), walked backward slot by slot with the
rule of ``backward_step_helper_preprocess`` (a chunk's grad sync is enabled for its last
micro-batch) and a FIFO communication stream simulated event by event; the closed form must
give the same exposed time. And the published rows it was written for: dgxc 25.04's
Nemotron4-340B (vpp 12) and GPT3-175B (vpp 6) on H100, whose gradient sync the schedule hides.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from partita.cost import step as step_mod
from partita.estimate import estimate

ROOT = Path(__file__).resolve().parents[1]


def schedule_table(m: int, vpp: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) per virtual micro-batch: groups of ``group`` micro-batches, each
    run through chunk 0, then chunk 1, ... (Megatron's get_schedule_table)."""
    table = []
    for start in range(0, m, group):
        mbs = range(start, min(start + group, m))
        table += [(mb, chunk) for chunk in range(vpp) for mb in mbs]
    return table


def test_table_reproduces_megatrons_example() -> None:
    table = schedule_table(5, 2, 3)
    assert [mb for mb, _ in table] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in table] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


def simulated_exposure(t: float, window: float, vpp: int, group: int, m: int) -> float:
    """Backward slots of one chunk-micro-batch each (``window`` s) in the table's order, the
    chunk reversed (backward visits the last chunk first); a chunk's ``t / vpp`` of traffic
    joins the stream when its last micro-batch's backward starts; the stream runs one job at
    a time. Exposed: how long the stream outlasts the last backward."""
    order = [vpp - 1 - c for _, c in schedule_table(m, vpp, group)]
    last = {chunk: i for i, chunk in enumerate(order)}  # each chunk's last backward slot
    free = 0.0
    for chunk in sorted(last, key=last.get):
        free = max(free, last[chunk] * window) + t / vpp
    return max(0.0, free - len(order) * window)


@pytest.mark.parametrize("vpp,group,m,t,window", [
    (2, 3, 6, 1.0, 0.05), (4, 4, 8, 0.4, 0.01), (12, 8, 16, 0.42, 0.0125), (6, 8, 32, 0.3, 0.002),
    (5, 4, 64, 2.0, 0.01)])
def test_closed_form_matches_the_simulated_schedule(vpp: int, group: int, m: int, t: float, window: float) -> None:
    # overlap 1 and many layers: the closed form's only terms are the schedule's
    closed = step_mod._exposed_by_chunk(t, window, 10**9, 1.0, vpp, group)
    assert closed == pytest.approx(simulated_exposure(t, window, vpp, group, m), abs=1e-12)


def test_one_chunk_is_the_plain_rule() -> None:
    for t, w in ((1.0, 0.3), (0.2, 0.5)):
        assert step_mod._exposed_by_chunk(t, w, 40, 0.9, 1, 8) == step_mod._exposed_behind(t, w, 40, 0.9)


def _row(name: str, vpp: int, dtype: str = "bf16"):
    sys.path.insert(0, str(ROOT / "bench"))
    from published_runs import load_cases
    cases, _ = load_cases(ROOT / "data" / "published_runs.csv")
    return next(c for c in cases if c.source == "dgxc-25.04" and c.name == name and c.plan.vpp == vpp
                and c.plan.dtype == dtype and c.metric == "step_time_s")


@pytest.mark.parametrize("name,vpp", [("Nemotron4-340B", 12), ("GPT3-175B", 6)])
def test_interleaved_rows_hide_their_sync(name: str, vpp: int) -> None:
    """The same run with the chunks' syncs pooled (vpp 1's rule) exposes more; the schedule's
    rule brings the predicted step closer to the measured one."""
    row = _row(name, vpp)
    est = estimate(row.model, row.cluster, row.plan)
    chunked = est.time.parts.get("dp gradient sync", 0.0)
    original = step_mod._exposed_by_chunk
    try:
        step_mod._exposed_by_chunk = lambda t, w, n, f, v, g: step_mod._exposed_behind(t, w, n, f)
        pooled_est = estimate(row.model, row.cluster, dataclasses.replace(row.plan))
    finally:
        step_mod._exposed_by_chunk = original
    pooled = pooled_est.time.parts.get("dp gradient sync", 0.0)
    assert chunked < pooled
    assert abs(est.step_time_s / row.measured - 1) < abs(pooled_est.step_time_s / row.measured - 1)
