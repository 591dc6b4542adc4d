"""Validation at the edge: command-line values and input files, checked before any work.

Every check here turns a user mistake into one sentence that says what is wrong and what
would be right (issue 16). The command-line side (argparse ``type=`` factories with
these bounds) is :mod:`partita.cli.types`; the file readers here raise
:class:`partita.errors.PartitaError`.

The upper bounds are not physical limits but sizes beyond any real run, chosen so that
every search, estimate and export finishes in bounded time: the largest published
trainings use ~10^5 devices, 128 pipeline stages, 10^3 layers and 10^6-token sequences.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

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


def read_json(path: str | Path, kind: str) -> Any:
    """Parse the JSON file ``path`` (a ``kind`` file: "plan", "hardware", "model"),
    refusing directories, unreadable, huge, non-UTF-8, non-JSON and absurdly nested
    files, and the non-standard constants NaN/Infinity, each with one line."""
    path = Path(path)
    where = f"{kind} file {short(str(path))}"
    try:
        if path.is_dir():
            raise PartitaError(f"{where} is a directory; pass a JSON file")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise PartitaError(f"{where} is {size / 2**20:.0f} MiB; a {kind} file is at most "
                               f"{MAX_FILE_BYTES >> 20} MiB")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise PartitaError(f"{where} does not exist") from None
    except OSError as e:
        raise PartitaError(f"cannot read {where}: {e.strerror or e}") from None
    except ValueError:  # a NUL byte in the name
        raise PartitaError(f"{where}: not a usable file name") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise PartitaError(f"{where} is not UTF-8 text (byte {e.start}); save it as UTF-8 JSON") from None
    return loads_json(text, where, kind)


def loads_json(text: str, where: str, kind: str) -> Any:
    """Parse the JSON ``text`` (of a ``kind`` file, or given inline, e.g. ``--plan '{...}'``)
    with the same one-line refusals as :func:`read_json`: not JSON, nested too deeply,
    NaN/Infinity, numbers too long."""
    def no_constant(name: str) -> Any:
        raise PartitaError(f"{where}: {name} is not a number JSON allows; give a finite number")
    try:
        return json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as e:
        raise PartitaError(f"{where} is not valid JSON: {e.msg} at line {e.lineno}") from None
    except RecursionError:
        raise PartitaError(f"{where} is nested too deeply to be a {kind} file") from None
    except ValueError as e:  # an integer of more than 4,300 digits (CPython's int-parsing limit)
        raise PartitaError(f"{where} holds a number too long to be a {kind} setting ({e.args[0].split(':')[0]})"
                           [:300]) from None


def path_exists(path: str | Path) -> bool:
    """``Path(path).exists()`` that answers False for a name the system cannot look up (too
    long, a NUL byte) instead of raising: such a name is then reported as unknown."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False


def short(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters for an error line (a pasted file is not echoed whole)."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def finite_number(value: Any) -> bool:
    """True for an int or a finite float (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def check_output_path(path: str | Path, flag: str) -> None:
    """Refuse an output path that cannot be written (a directory, a missing or read-only
    folder) before any work is done."""
    import os
    if not str(path).strip():  # before Path(): Path("") is "."
        raise PartitaError(f"{flag} is empty; give a file name")
    path = Path(path)
    try:
        is_dir, parent_ok = path.is_dir(), path.parent.is_dir()
    except (OSError, ValueError) as e:
        raise PartitaError(f"{flag} {short(str(path))}: not a usable file name ({getattr(e, 'strerror', None) or e})") \
            from None
    if is_dir:
        raise PartitaError(f"{flag} {path} is a directory; give a file name")
    parent = path.parent
    if not parent_ok:
        raise PartitaError(f"{flag} {path}: folder {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK):
        raise PartitaError(f"{flag} {path}: folder {parent} is not writable")
