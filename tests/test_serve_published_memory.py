"""``partita serve``'s memory model against engines' own memory accounting (issue 37, item e).

The oracle: vLLM's memory-profiling log lines ("model weights take X GiB", "non_torch_memory",
"PyTorch activation peak memory", "available_kv_cache_memory"), collected with their sources
in data/published_serving_memory.csv (python bench/serve_published.py --memory prints them).
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_serve_published import _bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rows():
    bench = _bench()  # bench/serve_published.py, loaded as test_serve_published loads it
    out = bench.memory_rows()
    assert len(out) == len(bench.load_rows(bench.MEMORY_CSV)) and all(math.isfinite(r["error"]) for r in out)
    return out


def test_weights_match_what_vllm_loaded(rows):
    weights = [r for r in rows if r["component"] == "weights"]
    assert weights and all(abs(r["error"]) < 0.005 for r in weights)


def test_the_kv_pool_is_within_six_percent(rows):
    """What is left for the KV cache (the batch the search plans with): +1.9 % at tp 1, +5.5 %
    at tp 2, where vLLM's non-torch buffers (3.58 GiB: NCCL and the custom all-reduce) exceed
    the device file's 1 GiB workspace."""
    pools = [r for r in rows if r["component"] == "kv_pool"]
    assert pools and all(0 <= r["error"] < 0.06 for r in pools)


def test_every_row_names_its_source():
    import csv
    with (ROOT / "data" / "published_serving_memory.csv").open(newline="") as f:
        for rec in csv.DictReader(f):
            assert rec["url"].startswith("https://github.com/") and rec["quote"]
