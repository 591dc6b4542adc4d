"""``partita estimate``: memory and step time of one plan."""
from __future__ import annotations

import argparse
import json

from ..cost.memory import dp_gradient_bytes
from .traced import add_trace_args, cmd_estimate_traced, is_traced
from .common import add_cluster_args, cluster_and_model, framework_arg, parse_tokens
from .import_cmd import FILL_FIELDS, add_script_flags, fill_inputs, not_modelled_lines, script_inputs
from .plan_flags import add_plan_flags, plan_from_flags, read_plan_arg, refuse_plan_flags
from .plan_report import add_report_arg


def add_parser(sub) -> None:
    est = sub.add_parser("estimate", help="memory and step time of one plan")
    add_cluster_args(est)
    add_trace_args(est)
    est.add_argument("--plan", help="the plan: a plan JSON file (or plan/estimate --json output), its JSON text, "
                                    "or fields such as \"tp=8,pp=2,mbs=1,gbs=128\" (dp fills the devices), "
                                    "instead of the plan flags")
    est.add_argument("--from-script", metavar="FILE",
                     help="the plan of a Megatron/MindSpeed launch script, ds_config.json or torchtitan overrides "
                          "(see partita import; --seq-len for a ds_config)")
    add_script_flags(est)
    add_plan_flags(est, "estimate", plan_defaults=("seq_len",))
    add_report_arg(est)
    add_fit_args(est)
    est.set_defaults(func=cmd_estimate)


def add_fit_args(p: argparse.ArgumentParser) -> None:
    """``--headroom`` and ``--min-p-fit``: the same flags and defaults as ``partita plan``'s, so the
    two commands give one verdict (:mod:`partita.uncertainty`)."""
    from ..uncertainty import DEFAULT_HEADROOM, DEFAULT_MIN_P_FIT
    from .types import finite_float
    p.add_argument("--headroom", type=finite_float(0, 1, min_open=False, max_open=True), default=DEFAULT_HEADROOM,
                   help=f"fraction of usable memory kept free (default {DEFAULT_HEADROOM:g}, as partita plan)")
    p.add_argument("--min-p-fit", type=finite_float(0, 1, min_open=False), default=DEFAULT_MIN_P_FIT,
                   help=f"say \"does not fit\" only when P(fit) is below this (default {DEFAULT_MIN_P_FIT:g}, as "
                        "partita plan)")


def estimate_plan(args: argparse.Namespace, model, world_size: int):
    """The plan to estimate: ``--from-script``, ``--plan`` (file, JSON or fields) or the plan
    flags - one of them (:func:`refuse_plan_flags`) - with ``--framework`` applied to any."""
    fills = (*FILL_FIELDS, "pp") if args.from_script else ()  # what a file leaves open ("auto"): filled, not overridden
    refuse_plan_flags(args, "estimate", {"--plan": args.plan, "--from-script": args.from_script},
                      allowed=("framework", "seq_len", *fills))
    args.not_modelled, args.reading_note = (), ""
    if args.from_script:
        from ..imports import load_config as load_script
        read = load_script(args.from_script, devices=world_size, model=model, seq_len=args.seq_len, pp=args.pp,
                           fill=fill_inputs(args), **script_inputs(args))
        plan, args.not_modelled, args.reading_note = read.plan, read.not_modelled, read.reading_note
    elif args.plan is not None:
        plan = read_plan_arg(args.plan, world_size, defaults={"seq_len": args.seq_len})
    else:
        plan = plan_from_flags(args, "estimate", world_size)
    framework = framework_arg(args)
    return plan.with_(framework=framework) if framework else plan  # "as run by": a plan file or script too


def plan_time_notes(plan, script_notes: tuple[str, ...]) -> list[str]:
    """The estimate's own notes on time it leaves out (:func:`partita.estimate.time_not_modelled`),
    less those a script's importer already named by the same Megatron flag."""
    from ..estimate import time_not_modelled
    return [note for flag, note in time_not_modelled(plan) if not any(n.startswith(flag) for n in script_notes)]


def cmd_estimate(args: argparse.Namespace) -> int:
    if is_traced(args):  # --model module:factory or a traced spec (issue 19)
        return cmd_estimate_traced(args)
    from ..estimate import estimate
    from ..plan import check
    model, cluster = cluster_and_model(args)
    if args.report:
        from ..report import check_report_path
        check_report_path(args.report)
    plan = estimate_plan(args, model, cluster.world_size)
    check(plan, model, cluster.world_size)  # as given: estimate() normalises fields a pp=1 plan ignores (schedule)
    est = estimate(model, cluster, plan)
    plan_notes = plan_time_notes(est.plan, args.not_modelled)
    from ..uncertainty import MemoryLimit
    est.memory_limit = MemoryLimit.of(cluster.device, args.headroom)  # plan's limit and risk rule, by the same flags
    est.min_p_fit = args.min_p_fit
    tokens = parse_tokens(args.tokens) if args.tokens else None
    from .finetune_data import dataset_tokens
    tokens = dataset_tokens(args, est.plan.seq_len, tokens)  # --seq-lengths: days for the dataset (issue 36)
    if args.report:
        from .plan_report import write_estimate_report
        write_estimate_report(args, est, tokens)
    if args.json:
        out = est.to_dict()
        out["framework"] = est.plan.framework
        out["not_modelled"] = list(args.not_modelled) + plan_notes
        out["reading_note"] = args.reading_note  # what reading a --from-script file assumed ("" for none)
        out["dp_gradient_bytes"] = dp_gradient_bytes(est.model, est.plan)
        if tokens:
            out["run_days"] = est.run_days(tokens)
            out["device_hours"] = est.run_days(tokens) * 24 * cluster.world_size
        if args.seq_lengths:  # issue 36: the dataset's packing and days
            from .finetune_data import dataset_report
            out["dataset"] = dataset_report(args, est)
        print(json.dumps(out, indent=2))
    else:
        from .render import print_estimate
        print_estimate(est, tokens=tokens)
        from .finetune_data import dataset_lines, dataset_report, finetune_lines
        for line in finetune_lines(est) + dataset_lines(dataset_report(args, est)):  # issue 36: --finetune, --seq-lengths
            print(line)
        line = dp_gradient_line(est)
        if line:
            print(line)
        for line in not_modelled_lines(args.not_modelled):
            print(line)
        for note in plan_notes:
            print(f"not modelled: {note}")
        if args.reading_note:
            print(f"note: {args.reading_note}")  # what reading the script assumed
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
