"""Per-collective calibration (issue 22): each collective's own latency/bandwidth fit by
group size is recovered exactly from synthetic measurements, the device file carries it,
and the cost model's collectives use it (a test here fails if cost/comm.py ignores it).

Oracles: the synthetic timings are the alpha-beta model written out here by hand from
the algorithm factors of Thakur, Rabenseifner & Gropp 2005 (ring all-reduce 2(n-1) steps
moving 2(n-1)/n S; ring all-gather / reduce-scatter half; pairwise all-to-all one round
of (n-1)/n S; send/recv one message) - not from cost/comm.py. The count of tensor-parallel
all-reduces per layer (2 forward + 2 backward: one after attention and one after the MLP,
Megatron-LM, Shoeybi et al. 2019 sec. 3) is the paper's, not the code's.
"""
import json

import pytest

from partita.cost import comm
from partita.errors import PartitaError
from partita.estimate import estimate
from partita.plan import Plan
from partita.calibrate.fit import fit_per_collective
from partita.spec.hardware import Cluster, load_device
from partita.spec.load import load_model

#: Each collective's true per-step latency (s) and per-link bandwidth (B/s), by group size.
TRUE = {("all_reduce", 2): (900e-6, 0.9e9), ("all_reduce", 4): (700e-6, 0.8e9),
        ("all_gather", 2): (1100e-6, 0.6e9), ("reduce_scatter", 2): (1250e-6, 0.33e9),
        ("all_to_all", 2): (500e-6, 1.7e9), ("send_recv", 2): (450e-6, 1.5e9)}
SIZES = (4096, 65536, 1 << 20, 8 << 20)


def hand_time(kind: str, n: int, size: float, alpha: float, bw: float) -> float:
    steps, traffic = {"all_reduce": (2 * (n - 1), 2 * (n - 1) / n), "all_gather": (n - 1, (n - 1) / n),
                      "reduce_scatter": (n - 1, (n - 1) / n), "all_to_all": (1, (n - 1) / n),
                      "send_recv": (1, 1.0)}[kind]
    return steps * alpha + traffic * size / bw


def rows():
    return [{"kind": k, "group": g, "bytes": s, "seconds": hand_time(k, g, s, a, b)}
            for (k, g), (a, b) in TRUE.items() for s in SIZES]


def test_each_collective_and_group_is_recovered_exactly():
    fits, skipped = fit_per_collective(rows())
    assert not skipped
    got = {(k, f["group"]): (f["latency_us"], f["gbps"]) for k, fs in fits.items() for f in fs}
    assert set(got) == set(TRUE)
    for key, (alpha, bw) in TRUE.items():
        assert got[key][0] == pytest.approx(alpha * 1e6, rel=1e-9), key
        assert got[key][1] == pytest.approx(bw / 1e9, rel=1e-9), key


def test_a_negative_latency_fit_is_written_as_zero_and_kept_signed():
    # times below the bandwidth line at small sizes: the fitted latency is negative
    r = [{"kind": "all_reduce", "group": 2, "bytes": s, "seconds": s / 1e9 - 5e-6 if s > 4096 else 1e-6}
         for s in SIZES]
    fits, _ = fit_per_collective(r)
    f = fits["all_reduce"][0]
    assert f["latency_us_fitted"] < 0 and f["latency_us"] == 0.0


def calibrated(tmp_path, fits=None) -> str:
    """A device file that extends cpu with the fitted collectives."""
    fits = fits if fits is not None else fit_per_collective(rows())[0]
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"name": "cal", "extends": "cpu", "collectives": fits}))
    return str(path)


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
def test_cost_model_uses_each_collectives_own_fit(tmp_path, kind):
    dev = load_device(calibrated(tmp_path))
    alpha, bw = TRUE[(kind, 2)]
    fn = getattr(comm, kind)
    for size in (1000.0, 3e6):
        assert fn(dev, size, 2, 1) == pytest.approx(hand_time(kind, 2, size, alpha, bw), rel=1e-12)
    # a plain cpu device (no fits) gives a different time: the fits are what moved it
    assert fn(load_device("cpu"), 3e6, 2, 1) != pytest.approx(fn(dev, 3e6, 2, 1), rel=1e-3)


def test_send_recv_and_group_sizes_take_the_nearest_measured_fit(tmp_path):
    dev = load_device(calibrated(tmp_path))
    a, b = TRUE[("send_recv", 2)]
    assert comm.send_recv(dev, 2e6, False) == pytest.approx(a + 2e6 / b, rel=1e-12)
    # all-reduce on 8 ranks: the 4-rank fit carried by the ring factors; on 3 ranks the
    # nearer (in ratio) 4-rank fit
    a4, b4 = TRUE[("all_reduce", 4)]
    assert comm.all_reduce(dev, 5e6, 8, 1) == pytest.approx(hand_time("all_reduce", 8, 5e6, a4, b4), rel=1e-12)
    assert comm.all_reduce(dev, 5e6, 3, 1) == pytest.approx(hand_time("all_reduce", 3, 5e6, a4, b4), rel=1e-12)


def test_a_file_without_fits_estimates_exactly_as_the_datasheet_model(tmp_path):
    """Built-in devices carry no fits; an empty collectives object changes nothing."""
    assert all(not load_device(n).collective_fits for n in ("cpu", "h100", "910b"))
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"name": "e", "extends": "cpu", "collectives": {}}))
    plan = Plan.parse("tp=2", world_size=2, defaults={"gbs": 2, "seq_len": 64, "mbs": 1, "dtype": "fp32"})
    model = load_model("tiny-llama")
    t = [estimate(model, Cluster(device=load_device(d), nodes=1, devices_per_node=2), plan).step_time_s
         for d in ("cpu", str(path))]
    assert t[0] == t[1]


def test_tp_step_time_moves_by_the_fitted_all_reduce_latency(tmp_path):
    """A tp=2 step on 1 micro-batch of tiny-llama (4 layers) holds 4 all-reduces per layer
    (Megatron: 2 forward, 2 backward) plus the embedding's and the output's: raising the
    fitted all-reduce latency by d adds 2 (n-1) d per all-reduce."""
    fits = fit_per_collective(rows())[0]
    plan = Plan.parse("tp=2", world_size=2, defaults={"gbs": 1, "seq_len": 64, "mbs": 1, "dtype": "fp32"})
    model = load_model("tiny-llama")
    d = 1e-3
    slower = json.loads(json.dumps(fits))
    for f in slower["all_reduce"]:
        f["latency_us"] += d * 1e6
    times = []
    for i, fs in enumerate((fits, slower)):
        sub = tmp_path / str(i)
        sub.mkdir()
        dev = load_device(calibrated(sub, fs))
        times.append(estimate(model, Cluster(device=dev, nodes=1, devices_per_node=2), plan).time.parts)
    diff = times[1]["tp communication"] - times[0]["tp communication"]
    n_layers = model.layers
    per_microbatch = 4 * n_layers + 1 + 2  # layers + embedding (1) + output (fwd + bwd)
    assert diff == pytest.approx(per_microbatch * 2 * (2 - 1) * d, rel=1e-9)


@pytest.mark.parametrize("bad, msg", [({"allreduce": []}, "unknown collective 'allreduce'"),
                                      ({"all_reduce": [{"group": 1, "latency_us": 1, "gbps": 1}]}, "group must be"),
                                      ({"all_reduce": [{"group": 2, "latency_us": -1, "gbps": 1}]}, "latency_us must"),
                                      ({"all_reduce": [{"group": 2, "latency_us": 1, "gbps": 0}]}, "gbps must"),
                                      ({"all_reduce": {"group": 2}}, "must be a list")])
def test_bad_collective_fits_are_one_line(tmp_path, bad, msg):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"name": "b", "extends": "cpu", "collectives": bad}))
    with pytest.raises(PartitaError) as e:
        load_device(str(path))
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_each_part_of_the_breakdown_names_its_source(tmp_path):
    """A calibrated file: the tp part rests on the all-reduce fit (calibrated); the same
    plan on a built-in device keeps its link's own source and the breakdown prints no
    source column (its output is unchanged)."""
    from partita.cli.render import breakdown_tables
    from partita.cost.term_sources import term_sources
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"name": "cal", "extends": "cpu", "collectives": fit_per_collective(rows())[0],
                                "efficiency": {"gemm": 0.5, "gemm_half_gflop": 0.01, "memory_bandwidth": 1.0,
                                               "kernel_overhead_us_per_layer": 100.0},
                                "efficiency_provenance": {k: "measured: partita calibrate (test)" for k in
                                                          ("gemm", "gemm_half_gflop", "memory_bandwidth",
                                                           "kernel_overhead_us_per_layer")}}))
    plan = Plan.parse("tp=2", world_size=2, defaults={"gbs": 2, "seq_len": 64, "mbs": 1, "dtype": "fp32"})
    model = load_model("tiny-llama")
    cal = estimate(model, Cluster(device=load_device(str(path)), nodes=1, devices_per_node=2), plan)
    src = term_sources(cal.cluster.device, cal.time.parts)
    assert src["compute"]["source"] == "calibrated"
    assert "all_reduce fit (groups 2, 4)" in src["tp communication"]["inputs"]
    assert "intra_node_comm" not in src["tp communication"]["inputs"]  # the fit replaces the link
    assert [c.header for c in breakdown_tables(cal)[1].columns][-1] == "source"
    builtin = estimate(model, Cluster(device=load_device("h100"), nodes=1, devices_per_node=2), plan)
    bsrc = term_sources(builtin.cluster.device, builtin.time.parts)
    assert bsrc["tp communication"]["inputs"]["intra_node_comm"] != "calibrated"
    assert all(s["source"] != "calibrated" for s in bsrc.values())
    assert [c.header for c in breakdown_tables(builtin)[1].columns] == ["component", "time", "share"]


def test_estimate_json_carries_the_sources_only_for_a_calibrated_file(tmp_path):
    """``time_sources`` appears in Estimate.to_dict (the --json output) when the device
    file holds collective fits, one entry per time part; a built-in device's dict is as before."""
    plan = Plan.parse("tp=2", world_size=2, defaults={"gbs": 2, "seq_len": 64, "mbs": 1, "dtype": "fp32"})
    model = load_model("tiny-llama")
    cal = estimate(model, Cluster(device=load_device(calibrated(tmp_path)), nodes=1, devices_per_node=2), plan)
    out = cal.to_dict()
    assert set(out["time_sources"]) == set(out["time"])
    assert out["time_sources"]["tp communication"]["source"] == "calibrated"
    builtin = estimate(model, Cluster(device=load_device("cpu"), nodes=1, devices_per_node=2), plan).to_dict()
    assert "time_sources" not in builtin
