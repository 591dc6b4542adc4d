"""Validation at the edge: command-line values and input files, checked before any work.

Every check here turns a user mistake into one sentence that says what is wrong and what
would be right (issue 16). The argparse ``type=`` factories raise
:class:`argparse.ArgumentTypeError` (argparse prefixes the flag name); the file reader
raises :class:`partita.errors.PartitaError`.

The upper bounds are not physical limits but sizes beyond any real run, chosen so that
every search, estimate and export finishes in bounded time: the largest published
trainings use ~10^5 devices, 128 pipeline stages, 10^3 layers and 10^6-token sequences.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Callable

from .errors import PartitaError

#: Upper bounds of command-line sizes (see the module docstring for why these).
MAX_DEGREE = 1 << 20  # any parallel degree, device count
MAX_VPP = 128  # virtual stages per pipeline rank
MAX_SEQ_LEN = 1 << 24  # 16M tokens
MAX_BATCH = 1 << 24  # sequences per global batch
MAX_DEVICES_PER_NODE = 1024
MAX_TOP = 10_000
#: Input files larger than this are refused before parsing (real configs are kilobytes).
MAX_FILE_BYTES = 64 << 20


def positive_int(maximum: int = MAX_DEGREE, minimum: int = 1) -> Callable[[str], int]:
    """An argparse type: an integer in ``minimum..maximum``."""
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number from {minimum:,} to {maximum:,}, "
                                             f"got {text!r}") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be from {minimum:,} to {maximum:,}, got {text}")
        return value
    parse.__name__ = "positive_int"
    return parse


def finite_float(minimum: float = 0.0, maximum: float = math.inf, *, min_open: bool = True,
                 max_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in the interval (open ends where asked)."""
    lo, hi = ("(" if min_open else "["), (")" if max_open or math.isinf(maximum) else "]")
    span = f"{lo}{minimum:g}, {maximum:g}{hi}"
    if math.isinf(minimum) and math.isinf(maximum):
        span = "(-inf, inf)"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number in {span}, got {text!r}") from None
        below = value < minimum or (min_open and value == minimum and math.isfinite(minimum))
        above = value > maximum or (max_open and value == maximum)
        if not math.isfinite(value) or below or above:
            raise argparse.ArgumentTypeError(f"must be a finite number{'' if '-inf' in span else ' in ' + span}, "
                                             f"got {text}")
        return value
    parse.__name__ = "finite_float"
    return parse


def read_json(path: str | Path, kind: str) -> Any:
    """Parse the JSON file ``path`` (a ``kind`` file: "plan", "hardware", "model"),
    refusing directories, unreadable, huge, non-UTF-8, non-JSON and absurdly nested
    files, and the non-standard constants NaN/Infinity, each with one line."""
    path = Path(path)
    where = f"{kind} file {path}"
    if path.is_dir():
        raise PartitaError(f"{where} is a directory; pass a JSON file")
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise PartitaError(f"{where} is {size / 2**20:.0f} MiB; a {kind} file is at most "
                               f"{MAX_FILE_BYTES >> 20} MiB")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise PartitaError(f"{where} does not exist") from None
    except OSError as e:
        raise PartitaError(f"cannot read {where}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise PartitaError(f"{where} is not UTF-8 text (byte {e.start}); save it as UTF-8 JSON") from None

    def no_constant(name: str) -> Any:
        raise PartitaError(f"{where}: {name} is not a number JSON allows; give a finite number")
    try:
        return json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as e:
        raise PartitaError(f"{where} is not valid JSON: {e.msg} at line {e.lineno}") from None
    except RecursionError:
        raise PartitaError(f"{where} is nested too deeply to be a {kind} file") from None


def finite_number(value: Any) -> bool:
    """True for an int or a finite float (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def check_output_path(path: str | Path, flag: str) -> None:
    """Refuse an output path that cannot be written (a directory, a missing or read-only
    folder) before any work is done."""
    import os
    path = Path(path)
    if path.is_dir():
        raise PartitaError(f"{flag} {path} is a directory; give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise PartitaError(f"{flag} {path}: folder {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK):
        raise PartitaError(f"{flag} {path}: folder {parent} is not writable")
