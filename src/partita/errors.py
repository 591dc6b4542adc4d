"""User-facing errors.

Every mistake a user can make (unknown name, impossible plan, malformed file)
raises :class:`PartitaError`; the CLI prints its message as one line and exits
with status 2. Anything else escaping to the top is a bug in Partita.
"""
from __future__ import annotations

import difflib
from typing import Iterable


class PartitaError(Exception):
    """A problem with the user's input, explained in one line."""


def unknown_name(kind: str, name: str, known: Iterable[str]) -> PartitaError:
    """Build the error for an unknown model/hardware name, listing close matches."""
    known = sorted(set(known))
    close = difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=4, cutoff=0.5)
    by_lower = {k.lower(): k for k in known}
    if close:
        hint = "did you mean " + ", ".join(by_lower[c] for c in close) + "?"
    else:
        hint = "known: " + ", ".join(known)
    shown = name if len(name) <= 80 else name[:77] + "..."  # a pasted file is not echoed whole
    return PartitaError(f"unknown {kind} {shown!r}: {hint}")
