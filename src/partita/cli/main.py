"""``main()``: the parser of every command, and the one place errors become exit codes.

Every user mistake surfaces as :class:`partita.errors.PartitaError`: one line on stderr,
exit code 2.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from ..errors import PartitaError
from . import calibrate, estimate, export, hardware, models, plan, profile, train

COMMANDS = (estimate, export, calibrate, models, hardware, plan, train, profile)  # the order of --help


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="partita", description="Plan, run and check parallel LLM training.")
    sub = parser.add_subparsers(dest="command")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv or ["plan"])  # no arguments: the default planning scenario
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return func(args)
    except PartitaError as e:
        print(f"partita: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
