"""``partita plan``: argument wiring and printing for the search (the logic is in engine/explain)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

from ..errors import PartitaError

DEFAULT_SCENARIO = ("LLaMA-65B on 512 Ascend 910B NPUs (64 nodes x 8, HCCS inside, RoCE between), "
                    "2048-token sequences, 4M-token global batch (2048 sequences), 1.4T tokens")


def add_plan_command(sub, add_cluster_args: Callable[..., None]) -> None:
    p = sub.add_parser("plan", help="search for the best plan (no arguments: " + DEFAULT_SCENARIO + ")")
    add_cluster_args(p, defaults=True)
    p.set_defaults(global_batch=2048, tokens="1.4T")
    p.add_argument("--top", type=int, default=5, help="how many plans to show")
    for knob in ("tp", "pp", "vpp", "cp", "ep", "dp", "mbs"):
        p.add_argument(f"--{knob}", type=int, help=f"fix {knob}")
    p.add_argument("--zero", type=int, choices=[0, 1, 2, 3], help="fix the ZeRO stage")
    p.add_argument("--recompute", choices=["none", "selective", "full"], help="fix recomputation")
    p.add_argument("--no-zero3", action="store_true", help="forbid ZeRO-3 / FSDP")
    p.add_argument("--no-recompute", action="store_true", help="forbid activation recomputation")
    p.add_argument("--max-memory-gib", type=float, help="memory cap per device")
    p.add_argument("--export", choices=["megatron", "mindspeed", "deepspeed", "torchtitan"],
                   help="also print the best plan as this framework's configuration")
    p.add_argument("--headroom", type=float, default=0.05, help="fraction of usable memory kept free (default 0.05)")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    from ..cli import _cluster_and_model, parse_tokens
    from .engine import infeasible_message, search_plans
    from .explain import why_not
    from .space import SearchSpace
    model, cluster = _cluster_and_model(args)
    if args.global_batch is None or args.global_batch <= 0:
        raise PartitaError("--global-batch must be a positive number of sequences")
    space = SearchSpace(tp=args.tp, pp=args.pp, vpp=args.vpp, cp=args.cp, ep=args.ep, dp=args.dp, mbs=args.mbs,
                        zero=args.zero, recompute=args.recompute, dtype=args.dtype or "bf16",
                        allow_zero3=not args.no_zero3, allow_recompute=not args.no_recompute,
                        max_memory_gib=args.max_memory_gib, memory_headroom=args.headroom)
    if args.ep and not model.moe:
        raise PartitaError(f"--ep {args.ep} needs a mixture-of-experts model; {model.name} is dense")
    # with --export, keep more ranked plans: the best one the target can express is exported
    result = search_plans(model, cluster, args.global_batch, args.seq_len, space,
                          top=max(args.top, 200) if args.export else args.top)
    ranked_all = result.plans
    result.plans = ranked_all[:args.top]
    tokens = parse_tokens(args.tokens) if args.tokens else None
    if not result.plans:
        raise PartitaError(infeasible_message(result))
    reasons = why_not(result)
    exported = None
    export_note = None
    if args.export:
        from ..export import export
        refusals = []
        for rank, candidate in enumerate(ranked_all, 1):
            try:
                exported = export(args.export, candidate.plan, model)
            except PartitaError as e:
                refusals.append(f"plan {rank}: {e}")
                continue
            if rank > 1:
                export_note = (f"{args.export} cannot express plan 1 ({refusals[0].split(': ', 1)[1]}); exported plan "
                               f"{rank}, {candidate.plan.summary()}, {candidate.step_time_s / result.best.step_time_s - 1:+.0%} "
                               "step time")
            break
        if exported is None:
            raise PartitaError(f"none of the {len(ranked_all)} best plans can be expressed in {args.export}: "
                               + (refusals[0] if refusals else "no plan"))
    if args.json:
        out = {"model": model.name, "hardware": cluster.device.name, "devices": cluster.world_size,
               "devices_per_node": cluster.devices_per_node, "global_batch": args.global_batch, "seq_len": args.seq_len,
               "search_time_s": result.search_time_s, "candidates_evaluated": result.candidates_evaluated,
               "candidates_pruned_by_memory": result.candidates_pruned,
               "candidates_bounded_by_time": result.candidates_bounded,
               "memory_limit_gib": result.memory_limit_gib,
               "plans": [dict(e.to_dict(), **({"run_days": e.run_days(tokens),
                                               "device_hours": e.run_days(tokens) * 24 * cluster.world_size} if tokens else {}))
                         for e in result.plans],
               "why_not": reasons}
        if exported:
            out["export"] = {"target": exported.target, "text": exported.text, "warnings": exported.warnings,
                             "note": export_note}
        print(json.dumps(out, indent=2))
        return 0
    from rich.table import Table
    from ..report import breakdown_tables, make_console
    console = make_console()
    console.print(f"[bold]{model.name}[/bold] on {cluster.describe()}; seq {args.seq_len}, global batch "
                  f"{args.global_batch} ({args.global_batch * args.seq_len:,} tokens)")
    t = Table(title=f"Best plans ({result.candidates_evaluated:,} candidates evaluated, "
                    f"{result.candidates_pruned + result.candidates_bounded:,} ruled out by memory or time bounds, "
                    f"in {result.search_time_s:.2f} s; "
                    f"memory limit {result.memory_limit_gib:.1f} GiB)", title_justify="left")
    for col in ("#", "dp", "tp", "pp", "vpp", "cp", "ep", "zero", "mbs x acc", "recompute", "mem GiB", "step s",
                "tok/s/dev", "MFU") + (("days", "device-hours") if tokens else ()):
        t.add_column(col, justify="right")
    for i, e in enumerate(result.plans, 1):
        p = e.plan
        row = [str(i), str(p.dp), str(p.tp) + ("+sp" if p.sp else ""), str(p.pp), str(p.vpp), str(p.cp), str(p.ep),
               str(p.zero), f"{p.mbs}x{p.grad_accum}", p.recompute, f"{e.peak_memory_gib:.1f}", f"{e.step_time_s:.2f}",
               f"{e.tokens_per_s_per_device:,.0f}", f"{e.mfu:.1%}"]
        if tokens:
            days = e.run_days(tokens)
            row += [f"{days:.1f}", f"{days * 24 * cluster.world_size:,.0f}"]
        t.add_row(*row)
    console.print(t)
    best = result.best
    assert best is not None
    if best.plan.layer_split:
        console.print(f"layer split (per virtual stage): {list(best.plan.layer_split)}")
    mem, tt = breakdown_tables(best)
    console.print(mem)
    console.print(tt)
    if tokens:
        days = best.run_days(tokens)
        console.print(f"[bold]{tokens:.3g} tokens with plan 1: {days:.1f} days[/bold] "
                      f"({days * 24 * cluster.world_size:,.0f} device-hours; {best.model_flops_per_step * tokens / best.plan.tokens_per_step:.2e} model FLOPs)")
    console.print("[bold]Why not[/bold]")
    for line in reasons:
        console.print("  " + line, highlight=False)
    if exported:
        if export_note:
            print(f"partita: warning: {export_note}", file=sys.stderr)
        console.print(f"[bold]{'Plan 1' if not export_note else 'Best expressible plan'} as {exported.target} "
                      f"configuration[/bold]")
        print(exported.text, end="")
        for w in exported.warnings:
            print(f"partita: warning: {w}", file=sys.stderr)
    return 0
