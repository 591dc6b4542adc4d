"""The recorded loss-phase memory oracle (tests/data/memory_physics_oracles.json) is what
torch measures now: re-measure every case with the recorder's own function and compare.
When torch (or the recorded loss code) changes what the allocator holds, this fails: run
``python tests/measure_memory_physics.py`` and review the diff of the data file."""
import json
from pathlib import Path

import pytest

from conftest import load_script

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent
DATA = json.loads((ROOT / "data" / "memory_physics_oracles.json").read_text())


REC = load_script(ROOT / "measure_memory_physics.py", "measure_memory_physics")


@pytest.mark.parametrize("case", DATA["loss"], ids=lambda c: f"{c['mode']}-{c['dtype']}")
def test_loss_phase_recording_is_current(case):
    assert (REC.T, REC.V, REC.H) == (DATA["tokens"], DATA["vocab"], DATA["hidden"])
    measured = REC.loss_bytes_per_logit(case["mode"], case["dtype"])
    assert measured == pytest.approx(case["bytes_per_logit"], abs=0.01)
