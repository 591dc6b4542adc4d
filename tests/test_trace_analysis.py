"""Trace analysis against hand-computed cases, a real GPU trace and a CPU (gloo) trace; `partita profile` and `partita calibrate` end to end."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from partita.analyze.breakdown import DEVICE_COMM, analyze_trace, load_trace

TRACES = Path(__file__).parent / "data" / "traces"


def ev(name, ts, dur, cat="kernel", pid=0, tid=7, **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": pid, "tid": tid, "args": args}


def test_hand_computed_device_trace():
    # compute 0-100 and 150-200; all-reduce 80-170 (overlaps 20 + 20); memcpy 210-220; window 0-250
    trace = {"traceEvents": [
        ev("ProfilerStep#1", 0, 250, cat="user_annotation", tid=1),
        ev("gemm", 0, 100), ev("gemm", 150, 50), ev("gemm", 20, 30),          # nested kernel counts once
        ev("ncclKernel_AllReduce_RING", 80, 90, tid=9),
        ev("Memcpy HtoD", 210, 10, cat="gpu_memcpy"),
    ]}
    b = analyze_trace(trace)
    assert b.kind == "device" and b.window_us == 250
    assert b.compute_us == 150 and b.communication_us == 90
    assert b.overlapped_us == 40 and b.exposed_communication_us == 50
    assert b.memory_us == 10
    assert b.idle_us == 250 - (200 + 10)   # busy: 0-200 and 210-220
    assert b.by_collective_us == {"all_reduce": 90}


def test_hand_computed_cpu_trace():
    trace = {"traceEvents": [
        ev("aten::mm", 0, 100, cat="cpu_op", tid=1), ev("aten::add", 10, 5, cat="cpu_op", tid=1),
        ev("c10d::allreduce_", 100, 10, cat="cpu_op", tid=1),
        ev("gloo:all_reduce", 95, 30, cat="cpu_op", tid=2),
        ev("aten::mm", 140, 60, cat="cpu_op", tid=1),
    ]}
    b = analyze_trace(trace)
    assert b.kind == "cpu" and b.window_us == 200
    assert b.compute_us == 160 and b.communication_us == 30     # 95-125
    assert b.overlapped_us == 5 and b.exposed_communication_us == 25
    assert b.idle_us == 200 - 185


def bitmap_split(trace: dict) -> tuple[int, int, int]:
    """Independent check: mark every microsecond busy with compute / communication."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    t0 = int(min(e["ts"] for e in events))
    size = int(max(e["ts"] + e["dur"] for e in events)) - t0 + 2
    compute, comm = bytearray(size), bytearray(size)
    for e in events:
        target = comm if DEVICE_COMM.search(e["name"]) else compute
        a, b = int(round((e["ts"] - t0) * 1)), int(round((e["ts"] + e["dur"] - t0) * 1))
        target[a:b] = b"\x01" * (b - a)
    both = sum(1 for x, y in zip(compute, comm) if x and y)
    return sum(compute), sum(comm), both


@pytest.mark.parametrize("name", ["ddp_2gpu_rank0", "a2a_128gpu_rank0", "a2a_128gpu_rank1"])
def test_real_gpu_traces_match_an_independent_count(name):
    trace = load_trace(TRACES / f"{name}.json.gz")
    b = analyze_trace(trace)
    compute, comm, both = bitmap_split(trace)
    # microsecond rounding of thousands of kernels: agree within 1%
    assert b.compute_us == pytest.approx(compute, rel=0.01)
    assert b.communication_us == pytest.approx(comm, rel=0.01)
    assert b.overlapped_us == pytest.approx(both, rel=0.02)
    # each collective kernel is attributed to one kind; kinds may run concurrently on
    # different streams, so their sum covers the total communication time and can exceed it
    assert sum(b.by_collective_us.values()) >= b.communication_us * (1 - 1e-9)
    assert "other" not in b.by_collective_us
    if name.startswith("a2a"):
        assert {"all_to_all", "all_gather", "all_reduce"} <= set(b.by_collective_us)


#: the gloo trace is recorded on the session's shared 2-rank processes (tests/conftest.py
#: ``equivalence``; this file's :func:`shared_case`), not in a torchrun of its own
EQUIVALENCE_CASES = [(2, 0, "gloo-trace", str(Path(__file__).resolve()))]


def shared_case(case: str) -> dict:
    """``gloo-trace``: a 4-layer DDP model on the 2 gloo ranks of the process group that is
    up, 3 steps under torch.profiler (wait 0, warmup 1, active 2); each rank exports its
    Chrome trace under ``$PARTITA_WORKER_DIR/trace_analysis``. Returns that folder."""
    import torch
    import torch.distributed as dist
    assert case == "gloo-trace", case
    folder = Path(os.environ["PARTITA_WORKER_DIR"]) / "trace_analysis"
    folder.mkdir(parents=True, exist_ok=True)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.1)
    out = str(folder / f"rank{dist.get_rank()}.json")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=2),
                                on_trace_ready=lambda p: p.export_chrome_trace(out)) as prof:
        for _ in range(3):
            ddp(torch.randn(64, 256)).sum().backward()
            prof.step()
    dist.barrier()
    return {"folder": str(folder)}


def test_cpu_trace_recorded_with_gloo(equivalence):
    tmp_path = Path(equivalence["results"][EQUIVALENCE_CASES[0]]["folder"])
    b = analyze_trace(tmp_path / "rank0.json")
    assert b.kind == "cpu" and b.steps == 2
    assert b.compute_us > 0 and b.communication_us > 0
    assert "all_reduce" in b.by_collective_us
    assert b.overlapped_us + b.exposed_communication_us == pytest.approx(b.communication_us)
    assert 0 <= b.idle_us <= b.window_us


def test_partita_profile_reports_measured_beside_predicted(tmp_path):
    report_path = tmp_path / "profile.html"
    proc = subprocess.run([sys.executable, "-m", "partita", "profile", "--model", "tiny-llama", "--plan", "dp=2",
                           "--nproc", "2", "--steps", "4", "--json", "--run-dir", str(tmp_path),
                           "--report", str(report_path)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    for r in report["ranks"]:
        assert r["step_time_s"] > 0 and r["compute_s"] > 0 and r["communication_s"] > 0
        assert "all_reduce" in r["by_collective_s"] and r["memory"]["peak_rss_gib"] > 0
        # the gradient all-reduce runs on the dp group; gloo's worker thread is matched to it
        assert r["by_axis_s"].get("dp", 0) > 0
    assert report["predicted"]["step_time_s"] > 0
    assert report["ratio_measured_over_predicted"]["step_time_s"] > 0
    assert (tmp_path / "profile" / "rank0.json").exists() and (tmp_path / "profile" / "rank1.json").exists()
    # the HTML report: plotly.js inline (opens offline), a timeline row per rank with
    # compute and all-reduce bars, and the measured/predicted figures of this report
    page = report_path.read_text()
    assert report["html_report"] == str(report_path)
    assert page.count("<script src=") == 0 and "Plotly.newPlot" in page and len(page) > 1_000_000
    for fig in range(3):
        assert f'id="partita-fig-{fig}"' in page
    assert '"name":"compute"' in page and '"name":"all_reduce"' in page
    assert '"rank 0"' in page and '"rank 1"' in page
    assert f"{report['overall']['step_time_s'] * 1e3:.1f}" in page
    assert f"{report['predicted']['step_time_s'] * 1e3:.1f}" in page


def test_groups_are_named_after_mesh_axes():
    from partita.plan import Plan
    from partita.train.profile_report import axis_of_group, by_axis
    plan = Plan(dp=2, tp=2, pp=2)  # mesh (pp, dp, cp, tp): rank = pp*4 + dp*2 + tp
    assert axis_of_group(plan, 5, "4,5") == "tp"
    assert axis_of_group(plan, 5, "5,7") == "dp"
    assert axis_of_group(plan, 5, "1,5") == "pp"
    assert axis_of_group(plan, 5, "0,1,2,3,4,5,6,7") == "world"
    assert axis_of_group(plan, 5, "0,3") == "ranks 0,3"
    assert by_axis(plan, 0, {"0,1": 0.5, "0,2": 0.25, "0,4": 0.125}) == {"tp": 0.5, "dp": 0.25, "pp": 0.125}


def test_gpu_trace_communication_by_process_group():
    # the NCCL kernels of the DDP fixture name their group: [0, 1] for every collective
    b = analyze_trace(TRACES / "ddp_2gpu_rank0.json.gz")
    assert list(b.by_group_us) == ["0,1"]
    assert b.by_group_us["0,1"] == pytest.approx(b.communication_us)


REPEATS = 2  # partita calibrate --repeats of the end-to-end run below


def test_calibrate_writes_a_hardware_file_the_planner_reads(tmp_path):
    """`partita calibrate` on 2 gloo processes, end to end, structure only: the file
    extends the base device, every fitted field is finite and in its physical range, the
    framework terms were computed, and the planner predicts with it. No timing magnitude
    is asserted (they depend on machine load); tests/test_calibrate_fit.py checks the
    fits themselves on synthetic measurements. Run with ``--repeats 2`` (the fewest a
    spread needs; every term must then hold 2 repeats): the default's 5 cost the suite a
    minute and are checked on the parser."""
    from partita.estimate import estimate
    from partita.plan import Plan
    from partita.spec.hardware import load_device, make_cluster
    from partita.spec.load import load_model
    from partita.cli import build_parser
    assert build_parser().parse_args(["calibrate"]).repeats == 5  # the default repeats
    out = tmp_path / "my-cpu.json"
    proc = subprocess.run([sys.executable, "-m", "partita", "calibrate", "--nproc", "2", "--repeats", str(REPEATS),
                           "-o", str(out)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    log = tmp_path / "my-cpu.json.failed.log"  # a failed calibration keeps every rank's output there
    assert proc.returncode == 0, proc.stderr[-3000:] + (log.read_text()[-6000:] if log.exists() else "")
    data = json.loads(out.read_text())
    raw, terms = data["calibration"]["raw"], data["calibration"]["terms"]
    assert data["extends"] == "cpu" and raw["world"] == 2 and raw["repeats"] == REPEATS
    assert "run-queue" in raw["clock"]  # timed on calibrate/busy_clock.py (Linux: schedstat present)
    assert len(raw["gemm"]) == 12 and {r["kind"] for r in raw["collectives"]} == {
        "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast"}
    # one micro-run of Partita's runtime per mechanism, every repeat timed
    assert set(raw["runtime"]) == {"base", "tp", "tp_nosp", "zero3", "comm_overlap", "pp", "moe", "ep", "recompute",
                                   "cp"}
    assert raw["runtime"]["tp"]["model"] == "tiny-llama" and raw["runtime"]["comm_overlap"]["model"] == "zero3-probe"
    assert all(len(r["samples"]) == REPEATS and all(math.isfinite(s) and s > 0 for s in r["samples"])
               for r in raw["runtime"].values())
    # every runtime term has a value (signed), a spread and its repeats
    overheads = {k: t for k, t in terms.items() if k.startswith("efficiency.")}
    assert set(data["collectives"]) <= {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv",
                                        "broadcast"}
    assert len(overheads) == 10 and all(math.isfinite(t["value"]) and t["spread"] >= 0 and t["repeats"] == REPEATS
                                       for t in overheads.values())
    assert "spread" in proc.stdout and "repeats" in proc.stdout
    device = load_device(str(out))
    assert 0 < device.efficiency["gemm"] <= 1
    assert all(math.isfinite(v) and v > 0 for v in (device.intra_gbps, device.hbm_tbps))
    # the optimizer step measured on its own (in place: faster than the allocating copy)
    assert device.optimizer_tbps == terms["memory.optimizer_tbps"]["value"] > 0
    assert terms["memory.optimizer_tbps"]["repeats"] == REPEATS
    # written as 0 when a measurement is below the model's prediction (the term keeps the sign)
    for key in ("gemm_half_gflop", "tp_framework_us_per_layer", "zero3_framework_us_per_layer",
                "kernel_overhead_us_per_layer", "pp_framework_us_per_microbatch", "moe_framework_us_per_layer",
                "ep_framework_us_per_layer"):
        assert math.isfinite(device.efficiency[key]) and device.efficiency[key] >= 0, key
    assert math.isfinite(device.intra_latency_us) and device.intra_latency_us >= 0
    assert 0 <= device.efficiency.comm_overlap <= 1  # a share, written clamped (the term keeps its sign)
    plan = Plan(tp=2, sp=True, gbs=4, mbs=1, seq_len=64, dtype="fp32")
    est = estimate(load_model("tiny-llama"), make_cluster(str(out), 2), plan)
    assert math.isfinite(est.step_time_s) and est.step_time_s > 0 and est.time.parts["tp communication"] > 0


def test_profile_predicts_a_run_dir_as_partitas_runtime_ran_it(tmp_path):
    """A run dir's plan planned for Megatron is predicted with Partita's runtime entry: for
    cp that is K/V all-gathered (not Megatron's ring), a different step time."""
    from partita.estimate import estimate
    from partita.plan import Plan
    from partita.spec.hardware import make_cluster
    from partita.spec.load import load_model
    from partita.train.profile_report import runtime_plan
    planned = Plan.parse("cp=2", world_size=2, defaults={"gbs": 2, "seq_len": 256, "mbs": 1, "dtype": "fp32",
                                                         "framework": "megatron"})
    planned.to_json(tmp_path / "plan.json")
    ran = runtime_plan(tmp_path)
    assert ran.framework == "partita" and ran.cp == 2 and ran.seq_len == 256
    model, cluster = load_model("tiny-llama"), make_cluster("cpu", 2)
    assert estimate(model, cluster, ran).step_time_s != pytest.approx(estimate(model, cluster, planned).step_time_s,
                                                                      rel=1e-4)
