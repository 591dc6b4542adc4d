"""The recorded cost oracles (tests/data/cost_oracles.json) are what torch measures now.

``tests/test_cost_oracles.py`` checks the cost model against the recording without
torch; this test re-measures a subset of every kind of figure - FLOPs (dense with tensor
parallel, MoE), activation bytes (every recompute mode, fp32 and bf16, dense and MoE)
and per-rank model-state bytes on two gloo ranks (FSDP zero 2, expert parallel with
ZeRO-1) - with the recorder's own functions, and asserts equality. When the reference
models, the runtime or torch change what they hold or compute, this fails: run
``python bench/record_cost_oracles.py`` and review the diff of the data file.
"""
import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
DATA = json.loads((ROOT / "tests" / "data" / "cost_oracles.json").read_text())


def _recorder():
    spec = importlib.util.spec_from_file_location("record_cost_oracles", ROOT / "bench" / "record_cost_oracles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REC = _recorder()


def _recorded(kind: str, **keys) -> dict:
    found = [c for c in DATA[kind] if all(c[k] == v for k, v in keys.items())]
    assert len(found) == 1, (kind, keys)
    return found[0]


def test_recorded_with_this_torch():
    assert DATA["torch"].split("+")[0] == torch.__version__.split("+")[0]


@pytest.mark.parametrize("case", [("tiny-llama", 16, 2, 2), ("tiny-moe", 16, 1, 1)], ids=str)
def test_flops_current(case):
    name, seq, mbs, tp = case
    assert REC.measure_flops(name, seq, mbs, tp) == _recorded("flops", model=name, seq_len=seq, mbs=mbs, tp=tp)


@pytest.mark.parametrize("case", [("tiny-llama", 16, 1, 1, "fp32", rc) for rc in ("none", "selective", "full")]
                         + [("tiny-moe", 16, 1, 1, "bf16", "none"), ("tiny-llama", 64, 1, 2, "fp32", "selective")],
                         ids=str)
def test_activations_current(case):
    name, seq, mbs, tp, dtype, rc = case
    recorded = _recorded("activations", model=name, seq_len=seq, mbs=mbs, tp=tp, dtype=dtype, recompute=rc)
    assert REC.measure_activations(*case) == recorded


STATE_CASES = [("tiny-llama", "dp=2,zero=2,dtype=fp32,gbs=2,mbs=1,seq_len=16"),
               ("tiny-moe", "dp=2,ep=2,zero=1,dtype=fp32,gbs=2,mbs=1,seq_len=16")]
#: the model-state cases run on the session's shared 2-rank processes (tests/conftest.py
#: ``equivalence``; this file's :func:`shared_case`), not in a torchrun of their own
EQUIVALENCE_CASES = [(2, 0, f"{model}:{plan}", str(Path(__file__).resolve())) for model, plan in STATE_CASES]


def shared_case(case: str) -> dict:
    """In the shared 2-rank process group: what the recorder's own ``states_worker`` records for
    ``case`` (``MODEL:PLAN``) - its ``_state_case`` on every rank, gathered."""
    import torch.distributed as dist
    model_name, plan_text = case.split(":", 1)
    mine = REC._state_case(model_name, plan_text)
    ranks: list = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    return {"model": model_name, "plan": plan_text, "world": dist.get_world_size(), "ranks": ranks}


def test_model_states_current(equivalence):
    measured = [equivalence["results"][spec] for spec in EQUIVALENCE_CASES]
    assert [(m["model"], m["plan"]) for m in measured] == STATE_CASES
    for m in measured:
        assert m == _recorded("model_states", model=m["model"], plan=m["plan"], world=2)
