"""Partial full recompute in the runtime (``plan.recompute_layers``, issue 12): the first N
blocks of a chunk are checkpointed, the rest keep their activations.

Oracles from outside the cost model: single-process training without recompute (the same
losses, SGD, 1e-6), and the activation storages the forward really leaves alive (a
``TorchDispatchMode`` holding weak references to every op output, as
bench/record_cost_oracles.py measures the ``bytes`` of tests/data/cost_oracles.json). The
cost model's prediction is the difference of its activation parts between recompute none,
partial and full for the same plan: it must equal the measured differences within the
oracle tests' tolerance (``ACT_SLACK`` bytes per layer, tests/test_cost_oracles.py).
"""
from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from partita.cost.memory import memory_parts, rank_shapes
from partita.models.llama import MODEL_PRESETS, build_model
from partita.plan import Plan
from partita.runtime.recompute import apply_recompute
from partita.spec.hardware import make_cluster
from partita.spec.load import load_model

SEQ, MBS, LAYERS = 32, 2, 4
ACT_SLACK = 4  # bytes per layer, as tests/test_cost_oracles.py


class _Alive(TorchDispatchMode):
    """Weak references to the storage of every op output while active."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[StorageWeakRef, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
                s = t.untyped_storage()
                self.refs.append((StorageWeakRef(s), s.data_ptr(), s.nbytes()))
        return out

    def bytes(self, exclude: set[int]) -> int:
        return sum({p: n for r, p, n in self.refs if not r.expired() and p not in exclude}.values())


def _model(mode: str, layers: int = 0):
    model = build_model(MODEL_PRESETS["tiny-llama"], seed=0)
    apply_recompute(model, mode, layers)
    return model


def _tokens() -> torch.Tensor:
    return torch.randint(0, MODEL_PRESETS["tiny-llama"].vocab, (MBS, SEQ + 1), generator=torch.Generator().manual_seed(3))


def _kept_bytes(mode: str, layers: int = 0) -> int:
    """Bytes the forward (to the logits) leaves alive for backward, parameters and buffers aside."""
    model = _model(mode, layers)
    tokens = _tokens()[:, :-1]
    fixed = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), tokens]}
    gc.collect()
    with _Alive() as alive:
        logits = model(tokens)
    gc.collect()
    kept = alive.bytes(fixed | {logits.untyped_storage().data_ptr()})
    del logits
    return kept


def _predicted(plan: Plan) -> float:
    spec = load_model("tiny-llama")
    device = make_cluster("h100-sxm", devices=1).device
    setting = (plan.recompute, plan.zero)
    return memory_parts(spec, device, plan, 0, rank_shapes(spec, plan)[0], [setting])[setting].activations


@pytest.mark.parametrize("n", [1, 3])
def test_partial_recompute_trains_like_no_recompute(n):
    torch.manual_seed(0)
    ref, part = _model("none"), _model("full", n)
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt_p = torch.optim.SGD(part.parameters(), lr=0.1)
    tokens = _tokens()
    for _ in range(3):
        losses = []
        for model, opt in ((ref, opt_r), (part, opt_p)):
            opt.zero_grad()
            loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], abs=1e-6)


def test_partial_recompute_wraps_only_the_first_blocks():
    model = _model("full", 2)
    wrapped = [hasattr(b.forward, "__wrapped__") for b in model.layers.values()]
    assert wrapped == [True, True, False, False]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_saved_activations_between_none_and_full_as_the_cost_model_says(n):
    none, full, part = _kept_bytes("none"), _kept_bytes("full"), _kept_bytes("full", n)
    assert full < part < none
    base = Plan(mbs=MBS, gbs=MBS, seq_len=SEQ, dtype="fp32", zero=0, framework="partita")
    p_none = _predicted(base)
    p_full = _predicted(base.with_(recompute="full"))
    p_part = _predicted(base.with_(recompute="full", recompute_layers=n))
    assert abs((none - part) - (p_none - p_part)) <= ACT_SLACK * LAYERS, (none - part, p_none - p_part)
    assert abs((part - full) - (p_part - p_full)) <= ACT_SLACK * LAYERS, (part - full, p_part - p_full)


_PARALLELIZE_SCRIPT = """
import os, sys
from datetime import timedelta
import torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
from partita.models.llama import build_model
from partita.runtime.parallelize import parallelize
pm = parallelize(build_model("tiny-llama"), "recompute=full,recompute_layers=2,gbs=2,seq_len=16,dtype=fp32",
                 device_type="cpu")
blocks = [b for m in pm.modules for b in m.layers.values()]
print("WRAPPED", [hasattr(b.forward, "__wrapped__") for b in blocks])
dist.barrier()
dist.destroy_process_group()
"""


def test_parallelize_applies_the_plans_recompute_layers():
    """``partita.parallelize`` hands ``plan.recompute_layers`` to the recompute pass: a plan
    that recomputes 2 of tiny-llama's 4 layers checkpoints exactly the first two (one gloo
    process, in a fresh interpreter so no process group leaks into other tests)."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    out = subprocess.run([sys.executable, "-c", _PARALLELIZE_SCRIPT, port], capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "WRAPPED [True, True, False, False]" in out.stdout
