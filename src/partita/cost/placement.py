"""Placement over pipeline stages: which layers each pipeline rank holds, and the distinct
rank shapes the memory and time formulas walk.

A virtual-stage split (``plan.stage_layers``) assigns contiguous layers to ``pp x vpp``
chunks, and the schedule places chunk ``j`` on a pipeline rank: ``j mod pp`` for 1F1B and
interleaving (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", sec. 2.2.2: the interleaved schedule gives each device several
non-contiguous chunks), DualPipeV's V otherwise. That placement is defined once,
:func:`partita.plan.chunk_ranks`, which the runtime builds its stages from too; the
functions here take it (``owner``: the rank of each chunk) rather than a flag naming the
shape, so a schedule with another placement is priced as it places its chunks. A rank's cost
depends on its layers only through how many there are, how many are MoE, which end
layers it holds, and (with ``plan.recompute_layers``) how many of them are recomputed -
its :class:`RankShape`; ranks of one shape cost the same but for their in-flight
micro-batches (:func:`.pipeline.in_flight_chunks`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..errors import PartitaError
from ..plan import Plan, chunk_ranks
from ..spec.model import ModelSpec
from .memo import memoised


def placement(plan: Plan) -> tuple[int, ...]:
    """The pipeline rank of each of the plan's chunks, in layer order: its schedule's own
    placement, :func:`partita.plan.chunk_ranks` (memoised: the search asks for it per plan)."""
    return _placement(plan.pp, plan.vpp, plan.schedule)


@lru_cache(maxsize=1024)
def _placement(pp: int, vpp: int, schedule: str) -> tuple[int, ...]:
    return chunk_ranks(pp, vpp, schedule)


def _check_owner(pp: int, split: tuple[int, ...], owner: tuple[int, ...]) -> None:
    """Refuse a placement that does not put every chunk of ``split`` on one of the ``pp``
    ranks, as :class:`PartitaError` (one line, like every other refused plan) rather than
    an index error deep in the rank walk."""
    if len(owner) != len(split) or any(not 0 <= r < pp for r in owner):
        raise PartitaError(f"chunk placement {owner} does not place the {len(split)} chunks of the split on {pp} ranks")


@lru_cache(maxsize=4096)
def all_rank_layers(layers: int, pp: int, split: tuple[int, ...],
                    owner: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Layer indices of every pipeline rank for a given virtual-stage split, chunk ``j`` on
    rank ``owner[j]`` (:func:`placement`)."""
    _check_owner(pp, split, owner)
    out: list[list[int]] = [[] for _ in range(pp)]
    start = 0
    for j, n in enumerate(split):
        out[owner[j]].extend(range(start, start + n))
        start += n
    return tuple(tuple(ids) for ids in out)


@dataclass(frozen=True)
class RankShape:
    """What a pipeline rank holds: its layers (and how many are MoE), and whether it
    carries the embedding (first) or the output layer (last)."""

    n_layers: int
    n_moe: int
    edge_moe: tuple[bool, ...]  # MoE flags of its first and last layer (for the transient)
    first: bool
    last: bool
    #: with ``plan.recompute_layers`` N > 0: how many of the rank's dense / MoE layers are
    #: the first N of one of its chunks (:func:`recomputed_layers`); 0 otherwise
    rc_dense: int = 0
    rc_moe: int = 0


def rank_shapes(model: ModelSpec, plan: Plan) -> tuple[RankShape, ...]:
    """The :class:`RankShape` of every pipeline rank (memoised per model and split)."""
    return _rank_shapes(model, plan.pp, plan.stage_layers(model.layers), placement(plan), plan.recompute_layers)


def recomputed_layers(layers: int, pp: int, split: tuple[int, ...], n: int,
                      owner: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Layer indices each pipeline rank recomputes when only ``n`` layers per stage are
    (``plan.recompute_layers``): the first ``min(n, len)`` layers of every virtual chunk
    (``split`` entry) the rank runs. Megatron-LM's block method, TransformerBlock
    ``_checkpointed_forward``: ``for layer_idx in range(num_layers_per_pipeline_rank):
    if layer_idx < recompute_num_layers: checkpoint(layer) else: layer(...)``, where the
    block is one model chunk (with vpp, one virtual stage) - so the first N of each. With
    fp8 Megatron moves the window past leading layers whose input needs no gradient
    (``recompute_skip_num_layers``); the count, which is what memory and time depend on,
    stays N. Chunk ``j`` is on rank ``owner[j]`` (:func:`placement`)."""
    _check_owner(pp, split, owner)
    out: list[list[int]] = [[] for _ in range(pp)]
    start = 0
    for j, size in enumerate(split):
        out[owner[j]].extend(range(start, start + min(n, size)))
        start += size
    return tuple(tuple(ids) for ids in out)


@memoised
def _rank_shapes(model: ModelSpec, pp: int, split: tuple[int, ...], owner: tuple[int, ...],
                 rc_layers: int = 0) -> tuple[RankShape, ...]:
    flags = model.moe_flags
    out = []
    rc = recomputed_layers(model.layers, pp, split, rc_layers, owner) if rc_layers else ((),) * pp
    # the embedding is on the first chunk's rank, the output layer and the loss on the last
    # chunk's (DualPipeV: both on rank 0)
    first_rank, last_rank = owner[0], owner[-1]
    for r, ids in enumerate(all_rank_layers(model.layers, pp, split, owner)):
        edges = tuple(flags[i] for i in sorted({ids[0], ids[-1]})) if ids else ()
        rc_moe = sum(flags[i] for i in rc[r])
        out.append(RankShape(len(ids), sum(flags[i] for i in ids), edges, r == first_rank, r == last_rank,
                             len(rc[r]) - rc_moe, rc_moe))
    return tuple(out)


def distinct_shapes(model: ModelSpec, plan: Plan) -> tuple[tuple[int, RankShape, int], ...]:
    """(first rank, shape, number of ranks) for each distinct rank shape (memoised). Ranks
    of one shape differ only in their in-flight micro-batches, which never grow with the
    rank (see :func:`.pipeline.in_flight_chunks`), so the first is the most loaded."""
    return _distinct_shapes(model, plan.pp, plan.stage_layers(model.layers), placement(plan), plan.recompute_layers)


@memoised
def _distinct_shapes(model: ModelSpec, pp: int, split: tuple[int, ...], owner: tuple[int, ...],
                     rc_layers: int = 0) -> tuple[tuple[int, RankShape, int], ...]:
    first: dict[RankShape, int] = {}
    count: dict[RankShape, int] = {}
    for r, shape in enumerate(_rank_shapes(model, pp, split, owner, rc_layers)):
        first.setdefault(shape, r)
        count[shape] = count.get(shape, 0) + 1
    return tuple((r, shape, count[shape]) for shape, r in first.items())
