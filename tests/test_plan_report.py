"""`partita plan --report` / `partita estimate --report` (issue 18): the page's charts carry the
same numbers as the commands' --json output (read back from the Plotly.newPlot calls, not from
our own data), the schedule of one step matches the pipeline's closed form and the estimate's
step time, each scaling point equals a separate search at that device count, the why-not
chart's bars equal the percentages the why-not lines print, nothing is loaded from the
network, and a bad path is one line. In-process, no browser, no torch."""
import json
import re

import pytest

from partita.cli.main import main
from partita.report.schedule import MAX_DRAWN_OPS, simulate

PLAN = ["plan", "--model", "llama-65b", "--hardware", "ascend-910b2", "--devices", "512", "--global-batch", "2048",
        "--tokens", "1.4T", "--top", "4"]  # partita plan's default scenario, fixed here
ESTIMATE = ["estimate", "--model", "llama3-70b", "--hardware", "h100", "--devices", "64", "--global-batch", "64",
            "--seq-len", "4096", "--tp", "8", "--pp", "4", "--vpp", "2", "--mbs", "1", "--recompute", "selective",
            "--tokens", "15T"]
FIGURES = ("plans-table", "plans", "memory", "time", "timeline", "scaling", "why-not")


def _run(argv, capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _figures(page: str) -> dict[str, tuple[list, dict]]:
    """Every Plotly.newPlot(id, data, layout) call of the page, decoded as plotly.js receives it."""
    decoder = json.JSONDecoder()
    out = {}
    for m in re.finditer(r"Plotly\.newPlot\(\s*", page):
        div, i = decoder.raw_decode(page, m.end())
        i = page.index("[", i)
        data, i = decoder.raw_decode(page, i)
        i = page.index("{", i)
        layout, _ = decoder.raw_decode(page, i)
        out[div] = (data, layout)
    return out


@pytest.fixture(scope="module")
def plan_pages(tmp_path_factory):
    """The plan scenario's --json and its page, run once."""
    return {}


def _plan(plan_pages, tmp_path, capsys):
    if not plan_pages:
        code, out, _ = _run(PLAN + ["--json"], capsys)
        assert code == 0
        path = tmp_path / "plan.html"
        code, screen, err = _run(PLAN + ["--report", str(path)], capsys)
        assert code == 0, err
        plan_pages.update(json=json.loads(out), page=path.read_text(), screen=screen)
    return plan_pages["json"], plan_pages["page"]


def test_plan_report_charts_equal_the_search_json(plan_pages, tmp_path, capsys):
    js, page = _plan(plan_pages, tmp_path, capsys)
    figs = _figures(page)
    assert set(FIGURES) <= {re.sub(r"^partita-|-\d+$", "", k) for k in figs}, sorted(figs)
    plans = js["plans"]
    # step time vs memory: one marker per plan at (peak GiB, step s), the memory limit as a line
    scatter, layout = figs["partita-plans"]
    assert [t["x"][0] for t in scatter] == pytest.approx([p["peak_memory_gib"] for p in plans], rel=1e-12)
    assert [t["y"][0] for t in scatter] == pytest.approx([p["step_time_s"] for p in plans], rel=1e-12)
    assert [s["x0"] for s in layout["shapes"]] == pytest.approx([js["memory_limit_gib"]])
    # the table: every plan's full layout and step time
    table = figs["partita-plans-table"][0][0]["cells"]["values"]
    assert table[2] == [f"{p['step_time_s']:.2f} [{p['interval']['step_time_s'][0]:.2f}-"
                        f"{p['interval']['step_time_s'][1]:.2f}]" for p in plans]  # with the --json's 80 % interval
    assert table[4] == [f"{p['p_fit']:.2f}" + ("" if p["verdict"] == "fits" else f" ({p['verdict']})") for p in plans]
    # the error bars are the JSON's intervals
    assert [t["x"][0] + t["error_x"]["array"][0] for t in scatter] == \
        pytest.approx([p["interval"]["peak_memory_gib"][1] for p in plans], rel=1e-9)
    # memory per rank: the parts of each pipeline rank add up to that rank's memory, and the peak rank's parts
    # are the JSON's breakdown
    mem = figs["partita-memory"][0]
    bars = [f"plan {i} rank {r}" for i, p in enumerate(plans, 1) for r in range(len(p["memory_per_stage_gib"]))]
    assert mem[0]["x"] == bars
    stacked = [sum(t["y"][k] for t in mem) for k in range(len(bars))]
    assert stacked == pytest.approx([g for p in plans for g in p["memory_per_stage_gib"]], rel=1e-9)
    first_peak = bars.index(f"plan 1 rank {plans[0]['peak_memory_rank']}")
    assert {t["name"]: t["y"][first_peak] for t in mem if t["y"][first_peak]} == pytest.approx(plans[0]["memory"])
    # where the time goes: one bar per plan and part, equal to the JSON's parts
    for trace in figs["partita-time"][0]:
        assert trace["x"] == pytest.approx([p["time"].get(trace["name"], 0.0) for p in plans], rel=1e-12)


def test_plan_report_timeline_is_one_step_of_plan_1(plan_pages, tmp_path, capsys):
    js, page = _plan(plan_pages, tmp_path, capsys)
    figs = _figures(page)
    best = js["plans"][0]["plan"]
    for div, (traces, layout) in figs.items():
        if not div.startswith("partita-timeline"):
            continue
        # the step ends where the estimate says (pipeline simulated + what follows it)
        end = max(b + x for t in traces for b, x in zip(t["base"], t["x"]))
        label = layout["title"]["text"]
        plan = js["plans"][int(re.match(r"One step of plan (\d+): ", label)[1]) - 1]
        # (uniform stages: exactly the closed form; uneven ones: the simulated schedule, within 1%)
        assert end == pytest.approx(plan["step_time_s"], rel=1e-2), label
        _tiles(traces, end)
        rows = {y for t in traces for y in t["y"]}
        assert rows == {f"rank {r}" for r in range(plan["plan"]["pp"])}
        compute = next(t for t in traces if t["name"] == "compute")
        forwards = {(y, text) for y, text in zip(compute["y"], compute["text"]) if text.startswith("forward")}
        n_forward = plan["plan"]["pp"] * plan["plan"]["grad_accum"] * plan["plan"]["vpp"]
        if 2 * n_forward <= MAX_DRAWN_OPS:  # beyond it the page draws runs of passes (report/schedule.py _spans)
            assert len(forwards) == n_forward
        else:
            assert compute["text"] and all("forward/backward passes" in t for t in compute["text"])
    # plan 1 always; when plan 1 has no pipeline, the best pipelined plan shown too
    assert "partita-timeline" in figs and ("partita-timeline-2" in figs) == (best["pp"] == 1 and any(
        p["plan"]["pp"] > 1 for p in js["plans"]))


def test_plan_report_scaling_points_are_searches(plan_pages, tmp_path, capsys):
    js, page = _plan(plan_pages, tmp_path, capsys)
    traces, _ = _figures(page)["partita-scaling"]
    days = dict(zip(traces[0]["x"], traces[0]["y"]))
    hours = dict(zip(traces[1]["x"], traces[1]["y"]))
    assert {128, 256, 512, 1024, 2048} == set(days)
    assert days[512] == pytest.approx(js["plans"][0]["run_days"], rel=1e-12)
    # another point: its own search, from the command line (the same flags: with the gradient-knob
    # pass, a plan below the search's first can become plan 1, so --top is the page's)
    code, out, _ = _run([a if a != "512" else "256" for a in PLAN] + ["--json"], capsys)
    assert code == 0
    other = json.loads(out)["plans"][0]
    assert days[256] == pytest.approx(other["run_days"], rel=1e-12)
    assert hours[256] == pytest.approx(other["device_hours"], rel=1e-12)


def test_plan_report_why_not_bars_are_the_why_not_lines(plan_pages, tmp_path, capsys):
    js, page = _plan(plan_pages, tmp_path, capsys)
    timed, over = _figures(page)["partita-why-not"][0]
    lines = js["why_not"]
    assert len(timed["y"]) + len(over["y"]) == len(lines) >= 5
    for y, x in zip(timed["y"], timed["x"]):
        knob, layout = re.match(r"(\S+) \((.*)\)$", y).groups()
        line = next(t for t in lines if t.startswith(f"{knob} ") and f"({layout})" in t)
        timed_line = re.search(r"([+-]\d+)% step time \((\d+\.\d+) s vs (\d+\.\d+) s\)", line)
        if timed_line is None:  # a gradient-knob line (search/comm_knobs.py): "-0.2% step time; ..."
            printed = re.search(r": ([+-]\d+(?:\.(\d+))?)% step time", line)
            decimals = len(printed[2] or "")  # the bar is the exact value, the line rounds it
            assert x == pytest.approx(float(printed[1]), abs=0.5 * 10 ** -decimals + 1e-9)
            continue
        slower, alt, best = timed_line.groups()
        assert x == pytest.approx(int(slower), abs=0.5)
        assert x == pytest.approx(100 * (float(alt) / float(best) - 1), abs=0.06)


def test_plan_report_is_offline_and_the_terminal_unchanged(plan_pages, tmp_path, capsys):
    js, page = _plan(plan_pages, tmp_path, capsys)
    scripts = list(re.finditer(r"<script[^>]*>.*?</script>", page, re.S))
    bundle = max(scripts, key=lambda m: m.end() - m.start())
    assert "plotly.js" in bundle.group(0)[:2000] and bundle.end() - bundle.start() > 1_000_000
    rest = page[:bundle.start()] + page[bundle.end():]
    assert not re.search(r"https?://|<script src=|<link |@import|//cdn", rest), re.search(r"https?://\S{0,60}", rest)
    assert page.count("<script src=") == 0
    assert "memory limit" in plan_pages["screen"] and "Why not" in plan_pages["screen"]
    # the page's notes are the terminal's memory-limit sentence
    assert f"memory limit: {js['memory_limit_gib']:.1f} GiB usable (" in rest  # the one named limit (partita.uncertainty)


def test_estimate_report_matches_estimate_json(tmp_path, capsys):
    code, out, _ = _run(ESTIMATE + ["--json"], capsys)
    assert code == 0
    est = json.loads(out)
    path = tmp_path / "est.html"
    code, _, err = _run(ESTIMATE + ["--report", str(path)], capsys)
    assert code == 0, err
    page = path.read_text()
    figs = _figures(page)
    assert set(FIGURES) <= {re.sub(r"^partita-|-\d+$", "", k) for k in figs}
    scatter = figs["partita-plans"][0]
    assert scatter[0]["name"].startswith("this plan: dp2 tp8+sp pp4v2")
    assert (scatter[0]["x"][0], scatter[0]["y"][0]) == pytest.approx((est["peak_memory_gib"], est["step_time_s"]))
    timeline = figs["partita-timeline"][0]
    assert max(b + x for t in timeline for b, x in zip(t["base"], t["x"])) == pytest.approx(est["step_time_s"],
                                                                                         rel=1e-9)
    _tiles(timeline, est["step_time_s"])
    bubble = next(t for t in timeline if t["name"] == "bubble (idle)")
    assert {y for y in bubble["y"]} == {f"rank {r}" for r in range(4)}
    for trace in figs["partita-time"][0]:
        assert trace["x"][0] == pytest.approx(est["time"].get(trace["name"], 0.0), rel=1e-12)
    assert est["memory_verdict"] in page


def _tiles(traces: list, end: float) -> None:
    """Every rank's bars (work, exposed communication, bubbles, what follows the pipeline) cover
    the step once: no overlap, no hole."""
    spans: dict[str, list] = {}
    for t in traces:
        for y, b, x in zip(t["y"], t["base"], t["x"]):
            spans.setdefault(y, []).append((b, b + x))
    for rank, bars in spans.items():
        bars.sort()
        assert bars[0][0] == pytest.approx(0, abs=1e-9 * end) and bars[-1][1] == pytest.approx(end, rel=1e-2), rank
        assert all(abs(a[1] - b[0]) <= 1e-9 * end for a, b in zip(bars, bars[1:])), rank


def test_large_schedule_is_drawn_in_runs_with_the_cost_models_totals():
    """DeepSeek-V3 at pp=32 and 480 micro-batches (30,720 passes) is drawn in runs; each rank's work
    and exposed communication still add up to m x its per-micro-batch parts (partita.cost.step)."""
    from partita.estimate import estimate
    from partita.plan import Plan
    from partita.report.schedule import step_schedule
    from partita.spec.hardware import make_cluster
    from partita.spec.load import load_model
    est = estimate(load_model("deepseek-v3"), make_cluster("h800", 2048),
                   Plan(dp=32, pp=32, cp=2, ep=8, zero=1, mbs=1, gbs=15360, seq_len=4096))
    sched = step_schedule(est)
    assert sched.coalesced and len(sched.blocks) < 10_000
    m = est.plan.grad_accum
    for stage in est.time.stages:
        mine = [b for b in sched.blocks if b.rank == stage.rank]
        assert sum(b.length for b in mine) == pytest.approx(sched.step_s, rel=1e-9)
        work = sum(b.length for b in mine if b.kind == "compute")
        assert work == pytest.approx(m * (stage.parts["compute"] + stage.parts.get("recompute", 0.0)), rel=1e-9)
        a2a = sum(b.length for b in mine if b.kind == "ep all-to-all")
        assert a2a == pytest.approx(m * stage.parts.get("ep all-to-all", 0.0), rel=1e-9, abs=1e-12)
    assert sched.pipeline_s == pytest.approx(sched.closed_form_s, rel=1e-2)


def test_simulated_schedule_matches_the_closed_forms():
    """Uniform stages: 1F1B and GPipe take (m + p - 1)(f + b), interleaving (m + (p - 1)/v)(f + b)
    [Narayanan et al. SC'21 eq. 1-2] - the simulation is Megatron's op order, the oracle the paper's formula."""
    for p, m, v, schedule in ((4, 8, 1, "1f1b"), (4, 8, 1, "gpipe"), (4, 8, 2, "interleaved-1f1b"),
                              (8, 16, 4, "interleaved-1f1b"), (1, 3, 1, "1f1b")):
        ops = simulate([1.0] * p, [2.0] * p, m, v, schedule)
        assert len(ops) == 2 * p * m * v
        assert max(op[5] for op in ops) == pytest.approx((m + (p - 1) / v) * 3.0)
        for r in range(p):  # a rank never runs two ops at once
            spans = sorted((op[4], op[5]) for op in ops if op[0] == r)
            assert all(a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:]))


@pytest.mark.parametrize("where, message", [("missing/plan.html", "does not exist"), (".", "is a directory")])
def test_bad_report_path_is_one_line(tmp_path, capsys, where, message):
    code, out, err = _run(PLAN[:-4] + ["--report", str(tmp_path / where)], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err and err.startswith("partita: error: --report")
    code, out, err = _run(ESTIMATE + ["--report", str(tmp_path / where)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err
