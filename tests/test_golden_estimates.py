"""Every estimate and search result of a fixed set is bit-identical to the recorded one.

The golden file (tests/data/golden_estimates.json, written by
``python bench/golden_estimates.py``) holds ~50 estimates over dense / MoE / MLA presets
and every knob, on Ascend, NVIDIA, AMD and CPU devices, and the top 8 plans plus the
"why not" lines of the search benchmark scenarios. Refactors of the cost model and the
search must keep every float equal (``==``, not approx); a change meant to move numbers
regenerates the file in the same commit (``--check`` prints what moved).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
golden = load_script(ROOT / "bench" / "golden_estimates.py", "golden_estimates")

DATA = json.loads(golden.GOLDEN.read_text())


def test_golden_file_covers_the_recorded_cases():
    assert [e["case"] for e in DATA["estimates"]] == golden._normalise([list(c) for c in golden.ESTIMATE_CASES])
    assert len(DATA["estimates"]) >= 40 and len(DATA["searches"]) == len(golden.SEARCH_CASES) + len(golden.SEARCH_EXTRA)


@pytest.mark.parametrize("index", range(len(DATA["estimates"])))
def test_estimate_is_bit_identical(index):
    entry = DATA["estimates"][index]
    model, hardware, devices, fields = entry["case"]
    got = golden._normalise(golden.record_estimate(model, hardware, devices, fields))
    assert golden.diff(entry["result"], got) == []
    assert got == entry["result"]


@pytest.mark.parametrize("index", range(len(DATA["searches"])))
def test_search_is_bit_identical(index):
    entry = DATA["searches"][index]
    model, hardware, devices, gbs, seq, fields = entry["case"]
    got = golden._normalise(golden.record_search(model, hardware, devices, gbs, seq, fields))
    assert golden.diff(entry["result"], got) == []
    assert got == entry["result"]


@pytest.mark.parametrize("index", range(len(DATA["estimates"])))
def test_peak_is_the_sum_of_the_breakdown(index):
    """One set of memory parts: the search's peak (and its ladder at the plan's own
    setting) is exactly the largest breakdown total `partita estimate` prints."""
    result = DATA["estimates"][index]["result"]
    totals = [m["total"] for m in result["memory_all_ranks"]]
    peak, rank = result["peak_memory"]
    assert peak == max(totals) == totals[rank]
    assert peak / 1024 ** 3 == result["peak_memory_gib"]
    plan = result["plan"]
    ladder = {(rc, z): (b, r) for rc, z, b, r in result["peak_memory_ladder"]}
    assert ladder[(plan["recompute"], plan["zero"])] == (peak, rank)
