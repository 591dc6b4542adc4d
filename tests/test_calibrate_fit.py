"""`partita calibrate`'s fits on synthetic measurements generated from known parameters:
each fit must recover them exactly (to float rounding), independent of machine load.

The measurement code (torch, timing) is exercised once, for structure only, by
tests/test_trace_analysis.py::test_calibrate_writes_a_hardware_file_the_planner_reads.

Tolerance: the fits are least squares over five exact points of a line, so they are
exact up to float rounding: the sums of products lose at most a few ulps times the
condition of the 5x2 system (x spans 1/2 GFLOP to 1/0.0005, or 4 KiB to 16 MiB: about
1e4), far inside rel 1e-9.
"""
import math

import pytest

from partita.cost.step import step_time_lower_bound
from partita.plan import Plan
from partita.profile.calibrate import (FRAMEWORK_MODEL, FRAMEWORK_SEQ, fit_all_reduce, fit_gemm,
                                       framework_overheads, hardware_file, kernel_overhead_s)
from partita.spec.hardware import Cluster, load_device
from partita.spec.load import load_model

REL = 1e-9
PEAK = load_device("cpu").peak_flops("fp32")  # the synthetic machine: the base file's peak (FLOP/s)
EFF, G_HALF = 0.6, 0.05  # GEMM efficiency and half-saturation size (GFLOP)
ALPHA, BW = 20e-6, 5e9  # all-reduce per-hop latency (s) and bandwidth (bytes/s)
OVERHEAD = 35e-6  # per-layer time beyond the GEMMs (s)
TP_US, Z3_US = 120.0, 80.0  # framework time per layer that TP / FSDP add (us)


def gemm_rows(peak=PEAK, eff=EFF, g_half=G_HALF):
    """What `measure` records for n x n GEMMs, n = 64 ... 1024, on the model's curve
    ``rate(G) = peak eff G / (G + G_half)``."""
    rows = []
    for n in (64, 128, 256, 512, 1024):
        g = 2 * n ** 3 / 1e9
        rows.append({"gflop": g, "seconds": g * 1e9 / (peak * eff * g / (g + g_half))})
    return rows


def all_reduce_rows(world, alpha=ALPHA, bw=BW):
    """Ring all-reduce times ``2(n-1) alpha + 2(n-1)/n S / B`` at the sizes `measure` uses."""
    return [{"bytes": s, "seconds": 2 * (world - 1) * alpha + 2 * (world - 1) / world * s / bw}
            for s in (4096, 65536, 1 << 20, 4 << 20, 16 << 20)]


def test_gemm_fit_recovers_efficiency_and_half_size():
    peak, eff, g_half = fit_gemm(gemm_rows(), PEAK)
    assert peak == PEAK  # no measured rate exceeds the peak (eff < 1)
    assert eff == pytest.approx(EFF, rel=REL)
    assert g_half == pytest.approx(G_HALF, rel=REL)


def test_gemm_fit_raises_a_peak_the_machine_beats():
    # the base file claims half the real peak: the fastest measured rate (n = 1024:
    # 2*PEAK*EFF*G/(G+G_HALF)) becomes the peak, and eff is relative to it
    rows = gemm_rows(peak=2 * PEAK)
    best = max(r["gflop"] * 1e9 / r["seconds"] for r in rows)
    peak, eff, g_half = fit_gemm(rows, PEAK)
    assert peak == best
    # the curve's asymptote 2*PEAK*EFF lies above the fastest measured rate, so
    # 1/(a*peak) = 2*PEAK*EFF/best > 1: clamped to 1
    assert 2 * PEAK * EFF / best > 1 and eff == 1.0
    assert g_half == pytest.approx(G_HALF, rel=REL)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_all_reduce_fit_recovers_latency_and_bandwidth(world):
    alpha, bw = fit_all_reduce(all_reduce_rows(world), world)
    assert alpha == pytest.approx(ALPHA, rel=REL)
    assert bw == pytest.approx(BW, rel=REL)


def test_kernel_overhead_is_forward_minus_gemm_time():
    g = 0.0005
    gemm_s = g * 1e9 / (PEAK * EFF * g / (g + G_HALF))
    assert kernel_overhead_s(gemm_s + OVERHEAD, g, PEAK, EFF, G_HALF) == pytest.approx(OVERHEAD, rel=REL)
    assert kernel_overhead_s(gemm_s / 2, g, PEAK, EFF, G_HALF) == 0.0  # faster than the curve: clamped, never negative


def _synthetic_measurements(world: int) -> dict:
    """A full `measure` record of the synthetic machine, the framework times included."""
    g = 0.0005  # GFLOP of the tiny block (any positive size: the overhead is what is left)
    m = {"device": "cpu", "dtype": "fp32", "world": world, "gemm": gemm_rows(), "copy_bytes_per_s": 3.0e10,
         "all_reduce": all_reduce_rows(world), "tiny_block_gflop": g,
         "tiny_block_forward_s": g * 1e9 / (PEAK * EFF * g / (g + G_HALF)) + OVERHEAD}
    # The framework terms are what the measured TP / FSDP runs cost beyond the plain run
    # *beyond what the cost model predicts for them on the calibrated device*; the
    # prediction comes from the public cost function on that device (its fields are the
    # synthetic truth), the rest is the known per-layer term.
    model = load_model(FRAMEWORK_MODEL)
    device = load_device("cpu", overrides={"peak_tflops": {"fp32": PEAK / 1e12}, "memory": {"hbm_tbps": 0.03},
                                           "intra_node": {"gbps_per_direction": BW / 1e9,
                                                          "peer_gbps_per_direction": BW / 1e9,
                                                          "latency_us": ALPHA * 1e6},
                                           "efficiency": {"gemm": EFF, "gemm_half_gflop": G_HALF,
                                                          "memory_bandwidth": 1.0, "intra_node_comm": 1.0,
                                                          "kernel_overhead_us_per_layer": OVERHEAD * 1e6}})
    cluster = Cluster(device=device, nodes=1, devices_per_node=world)
    common = {"mbs": 1, "seq_len": FRAMEWORK_SEQ, "dtype": "fp32"}
    plain = step_time_lower_bound(model, cluster, Plan(gbs=1, **common))
    tp = step_time_lower_bound(model, cluster, Plan(gbs=1, tp=2, sp=True, **common))
    z3 = step_time_lower_bound(model, cluster, Plan(gbs=world, dp=world, zero=3, **common))
    plain_s = 0.01
    m["framework"] = {"model": FRAMEWORK_MODEL, "seq_len": FRAMEWORK_SEQ, "tp": 2, "plain_s": plain_s,
                      "tp_s": plain_s + (tp - plain) + TP_US * 1e-6 * model.layers,
                      "fsdp_s": plain_s + (z3 - plain) + Z3_US * 1e-6 * model.layers}
    return m


@pytest.mark.parametrize("world", [2, 4])
def test_hardware_file_recovers_every_parameter(world):
    out = hardware_file(_synthetic_measurements(world), "cpu", "synthetic")
    assert out["extends"] == "cpu" and out["name"] == "synthetic"
    assert out["peak_tflops"] == {"fp32": PEAK / 1e12}
    assert out["memory"]["hbm_tbps"] == 3.0e10 / 1e12
    eff = out["efficiency"]
    assert eff["gemm"] == pytest.approx(EFF, rel=REL)
    assert eff["gemm_half_gflop"] == pytest.approx(G_HALF, rel=REL)
    assert eff["kernel_overhead_us_per_layer"] == pytest.approx(OVERHEAD * 1e6, rel=REL)
    assert out["intra_node"]["gbps_per_direction"] == pytest.approx(BW / 1e9, rel=REL)
    assert out["intra_node"]["latency_us"] == pytest.approx(ALPHA * 1e6, rel=REL)
    # the framework terms subtract predictions made on the *fitted* device, which equals
    # the true one to rounding, so they are recovered to the same bound
    assert eff["tp_framework_us_per_layer"] == pytest.approx(TP_US, rel=REL)
    assert eff["zero3_framework_us_per_layer"] == pytest.approx(Z3_US, rel=REL)


def test_framework_terms_are_clamped_at_zero():
    # a TP run faster than the plain one (noise) gives 0, not a negative cost
    m = _synthetic_measurements(2)
    m["framework"]["tp_s"] = m["framework"]["fsdp_s"] = m["framework"]["plain_s"] / 2
    device_file = hardware_file({k: v for k, v in m.items() if k != "framework"}, "cpu", "x")
    terms = framework_overheads(m, device_file)
    assert terms == {"tp_framework_us_per_layer": 0.0, "zero3_framework_us_per_layer": 0.0}


def test_single_process_keeps_the_base_links():
    m = {k: v for k, v in _synthetic_measurements(2).items() if k != "framework"}
    m["world"] = 1
    out = hardware_file(m, "cpu", "one")
    base = load_device("cpu")
    assert out["intra_node"]["gbps_per_direction"] == base.intra_gbps
    assert out["intra_node"]["latency_us"] == pytest.approx(base.intra_latency_us, rel=1e-15)
    assert "tp_framework_us_per_layer" not in out["efficiency"]
    assert math.isfinite(out["efficiency"]["gemm"])
