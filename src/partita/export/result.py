"""What every exporter returns (its own module so the emitters and the dispatcher in
``__init__`` import it without importing each other)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Export:
    """The configuration text for the target, the warnings for anything emitted as a
    closest equivalent, and the structured form (argument list, dict) behind ``text``."""

    target: str
    text: str
    warnings: list[str] = field(default_factory=list)
    data: object = None
