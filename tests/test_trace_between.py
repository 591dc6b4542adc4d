"""Pipeline cuts of a model whose forward does more than call its blocks (issue 19).

Between two of its blocks the toy's forward calls a module (``mid``, a linear layer) and
runs plain tensor code, and its head reuses the stem's output. The traced pipeline stops a
stage at the call of the next stage's first block, so both run on the stage of the block
before them; the cost model places them there too (trained) and on later stages (forward
only, on a pass-through). A model that uses a tensor across a block - a long skip
connection, a residual taken around a block from outside it - cannot be cut: the tracer
names it, the cost model refuses pp for it, and every pipeline rank refuses it in one line.

Oracles, all from outside the code under test: the toy trained in one process with SGD
(losses over three steps, 1e-5), torch ``FlopCounterMode``'s count of each rank's real
training step, the parameters each rank really holds, ``mid``'s parameter count summed
from its tensors and its FLOPs counted by ``FlopCounterMode`` on one call, and - for the
refusal - the pipelined loss with the refusal switched off, which is not the true loss.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from partita.errors import PartitaError
from partita.estimate import estimate
from partita.plan import Plan
from partita.spec.hardware import make_cluster
from partita.tracing import trace

STEPS = 3
CASES = {  # name -> (model, plan over 4 ranks)
    "pp4": ("Between", Plan(pp=4, mbs=1, gbs=4, zero=0, dtype="fp32")),  # 1f1b, the default
    "pp4-gpipe": ("Between", Plan(pp=4, mbs=1, gbs=4, zero=0, schedule="gpipe", dtype="fp32")),
    "pp4-m1": ("Between", Plan(pp=4, mbs=4, gbs=4, zero=0, dtype="fp32")),  # saved bytes of one micro-batch
    "pp2xdp2": ("Between", Plan(pp=2, dp=2, mbs=1, gbs=4, zero=0, dtype="fp32")),
    "pp2xdp2-zero1": ("Between", Plan(pp=2, dp=2, mbs=1, gbs=4, zero=1, dtype="fp32")),
    "pp2xdp2-zero3": ("Between", Plan(pp=2, dp=2, zero=3, mbs=1, gbs=4, dtype="fp32")),
    "stem-again": ("StemAgain", Plan(pp=4, mbs=2, gbs=4, zero=0, dtype="fp32")),
    "skip": ("Skip", Plan(pp=4, mbs=2, gbs=4, dtype="fp32")),
    "skip-unguarded": ("Skip", Plan(pp=4, mbs=2, gbs=4, dtype="fp32")),
}


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        out = x + torch.tanh(self.lin(x))
        return out * self.gate if hasattr(self, "gate") else out


class Between(nn.Module):
    """embed, blocks 0-1, ``mid``, block 2, plain tensor code, block 3, head."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.embed, self.head = nn.Linear(8, d), nn.Linear(d, 4)
        self.blocks = nn.ModuleList(Block(d) for _ in range(4))
        self.mid = nn.Linear(d, d)

    def forward(self, x):
        x = self.embed(x)
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i == 1:
                x = self.mid(x)
            if i == 2:
                x = 0.5 * x + torch.sin(x)
        return self.head(x)


class StemAgain(Between):
    """The head reads the stem's output again: recomputed on every stage, so not a crossing."""

    def forward(self, x):
        h0 = x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x + h0)


class Skip(Between):
    """The output of block 0 added again before the head: a skip connection around blocks 1-3."""

    def forward(self, x):
        x = self.embed(x)
        first = None
        for block in self.blocks:
            x = block(x)
            first = x if first is None else first
        return self.head(x + first)


class Around(Between):
    """A residual around block 2, taken outside it."""

    def forward(self, x):
        x = self.embed(x)
        for i, block in enumerate(self.blocks):
            x = block(x) + x if i == 2 else block(x)
        return self.head(x)


class LastDiffers(Between):
    """The last block has one more parameter (SD3's last joint block drops its context branch:
    the same class, other parameter shapes)."""

    def __init__(self, d: int = 16):
        super().__init__(d)
        self.blocks[3].gate = nn.Parameter(torch.ones(d))


class TwoLists(Between):
    """Blocks in two containers, as a UNet's transformer blocks sit in one list per resolution."""

    def __init__(self, d: int = 16):
        super().__init__(d)
        self.down, self.up = nn.ModuleList(Block(d) for _ in range(2)), nn.ModuleList(Block(d) for _ in range(2))
        del self.blocks

    def forward(self, x):
        x = self.embed(x)
        for block in [*self.down, *self.up]:
            x = block(x)
        return self.head(x)


def test_blocks_that_are_not_one_run_are_refused_naming_why():
    from partita.runtime.traced_pipeline import TracedPipeline
    cluster = make_cluster("h100-sxm", devices=8)
    for model, why in ((LastDiffers(), "blocks.3 has other parameter shapes than blocks.0"),
                       (TwoLists(), "its 4 blocks lie in 2 containers (down, up)")):
        spec = trace(model, torch.zeros(2, 8))
        assert not spec.pipeline and why in spec.pipeline_blocker, spec.pipeline_blocker
        with pytest.raises(PartitaError, match="use pp=1") as e:
            estimate(spec, cluster, Plan(dp=4, pp=2, gbs=8))
        assert why in str(e.value) and "\n" not in str(e.value)
        with pytest.raises(PartitaError, match="use pp=1") as e:  # the runtime, before any process group
            TracedPipeline(model, Plan(pp=2), None, None)
        assert why in str(e.value)


def _loss(out, chunk):
    return (out.float() ** 2).mean()


def _sum_loss(out, chunk):  # saves nothing itself: the stage's saved bytes are its model's alone
    return out.float().sum()


def _batch(step: int) -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(100 + step))


def _reference(name: str) -> list[float]:
    torch.manual_seed(0)
    model = globals()[name]()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        loss = _loss(model(_batch(step)), None)
        loss.backward()
        sgd.step()
        sgd.zero_grad()
        losses.append(float(loss))
    return losses


def test_trace_places_the_module_between_blocks_and_names_what_cannot_be_cut():
    spec = trace(Between(), torch.zeros(2, 8))
    mid = Between().mid
    with FlopCounterMode(display=False) as counter:
        mid(torch.zeros(2, 16))
    assert spec.pipeline and spec.pipeline_blocker == ""
    assert spec.between == (("mid", sum(p.numel() for p in mid.parameters()), counter.get_total_flops(),
                             2.0 * counter.get_total_flops(), (2,)),)  # called after 2 blocks entered
    assert spec.head_params == sum(p.numel() for p in Between().head.parameters())  # mid is not the head's
    cluster = make_cluster("h100-sxm", devices=8)
    assert estimate(spec, cluster, Plan(dp=2, pp=4, gbs=8)).step_time_s > 0
    for model, where in ((Skip(), "made by or fed to block blocks.0"), (Around(), "made by or fed to block blocks.1")):
        cut = trace(model, torch.zeros(2, 8))
        assert not cut.pipeline and where in cut.pipeline_blocker, cut.pipeline_blocker
        with pytest.raises(PartitaError, match="cannot cut .* skip connection") as e:
            estimate(cut, cluster, Plan(dp=4, pp=2, gbs=8))
        assert "\n" not in str(e.value) and "use pp=1" in str(e.value)
        assert estimate(cut, cluster, Plan(dp=8, zero=3, gbs=8)).step_time_s > 0


class _SavedBytes(torch.autograd.graph.saved_tensors_hooks):
    """How many micro-batches' activations autograd holds at once (``peak``): each forward of
    the stage's module starts a new pass (a forward pre-hook); each tensor saved for backward
    (parameters excluded) is counted for its pass when packed and uncounted when autograd frees
    it (the packed holder is deleted with its graph, after that micro-batch's backward)."""

    def __init__(self, module: nn.Module):
        self.params = {p.untyped_storage().data_ptr() for p in module.parameters()}
        self.live: dict[int, int] = {}  # pass -> saved tensors alive
        self.passes = self.peak = 0
        self.storages: dict[int, list[int]] = {}  # storage -> [saved tensors alive on it, its bytes]
        self.bytes = 0  # bytes of the distinct storages saved tensors hold now
        module.register_forward_pre_hook(lambda mod, args: setattr(self, "passes", self.passes + 1))
        owner = self

        class Held:
            def __init__(self, t: torch.Tensor):
                self.t, self.which, self.key = t, owner.passes, t.untyped_storage().data_ptr()
                owner.live[self.which] = owner.live.get(self.which, 0) + 1
                owner.peak = max(owner.peak, sum(1 for n in owner.live.values() if n))
                entry = owner.storages.setdefault(self.key, [0, t.untyped_storage().nbytes()])
                owner.bytes += entry[1] if entry[0] == 0 else 0
                entry[0] += 1

            def __del__(self):
                owner.live[self.which] -= 1
                entry = owner.storages[self.key]
                entry[0] -= 1
                owner.bytes -= entry[1] if entry[0] == 0 else 0

        def pack(t: torch.Tensor):
            return t if t.untyped_storage().data_ptr() in self.params else Held(t)

        super().__init__(pack, lambda h: h.t if isinstance(h, Held) else h)


def _run_case(case: str, rank: int) -> tuple[str, object]:
    """One case on this rank of a 4-rank gloo process group that is up: ("ok", (losses, FLOPs per
    step, parameters held, saved bytes after the forwards, stage, peak saved bytes)), ("error",
    the PartitaError's text) or ("crash", the traceback)."""
    torch.set_num_threads(1)
    from partita.runtime.traced_pipeline import TracedPipeline
    from partita.runtime.traced import parallelize_traced
    check = TracedPipeline._check_cuts
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
    name, plan = CASES[case]
    TracedPipeline._check_cuts = (lambda self, chunk: None) if case == "skip-unguarded" else check
    torch.manual_seed(0)
    model = globals()[name]()
    replica = (rank // plan.tp) % plan.dp
    share = 4 // plan.dp
    try:
        pm = parallelize_traced(model, plan, make_optimizer=sgd, device_type="cpu",
                                example_inputs=(_batch(0)[:plan.mbs],))
        losses, flops = [], []
        saved = _SavedBytes(pm.module) if plan.zero == 0 else contextlib.nullcontext()  # FSDP: DTensors
        forwarded = []  # saved bytes once every forward of the measured step is done
        first_backward = pm._backward
        pm._backward = lambda *a: (forwarded.append(getattr(saved, "bytes", None)), first_backward(*a))[1]
        for step in range(STEPS + 1):
            batch = (_batch(step)[replica * share:(replica + 1) * share],)
            if step == STEPS:  # apart: FlopCounterMode keeps the step's graphs alive until it exits
                forwarded.clear()
                with saved:
                    pm.train_step(batch, _sum_loss if case == "pp4-m1" else _loss)
                continue
            with FlopCounterMode(display=False) as counter:
                losses.append(pm.train_step(batch, _loss))
            flops.append(counter.get_total_flops())
        held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in pm.module.parameters())
        return "ok", (losses, flops, held, forwarded[0], pm.stage, getattr(saved, "peak", None))
    except PartitaError as e:
        return "error", str(e)
    except Exception as e:  # reported, not waited for
        import traceback
        return "crash", f"{e!r}\n{traceback.format_exc()}"
    finally:
        TracedPipeline._check_cuts = check  # the processes run other test files' cases next


#: every case runs on the session's shared 4-rank processes (tests/conftest.py ``equivalence``;
#: :func:`shared_case`), not on 4 processes spawned for this file
EQUIVALENCE_CASES = [(4, 0, case, str(Path(__file__).resolve())) for case in CASES]


def shared_case(case: str) -> dict:
    """:func:`_run_case` on every rank of the shared 4-rank process group; each rank's
    (kind, value), gathered."""
    got: list = [None] * dist.get_world_size()
    dist.all_gather_object(got, _run_case(case, dist.get_rank()))
    return {"ranks": got}


@pytest.fixture(scope="module")
def runs(equivalence) -> dict:
    """case -> {rank: (kind, value)} (:func:`_run_case`)."""
    return {spec[2]: {rank: tuple(kv) for rank, kv in enumerate(equivalence["results"][spec]["ranks"])}
            for spec in EQUIVALENCE_CASES}


@pytest.mark.timeout(400)
@pytest.mark.parametrize("case", ["pp4", "pp4-gpipe", "pp2xdp2", "pp2xdp2-zero1", "pp2xdp2-zero3"])
def test_pipeline_cut_after_between_work_trains_like_one_process(runs, case):
    from partita.cost.traced import _stage_params, stage_blocks, traced_step_time
    name, plan = CASES[case]
    result = runs[case]
    assert {kind for kind, _ in result.values()} == {"ok"}, result
    true = _reference(name)
    for rank, (_, (losses, *_)) in result.items():
        assert losses == pytest.approx(true, rel=1e-5, abs=1e-7), (case, rank, losses, true)
    spec = trace(Between(), torch.zeros(2, 8))
    step = traced_step_time(spec, make_cluster("h100-sxm", devices=4), plan)
    ranges = stage_blocks(spec, plan)
    for rank, (_, (_, flops, held, _, stage, _)) in result.items():
        assert flops == [pytest.approx(step.stages[stage].flops * plan.grad_accum, rel=1e-9)] * STEPS, (case, rank)
        if plan.zero == 0:  # the parameters this rank holds, as the cost model counts them
            assert held == _stage_params(spec, plan, ranges[stage], stage)[0], (case, rank)


@pytest.mark.timeout(400)
def test_1f1b_holds_the_micro_batches_the_cost_model_says(runs):
    """Micro-batches whose activations a stage holds at once, counted with saved-tensor hooks
    over real steps: 1F1B ``min(m, pp - stage)``, GPipe all ``m`` - the in-flight counts the
    traced cost model multiplies its per-micro-batch bytes by
    (:func:`partita.cost.pipeline.in_flight_chunks`)."""
    from partita.cost.pipeline import in_flight_chunks
    plan = CASES["pp4"][1]
    for case, schedule in (("pp4", "1f1b"), ("pp4-gpipe", "gpipe")):
        for rank, (_, (*_, stage, held)) in runs[case].items():
            assert held == in_flight_chunks(schedule, plan.pp, 1, plan.grad_accum, stage), (case, rank, held)
    assert [runs["pp4"][r][1][-1] for r in range(4)] == [4, 3, 2, 1]


@pytest.mark.timeout(400)
def test_each_stage_keeps_the_activations_the_cost_model_places_on_it(runs):
    """Bytes of the distinct storages autograd holds for backward on each stage once the
    forward of one micro-batch is done (saved-tensor hooks over a real step, pp=4, m=1): the
    stem's saved input on the first stage, ``mid``'s and the tensor code's on the stages of
    the blocks before them, the head's on the last - the traced cost model's activation term of
    each stage, to the byte."""
    from partita.cost.traced import traced_memory
    plan = CASES["pp4-m1"][1]
    spec = trace(Between(), torch.zeros(plan.mbs, 8))  # the micro-batch's shape: no scaling
    predicted = [r.parts["activations"] for r in traced_memory(spec, make_cluster("h100-sxm", devices=4).device, plan)]
    measured = {stage: saved for _, (_, (_, _, _, saved, stage, _)) in runs["pp4-m1"].items()}
    assert [measured[s] for s in range(4)] == predicted, (measured, predicted)
    assert len(set(predicted)) > 1  # the stages differ: the placement matters


@pytest.mark.timeout(400)
def test_the_stems_output_read_again_by_the_head_is_no_crossing(runs):
    """The last stage recomputes the stem, so its head reads the real value; the stem's
    gradient from that path is computed there and summed with the first stage's over the
    stages (``_sum_shared_gradients``): one process's losses."""
    assert trace(StemAgain(), torch.zeros(2, 8)).pipeline
    result = runs["stem-again"]
    assert {kind for kind, _ in result.values()} == {"ok"}, result
    true = _reference("StemAgain")
    for rank, (_, (losses, *_)) in result.items():
        assert losses == pytest.approx(true, rel=1e-5, abs=1e-7), (rank, losses, true)


@pytest.mark.timeout(400)
def test_runtime_refuses_a_skip_connection_on_every_stage(runs):
    refused, unguarded = runs["skip"], runs["skip-unguarded"]
    assert [refused[r][0] for r in range(4)] == ["error"] * 4, refused
    assert all("cannot cut Skip between its blocks" in text and "skip connection" in text and "use pp=1" in text
               and "\n" not in text for _, text in refused.values()), refused
    # what the refusal prevents: the pass-through's garbage added before the head, a wrong loss
    assert {kind for kind, _ in unguarded.values()} == {"ok"}, unguarded
    true = _reference("Skip")
    assert abs(unguarded[0][1][0][0] - true[0]) > 1e-3 * abs(true[0]), (unguarded[0], true)

