"""The search's caches hold every plan field their values depend on (issue 31, item 4).

The search memoises cost terms across the thousands of layouts it builds
(:class:`partita.search.layouts._LayoutBuilder`: stage terms and the cheap bound's total
per stage shape, the output layer's weight in the min-max split per layer shape; :class:`partita.search.engine._Search`:
each layout's setting bounds). Their keys are the cost model's frozen shape records
(:mod:`partita.cost.shape`), so a plan field that changes a term cannot hit an entry
made for another value. Each test fills a cache with one plan, then asks it for plans
that differ from it in one field only, and compares with the term computed afresh: a
key missing that field would return the first plan's value. The fields named in
``MISSED_BY_HAND_KEYS`` change the terms and were missing from the hand-built tuple keys
these caches had before (tp, cp, ep, mbs, etp, sp, pp > 1 and the collective spans):
that they change the terms is checked too, so the comparison can fail.

No torch: planning code only.
"""
from __future__ import annotations

import pytest

from partita.cost.memory import peak_memory, peak_memory_ladder
from partita.cost.shape import stage_shape
from partita.cost.step import step_time_lower_bound, stage_terms, zero2_accumulation_floor
from partita.plan import Plan
from partita.search.engine import _Search
from partita.search.layouts import Layout, _LayoutBuilder, _output_in_layers, cheap_total
from partita.search.space import SearchSpace
from partita.spec.hardware import make_cluster
from partita.spec.load import load_model

MODEL = load_model("llama3-8b")
CLUSTER = make_cluster("h100-sxm", 32)
BASE = Plan(dp=2, tp=4, pp=4, sp=True, mbs=1, gbs=64, seq_len=4096, zero=1)

#: one other value of each plan field a cost term may read (those the search varies and
#: the options a user sets for every candidate)
VARIANTS = [
    ("tp", 8), ("cp", 2), ("pp", 2), ("dp", 4), ("mbs", 2), ("sp", False), ("seq_len", 8192),
    ("dtype", "fp32"), ("dtype", "fp8"), ("framework", "torchtitan"), ("framework", "deepspeed"),
    ("tp_comm_overlap", True), ("recompute", "selective"), ("recompute", "full"), ("attention", "unfused"),
    ("zero", 2), ("zero", 3), ("grad_dtype", "bf16"), ("vpp", 2), ("overlap_grad_reduce", False),
]

#: fields the old hand-built keys left out, each with a value that changes the stage terms
MISSED_BY_HAND_KEYS = [("seq_len", 8192), ("dtype", "fp32"), ("tp_comm_overlap", True), ("recompute", "full")]


def _variant(field: str, value) -> Plan:
    plan = BASE.with_(**{field: value})
    if field == "vpp":
        plan = plan.with_(schedule="interleaved-1f1b")
    return plan


@pytest.fixture
def builder() -> _LayoutBuilder:
    return _LayoutBuilder(MODEL, CLUSTER, BASE.gbs, BASE.seq_len, SearchSpace(), [])


@pytest.mark.parametrize("field,value", MISSED_BY_HAND_KEYS)
def test_the_fields_old_keys_missed_change_the_terms(field, value):
    assert stage_terms(MODEL, CLUSTER, _variant(field, value)) != stage_terms(MODEL, CLUSTER, BASE)


@pytest.mark.parametrize("field,value", VARIANTS)
def test_stage_terms_cache_holds_every_field(builder, field, value):
    builder._terms_and_total(BASE)  # the entry a stale key would return
    plan = _variant(field, value)
    assert builder._terms_and_total(plan)[0] == stage_terms(MODEL, CLUSTER, plan)
    assert stage_shape(plan, CLUSTER.devices_per_node) in builder.stage_terms


@pytest.mark.parametrize("field,value", VARIANTS)
def test_cheap_total_cache_holds_every_field(builder, field, value):
    builder._terms_and_total(BASE)
    plan = _variant(field, value)
    assert builder._terms_and_total(plan)[1] == cheap_total(MODEL, CLUSTER, plan)


@pytest.mark.parametrize("field,value", VARIANTS)
def test_output_ratio_cache_holds_every_field(builder, field, value):
    builder._output_ratio(BASE)
    plan = _variant(field, value)
    assert builder._output_ratio(plan) == _output_in_layers(MODEL, CLUSTER, plan)


def test_two_layouts_differing_in_one_knob_get_their_own_entries(builder):
    """The output ratio of two layer shapes that the old key (tp, cp, ep, mbs, etp) could
    not tell apart: two entries, each its own value."""
    fp32 = BASE.with_(dtype="fp32")
    assert _output_in_layers(MODEL, CLUSTER, fp32) != _output_in_layers(MODEL, CLUSTER, BASE)
    builder._output_ratio(BASE)
    builder._output_ratio(fp32)
    assert len(builder.output_ratio) == 2


@pytest.mark.parametrize("field,value", [kv for kv in VARIANTS if kv[0] not in ("recompute", "zero")])
def test_setting_bounds_are_per_layout(field, value):
    """The engine's bound memos are per layout: a layout differing from another in one
    field gets its own setting bounds, equal to the bounds computed afresh."""
    search = _Search(MODEL, CLUSTER, usable=80.0, top=5, partial=True)
    layouts = []
    for plan in (BASE, _variant(field, value)):
        bound = step_time_lower_bound(MODEL, CLUSTER, plan)
        lay = Layout(plan, [("none", 1), ("full", 1), ("full", 2)], bound, True, ())
        layouts.append(lay)
        for recompute, zero in lay.ladder:
            search.setting_bound(lay, recompute, zero)
    plan, lay = layouts[1].plan, layouts[1]
    assert search.setting_bound(lay, "full", 1) == step_time_lower_bound(MODEL, CLUSTER, plan.with_(recompute="full"))
    z2 = plan.with_(recompute="full", zero=2)
    assert search.setting_bound(lay, "full", 2) == (step_time_lower_bound(MODEL, CLUSTER, z2)
                                                    + zero2_accumulation_floor(MODEL, CLUSTER, plan.with_(zero=2)))


def test_memory_ladder_is_the_peak_of_each_setting():
    """The search's memory ladder and the estimate's peak are one sum (MemoryParts.peak)."""
    steps = [("none", 1), ("selective", 2), ("full", 3)]
    ladder = peak_memory_ladder(MODEL, CLUSTER.device, BASE, steps)
    for recompute, zero in steps:
        plan = BASE.with_(recompute=recompute, zero=zero)
        assert ladder[(recompute, zero)] == peak_memory(MODEL, CLUSTER.device, plan)
