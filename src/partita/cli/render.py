"""Human-readable tables for estimates and plans (rich), kept out of the cost model."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .estimate import Estimate

GIB = 1024 ** 3


def make_console() -> Console:
    """A console that does not squash wide tables when output is piped to a file or CI log."""
    console = Console()
    if not console.is_terminal:
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
    usable = est.cluster.device.usable_gib
    verdict = "fits" if est.fits else "DOES NOT FIT"
    mem.add_row("[bold]total[/bold]", f"[bold]{peak.total / GIB:.2f}[/bold]")
    mem.caption = f"{verdict}: usable {usable:.1f} GiB per device"
    tt = Table(title="Step time", title_justify="left")
    tt.add_column("component")
    tt.add_column("time", justify="right")
    tt.add_column("share", justify="right")
    for name, value in est.time.parts.items():
        tt.add_row(name, fmt_time(value), f"{value / est.step_time_s:.1%}")
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
    console.print(tt)
    console.print(f"throughput: {est.tokens_per_s_per_device:,.0f} tokens/s per device, "
                  f"{est.model_tflops_per_device:.1f} model TFLOP/s per device, MFU {est.mfu:.1%}")
    if tokens:
        days = est.run_days(tokens)
        console.print(f"run of {tokens:.3g} tokens: {days:.1f} days, "
                      f"{days * 24 * est.cluster.world_size:,.0f} device-hours")
