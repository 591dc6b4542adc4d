"""`partita calibrate`'s fits on synthetic measurements generated from known parameters:
each fit must recover them exactly (to float rounding), independent of machine load.

The oracles are outside the fitting code: collective times come from the cost model's
own formulas (partita.cost.comm) on a device with known latency and bandwidth, micro-run
step times from the public estimate on a device with known overhead fields. The
measurement code (torch, timing) is exercised once, for structure only, by
tests/test_trace_analysis.py::test_calibrate_writes_a_hardware_file_the_planner_reads.

Tolerance: least squares over exact points of a line (or the 2x2 normal equations of
the collective model), so exact up to float rounding: a few ulps times the condition of
the system (sizes span 4 KiB to 8 MiB, GEMMs 1/2 to 1/0.0005 GFLOP: about 1e4), far
inside rel 1e-9; the overhead fields divide a difference of two step predictions
(~0.05 s) by the field's weight, losing ~1e-16 * 0.05 / 1e-6 relative: 1e-8 bound.
"""
import pytest

from partita.cost import comm
from partita.calibrate.hardware_file import hardware_file, predictor
from partita.calibrate.fit import fit_all_reduce, fit_collectives, fit_gemm, fit_overheads, summarize
from partita.calibrate.measure import RUNTIME_SEQ, increment_plans, runtime_plans
from partita.calibrate.refine import mechanism_of
from partita.plan import Plan
from partita.spec.hardware import load_device

REL = 1e-9
REL_OVERHEAD = 1e-8
PEAK = load_device("cpu").peak_flops("fp32")  # the synthetic machine: the base file's peak (FLOP/s)
EFF, G_HALF = 0.6, 0.05  # GEMM efficiency and half-saturation size (GFLOP)
ALPHA, BW = 20e-6, 5e9  # collective per-step latency (s) and bandwidth (bytes/s)
#: the true per-mechanism times (us); pp negative: a mechanism faster than the model predicts
TRUTH = {"kernel_overhead_us_per_layer": 350.0, "tp_framework_us_per_layer": 1200.0,
         "tp_nosp_framework_us_per_layer": 2100.0, "zero3_framework_us_per_layer": 800.0, "pp_framework_us_per_microbatch": -500.0,
         "moe_framework_us_per_layer": 400.0, "ep_framework_us_per_layer": 650.0,
         "recompute_framework_us_per_layer": 300.0,
         "cp_framework_us_per_layer": 900.0}


def gemm_rows(peak=PEAK, eff=EFF, g_half=G_HALF):
    """GEMMs of several shapes on the model's curve ``rate(G) = peak eff G / (G + G_half)``."""
    rows = []
    for cls, (m, k, n) in [("square", (s, s, s)) for s in (64, 256, 1024)] + [("wide", (128, 64, 256)),
                                                                               ("skinny", (8, 512, 512))]:
        g = 2 * m * k * n / 1e9
        t = g * 1e9 / (peak * eff * g / (g + g_half))
        rows.append({"class": cls, "gflop": g, "seconds": t, "samples": [t, t, t]})
    return rows


def synthetic_device():
    return load_device("cpu", overrides={"intra_node": {"gbps_per_direction": BW / 1e9, "latency_us": ALPHA * 1e6},
                                         "efficiency": {"intra_node_comm": 1.0}})


def collective_rows(groups=(2, 4)):
    """Every collective's time from partita.cost.comm on the synthetic device, at the sizes
    calibrate measures (all-to-all's S: what one rank sends, nccl-tests' convention)."""
    dev = synthetic_device()
    fns = {"all_reduce": lambda s, g: comm.all_reduce(dev, s, g, 1),
           "all_gather": lambda s, g: comm.all_gather(dev, s, g, 1),
           "reduce_scatter": lambda s, g: comm.reduce_scatter(dev, s, g, 1),
           "all_to_all": lambda s, g: comm.all_to_all(dev, s, g, 1),
           "send_recv": lambda s, g: comm.send_recv(dev, s, False)}
    return [{"kind": k, "group": g, "bytes": s, "seconds": f(s, g), "samples": [f(s, g)] * 3}
            for k, f in fns.items() for g in groups for s in (4096, 65536, 1 << 20, 8 << 20)]


def test_summary_is_median_and_half_iqr_of_the_repeats():
    t = summarize([5.0, 1.0, 3.0, 2.0, 4.0], "us", "synthetic")
    # inclusive quartiles of 1..5 are 2 and 4: half the IQR is 1
    assert (t["value"], t["spread"], t["repeats"]) == (3.0, 1.0, 5)
    assert summarize([7.0], "us", "one")["spread"] == 0.0


def test_gemm_fit_recovers_efficiency_and_half_size_over_shape_classes():
    peak, eff, g_half = fit_gemm(gemm_rows(), PEAK)
    assert peak == PEAK  # no measured rate exceeds the peak (eff < 1)
    assert eff == pytest.approx(EFF, rel=REL)
    assert g_half == pytest.approx(G_HALF, rel=REL)


def test_gemm_fit_raises_a_peak_the_machine_beats():
    rows = gemm_rows(peak=2 * PEAK)
    best = max(r["gflop"] * 1e9 / r["seconds"] for r in rows)
    peak, eff, g_half = fit_gemm(rows, PEAK)
    assert peak == best
    # the curve's asymptote 2*PEAK*EFF lies above the fastest measured rate: eff clamped to 1
    assert 2 * PEAK * EFF / best > 1 and eff == 1.0
    assert g_half == pytest.approx(G_HALF, rel=REL)


def test_collective_fit_recovers_latency_and_bandwidth_from_every_collective():
    alpha, bw, per_kind = fit_collectives(collective_rows())
    assert alpha == pytest.approx(ALPHA, rel=REL)
    assert bw == pytest.approx(BW, rel=REL)
    assert set(per_kind) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
    for kind, fit in per_kind.items():
        assert fit["latency_us"] == pytest.approx(ALPHA * 1e6, rel=REL), kind
        assert fit["gbps"] == pytest.approx(BW / 1e9, rel=REL), kind
        assert fit["joint_fit_worst_rel_error"] < 1e-9, kind


def test_collective_fit_names_a_collective_off_the_joint_model():
    rows = collective_rows()
    for r in rows:
        if r["kind"] == "all_to_all":
            r["seconds"] *= 3  # an all-to-all three times slower than the others predict
    _, _, per_kind = fit_collectives(rows)
    worst = max(per_kind, key=lambda k: per_kind[k]["joint_fit_worst_rel_error"])
    assert worst == "all_to_all"


@pytest.mark.parametrize("world", [2, 4, 8])
def test_all_reduce_fit_recovers_latency_and_bandwidth(world):
    rows = [r for r in collective_rows(groups=(world,)) if r["kind"] == "all_reduce"]
    alpha, bw = fit_all_reduce(rows, world)
    assert alpha == pytest.approx(ALPHA, rel=REL)
    assert bw == pytest.approx(BW, rel=REL)


def _base_fields():
    """The measured non-overhead fields of the synthetic machine, as hardware_file writes them."""
    return {"peak_tflops": {"fp32": PEAK / 1e12}, "memory": {"hbm_tbps": 0.03},
            "intra_node": {"gbps_per_direction": BW / 1e9, "peer_gbps_per_direction": BW / 1e9,
                           "latency_us": ALPHA * 1e6},
            "efficiency": {"gemm": EFF, "gemm_half_gflop": G_HALF, "memory_bandwidth": 1.0, "intra_node_comm": 1.0}}


def _synthetic_step(run: dict, predict) -> float:
    """The public estimate of ``run`` on the synthetic machine with the true fields."""
    # a device field cannot be negative: a negative truth is the estimate at 0 minus
    # |value| times the field's weight in that step (the estimate's own slope)
    zero = {k: max(v, 0.0) for k, v in TRUTH.items()}
    t = predict(run, zero)
    for field, value in TRUTH.items():
        if value < 0:
            weight = (predict(run, dict(zero, **{field: 1000.0})) - t) / 1e-3
            t += value * 1e-6 * weight
    return t


def _runs(world: int, spread_s: float = 0.0) -> dict:
    """Micro-run records whose step times are the public estimate on the synthetic machine
    with the true fields (negative ones included), +- ``spread_s`` around it; the
    mechanisms measured by their increment carry their longer run."""
    predict = predictor("cpu", _base_fields())
    runs = {}
    longer = increment_plans(world)
    for mech, (model, text) in runtime_plans(world).items():
        run = {"model": model, "plan_text": text, "plan": text, "seq_len": RUNTIME_SEQ, "dtype": "fp32",
               "world": world}
        t = _synthetic_step(run, predict)
        run["samples"] = [t - spread_s, t, t + spread_s]
        if mech in longer:
            long = dict(run, plan_text=longer[mech], plan=longer[mech])
            t_long = _synthetic_step(long, predict)
            long["samples"] = [t_long - spread_s, t_long, t_long + spread_s]
            run["long"] = long
        runs[mech] = run
    return runs


def test_every_mechanism_is_recovered_and_a_negative_one_is_reported_not_clamped():
    terms = fit_overheads(_runs(2), predictor("cpu", _base_fields()))
    assert set(terms) == set(TRUTH)
    for field, value in TRUTH.items():
        assert terms[field]["value"] == pytest.approx(value, rel=REL_OVERHEAD), field
        assert terms[field]["read_by_cost_model"], field
        assert terms[field]["repeats"] == 3 and terms[field]["spread"] == 0.0
    assert terms["pp_framework_us_per_microbatch"]["value"] < 0


def test_base_and_pipeline_are_measured_by_their_increment_on_a_compute_free_probe():
    """The base overhead and the pipeline field come from two runs each (more micro-batches
    in the second): a per-step cost the model does not hold (optimizer, fill/drain) added to
    both runs' measured steps cancels, so the fields are still recovered exactly - a
    single-run residual would absorb it. The pipeline runs the probe model."""
    runs = _runs(2)
    assert runs["pp"]["model"] == "pp-probe" and "long" in runs["pp"] and "long" in runs["base"]
    per_step = 0.050  # 50 ms per step the model does not know about
    for mech in ("base", "pp"):
        for r in (runs[mech], runs[mech]["long"]):
            r["samples"] = [s + per_step for s in r["samples"]]
    terms = fit_overheads(runs, predictor("cpu", _base_fields()))
    for field in ("kernel_overhead_us_per_layer", "pp_framework_us_per_microbatch"):
        assert terms[field]["value"] == pytest.approx(TRUTH[field], rel=REL_OVERHEAD), field
        assert "increment" in terms[field]["method"]


def test_the_local_moe_run_is_tiny_moe_without_ep_measured_by_its_increment():
    runs = _runs(2)
    moe_plan = Plan.parse(runs["moe"]["plan_text"], world_size=2, defaults={"mbs": 1, "seq_len": 128})
    assert runs["moe"]["model"] == runs["ep"]["model"] == "tiny-moe"
    assert moe_plan.ep == 1 and moe_plan.dp == 2 and "long" in runs["moe"] and "long" in runs["ep"]


def test_ep_is_measured_on_top_of_the_local_moe_term():
    """The ep run pays both fields once per MoE layer forward + backward (the same weight):
    fitted after the moe run, the ep field is what ep adds (650 us); without the moe run it
    is the whole dispatch, 400 + 650 = 1050 us (by hand)."""
    predict = predictor("cpu", _base_fields())
    runs = _runs(2)
    terms = fit_overheads(runs, predict)
    ep = terms["ep_framework_us_per_layer"]
    assert ep["value"] == pytest.approx(650.0, rel=REL_OVERHEAD)
    assert "on top of moe_framework_us_per_layer = 400 us" in ep["method"]
    alone = fit_overheads({k: v for k, v in runs.items() if k != "moe"}, predict)
    assert alone["ep_framework_us_per_layer"]["value"] == pytest.approx(400.0 + 650.0, rel=REL_OVERHEAD)


def test_a_negative_moe_term_is_written_as_0_and_says_so(monkeypatch):
    """A local MoE layer measured 200 us faster than the model: its record keeps -200, says
    it was clamped, the ep fit holds it at 0, so ep's term is 650 - 200 = 450 us (by hand:
    both fields weigh the same in the ep run), and the file writes 0 with the note."""
    monkeypatch.setitem(TRUTH, "moe_framework_us_per_layer", -200.0)
    m = _measurements(2)
    terms = fit_overheads(m["runtime"], predictor("cpu", _base_fields()))
    moe = terms["moe_framework_us_per_layer"]
    assert moe["value"] == pytest.approx(-200.0, rel=REL_OVERHEAD)
    assert moe["clamped_to"] == 0.0 and "written as 0" in moe["note"]
    assert terms["ep_framework_us_per_layer"]["value"] == pytest.approx(450.0, rel=REL_OVERHEAD)
    out = hardware_file(m, "cpu", "synthetic")
    assert out["efficiency"]["moe_framework_us_per_layer"] == 0.0
    assert "negative: written as 0" in out["efficiency_provenance"]["moe_framework_us_per_layer"]


def test_overhead_spread_is_the_repeats_spread_over_the_fields_weight():
    spread_s = 0.002
    runs = _runs(2, spread_s)
    runs["tp"].pop("long")  # one run: the spread of its own repeats (an increment's cancels here)
    terms = fit_overheads(runs, predictor("cpu", _base_fields()))
    tp = terms["tp_framework_us_per_layer"]
    # 3 samples t-d, t, t+d: inclusive quartiles t-d/2 and t+d/2, half the IQR d/2 per step,
    # divided by the field's weight (the model counts tp once per layer: 4 layers, 1 micro-batch)
    assert tp["weight"] == pytest.approx(4.0, rel=1e-9)
    assert tp["spread"] == pytest.approx(spread_s / 2 / 4 * 1e6, rel=1e-6)


def _measurements(world: int) -> dict:
    """A full `measure` record of the synthetic machine."""
    return {"device": "cpu", "dtype": "fp32", "world": world, "repeats": 3, "gemm": gemm_rows(),
            "copy": [3.0e10] * 3, "collectives": collective_rows(groups=(2,) if world == 2 else (world, 2)),
            "runtime": _runs(world)}


@pytest.mark.parametrize("world", [2, 4])
def test_hardware_file_recovers_every_parameter_with_its_provenance(world):
    out = hardware_file(_measurements(world), "cpu", "synthetic")
    assert out["extends"] == "cpu" and out["name"] == "synthetic"
    assert out["memory"]["hbm_tbps"] == 3.0e10 / 1e12
    eff = out["efficiency"]
    assert eff["gemm"] == pytest.approx(EFF, rel=REL)
    assert eff["gemm_half_gflop"] == pytest.approx(G_HALF, rel=REL)
    assert out["intra_node"]["gbps_per_direction"] == pytest.approx(BW / 1e9, rel=REL)
    assert out["intra_node"]["latency_us"] == pytest.approx(ALPHA * 1e6, rel=REL)
    for field, value in TRUTH.items():
        assert eff[field] == pytest.approx(max(value, 0.0), rel=REL_OVERHEAD, abs=1e-6), field
        term = out["calibration"]["terms"][f"efficiency.{field}"]
        assert term["value"] == pytest.approx(value, rel=REL_OVERHEAD)  # signed, as measured
        assert out["efficiency_provenance"][field].startswith("measured: partita calibrate")
    assert "negative: written as 0" in out["efficiency_provenance"]["pp_framework_us_per_microbatch"]
    # the file loads, and the planner reads every measured field from it
    dev = load_device("cpu", overrides={k: v for k, v in out.items() if k in ("efficiency", "intra_node", "memory")})
    assert dev.efficiency.tp_framework_us_per_layer == eff["tp_framework_us_per_layer"]


def test_single_process_keeps_the_base_links_and_measures_the_base_overhead():
    m = _measurements(2)
    m.update(world=1, collectives=[])
    base_run = {k: v for k, v in m["runtime"]["base"].items() if k != "long"} | {"world": 1, "plan_text": "dp=1,gbs=1"}
    t = predictor("cpu", _base_fields())(base_run, {k: max(v, 0.0) for k, v in TRUTH.items()})
    m["runtime"] = {"base": dict(base_run, samples=[t] * 3)}
    out = hardware_file(m, "cpu", "one")
    base = load_device("cpu")
    assert out["intra_node"]["gbps_per_direction"] == base.intra_gbps
    assert out["efficiency"]["kernel_overhead_us_per_layer"] == pytest.approx(
        TRUTH["kernel_overhead_us_per_layer"], rel=REL_OVERHEAD)
    assert "tp_framework_us_per_layer" not in out["efficiency"]


@pytest.mark.parametrize("text, mech", [("dp=2", "base"), ("tp=2", "tp"), ("tp=2,sp=false", "tp_nosp"),
                                        ("dp=2,zero=3", "zero3"), ("pp=2", "pp"),
                                        ("cp=2", "cp"), ("dp=2,recompute=full", "recompute"),
                                        ("tp=2,recompute=full", None)])
def test_a_profiled_run_refines_the_one_mechanism_it_uses(text, mech):
    plan = Plan.parse(text, world_size=2, defaults={"gbs": 8, "seq_len": 128, "mbs": 1})
    assert mechanism_of(plan) == mech


@pytest.mark.parametrize("text, mech", [("dp=2", "moe"), ("ep=2", "ep"), ("tp=2", "tp")])
def test_a_profiled_moe_run_without_other_mechanisms_refines_the_moe_term(text, mech):
    plan = Plan.parse(text, world_size=2, defaults={"gbs": 8, "seq_len": 128, "mbs": 1})
    assert mechanism_of(plan, moe=True) == mech


def test_term_by_term_comparison_names_the_term_most_off():
    from partita.profile.compare_terms import term_table
    parts = {"compute": 0.300, "optimizer step": 0.010, "tp communication": 0.120, "pipeline bubble": 0.0}
    # 40 ms of the tp part is DTensor framework time: compared with compute, where a CPU trace books it
    framework = {"tp_framework_us_per_layer": (0.040, "measured: partita calibrate")}
    measured = {"compute": 0.360, "tp": 0.200, "idle": 0.005}
    table = term_table(measured, parts, framework, {"compute": "calibrated", "tp": "calibrated"})
    rows = {r["term"]: r for r in table["rows"]}
    assert rows["compute"]["predicted_s"] == pytest.approx(0.350, rel=1e-12)  # 300 + 10 + 40 framework
    assert rows["tp communication"]["predicted_s"] == pytest.approx(0.080, rel=1e-12)
    assert rows["  of which framework: tp_framework_us_per_layer"]["source"] == "calibrated"
    # tp is 120 ms over, compute 10 ms, idle 5 ms: tp communication is the term most off
    assert table["most_off"] == "tp communication"
    assert table["most_off_diff_s"] == pytest.approx(0.120, rel=1e-12)


def test_term_by_term_comparison_keeps_the_moe_term_under_compute_and_moves_ep():
    """The moe term is booked under compute (nothing to move); ep's share on top is booked
    under the ep all-to-all and compared with compute, where a CPU trace counts it."""
    from partita.profile.compare_terms import term_table
    parts = {"compute": 0.200, "ep all-to-all": 0.050}
    framework = {"moe_framework_us_per_layer": (0.030, "measured: partita calibrate"),
                 "ep_framework_us_per_layer": (0.020, "measured: partita calibrate")}
    table = term_table({"compute": 0.260, "ep": 0.030}, parts, framework, {})
    rows = {r["term"]: r for r in table["rows"]}
    assert rows["compute"]["predicted_s"] == pytest.approx(0.220, rel=1e-12)  # 200 + 20 ep share; moe already in
    assert rows["ep communication"]["predicted_s"] == pytest.approx(0.030, rel=1e-12)
    assert rows["  of which framework: moe_framework_us_per_layer"]["source"] == "calibrated"
    assert table["most_off"] == "compute" and table["most_off_diff_s"] == pytest.approx(0.040, rel=1e-12)


def test_from_profile_recovers_the_framework_field_of_a_run_dir(tmp_path):
    """A run dir whose step times are the estimate on a device with a known tp framework
    time: refining a file that has the wrong value recovers the right one."""
    import json

    from partita.estimate import estimate
    from partita.calibrate.refine import refine_from_runs
    from partita.spec.hardware import Cluster
    from partita.spec.load import load_model
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"name": "b", "extends": "cpu", "efficiency": {"tp_framework_us_per_layer": 10.0}}))
    plan = Plan.parse("tp=2", world_size=2, defaults={"gbs": 2, "seq_len": 64, "mbs": 1, "dtype": "fp32"})
    true = load_device(str(base), overrides={"efficiency": {"tp_framework_us_per_layer": 2500.0}})
    t = estimate(load_model("tiny-llama"), Cluster(device=true, nodes=1, devices_per_node=2), plan).step_time_s
    run = tmp_path / "run"
    run.mkdir()
    plan.to_json(run / "plan.json")
    (run / "train.json").write_text(json.dumps({"model": "tiny-llama"}))
    # the first step is a warm-up (left out); the others are the repeats
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "step_time_s": s}) + "\n"
                                               for i, s in enumerate([9.0, t, t, t])))
    out = refine_from_runs(str(base), [str(run)], None)
    assert out["efficiency"]["tp_framework_us_per_layer"] == pytest.approx(2500.0, rel=REL_OVERHEAD)
    assert out["calibration"]["terms"]["efficiency.tp_framework_us_per_layer"]["repeats"] == 3


def test_comm_overlap_is_recovered_in_turn_with_the_fsdp_framework_term(monkeypatch):
    """Synthetic steps from the estimate with 35 % of FSDP's traffic hidden behind compute:
    the probe run and the tiny zero-3 run each hold the other's field, so neither can be
    read alone; fitted in turn, both come back (the framework term to the alternating fit's
    tolerance), and the file carries them with their provenance."""
    from partita.calibrate.overlap import fit_with_overlap
    monkeypatch.setitem(TRUTH, "comm_overlap", 0.35)
    m = _measurements(2)
    assert m["runtime"]["comm_overlap"]["model"] == "zero3-probe"
    out = hardware_file(m, "cpu", "synthetic")
    assert out["efficiency"]["comm_overlap"] == pytest.approx(0.35, rel=1e-8)
    assert out["efficiency"]["zero3_framework_us_per_layer"] == pytest.approx(800.0, rel=1e-6)
    term = out["calibration"]["terms"]["efficiency.comm_overlap"]
    assert term["unit"] == "fraction" and "rounds" in term["method"]
    assert out["efficiency_provenance"]["comm_overlap"].startswith("measured: partita calibrate")
    # read with a fixed overlap, the framework term absorbs the error: all traffic hidden
    # (the accelerators' default) leaves the serial share to it, none hidden (cpu.json's
    # measured 0) charges it the hidden share
    without_probe = {k: v for k, v in m["runtime"].items() if k != "comm_overlap"}
    for overlap, wrong in ((1.0, lambda v: v > 800.0 * 1.02), (0.0, lambda v: v < 800.0 * 0.98)):
        fields = _base_fields()
        fields["efficiency"]["comm_overlap"] = overlap
        alone = fit_overheads(without_probe, predictor("cpu", fields))
        assert wrong(alone["zero3_framework_us_per_layer"]["value"]), overlap
    assert fit_with_overlap(m["runtime"], predictor("cpu", _base_fields()))["comm_overlap"]["value"] == \
        pytest.approx(0.35, rel=1e-8)


def test_the_overlap_probe_is_compute_bound_so_its_step_is_linear_in_the_overlap():
    """The exact recovery rests on the probe's traffic fitting under its compute: then the
    predicted step at f = 0.5 is the mean of f = 0 and f = 1 (a comm-bound probe bends)."""
    run = _runs(2)["comm_overlap"]
    predict = predictor("cpu", _base_fields())
    truth = {k: max(v, 0.0) for k, v in TRUTH.items()}
    p0, p_half, p1 = (predict(run, dict(truth, comm_overlap=f)) for f in (0.0, 0.5, 1.0))
    # the overlap moves the probe's step by 2 % on this synthetic machine (5 GB/s links; 14 %
    # on the development CPU's calibrated file), the tiny zero-3 run's by under 1 %
    assert p0 - p1 > 0.015 * p0
    assert p_half == pytest.approx((p0 + p1) / 2, rel=1e-12)


def test_a_probe_slower_than_serial_traffic_is_written_as_0_and_says_so():
    """10 ms per micro-batch more than the fully serial prediction (1 and 3 micro-batches:
    the increment is 20 ms over): the record keeps the negative share, the file writes 0
    and its provenance says so."""
    m = _measurements(2)
    predict = predictor("cpu", _base_fields())
    serial = {k: max(v, 0.0) for k, v in TRUTH.items()} | {"comm_overlap": 0}
    probe = m["runtime"]["comm_overlap"]
    probe["samples"] = [predict(probe, serial) + 0.010] * 3
    probe["long"]["samples"] = [predict(probe["long"], serial) + 0.030] * 3
    out = hardware_file(m, "cpu", "synthetic")
    term = out["calibration"]["terms"]["efficiency.comm_overlap"]
    assert term["value"] < 0 and term["clamped_to"] == 0.0
    assert out["efficiency"]["comm_overlap"] == 0.0
    assert "negative: written as 0" in out["efficiency_provenance"]["comm_overlap"]
