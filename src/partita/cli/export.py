"""``partita export``: a plan as another framework's configuration."""
from __future__ import annotations

import argparse
import sys

from ..errors import PartitaError
from ..inputs import check_output_path


def add_parser(sub) -> None:
    exp = sub.add_parser("export", help="write a plan as Megatron-LM / MindSpeed-LLM / DeepSpeed / torchtitan config")
    exp.add_argument("--to", required=True, choices=["megatron", "mindspeed", "deepspeed", "torchtitan"])
    exp.add_argument("plan_file", metavar="PLAN.json", help="a plan (or the output of plan/estimate --json)")
    exp.add_argument("--model", help="add the model shape (Megatron/MindSpeed) and check the plan against it")
    exp.add_argument("-o", "--output", help="write here instead of stdout")
    exp.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from ..export import export
    from ..plan import Plan, check
    from ..spec.load import load_model
    plan = Plan.load(args.plan_file)
    model = load_model(args.model) if args.model else None
    check(plan, model)  # the plan's own constraints always; the model's when given
    if args.output is not None:
        check_output_path(args.output, "-o")
    result = export(args.to, plan, model)
    for w in result.warnings:
        print(f"partita: warning: {w}", file=sys.stderr)
    if args.output:
        try:
            with open(args.output, "w") as f:
                f.write(result.text)
        except OSError as e:
            raise PartitaError(f"cannot write -o {args.output}: {e.strerror}") from None
    else:
        sys.stdout.write(result.text)
    return 0
