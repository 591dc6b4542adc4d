"""``partita serve``: plan LLM serving - layouts, memory, TTFT, TPOT, goodput; engine exports.

Planning only (no torch): :mod:`partita.serve` searches the layouts and predicts; this module
parses the flags, checks the model name through the registry, prints the table (or JSON) and
the "why not" lines, or writes the launch arguments of the best layout an engine can run.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from ..errors import PartitaError
from ..inputs import MAX_DEGREE, MAX_DEVICES_PER_NODE
from .types import finite_float, positive_int

INTERVALS_NOTE = ("intervals (in brackets): 80 %, split conformal on the out-of-sample errors of {rows} "
                  "published serving figures (vLLM, SGLang, vLLM-Ascend, MindIE, torchair, TensorRT-LLM on A100, H100, "
                  "Ascend 910B), coverage leave-one-source-out {cov}; wide where the model errs widely, "
                  "see docs/serve.md")


def intervals_note() -> str:
    """The last line of the text output: where the intervals come from and what they cover."""
    from ..serve.intervals import table
    tab = table()
    cov = tab.get("loso_coverage", {}).get("all", {})
    rows = sum(len(r.values) for r in tab["residuals"].values())
    return INTERVALS_NOTE.format(rows=rows, cov=f"{cov['inside'] / cov['rows']:.0%}" if cov.get("rows") else "n/a")


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="plan LLM serving: layouts, memory, TTFT, TPOT, goodput; engine exports")
    p.add_argument("--model", required=True, help="preset name (partita models) or a config.json path")
    p.add_argument("--hardware", required=True, help="device name (partita hardware) or a device JSON file")
    p.add_argument("--devices", type=positive_int(MAX_DEGREE), required=True, help="devices to serve on")
    p.add_argument("--devices-per-node", type=positive_int(MAX_DEVICES_PER_NODE),
                   help="devices per node (default: the device file's)")
    p.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE", dest="overrides",
                   help="override a hardware field, e.g. --set memory.hbm_tbps=1.8")
    p.add_argument("--prompt-len", type=positive_int(1 << 22), required=True, help="mean prompt tokens")
    p.add_argument("--output-len", type=positive_int(1 << 22), required=True, help="mean output tokens")
    p.add_argument("--rate", type=finite_float(0.0, 1e9), required=True, help="arrival rate, requests/s (Poisson)")
    p.add_argument("--ttft-ms", type=finite_float(0.0, 1e9), help="target time to first token (ms, mean)")
    p.add_argument("--tpot-ms", type=finite_float(0.0, 1e9), help="target time per output token (ms, mean)")
    p.add_argument("--top", type=positive_int(1000), default=8, help="layouts to show (default 8)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--export", choices=("vllm", "sglang", "mindie"),
                   help="write the launch arguments of the best layout this engine can run")
    p.add_argument("--model-path", help="weights path or HF repo id the export names (default: --model)")
    p.add_argument("--output", metavar="FILE", help="write the export to FILE instead of standard output")
    p.set_defaults(func=cmd_serve)


def _inputs(args: argparse.Namespace):
    """The model spec (its name checked through the registry), device, node size and workload."""
    from ..models.registry import resolve_model
    from ..serve.workload import Workload
    from ..spec.hardware import load_device, parse_overrides
    if not args.model.strip():
        raise PartitaError("--model is empty; give a name (see `partita models`) or a config.json path")
    spec = resolve_model(args.model).spec()
    device = load_device(args.hardware, parse_overrides(args.overrides))
    per_node = min(args.devices_per_node or device.devices_per_node, args.devices)
    if args.devices % per_node:
        raise PartitaError(f"--devices {args.devices} is not a whole number of nodes of {per_node}; "
                           f"use a multiple of {per_node} or set --devices-per-node")
    work = Workload(args.prompt_len, args.output_len, args.rate, args.ttft_ms, args.tpot_ms)
    return spec, device, per_node, work


def cmd_serve(args: argparse.Namespace) -> int:
    from ..serve.search import search_serve
    spec, device, per_node, work = _inputs(args)
    result = search_serve(spec, device, args.devices, per_node, work)
    if result.best is None:
        raise PartitaError(f"{spec.name} does not fit on {args.devices} x {device.name} for "
                           f"{work.max_len}-token sequences: {result.results[0].rejected}; use more devices")
    if args.export:
        return _export(args, spec, device, per_node, work, result)
    if args.json:
        print(json.dumps(_to_json(args, spec, device, work, result), indent=2))
        return 0
    _print(args, spec, device, work, result)
    return 0


def _to_json(args, spec, device, work, result) -> dict:
    return {"model": spec.name, "hardware": device.name, "devices": args.devices,
            "workload": {"prompt_len": work.prompt_len, "output_len": work.output_len, "rate": work.rate,
                         "ttft_ms": work.ttft_ms, "tpot_ms": work.tpot_ms},
            "layouts_considered": result.considered,
            "layouts": [r.to_dict() for r in result.results[:args.top]],
            "why_not": result.why_not, "devices_needed": devices_needed(result.best, work),
            "interval": result.best.interval(), "intervals_note": intervals_note()}


def devices_needed(best, work) -> int | None:
    """Devices the best layout needs for the workload's rate (None: these suffice)."""
    if best.stable and best.meets:
        return None
    if best.capacity <= 0:
        return None
    per_replica = best.capacity / best.layout.replicas
    return math.ceil(work.rate / per_replica) * best.layout.replica_devices


def _export(args, spec, device, per_node, work, result) -> int:
    from ..serve.export import ExportInput, not_expressible, render
    chosen = next((r for r in result.results if r.memory.fits and not not_expressible(args.export, r.layout)), None)
    if chosen is None:
        raise PartitaError(f"no layout that fits can run on {args.export}: "
                           f"{not_expressible(args.export, result.best.layout)}")
    inp = ExportInput(chosen.layout, chosen.memory.max_seqs, work, args.model_path or args.model, device,
                      chosen.prefill,
                      chosen.tpot if math.isfinite(chosen.tpot) else 0.0, per_node)
    text = render(args.export, inp, spec.name)
    rank = result.results.index(chosen) + 1
    note = f"{'//' if args.export == 'mindie' else '#'} partita serve: layout #{rank} ({chosen.layout.describe()})\n"
    if args.output:
        Path(args.output).write_text(note + text)
        print(f"wrote {args.export} launch arguments of layout #{rank} ({chosen.layout.describe()}) to {args.output}")
    else:
        print(note + text, end="")
    return 0


def _print(args, spec, device, work, result) -> None:
    from .render import make_console
    console = make_console()
    console.print(serve_table(result.results[:args.top], work))
    for line in summary_lines(spec, device, args.devices, work, result, devices_needed(result.best, work)):
        console.print(line, highlight=False)
    console.print(intervals_note(), highlight=False)


GIB = 1024 ** 3


def _ms(seconds: float) -> str:
    return "-" if not math.isfinite(seconds) else (f"{seconds * 1e3:.0f}" if seconds >= 0.1 else f"{seconds * 1e3:.1f}")


def serve_table(results, work):
    """The ranked layouts: degrees, replicas, batch, KV / weight dtypes, P/D split, memory, latencies."""
    from rich.table import Table
    t = Table(title=f"Serving layouts (prompt {work.prompt_len}, output {work.output_len}, {work.rate:g} req/s)")
    cols = ("#", "tp/pp/dpa/ep", "repl", "batch", "KV/wt", "P/D", "weights", "KV pool", "act", "wksp", "at req/s",
            "TTFT ms", "TPOT ms", "goodput", "cap req/s", "targets")
    for col in cols:
        t.add_column(col, justify="left" if col in ("tp/pp/dpa/ep", "targets") else "right", no_wrap=True)
    for i, r in enumerate(results, 1):
        lay, mem = r.layout, r.memory
        targets = "-" if not (work.ttft_ms or work.tpot_ms) else ("met" if r.meets else "missed")
        if not r.stable and mem.fits:
            targets = "overloaded"
        t.add_row(str(i), f"{lay.tp}/{lay.pp}/{lay.dp_attn}/{lay.ep}", str(lay.replicas), str(mem.max_seqs),
                  f"{lay.kv_dtype}/{lay.dtype}", f"{lay.prefill_replicas}:{lay.decode_replicas}" if lay.disaggregated else "together",
                  f"{mem.weights / GIB:.1f}", f"{mem.kv / GIB:.1f}", f"{mem.activations / GIB:.2f}",
                  f"{mem.workspace / GIB:.2f}", f"{r.shown_rate:.2g}" if r.shown_rate else "-", _ms(r.ttft),
                  _ms(r.tpot), f"{r.goodput_per_device:.0f}",
                  f"{r.capacity:.2f}", targets if mem.fits else "no fit")
    return t


def _span(value: float, bounds, fmt) -> str:
    return fmt(value) + (f" [{fmt(bounds[0])}-{fmt(bounds[1])}]" if bounds else "")


def interval_line(best) -> str:
    """The best layout's figures with their 80 % intervals, e.g. "TTFT 52 [50-248] ms"."""
    iv = best.interval() or {}
    two, whole = (lambda v: f"{v:.2f}"), (lambda v: f"{v:.0f}")
    parts = [f"TTFT {_span(best.ttft, iv.get('ttft_s'), _ms)} ms",
             f"TPOT {_span(best.tpot, iv.get('tpot_s'), _ms)} ms",
             f"capacity {_span(best.capacity, iv.get('capacity_rps'), two)} req/s",
             f"goodput {_span(best.goodput_per_device, iv.get('goodput_tokens_per_s_per_device'), whole)} tok/s/device"]
    return f"best layout, 80 % intervals: {', '.join(parts)}"


def summary_lines(spec, device, devices, work, result, needed) -> list[str]:
    """The best layout in words, what the rate needs, the prefill time, and the why-not lines."""
    best = result.best
    head = (f"{spec.name} on {devices} x {device.name}: best {best.layout.describe()}; prefill of one prompt "
            f"{best.prefill * 1e3:.0f} ms; {result.considered} layouts considered")
    lines = [head, interval_line(best)]
    if not best.stable:
        more = f"; about {needed} devices for {work.rate:g} req/s" if needed else ""
        lines.append(f"no layout sustains {work.rate:g} req/s on {devices} devices: the best sustains "
                     f"{best.capacity:.2f} req/s{more}")
    elif not best.meets:
        lines.append(f"no layout meets the targets at {work.rate:g} req/s: {best.rejected}"
                     + (f"; about {needed} devices would" if needed else ""))
    lines += [f"  {line}" for line in result.why_not]
    lines.append("tp/pp/dpa/ep: tensor, pipeline, attention data and expert parallel degrees of a replica; "
                 "repl: replicas; "
                 "batch: sequences a replica's KV pool holds; wksp: workspace; "
                 "memory per device of the most loaded stage (GiB); KV pool = what the engine allocates for the cache; "
                 "TTFT/TPOT at the workload's rate, or at 90 % of the capacity where it is overloaded; "
                 "goodput = output tokens/s per device at the capacity (cap: the highest rate within the targets)")
    return lines
