"""``partita export``: a plan as another framework's configuration."""
from __future__ import annotations

import argparse
import sys

from ..errors import PartitaError
from ..export.registry import target_names, targets_help
from ..inputs import check_output_path


def add_parser(sub) -> None:
    exp = sub.add_parser("export", help="write a plan as Megatron-LM / MindSpeed-LLM / DeepSpeed / torchtitan config")
    exp.add_argument("--to", required=True, choices=target_names(), help=targets_help())
    exp.add_argument("plan_file", metavar="PLAN", help="a plan file (or the output of plan/estimate --json), its JSON "
                                                       "text, or fields such as tp=2,pp=2,gbs=8")
    exp.add_argument("--model", help="add the model shape (Megatron/MindSpeed) and check the plan against it")
    exp.add_argument("-o", "--output", help="write here instead of stdout")
    exp.set_defaults(func=cmd_export)


def _load_model(name: str | None):
    """The ``--model`` spec, None when the flag is left out. An empty name is refused here: it
    would otherwise read as "no model" and export without the model's shape and checks."""
    from ..spec.load import load_model
    if name is None:
        return None
    if not name.strip():
        raise PartitaError("--model is empty; give a model name (see `partita models`) or a config.json, "
                           "or leave --model out to export the parallel layout only")
    return load_model(name)


def cmd_export(args: argparse.Namespace) -> int:
    from ..export import export
    from ..plan import check
    from .plan_flags import read_plan_arg
    plan = read_plan_arg(args.plan_file, flag="PLAN")
    model = _load_model(args.model)
    check(plan, model)  # the plan's own constraints always; the model's when given
    if args.output is not None:
        check_output_path(args.output, "-o")
    result = export(args.to, plan, model)
    for w in result.warnings:
        print(f"partita: warning: {w}", file=sys.stderr)
    if args.output:
        from ..outputs import write_output
        write_output(args.output, result.text, "-o")
    else:
        sys.stdout.write(result.text)
    return 0
