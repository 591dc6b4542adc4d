"""Record the loss-phase memory oracle (tests/data/memory_physics_oracles.json) with torch.

    python tests/measure_memory_physics.py          # rewrite the data file

What is measured: the peak of live CPU allocations (torch.profiler with
``profile_memory=True``: every allocator alloc/free event, in time order, summed) while
an output layer ``pred = x @ W^T`` and a cross-entropy loss run forward and backward,
per logit element (``T x V``), for the ways the frameworks of ``partita.cost.frameworks``
run their loss:

* ``eager``: torchtitan's ``cross_entropy_loss`` (``F.cross_entropy(pred.flatten(0, 1).float(),
  labels)``, torchtitan/components/loss.py) with the train step's ``del pred`` before
  ``loss.backward()`` (torchtitan/train.py "need to free to before bwd to avoid peaking memory");
* ``eager-kept``: the same loss with the logits still referenced during backward (partita's
  own train step, partita/runtime/parallelize.py ``cross_entropy(out, y)``);
* ``compiled``: the same function under ``torch.compile`` (torchtitan compiles the loss
  when compile is on: ``build_cross_entropy_loss`` from torchtitan commit bbb1b616e,
  2025-04-02, ``"loss" in compile.components`` today).

``x`` and ``W`` are made small (h = 8) so the T x V tensors dominate; the figure includes
``x.grad`` and ``W.grad`` (< 0.1 % here). tests/test_memory_physics_current.py checks
that the recording is what torch measures now; tests/test_memory_physics.py checks the
cost model against it without torch.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

OUT = Path(__file__).resolve().parent / "data" / "memory_physics_oracles.json"
T, V, H = 1024, 16384, 8


def peak_live_bytes(fn) -> int:
    """Peak of the running sum of the allocator's alloc (+) / free (-) events while ``fn`` runs."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return peak


def cross_entropy_loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def loss_bytes_per_logit(mode: str, dtype: str) -> float:
    """Peak bytes per logit element of output layer + loss, forward and backward."""
    torch.manual_seed(0)
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    x = torch.randn(1, T, H, dtype=dt, requires_grad=True)
    w = torch.randn(V, H, dtype=dt, requires_grad=True)
    labels = torch.randint(0, V, (1, T))
    loss_fn = torch.compile(cross_entropy_loss) if mode == "compiled" else cross_entropy_loss

    def step() -> None:
        pred = x @ w.t()
        loss = loss_fn(pred, labels)
        if mode != "eager-kept":
            del pred
        loss.backward()

    step()  # warm-up (compilation)
    x.grad = w.grad = None
    return peak_live_bytes(step) / (T * V)


def measure() -> dict:
    cases = [{"mode": mode, "dtype": dtype, "bytes_per_logit": round(loss_bytes_per_logit(mode, dtype), 3)}
             for mode, dtype in (("eager", "bf16"), ("eager", "fp32"), ("eager-kept", "bf16"),
                                 ("compiled", "bf16"), ("compiled", "fp32"))]
    return {"torch": torch.__version__, "tokens": T, "vocab": V, "hidden": H, "loss": cases}


if __name__ == "__main__":
    data = measure()
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    json.dump(data, sys.stdout, indent=1)
