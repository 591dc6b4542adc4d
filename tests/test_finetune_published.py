"""Published fine-tuning memory and throughput (data/published_finetune.csv) against Partita's
prediction, per source, at the tolerances docs/finetune.md states. The oracle is the published
figure; nothing in the cost model is fitted to these rows (bench/finetune_published.py)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("finetune_published", ROOT / "bench" / "finetune_published.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _bench()


@pytest.fixture(scope="module")
def results(bench):
    return bench.evaluate()


#: (source, metric class) -> (rows, median |error| bound, worst |error| bound), as docs/finetune.md
#: "Against published fine-tuning memory and throughput" states them
CLAIMS = {
    ("llama-factory-readme", "memory"): (6, 0.05, 0.15),
    ("ms-swift-megatron-benchmark", "memory"): (2, 0.20, 0.25),
    ("ms-swift-megatron-benchmark", "throughput"): (3, 0.07, 0.13),
    ("nemo-24.07-perf-summary", "throughput"): (6, 0.27, 0.33),
    ("nemo-automodel-perf-summary", "throughput"): (6, 0.13, 0.25),
    ("torchtune-readme-optimization-flags", "throughput"): (3, 0.09, 0.17),
}


def test_every_row_cites_its_source(bench) -> None:
    """Each figure carries a pinned URL and the quoted table line it was read from."""
    rows = bench.read_rows()
    assert len(rows) == 30
    for r in rows:
        assert r["url"].startswith("https://github.com/") and "/blob/" in r["url"], r
        assert r["published"] in r["quote"].replace("\\", ""), r  # the figure is in the quoted line
        assert r["modelled"] in ("yes", "no") and (r["modelled"] == "yes" or "excluded" in r["notes"])


def test_per_source_errors_within_the_documented_tolerance(bench, results) -> None:
    """Median and worst |error| per source and metric class, out of sample."""
    stats = bench.summary(results)
    assert set(stats) == set(CLAIMS)
    for key, (n, median_bound, worst_bound) in CLAIMS.items():
        st = stats[key]
        assert st["n"] == n, key
        assert st["median_abs"] <= median_bound, (key, st)
        assert st["worst_abs"] <= worst_bound, (key, st)


def test_nemo_packed_rows_are_under_predicted(results) -> None:
    """The documented bias: NeMo 24.07's rows pack SQuAD samples of a few hundred tokens into
    4096-token sequences whose attention runs per sample; Partita charges attention over the
    whole 4096 tokens (and separate q/k/v/o adapters), so every row is predicted slower."""
    nemo = [r for r in results if r.source == "nemo-24.07-perf-summary"]
    assert len(nemo) == 6 and all(r.error < 0 for r in nemo)


def test_unknown_metric_is_a_one_line_error(bench) -> None:
    row = bench.read_rows()[0] | {"metric": "samples_per_s"}
    with pytest.raises(ValueError, match="use memory_gb, memory_gib") as err:
        bench.predict(row)
    assert "\n" not in str(err.value)
