"""``partita calibrate --pool``: the median of several calibrated files, field by field and term by term.

Oracles: the medians and half inter-quartile ranges below are worked by hand from the three
files' numbers; the pooled file's estimate is checked against the estimate of a file written
by hand with the median values (the cost model reads the pooled field, not something else).
"""
from __future__ import annotations

import json

import pytest

from partita.calibrate.pool import pool_calibrations
from partita.cli.main import main as partita_main
from partita.errors import PartitaError
from partita.estimate import estimate
from partita.plan import Plan
from partita.spec.hardware import make_cluster
from partita.spec.load import load_model

TP_US = (15_000.0, 33_500.0, 20_000.0)  # the lead's two quiet calibrations' tp term, and a third
PP_US = (-1451.0, 1505.0, 300.0)  # a negative fit is written as 0; the pooled record keeps the sign


def calibrated(tp: float, pp: float, gemm: float, lat: float, world: int = 2, base: str = "cpu") -> dict:
    """A calibrated file as `partita calibrate` writes one (the fields the pool reads)."""
    return {
        "name": "cpu-calibrated", "extends": base, "description": "synthetic",
        "peak_tflops": {"fp32": 0.128}, "memory": {"hbm_tbps": 0.004, "optimizer_tbps": 0.015},
        "intra_node": {"gbps_per_direction": 2.0, "peer_gbps_per_direction": 2.0, "latency_us": lat},
        "efficiency": {"gemm": gemm, "gemm_half_gflop": 0.01, "memory_bandwidth": 1.0, "intra_node_comm": 1.0,
                       "tp_framework_us_per_layer": tp, "pp_framework_us_per_microbatch": max(pp, 0.0)},
        "collectives": {"all_reduce": [{"group": world, "latency_us": lat, "gbps": 2.0}]},
        "efficiency_provenance": {"gemm": "measured"},
        "calibration": {"terms": {
            "efficiency.tp_framework_us_per_layer": {"value": tp, "spread": 100.0, "unit": "us", "repeats": 5,
                                                     "method": "increment"},
            "efficiency.pp_framework_us_per_microbatch": {"value": pp, "spread": 700.0, "unit": "us", "repeats": 5,
                                                          "method": "increment",
                                                          **({"clamped_to": 0.0} if pp < 0 else {})}},
            "raw": {"device": "cpu", "dtype": "fp32", "world": world, "clock": "busy"}},
    }


def three() -> list[dict]:
    return [calibrated(TP_US[i], PP_US[i], gemm=(0.70, 0.73, 0.72)[i], lat=(700.0, 900.0, 760.0)[i])
            for i in range(3)]


def test_pool_takes_the_median_of_every_field_and_term():
    pooled = pool_calibrations(three(), ["a.json", "b.json", "c.json"])
    eff = pooled["efficiency"]
    assert eff["tp_framework_us_per_layer"] == 20_000.0  # median of 15000, 33500, 20000
    assert eff["gemm"] == 0.72
    assert eff["pp_framework_us_per_microbatch"] == 300.0  # written values 0, 1505, 300
    assert pooled["intra_node"]["latency_us"] == 760.0
    assert pooled["collectives"]["all_reduce"][0]["latency_us"] == 760.0
    tp = pooled["calibration"]["terms"]["efficiency.tp_framework_us_per_layer"]
    # inclusive quartiles of (15000, 20000, 33500): 17500 and 26750 -> half IQR 4625
    assert tp["value"] == 20_000.0 and tp["spread"] == pytest.approx(4625.0)
    assert tp["pooled_values"] == list(TP_US) and tp["repeats"] == 15
    assert "median of 3 calibrations" in pooled["efficiency_provenance"]["tp_framework_us_per_layer"]
    assert pooled["calibration"]["pooled_from"] == ["a.json", "b.json", "c.json"]


def test_negative_pooled_term_keeps_its_sign_and_is_written_as_zero():
    files = [calibrated(TP_US[i], (-1451.0, -200.0, 1505.0)[i], 0.72, 700.0) for i in range(3)]
    pooled = pool_calibrations(files, ["a", "b", "c"])
    pp = pooled["calibration"]["terms"]["efficiency.pp_framework_us_per_microbatch"]
    assert pp["value"] == -200.0 and pp["clamped_to"] == 0.0
    assert pooled["efficiency"]["pp_framework_us_per_microbatch"] == 0.0  # written values 0, 0, 1505


def test_pooled_file_is_what_the_estimate_reads(tmp_path):
    paths = []
    for i, f in enumerate(three()):
        paths.append(tmp_path / f"c{i}.json")
        paths[-1].write_text(json.dumps(f))
    out = tmp_path / "pooled.json"
    assert partita_main(["calibrate", "--pool", *map(str, paths), "-o", str(out)]) == 0
    by_hand = tmp_path / "median.json"  # the median calibration, written by hand
    by_hand.write_text(json.dumps(calibrated(20_000.0, 300.0, 0.72, 760.0)))
    plan = Plan.parse("tp=2", world_size=2, defaults=dict(gbs=8, seq_len=128, mbs=1, dtype="fp32", framework="partita"))
    model = load_model("small-llama")

    def step(path) -> float:
        return estimate(model, make_cluster(str(path), 2), plan).step_time_s
    assert step(out) == pytest.approx(step(by_hand), rel=1e-12)
    assert abs(step(out) - step(paths[1])) > 0.05 * step(by_hand)  # the tp term moves this plan: a real check


@pytest.mark.parametrize("files, needle", [
    ([calibrated(1.0, 1.0, 0.7, 700.0)], "two or more"),
    ([calibrated(1.0, 1.0, 0.7, 700.0), calibrated(1.0, 1.0, 0.7, 700.0, world=4)], "process counts"),
    ([calibrated(1.0, 1.0, 0.7, 700.0), {"name": "x", "extends": "cpu"}], "not a file written by partita calibrate"),
    # hand-edited collectives: a list instead of a mapping, a fit without its group size (were TypeError / KeyError)
    ([calibrated(1.0, 1.0, 0.7, 700.0), {**calibrated(1.0, 1.0, 0.7, 700.0), "collectives": []}], "not a mapping"),
    ([calibrated(1.0, 1.0, 0.7, 700.0), {**calibrated(1.0, 1.0, 0.7, 700.0),
                                         "collectives": {"all_reduce": [{"latency_us": 700.0}]}}], "integer 'group'"),
])
def test_pool_refuses_what_it_cannot_pool(files, needle):
    with pytest.raises(PartitaError, match=needle):
        pool_calibrations(files, [f"f{i}" for i in range(len(files))])


def test_pool_of_a_missing_file_is_one_line(tmp_path, capsys):
    good = tmp_path / "a.json"
    good.write_text(json.dumps(calibrated(1.0, 1.0, 0.7, 700.0)))
    assert partita_main(["calibrate", "--pool", str(good), str(tmp_path / "nope.json"), "-o", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("partita: error: --pool ") and "nope.json" in err[0], err
