"""Guards the estimator's accuracy on measured published runs (bench/validate_published.py prints it)."""
import statistics

from partita.estimate import estimate
from partita.validation.published import load_cases


def test_median_error_on_published_runs(published_csv):
    cases, skipped = load_cases(published_csv)
    step = [c for c in cases if c.metric == "step_time_s"]
    mem = [c for c in cases if c.metric == "peak_memory_gib"]
    assert len(step) >= 240 and len(mem) == 4
    step_err = [abs(estimate(c.model, c.cluster, c.plan).step_time_s - c.measured) / c.measured for c in step]
    mem_err = [abs(estimate(c.model, c.cluster, c.plan).peak_memory_gib - c.measured) / c.measured for c in mem]
    assert statistics.median(step_err) <= 0.15
    assert statistics.median(mem_err) <= 0.15
    assert len(skipped) <= 10
