"""Users' existing launch configs read into Partita plans (issue 14 item 2, issue 32).

- :mod:`.load`: :func:`load_config`, the one entry point of ``partita import``,
  ``estimate --from-script`` and ``plan --from-script``;
- :mod:`.detect`: which framework a file is written for;
- :mod:`.shell`: a launch script read the way bash runs it;
- :mod:`.megatron`, :mod:`.deepspeed`, :mod:`.torchtitan`: each framework's own format.

Planning code: nothing here imports torch (tests/test_structure.py).
"""
from __future__ import annotations

from .load import load_config

__all__ = ["load_config"]
