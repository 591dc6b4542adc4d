"""``partita`` command line: parses, calls the library, prints. Nothing else lives here.

One module per command (:mod:`.plan`, :mod:`.estimate`, :mod:`.train`, :mod:`.profile`,
:mod:`.export`, :mod:`.calibrate`, :mod:`.models`, :mod:`.hardware`), each with
``add_parser(sub)`` and its ``cmd_*`` function; shared flags and loading in
:mod:`.common`; tables in :mod:`.render`. The library below never imports this package.
"""
from __future__ import annotations

from .common import parse_tokens
from .main import build_parser, main

__all__ = ["build_parser", "main", "parse_tokens"]
