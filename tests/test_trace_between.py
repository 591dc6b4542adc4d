"""A model whose forward calls a module between two of its repeated blocks (issue 19).

The traced pipeline runs each stage's blocks as one unbroken run: the stage holding the
block before such a module stops after that block, and the next stage runs the module on
a pass-through it then discards - the module would never train. The runtime refuses it on
every stage in one line and the cost model refuses pp for its trace; pp=1 plans still work.

Oracles: the loss of the same toy trained in one process (the runtime's refusal is guarded
by showing that, with the refusal switched off, the pipelined loss is not the true loss),
and the hand-written toy's structure (which module sits between which blocks).
"""
from __future__ import annotations

import os
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from partita.errors import PartitaError
from partita.estimate import estimate
from partita.plan import Plan
from partita.spec.hardware import make_cluster
from partita.tracing import trace


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return x + torch.tanh(self.lin(x))


class Toy(nn.Module):
    """embed, blocks 0-1, ``mid`` (a linear layer) when ``between``, blocks 2-3, head."""

    def __init__(self, between: bool, d: int = 16):
        super().__init__()
        self.between = between
        self.embed, self.head = nn.Linear(8, d), nn.Linear(d, 4)
        self.blocks = nn.ModuleList(Block(d) for _ in range(4))
        self.mid = nn.Linear(d, d)

    def forward(self, x):
        x = self.embed(x)
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i == 1 and self.between:
                x = self.mid(x)
        return self.head(x if self.between else self.mid(x))


def _loss(out, chunk):
    return (out.float() ** 2).mean()


def test_trace_and_cost_model_refuse_pp_for_a_module_between_blocks():
    cluster = make_cluster("h100-sxm", devices=8)
    between = trace(Toy(True), torch.zeros(2, 8))
    after = trace(Toy(False), torch.zeros(2, 8))  # same modules, mid after the last block: the head
    assert not between.pipeline and after.pipeline and between.layers == after.layers == 4
    assert between.total_params == after.total_params == sum(p.numel() for p in Toy(True).parameters())
    with pytest.raises(PartitaError, match="calls a module between two of them") as e:
        estimate(between, cluster, Plan(dp=4, pp=2, gbs=8))
    assert "\n" not in str(e.value)
    assert estimate(after, cluster, Plan(dp=4, pp=2, gbs=8)).step_time_s > 0
    assert estimate(between, cluster, Plan(dp=8, zero=3, gbs=8)).step_time_s > 0


def _worker(rank: int, port: int, refuse: bool, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    from partita.runtime import traced_pipeline
    from partita.runtime.traced import parallelize_traced
    if not refuse:
        traced_pipeline.TracedPipeline._refuse_between = lambda self, paths: None
    torch.manual_seed(0)
    model, inputs = Toy(True), torch.randn(4, 8)
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
    try:
        pm = parallelize_traced(model, Plan(pp=2, mbs=2, gbs=4, dtype="fp32"), make_optimizer=sgd,
                                device_type="cpu", example_inputs=(inputs[:2],))
        queue.put((rank, "loss", pm.train_step((inputs,), _loss)))
    except PartitaError as e:
        queue.put((rank, "error", str(e)))
    except Exception as e:  # reported, not waited for
        queue.put((rank, "crash", repr(e)))
    finally:
        dist.destroy_process_group()


def _run(refuse: bool) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, port, refuse, queue)) for r in range(2)]
    for p in procs:
        p.start()
    out = dict((r, (kind, value)) for r, kind, value in (queue.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(60)
    return out


@pytest.mark.timeout(240)
def test_runtime_refuses_a_module_between_blocks_on_every_stage():
    torch.manual_seed(0)
    model, inputs = Toy(True), torch.randn(4, 8)
    true_loss = float(_loss(model(inputs), inputs).detach())
    unguarded = _run(refuse=False)  # what the refusal prevents: mid trained nowhere, a wrong loss
    assert {kind for kind, _ in unguarded.values()} == {"loss"}, unguarded
    assert abs(unguarded[0][1] - true_loss) > 1e-3 * abs(true_loss), (unguarded, true_loss)
    refused = _run(refuse=True)
    assert [refused[r][0] for r in (0, 1)] == ["error", "error"], refused
    assert "calls mid between two of its blocks" in refused[1][1] and "use pp=1" in refused[0][1]
    assert all("\n" not in text for _, text in refused.values())
