"""Rank 0's record of a run: the JSON-lines metrics file (rewound on resume so every step
appears once) and the peak memory figure each step record carries. Its own module so the
trainer's step loop and what it writes down can change apart."""
from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import torch


def peak_memory_gib(device: torch.device) -> tuple[float, str]:
    """Peak allocated memory on the accelerator, or the process's peak RSS on CPU."""
    if device.type != "cpu":
        module = getattr(torch, device.type)
        return module.max_memory_allocated(device) / 2 ** 30, "allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, "rss"


class Metrics:
    """Rank 0's JSON-lines metrics file, written a line at a time (one ``write`` of the whole
    line, flushed); on resume, records after the checkpoint are discarded (and the
    discarded steps named) so every step appears exactly once, and a line that is not
    JSON (torn by a crash mid-write) is dropped with a note."""

    def __init__(self, path: Path, enabled: bool, note=None):
        self.path, self.enabled, self.note = path, enabled, note or (lambda msg: None)
        self._file = None

    def rewind(self, step: int) -> list[int]:
        if not self.enabled or not self.path.exists():
            return []
        kept, dropped = [], []
        lines = self.path.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            try:
                rec = json.loads(line)
            except ValueError:
                where = "its last line" if i == len(lines) - 1 else f"line {i + 1}"
                self.note(f"partita: note: {self.path}: dropped {where}, not JSON (torn by a crash mid-write?): "
                          f"{line[:60]!r}")
                continue
            if isinstance(rec, dict) and "step" in rec and rec.get("event") is None and rec["step"] > step:
                dropped.append(rec["step"])
            else:
                kept.append(line)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(k + "\n" for k in kept))
        os.replace(tmp, self.path)
        return dropped

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        if self._file is None:
            self._file = open(self.path, "a", buffering=1)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
