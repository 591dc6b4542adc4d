"""argparse ``type=`` factories: whole numbers and finite floats within a range, refused
with the range in the message (argparse prefixes the flag name). The bounds themselves
and the file checks live in :mod:`partita.inputs`."""
from __future__ import annotations

import argparse
import math
from typing import Callable

from ..inputs import MAX_DEGREE


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


def check_device_type(value: str | None, flag: str) -> None:
    """Refuse a device type no backend runs on (``tpu``, empty) before any process starts.
    The known types are the runtime's own table (:data:`partita.runtime.device.BACKENDS`,
    which imports torch: call this only where torch is needed anyway)."""
    if value is None:
        return
    from ..errors import PartitaError
    from ..runtime.device import BACKENDS
    if value not in BACKENDS:
        raise PartitaError(f"{flag} {value!r} is not a device type partita runs on; use one of "
                           f"{', '.join(BACKENDS)} (default: what the machine has)")
