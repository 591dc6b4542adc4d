"""``partita analyze``: traces Partita did not record.

Oracles: Holistic Trace Analysis 0.5.0 itself (the PyPI package, run on the same three real
GPU traces: temporal breakdown, comm/comp overlap, idle time per stream); hand-computed
traces for the conventions that differ; a trace recorded by torch.profiler here, whose
memory peaks are the bytes of tensors the test holds.
"""
import gzip
import json
import shutil
from pathlib import Path

import pytest

from partita.cli.main import main
from partita.analyze.ranks import analyze_traces
from partita.analyze.files import normalise_npu_trace

TRACES = Path(__file__).parent / "data" / "traces"
RUNS = {"ddp": ["ddp_2gpu_rank0"], "a2a": ["a2a_128gpu_rank0", "a2a_128gpu_rank1"]}


def run_cli(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def hta_figures(tmp_path_factory):
    """HTA 0.5.0's own figures per run and rank (each run in a directory of its own, as HTA reads them)."""
    from hta.trace_analysis import TraceAnalysis
    figures = {}
    for run, names in RUNS.items():
        d = tmp_path_factory.mktemp(run)
        for n in names:
            shutil.copy(TRACES / f"{n}.json.gz", d)
        ta = TraceAnalysis(trace_dir=str(d))
        temporal = ta.get_temporal_breakdown(visualize=False).set_index("rank")
        overlap = ta.get_comm_comp_overlap(visualize=False).set_index("rank")
        idle = {rank: ta.get_idle_time_breakdown(ranks=[rank], visualize=False)[0] for rank in temporal.index}
        figures[run] = (temporal, overlap, idle)
    return figures


@pytest.mark.parametrize("run", sorted(RUNS))
def test_hta_conventions_match_hta_itself(run, hta_figures, capsys):
    temporal, overlap, idle = hta_figures[run]
    paths = [str(TRACES / f"{n}.json.gz") for n in RUNS[run]]
    rc, out, err = run_cli(["analyze", *paths, "--conventions", "hta", "--json"], capsys)
    assert rc == 0, err
    ranks = json.loads(out)["ranks"]
    assert sorted(r["rank"] for r in ranks) == sorted(temporal.index)
    for r in ranks:
        h = temporal.loc[r["rank"]]
        # the done-when criterion: within 1 point of HTA's percentages ...
        assert abs(r["compute_pct"] - h["compute_time_pctg"]) <= 1
        assert abs(r["non_compute_pct"] - h["non_compute_time_pctg"]) <= 1
        assert abs(r["idle_pct"] - h["idle_time_pctg"]) <= 1
        assert abs(r["overlap_pct"] - overlap.loc[r["rank"], "comp_comm_overlap_pctg"]) <= 1
        # ... and the microseconds behind them (the same rules give the same sums)
        assert r["window_us"] == pytest.approx(h["kernel_time(us)"], rel=1e-6)
        assert r["compute_us"] == pytest.approx(h["compute_time(us)"], rel=1e-6)
        assert r["idle_us"] == pytest.approx(h["idle_time(us)"], rel=1e-6)
        # idle time per stream and category (HTA's get_idle_time_breakdown)
        df = idle[r["rank"]]
        for _, row in df.iterrows():
            ours = r["idle_by_stream"][str(int(row["stream"]))][f"{row['idle_category']}_us"]
            assert ours == pytest.approx(row["idle_time"], abs=1.0)


def test_partita_conventions_differ_from_hta_where_documented():
    """The default keeps every step: the a2a traces have two steps and HTA drops the last,
    so Partita's window is about twice HTA's; the ddp trace has fractional timestamps, which
    HTA rounds inward (each kernel loses up to 2 us)."""
    a2a = [str(TRACES / f"{n}.json.gz") for n in RUNS["a2a"]]
    ours, _ = analyze_traces(a2a)
    hta, _ = analyze_traces(a2a, "hta")
    for o, h in zip(ours["ranks"], hta["ranks"]):
        assert o["steps"] == 2 and h["steps"] == 1
        assert 1.8 < o["window_us"] / h["window_us"] < 2.3
    ddp = [str(TRACES / "ddp_2gpu_rank0.json.gz")]
    o, h = analyze_traces(ddp)[0]["ranks"][0], analyze_traces(ddp, "hta")[0]["ranks"][0]
    assert o["window_us"] != int(o["window_us"]) and h["window_us"] == int(h["window_us"])


def ev(name, ts, dur, cat="kernel", tid=7, **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": 0, "tid": tid, "args": args}


def launched(name, ts, dur, corr, stream=7, cpu_ts=None, **args):
    """A kernel and the runtime call that launched it (correlation ``corr``)."""
    return [ev("cudaLaunchKernel", ts - 5 if cpu_ts is None else cpu_ts, 2, cat="cuda_runtime", tid=1,
               correlation=corr),
            ev(name, ts, dur, stream=stream, correlation=corr, **args)]


def test_hand_computed_hta_rules():
    # steps 1 and 2 (2 is dropped: its kernel, launched inside it, too); fractional timestamps
    # are rounded inward: gemm [10.4, 60.6] -> [11, 60], nccl [50.2, 90.9] -> [51, 90]
    events = [ev("ProfilerStep#1", 0, 100, cat="user_annotation", tid=1),
              ev("ProfilerStep#2", 100.5, 100, cat="user_annotation", tid=1),
              *launched("gemm", 10.4, 50.2, 1), *launched("ncclKernel_AllReduce", 50.2, 40.7, 2, stream=9),
              *launched("Memcpy DtoD", 95.0, 2.0, 3), *launched("gemm", 120, 50, 4, cpu_ts=110)]
    r = analyze_traces([], "hta", loaded=_loaded({"traceEvents": events}))[0]["ranks"][0]
    assert r["window_us"] == 97 - 11                    # first start to last end
    assert r["compute_us"] == 49 and r["communication_us"] == 39 and r["memory_us"] == 2
    assert r["idle_us"] == 86 - (90 - 11) - 2            # union 11-90 and 95-97
    assert r["overlapped_us"] == 60 - 51
    assert r["overlap_pct"] == round(100 * 9 / 39, 2)
    assert r["compute_pct"] + r["non_compute_pct"] + r["idle_pct"] == pytest.approx(100, abs=0.02)


def _loaded(*traces):
    from partita.analyze.files import RankTrace
    return [RankTrace(f"rank{i}.json", i, t) for i, t in enumerate(traces)]


def test_axes_from_process_group_descriptions():
    def comm(ts, desc, ranks, corr):
        return launched("ncclDevKernel_AllGather", ts, 10, corr, stream=9, **{
            "Process Group Name": desc, "Process Group Description": desc, "Process Group Ranks": ranks})
    events = [*comm(10, "TENSOR_MODEL_PARALLEL_GROUP", "[0, 1]", 1), *comm(30, "mesh_dp_shard", "[0, 2, 4, 6]", 2),
              *comm(50, "EXPERT_DATA_PARALLEL_GROUP", "[0, 4]", 3), *comm(70, "undefined", "[0, 2]", 4),
              *launched("gemm", 0, 100, 5)]
    trace = {"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 8}}
    r = analyze_traces([], loaded=_loaded(trace))[0]["ranks"][0]
    assert r["by_axis_us"] == {"tp": 10, "dp": 10, "edp": 10, "size 2 stride 2": 10}
    assert r["by_collective_us"] == {"all_gather": 40}
    ddp = analyze_traces([str(TRACES / "ddp_2gpu_rank0.json.gz")])[0]["ranks"][0]
    assert set(ddp["by_axis_us"]) == {"world"}           # its only group is default_pg over ranks 0, 1


def test_stragglers():
    traces = [{"traceEvents": [*launched("gemm", 0, c, 1), *launched("ncclKernel_AllReduce", c, 200 - c, 2, 9)],
               "distributedInfo": {"rank": rank, "world_size": 3}} for rank, c in enumerate((100, 110, 150))]
    s = analyze_traces([], loaded=_loaded(*traces))[0]["stragglers"]
    assert s["compute"]["rank"] == 2 and s["compute"]["ratio_to_median"] == pytest.approx(150 / 110, abs=1e-3)
    assert s["least_communication_rank"] == 2


def test_memory_of_a_recorded_trace(tmp_path, capsys):
    """torch.profiler's [memory] events: the peak is the bytes of the tensors held."""
    import torch
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        a = torch.ones(1 << 20, dtype=torch.float32)
        b = torch.ones(1 << 21, dtype=torch.float32)
        peak = a.nbytes + b.nbytes
        del a
        c = torch.ones(1 << 18, dtype=torch.float32)
    prof.export_chrome_trace(str(tmp_path / "rank0.json"))
    rc, out, err = run_cli(["analyze", str(tmp_path), "--json"], capsys)
    assert rc == 0, err
    mem = json.loads(out)["ranks"][0]["memory"]["cpu"]
    assert mem["peak_allocated_bytes"] == peak
    assert mem["timeline"][-1][1] == b.nbytes + c.nbytes
    # hand-made device events: reserved 10 GiB while 6 GiB are allocated -> 40 % fragmentation
    gib = 2 ** 30
    mem_events = [{"ph": "i", "name": "[memory]", "ts": t, "pid": 0, "tid": 1,
                   "args": {"Total Allocated": a_ * gib, "Total Reserved": r_ * gib, "Device Type": 1, "Device Id": 0}}
                  for t, a_, r_ in ((0, 2, 4), (10, 8, 10), (20, 6, 10), (30, 1, 8))]
    trace = {"traceEvents": [*launched("gemm", 0, 10, 1), *mem_events]}
    m = analyze_traces([], loaded=_loaded(trace))[0]["ranks"][0]["memory"]["cuda:0"]
    assert m["peak_allocated_bytes"] == 8 * gib and m["peak_reserved_bytes"] == 10 * gib
    assert m["fragmentation_at_peak_reserved"] == pytest.approx(0.2)  # at the first peak of 10: 8 allocated


def test_text_and_html_report(tmp_path, capsys):
    page = tmp_path / "analyze.html"
    rc, out, err = run_cli(["analyze", str(TRACES / "a2a_128gpu_rank0.json.gz"), str(TRACES / "a2a_128gpu_rank1.json.gz"),
                            "--report", str(page)], capsys)
    assert rc == 0, err
    assert "Per rank" in out and "all_to_all" in out and "Stragglers: rank" in out
    text = page.read_text()
    assert "partita-fig-0" in text and "partita-fig-3" in text and "Plotly.newPlot" in text
    assert "cdn.plot.ly" not in text.split("<body", 1)[1][:2000]  # plotly.js is inline, not fetched


@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "text.json").write_text("this is not json\n")
    (tmp_path / "object.json").write_text(json.dumps({"model": "llama", "layers": 32}))
    good = gzip.decompress((TRACES / "a2a_128gpu_rank0.json.gz").read_bytes())
    (tmp_path / "cut.json.gz").write_bytes(gzip.compress(good)[:5000])
    (tmp_path / "cut.json").write_bytes(good[:5000])
    cpu = {"traceEvents": [ev("aten::mm", 0, 10, cat="cpu_op", tid=1)]}
    (tmp_path / "cpu.json").write_text(json.dumps(cpu))
    return tmp_path


@pytest.mark.parametrize("argv, message", [
    (["missing.json"], "missing.json: no such file or directory"),
    (["empty"], "empty holds no trace files"),
    (["text.json"], "text.json is not valid JSON"),
    (["object.json"], "object.json is JSON but not a Chrome trace"),
    (["cut.json.gz"], "cut.json.gz is a truncated or corrupt gzip file"),
    (["cut.json"], "cut.json is not valid JSON: ends early (truncated?)"),
    (["cpu.json", "--conventions", "hta"], "cpu.json has no GPU kernels"),
    (["--max-mb", "1", str(TRACES / "ddp_2gpu_rank0.json.gz")], "holds more than 1 MB of trace JSON"),
    ([str(TRACES / "ddp_2gpu_rank0.json.gz"), str(TRACES / "a2a_128gpu_rank0.json.gz")], "are both rank 0"),
])
def test_bad_trace_files_get_one_line(bad_files, argv, message, capsys, monkeypatch):
    monkeypatch.chdir(bad_files)
    rc, out, err = run_cli(["analyze", *argv], capsys)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("partita: error: ") and message in err, err


def test_torch_npu_trace_view():
    """torch_npu's trace_view.json: device work on the 'Ascend Hardware' process, one thread per
    stream, string timestamps, no cat; HCCL kernels are communication."""
    meta = [{"ph": "M", "name": "process_name", "pid": p, "tid": 0, "args": {"name": n}}
            for p, n in ((1, "Python"), (4, "Ascend Hardware"))]
    def hw(name, ts, dur, tid):
        return {"ph": "X", "name": name, "ts": f"{ts:.3f}", "dur": dur, "pid": 4, "tid": tid,
                "args": {"Task Type": "AI_CORE"}}
    events = [*meta, {**ev("ProfilerStep#3", "1000.000", 400, cat="user_annotation", tid=1), "pid": 1},
              hw("MatMulV2", 1000.5, 100, 2), hw("hcom_allReduce__123_0_1", 1050.5, 150, 3), hw("Add", 1300.5, 50, 2)]
    r = analyze_traces([], loaded=_loaded(normalise_npu_trace({"traceEvents": events})))[0]["ranks"][0]
    assert r["kind"] == "device" and r["compute_us"] == 150 and r["communication_us"] == 150
    assert r["overlapped_us"] == 50 and r["by_collective_us"] == {"all_reduce": 150}
    assert r["window_us"] == pytest.approx(400)               # the step, 1000-1400
    assert set(r["idle_by_stream"]) == {2, 3}


def test_mangled_events_are_an_answer_or_one_line(tmp_path, capsys):
    """Fields of the wrong type anywhere in a real trace: never an internal error."""
    import copy
    import random
    base = json.loads(gzip.decompress((TRACES / "a2a_128gpu_rank0.json.gz").read_bytes()))
    rng = random.Random(3)
    for trial in range(3):
        doc = copy.deepcopy(base)
        for e in rng.sample(doc["traceEvents"], 40):
            key = rng.choice(["ts", "dur", "name", "args", "cat", "ph", "pid", "tid"])
            e[key] = rng.choice([None, "x", -5, [], {}, True, "12.5", {"stream": [1], "correlation": "y"}])
        (tmp_path / "t.json").write_text(json.dumps(doc))
        for conventions in ("partita", "hta"):
            rc, out, err = run_cli(["analyze", str(tmp_path / "t.json"), "--json", "--conventions", conventions],
                                   capsys)
            assert rc in (0, 2) and "internal error" not in err, err
            if rc == 0:
                assert 0 <= json.loads(out)["ranks"][0]["idle_pct"] <= 100


def test_cpu_trace_under_partita_conventions(tmp_path, capsys):
    """A gloo (CPU) trace has no streams: Partita's CPU rules apply (HTA's need a GPU trace)."""
    events = [ev("aten::mm", 0, 100, cat="cpu_op", tid=1), ev("gloo:all_reduce", 80, 40, cat="cpu_op", tid=2)]
    (tmp_path / "rank0.json").write_text(json.dumps({"traceEvents": events}))
    rc, out, err = run_cli(["analyze", str(tmp_path / "rank0.json"), "--json"], capsys)
    assert rc == 0, err
    r = json.loads(out)["ranks"][0]
    assert r["kind"] == "cpu" and r["window_us"] == 120 and r["compute_us"] == 100
    assert r["overlap_pct"] == 50.0 and r["idle_by_stream"] == {}
