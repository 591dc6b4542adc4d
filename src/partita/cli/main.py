"""``main()``: the parser of every command, and the one place errors become exit codes.

Every user mistake surfaces as :class:`partita.errors.PartitaError` (or an argparse
usage error): one line ``partita: error: ...`` on stderr, exit code 2. Anything else
that escapes a command is a bug in Partita: one line ``partita: internal error: ...``
and exit code 1 (the traceback only with ``--debug`` or ``PARTITA_DEBUG=1``).
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
from typing import Callable, NoReturn, Sequence

from ..errors import PartitaError
from . import analyze, calibrate, estimate, export, hardware, import_cmd, infer, models, plan, profile, serve, train

COMMANDS = (estimate, export, import_cmd, calibrate, models, hardware, plan, serve, infer, train, profile, analyze)  # the order of --help


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line (no usage block), raised as
    :class:`PartitaError` so :func:`main` prints them like every other user mistake.
    Subparsers inherit the class (argparse's ``parser_class`` default)."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        raise PartitaError(f"{command + ': ' if command else ''}{message} (see partita {command} --help)"
                           .replace("partita  --help", "partita --help"))

    def _print_message(self, message: str, file=None) -> None:  # type: ignore[override]
        """argparse's one writer (``--help``, ``--version``, usage), less its ``except OSError:
        pass``: help into a full disk must fail like every other output. With an unbuffered
        stdout (``PYTHONUNBUFFERED=1``, ``python -u``) the write itself fails, argparse dropped
        the error and the flush in :func:`main` found nothing left to fail on: exit 0."""
        file = file or sys.stderr
        if message and file is not None:
            file.write(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="partita", description="Plan, run and check parallel LLM training.")
    from .. import __version__
    parser.add_argument("--version", action="version", version=f"partita {__version__}")
    sub = parser.add_subparsers(dest="command")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # anywhere on the line: show the traceback of an internal error
    argv = [a for a in argv if a != "--debug"]
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv or ["plan"])  # no arguments: the default planning scenario
        except SystemExit as e:  # --help: printed; a failed write of it is reported below like any output's
            sys.stdout.flush()
            return e.code if isinstance(e.code, int) else 0
        func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
        if func is None:
            parser.print_help()
            return 2
        rc = func(args)
        sys.stdout.flush()
        return rc
    except PartitaError as e:
        print(f"partita: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except OSError as e:
        if e.errno is not None and e.filename is None:  # writing our own output failed (disk full)
            _silence_stdout()
            print(f"partita: error: cannot write the output: {e.strerror}", file=sys.stderr)
            return 2
        return _internal(e, debug)
    except KeyboardInterrupt:
        print("partita: error: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the last net: a bug, reported in one line
        return _internal(e, debug)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _internal(e: BaseException, debug: bool = False) -> int:
    import traceback  # only on this path: keeps the start-up of every command short
    if debug or os.environ.get("PARTITA_DEBUG"):
        traceback.print_exc()
    frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    where = f" at {os.path.basename(frame.filename)}:{frame.lineno}" if frame else ""
    print(f"partita: internal error: {type(e).__name__}: {_one_line(str(e))}{where} (please report; "
          "--debug shows the traceback)", file=sys.stderr)
    return 1


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def console() -> None:
    """The ``partita`` command: :func:`main`, then the exit code. Before the interpreter shuts
    down, ``gc.freeze()`` moves every object alive into the collector's permanent generation:
    its final collection then skips what torch and a traced model's library created (0.6-0.9 s
    of a first ``partita plan --model examples.traced_models:sdxl_unet`` on the 2-core VM).
    atexit handlers and file flushes still run; only the search for cycles is skipped, as the
    process is about to free everything anyway. Not in :func:`main`: tests call it in-process."""
    rc = main()
    gc.freeze()
    sys.exit(rc)


if __name__ == "__main__":
    console()
