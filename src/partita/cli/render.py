"""Human-readable tables (rich) for the commands: estimates, plans, profiles. Only the CLI
imports this; the library returns data."""
from __future__ import annotations

import os

from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from ..cost.term_sources import term_sources
from ..estimate import Estimate
from ..search.recompute_modules import modules_shown

GIB = 1024 ** 3


def make_console() -> Console:
    """A console that does not squash wide tables when output is piped to a file or CI log,
    unless ``COLUMNS`` says how wide the reader's screen is (then that width is kept)."""
    console = Console()
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(width=160)
    return console


def fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.1f} ms"


def breakdown_tables(est: Estimate) -> tuple[Table, Table]:
    """Memory of the most loaded rank and where the step time goes."""
    peak = est.peak_rank
    mem = Table(title=f"Memory, pipeline rank {peak.rank} (most loaded)", title_justify="left")
    mem.add_column("component")
    mem.add_column("GiB", justify="right")
    for name, value in peak.parts.items():
        mem.add_row(name, f"{value / GIB:.2f}")
    mem.add_row("[bold]total[/bold]", f"[bold]{peak.total / GIB:.2f}[/bold]")
    mem.caption = {"fits": "fits", "at risk": "at risk", "does not fit": "DOES NOT FIT"}[est.verdict]
    tt = Table(title="Step time", title_justify="left")
    tt.add_column("component")
    tt.add_column("time", justify="right")
    tt.add_column("share", justify="right")
    # a calibrated device file: each part's source (calibrated / datasheet / fitted ...; issue 22)
    sources = term_sources(est.cluster.device, est.time.parts)
    src = any(s["source"] == "calibrated" for s in sources.values())
    if src:
        tt.add_column("source")
    for name, value in est.time.parts.items():
        tt.add_row(name, fmt_time(value), f"{value / est.step_time_s:.1%}", *([sources[name]["source"]] if src else []))
    tt.add_row("[bold]step[/bold]", f"[bold]{fmt_time(est.step_time_s)}[/bold]", "100%")
    return mem, tt


def print_estimate(est: Estimate, console: Console | None = None, tokens: float | None = None) -> None:
    console = console or make_console()
    p = est.plan
    console.print(f"[bold]{est.model.name}[/bold] on {est.cluster.describe()}")
    console.print(f"plan: {p.summary()}  (seq {p.seq_len}, global batch {p.gbs} = {p.tokens_per_step:,} tokens, "
                  f"{p.dtype}, {p.schedule})")
    mem, tt = breakdown_tables(est)
    console.print(mem)
    console.print(f"memory: {est.memory_verdict}", markup=False, highlight=False)
    console.print(tt)
    console.print(step_line(est), markup=False, highlight=False)
    console.print(f"throughput: {est.tokens_per_s_per_device:,.0f} tokens/s per device, "
                  f"{est.model_tflops_per_device:.1f} model TFLOP/s per device, MFU {est.mfu:.1%}")
    if tokens:
        days = est.run_days(tokens)
        console.print(f"run of {tokens:.3g} tokens: {days:.1f} days, "
                      f"{days * 24 * est.cluster.world_size:,.0f} device-hours")


def step_line(est: Estimate) -> str:
    """E.g. "step 4.21 s [3.6-5.0] (80 % interval, class dense)": the step time and its interval."""
    iv = est.interval
    lo, hi = iv["step_time_s"]
    return (f"step {fmt_time(est.step_time_s)} [{_short(lo)}-{_short(hi)}] ({iv['level']:.0%} interval from "
            f"out-of-sample residuals, class {iv['classes']['step_time']}); peak {est.peak_memory_gib:.1f} GiB "
            f"[{iv['peak_memory_gib'][0]:.0f}-{iv['peak_memory_gib'][1]:.0f}], P(fit) {est.p_fit:.2f}")


def _short(seconds: float) -> str:
    return f"{seconds:.2g}" if seconds < 1 else f"{seconds:.1f}" if seconds < 100 else f"{seconds:.0f}"


def print_report(report: dict) -> None:
    console = make_console()
    console.print(f"[bold]profile[/bold] {report['plan']}  (prediction: hardware '{report['hardware']}')")
    t = Table(title="Per rank, per step", title_justify="left")
    for col in ("rank", "step", "compute", "comm", "overlapped", "exposed comm", "idle", "collectives", "by axis",
                "memory"):
        t.add_column(col, justify="right" if col not in ("collectives", "by axis", "memory") else "left")
    ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
    for r in report["ranks"]:
        coll = ", ".join(f"{k} {ms(v)}" for k, v in r["by_collective_s"].items())
        axes = ", ".join(f"{k} {ms(v)}" for k, v in r.get("by_axis_s", {}).items()) or "-"
        mem = ", ".join(f"{k} {v:.2f}" for k, v in r["memory"].items())
        t.add_row(str(r["rank"]), ms(r["step_time_s"]), ms(r["compute_s"]), ms(r["communication_s"]),
                  ms(r["overlapped_s"]), ms(r["exposed_communication_s"]), ms(r["idle_s"]), coll, axes, mem)
    console.print(t)
    c = Table(title="Measured vs predicted (per step)", title_justify="left")
    for col in ("", "measured", "predicted", "measured / predicted"):
        c.add_column(col, justify="right")
    o, p, ratio = report["overall"], report["predicted"], report["ratio_measured_over_predicted"]
    for key, label in (("step_time_s", "step time (slowest rank)"), ("compute_s", "compute"),
                       ("exposed_communication_s", "exposed communication"), ("idle_s", "idle / bubble")):
        c.add_row(label, ms(o[key]), ms(p[key]), f"{ratio[key]:.2f}" if key in ratio else "-")
    console.print(c)
    if report["hardware"] == "cpu":
        console.print("prediction on the uncalibrated 'cpu' device file: `partita calibrate --nproc N -o my-cpu.json`, "
                      "then `--hardware my-cpu.json`, measures this machine at this process count")
    if report.get("html_report"):
        console.print(f"HTML report: {report['html_report']}")


#: the plans table's full width (about 135 columns); narrower screens get the compact table
WIDE_TABLE_COLUMNS = 140
#: the critical efficiencies: a device whose values for these are not fitted to or measured on
#: real runs gets a confidence note (``Efficiency.provenance``, kinds in hardware.PROVENANCE_KINDS)
KEY_EFFICIENCIES = ("gemm", "attention", "tp_overlap", "intra_node_comm", "inter_node_comm")
LEGEND = ("layout: dp/tp/pp/cp/ep = data/tensor/pipeline/context/expert parallel degree, +sp sequence "
          "parallel, pp2v4 = 2 stages x 4 interleaved chunks, pp2-dualpipev (vpp column: 2 V) = 2 ranks x 2 "
          "chunks in DualPipeV's V, z = ZeRO stage, mbs2x4 = micro-batch 2 x "
          "4 accumulation steps, rc- = recomputation (full:N = only the first N layers of each stage/chunk; selective:M = Megatron's --recompute-modules M); GiB = peak of the most loaded rank; tok/s per device")


def _search_line(result) -> str:
    return (f"{result.candidates_evaluated:,} candidates evaluated, "
            f"{result.candidates_pruned + result.candidates_bounded:,} ruled out by memory or time bounds, "
            f"in {result.search_time_s:.2f} s")


def memory_limit_line(result) -> str:
    """One named limit (:class:`partita.uncertainty.MemoryLimit`: usable memory, headroom, cap)
    and the risk rule the search applied to it (issue 33)."""
    return (f"memory limit: {result.limit.describe()}; a plan is discarded only when P(fit) < {result.min_p_fit:g} "
            f"(predicted peak above {result.admission_limit_gib:.1f} GiB), plans at risk are kept and ranked by "
            "step time / P(fit)")


def confidence_note(device) -> str | None:
    """A note where the device's key efficiencies are not fitted to measured runs (their provenance)."""
    weak = []
    for key in KEY_EFFICIENCIES:
        kind = device.efficiency.source(key).split(":", 1)[0].strip()
        if kind not in ("fitted", "measured"):
            weak.append(f"{key} {kind}")
    if not weak:
        return None
    name = device.name
    least = (" Ascend MFU is the least certain figure Partita prints (few published runs to fit)."
             if name.startswith("ascend") else "")
    return (f"confidence: {name}'s efficiencies are not all fitted to measured runs ({', '.join(weak)}); "
            f"step time, tok/s and MFU are less certain than on fitted devices.{least} `partita calibrate` "
            "measures them.")


def plans_table(result, tokens: float | None, world_size: int, width: int = 160) -> Table:
    """The ranked plans of a search, one row each; narrower than WIDE_TABLE_COLUMNS the layout is one
    cell (plan summary, see LEGEND) that wraps at spaces, so no cell is cut."""
    if width >= WIDE_TABLE_COLUMNS:
        return _wide_plans_table(result, tokens, world_size)
    t = Table(title="Best plans", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("layout", overflow="fold", ratio=1)
    for col in ("GiB", "P(fit)", "step s", "tok/s", "MFU") + (("days",) if tokens else ()):
        t.add_column(col, justify="right", no_wrap=True)
    for i, e in enumerate(result.plans, 1):
        row = [str(i), e.plan.summary() + (f":{modules_shown(e.plan)}" if modules_shown(e.plan) else ""), f"{e.peak_memory_gib:.1f}", _p_fit_cell(e), f"{e.step_time_s:.2f}",
               f"{e.tokens_per_s_per_device:,.0f}", f"{e.mfu:.1%}"]
        if tokens:
            row.append(f"{e.run_days(tokens):.1f}")
        t.add_row(*row)
    return t


def _wide_plans_table(result, tokens: float | None, world_size: int) -> Table:
    t = Table(title="Best plans", title_justify="left")
    for col in ("#", "dp", "tp", "pp", "vpp", "cp", "ep", "zero", "mbs x acc", "recompute", "mem GiB", "P(fit)", "step s",
                "tok/s/dev", "MFU") + (("days", "device-hours") if tokens else ()):
        t.add_column(col, justify="right", no_wrap=True)
    for i, e in enumerate(result.plans, 1):
        p = e.plan
        row = [str(i), str(p.dp), str(p.tp) + ("+sp" if p.sp else ""), str(p.pp), str(p.vpp) + (" V" if p.schedule == "dualpipev" else ""), str(p.cp),
               str(p.ep) + (f" etp{p.etp}" if p.etp > 1 else ""), str(p.zero), f"{p.mbs}x{p.grad_accum}", p.recompute + (f":{p.recompute_layers}" if p.recompute_layers else "") + (f":{modules_shown(p)}" if modules_shown(p) else ""), f"{e.peak_memory_gib:.1f}", _p_fit_cell(e), f"{e.step_time_s:.2f}",
               f"{e.tokens_per_s_per_device:,.0f}", f"{e.mfu:.1%}"]
        if tokens:
            days = e.run_days(tokens)
            row += [f"{days:.1f}", f"{days * 24 * world_size:,.0f}"]
        t.add_row(*row)
    return t


def _p_fit_cell(est: Estimate) -> str:
    """P(fit), and "at risk" where the predicted peak is over the limit (kept: P(fit) >= min)."""
    return f"{est.p_fit:.2f}" + (" at risk" if est.verdict == "at risk" else "")


def print_plans(model, cluster, global_batch: int, seq_len: int, result, reasons: list[str],
                tokens: float | None, console: Console | None = None, headroom: float | None = None,
                cap_gib: float | None = None) -> None:
    """``partita plan``'s screen: the ranked plans, plan 1's breakdown and run length, why not the others.
    Free text goes through ``markup=False`` (a plan summary in brackets is not rich markup)."""
    console = console or make_console()
    say = lambda text: console.print(text, markup=False, highlight=False)  # noqa: E731
    say(f"{model.name} on {cluster.describe()}; seq {seq_len}, global batch {global_batch} "
        f"({global_batch * seq_len:,} tokens)")
    say(memory_limit_line(result))
    note = confidence_note(cluster.device)
    if note:
        say(note)
    say(f"search: {_search_line(result)}")
    console.print(plans_table(result, tokens, cluster.world_size, console.width))
    if console.width < WIDE_TABLE_COLUMNS:
        say(LEGEND)
    best = result.best
    assert best is not None
    if best.plan.layer_split:
        say(f"layer split (per virtual stage): {list(best.plan.layer_split)}")
    mem, tt = breakdown_tables(best)
    console.print(mem)
    say(f"memory: plan 1 {best.memory_verdict}")
    console.print(tt)
    say(f"plan 1: {step_line(best)}")
    if tokens:
        days = best.run_days(tokens)
        say(f"{tokens:.3g} tokens with plan 1: {days:.1f} days ({days * 24 * cluster.world_size:,.0f} "
            f"device-hours; {best.model_flops_per_step * tokens / best.plan.tokens_per_step:.2e} model FLOPs)")
    console.print("[bold]Why not[/bold] (each alternative's full layout, its step time against plan 1's)")
    for line in reasons:  # indented as a block, so a wrapped line stays under its knob
        console.print(Padding(Text(line), (0, 0, 0, 2)))
