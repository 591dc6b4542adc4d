"""``partita calibrate --pool`` of files that carry their raw measurements: one fit to every
calibration's samples together (calibrate/pool.py pool_measurements), not the median of the
files' fitted values.

Oracle: the synthetic machine of tests/test_calibrate_fit.py, whose true fields are known.
Two of three calibrations each meet a burst in two of their three longer base runs: alone,
each reads the base per-layer overhead far too high, so the median of the three fitted values
is wrong; the nine pooled increments hold five quiet ones, so one fit to them is the truth.
"""
from __future__ import annotations

import copy

import pytest
from test_calibrate_fit import REL_OVERHEAD, TRUTH, _measurements

from partita.calibrate.hardware_file import hardware_file
from partita.calibrate.pool import pool_calibrations, pool_measurements
from partita.errors import PartitaError

FIELD = "kernel_overhead_us_per_layer"
BURST_S = 0.040  # 40 ms of a neighbour's burst in one longer run's step


def calibration(bursts: int) -> dict:
    """A calibrated file of the synthetic machine whose last ``bursts`` longer base runs met a burst."""
    m = _measurements(2)
    long = m["runtime"]["base"]["long"]
    for i in range(len(long["samples"]) - bursts, len(long["samples"])):
        long["samples"][i] += BURST_S
    return hardware_file(m, "cpu", "synthetic")


def test_pooled_samples_recover_what_the_median_of_fits_misses():
    files = [calibration(0), calibration(2), calibration(2)]
    own = [f["calibration"]["terms"][f"efficiency.{FIELD}"]["value"] for f in files]
    assert own[0] == pytest.approx(TRUTH[FIELD], rel=REL_OVERHEAD)
    assert min(own[1:]) > 2 * TRUTH[FIELD]  # alone, the bursty calibrations read it far too high
    pooled = pool_calibrations(files, ["a", "b", "c"])
    term = pooled["calibration"]["terms"][f"efficiency.{FIELD}"]
    assert pooled["efficiency"][FIELD] == pytest.approx(TRUTH[FIELD], rel=REL_OVERHEAD)
    assert term["repeats"] == 9 and term["pooled_values"] == own
    assert term["between_spread"] > 0 and "one fit to the samples of 3 calibrations" in term["method"]
    assert pooled["calibration"]["pooled_from"] == ["a", "b", "c"]
    # every other measured field is the machine's truth too (one consistent fit, not a mix)
    for field, value in TRUTH.items():
        assert pooled["efficiency"][field] == pytest.approx(max(value, 0.0), rel=REL_OVERHEAD, abs=1e-6), field


def test_pool_measurements_is_the_union_of_samples_with_medians_retaken():
    a, b = _measurements(2), _measurements(2)
    b["gemm"][0]["samples"] = [x * 3 for x in b["gemm"][0]["samples"]]
    b["copy"] = [1.0e10] * 3
    pooled = pool_measurements([copy.deepcopy(a), copy.deepcopy(b)])
    row = pooled["gemm"][0]
    assert row["samples"] == a["gemm"][0]["samples"] + b["gemm"][0]["samples"]
    assert row["seconds"] == pytest.approx(2 * a["gemm"][0]["seconds"])  # median of (t, t, t, 3t, 3t, 3t)
    assert pooled["copy"] == a["copy"] + b["copy"] and pooled["repeats"] == 6
    base = pooled["runtime"]["base"]
    assert len(base["samples"]) == len(base["long"]["samples"]) == 6  # a run and its longer run stay paired


def test_calibrations_of_different_measured_rows_are_refused_in_one_line():
    a, b = calibration(0), calibration(0)
    b["calibration"]["raw"]["gemm"][0]["gflop"] *= 2  # another shape: another partita version's calibration
    with pytest.raises(PartitaError, match="measured different gemm rows"):
        pool_calibrations([a, b], ["a", "b"])


@pytest.mark.parametrize("world", [1, 2, 4])
def test_each_run_is_timed_right_before_its_longer_run(world):
    """A term is read from a run and its longer run: they are timed back to back in each repeat
    (before, every run was timed, then every longer run - tens of seconds apart)."""
    from partita.calibrate.measure import increment_plans, measurement_order, runtime_plans
    order = list(measurement_order(world))
    longer = increment_plans(world)
    assert set(order) == set(runtime_plans(world)) | {f"{m}@long" for m in longer if m in runtime_plans(world)}
    for mech in runtime_plans(world):
        if f"{mech}@long" in order:
            assert order.index(f"{mech}@long") == order.index(mech) + 1, order
    assert "base@long" in order  # the base term is read by its increment at every world size


def test_a_damaged_raw_measurement_is_one_line():
    a, b = calibration(0), calibration(0)
    b["calibration"]["raw"]["runtime"]["base"]["samples"] = ["fast"] * 3  # hand-edited
    with pytest.raises(PartitaError, match="raw measurements .* cannot be fitted") as e:
        pool_calibrations([a, b], ["a", "b"])
    assert "\n" not in str(e.value)
