"""``partita estimate``: memory and step time of one plan."""
from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import PartitaError
from ..inputs import MAX_DEGREE, MAX_VPP
from .types import positive_int
from ..cost.memory import dp_gradient_bytes
from .traced import add_trace_args, cmd_estimate_traced, is_traced
from .common import add_cluster_args, cluster_and_model, framework_arg, parse_tokens
from .plan_report import add_report_arg


def add_parser(sub) -> None:
    est = sub.add_parser("estimate", help="memory and step time of one plan")
    add_cluster_args(est)
    add_trace_args(est)
    est.add_argument("--plan", help="a plan JSON file (instead of the degree flags)")
    est.add_argument("--from-script", metavar="FILE",
                     help="the plan of a Megatron/MindSpeed launch script, ds_config.json or torchtitan overrides "
                          "(see partita import; --seq-len for a ds_config)")
    est.add_argument("--tp", type=positive_int(MAX_DEGREE))
    est.add_argument("--pp", type=positive_int(MAX_DEGREE))
    est.add_argument("--vpp", type=positive_int(MAX_VPP))
    est.add_argument("--cp", type=positive_int(MAX_DEGREE))
    est.add_argument("--ep", type=positive_int(MAX_DEGREE))
    est.add_argument("--etp", type=positive_int(MAX_DEGREE),
                     help="expert tensor parallel: each routed expert's FFN split etp ways, the expert grid "
                          "etp x ep x edp folded out of tp x cp x dp (Megatron --expert-tensor-parallel-size; "
                          "default 1)")
    est.add_argument("--dp", type=positive_int(MAX_DEGREE), help="default: devices / (tp*pp*cp)")
    est.add_argument("--zero", type=int, choices=[0, 1, 2, 3], help="ZeRO stage (default 1)")
    est.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None,
                     help="sequence parallel (default: on when tp > 1)")
    est.add_argument("--mbs", type=positive_int(MAX_DEGREE), help="micro-batch size")
    est.add_argument("--recompute", choices=["none", "selective", "full"])
    est.add_argument("--recompute-layers", type=int,
                     help="with --recompute full: recompute only the first N layers of each pipeline stage/chunk "
                          "(Megatron --recompute-method block --recompute-num-layers N; default 0: all)")
    est.add_argument("--schedule", choices=["1f1b", "gpipe", "interleaved-1f1b", "zero-bubble"])
    est.add_argument("--layer-split", help="layers per virtual stage, e.g. 9,10,10,9")
    est.add_argument("--tp-comm-overlap", action="store_true",
                     help="overlap tensor-parallel communication (Megatron --tp-comm-overlap, Ascend MC2)")
    add_report_arg(est)
    add_comm_knob_arguments(est)
    est.set_defaults(func=cmd_estimate)


def add_comm_knob_arguments(p: argparse.ArgumentParser, search: bool = False) -> None:
    """The data-parallel communication knobs (plan fields grad_dtype, grad_compression,
    powersgd_rank, ddp_bucket_mb, fsdp_prefetch; docs/compression.md)."""
    fix = "fix " if search else ""
    p.add_argument("--grad-dtype", choices=["fp32", "bf16"],
                   help=fix + "dtype of the data-parallel gradient reduction (bf16 halves its bytes; default fp32)")
    p.add_argument("--grad-compression", choices=["none", "powersgd"],
                   help=fix + "low-rank gradient compression of the data-parallel all-reduce (zero 0; default none)")
    p.add_argument("--powersgd-rank", type=positive_int(1024), help="PowerSGD rank (default 4)")
    if not search:
        p.add_argument("--ddp-bucket-mb", type=int, help="DDP gradient bucket size in MiB (default: framework's)")
        p.add_argument("--fsdp-prefetch", type=int, help="FSDP2 all-gather prefetch depth in blocks (default 1)")


#: The flags that describe a plan, and their defaults (None in the parser, so that
#: ``--plan`` combined with any of them can be refused instead of silently ignoring it).
PLAN_FLAGS = {"tp": 1, "pp": 1, "vpp": 1, "cp": 1, "ep": 1, "etp": 1, "dp": None, "zero": 1, "sp": None, "mbs": 1,
              "recompute": "none", "schedule": None, "layer_split": None, "tp_comm_overlap": False,
              "grad_dtype": None, "grad_compression": None, "powersgd_rank": None, "ddp_bucket_mb": None,
              "fsdp_prefetch": None}


def plan_from_flags(args: argparse.Namespace, world_size: int):
    """The plan the degree flags describe (dp fills the devices unless given)."""
    from ..plan import Plan
    for name, default in PLAN_FLAGS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.global_batch is None:
        raise PartitaError("--global-batch is required (or pass --plan plan.json)")
    other = args.tp * args.pp * args.cp
    if world_size % other:
        raise PartitaError(f"tp*pp*cp = {other} does not divide --devices {world_size}")
    dp = args.dp or world_size // other
    fields: dict[str, Any] = dict(dp=dp, tp=args.tp, pp=args.pp, vpp=args.vpp, cp=args.cp, ep=args.ep,
                                  etp=args.etp, zero=args.zero, mbs=args.mbs, gbs=args.global_batch, seq_len=args.seq_len,
                                  recompute=args.recompute, dtype=args.dtype or "bf16")
    if args.sp is not None:
        fields["sp"] = args.sp
    if args.schedule:
        fields["schedule"] = args.schedule
    if args.layer_split is not None:
        if not args.layer_split.replace(",", " ").strip():
            raise PartitaError(f"--layer-split {args.layer_split!r} is empty; give the layers of each virtual "
                               "stage, e.g. 9,10,10,9")
        fields["layer_split"] = args.layer_split.replace(",", " ")  # the help's form: 9,10,10,9
    if args.tp_comm_overlap:
        fields["tp_comm_overlap"] = True
    for knob in ("grad_dtype", "grad_compression", "powersgd_rank", "ddp_bucket_mb", "fsdp_prefetch"):
        if getattr(args, knob) is not None:
            fields[knob] = getattr(args, knob)
    if getattr(args, "recompute_layers", None) is not None:  # only `partita estimate` has the flag
        fields["recompute_layers"] = args.recompute_layers
    return Plan.from_dict(fields, "plan")


def refuse_plan_flags(args: argparse.Namespace) -> None:
    """--plan and --from-script set the whole plan: a degree flag beside them would be ignored, so refuse it."""
    source = [f"{flag} {value}" for flag, value in (("--plan", args.plan), ("--from-script", args.from_script)) if value]
    if len(source) > 1:
        raise PartitaError(f"{source[0]} and {source[1]} both set the plan; give one")
    if source:
        given = [name for name in PLAN_FLAGS if getattr(args, name) not in (None, False)]
        given += ["recompute_layers"] if getattr(args, "recompute_layers", None) is not None else []
        given += [flag for flag, value in (("global_batch", args.global_batch), ("dtype", args.dtype)) if value]
        if given:
            raise PartitaError(f"{source[0]} already sets the plan; drop "
                               + ", ".join("--" + g.replace("_", "-") for g in given) + f" (or drop {source[0].split()[0]})")


def cmd_estimate(args: argparse.Namespace) -> int:
    if is_traced(args):  # --model module:factory or a traced spec (issue 19)
        return cmd_estimate_traced(args)
    from ..estimate import estimate
    from ..plan import Plan, check
    framework = framework_arg(args)
    model, cluster = cluster_and_model(args)
    refuse_plan_flags(args)
    if args.report:
        from ..report import check_report_path
        check_report_path(args.report)
    if args.from_script:
        from .import_cmd import load_script
        plan, _ = load_script(args.from_script, devices=cluster.world_size, model=model, seq_len=args.seq_len)
    else:
        plan = Plan.load(args.plan) if args.plan else plan_from_flags(args, cluster.world_size)
    if framework:
        plan = plan.with_(framework=framework)  # "as run by": applies to a plan file or script too
    check(plan, model, cluster.world_size)  # as given: estimate() normalises fields a pp=1 plan ignores (schedule)
    est = estimate(model, cluster, plan)
    tokens = parse_tokens(args.tokens) if args.tokens else None
    if args.report:
        from .plan_report import write_estimate_report
        write_estimate_report(args, est, tokens)
    if args.json:
        out = est.to_dict()
        out["framework"] = est.plan.framework
        out["dp_gradient_bytes"] = dp_gradient_bytes(est.model, est.plan)
        if tokens:
            out["run_days"] = est.run_days(tokens)
            out["device_hours"] = est.run_days(tokens) * 24 * cluster.world_size
        print(json.dumps(out, indent=2))
    else:
        from .render import print_estimate
        print_estimate(est, tokens=tokens)
        line = dp_gradient_line(est)
        if line:
            print(line)
    return 0


def dp_gradient_line(est) -> str:
    """One line: the data-parallel gradient bytes per step and what the knobs make of them."""
    b = dp_gradient_bytes(est.model, est.plan)
    if not b["held"]:
        return ""
    plan = est.plan
    knob = (f"powersgd rank {plan.powersgd_rank}" if plan.grad_compression == "powersgd"
            else f"grad_dtype {plan.grad_dtype}")
    extra = f", +{b['state'] / 2**30:.2f} GiB PowerSGD state" if b["state"] else ""
    per = "micro-batch" if plan.zero >= 2 and plan.grad_accum > 1 and plan.grad_accum_mode == "sharded" else "step"
    return (f"dp gradient bytes per {per} and rank: {b['wire'] / 2**20:,.1f} MiB on the wire ({knob}; "
            f"{b['ratio']:.3g} x the {b['held'] / 2**20:,.1f} MiB fp32 gradients{extra})")
