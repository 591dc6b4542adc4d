"""Which decoder layers each pipeline stage of a Megatron-LM / MindSpeed-LLM command line
builds (issue 32 item 3): the plan's ``layer_split`` as the framework runs it.

Each layout flag is read the way its framework reads it (facts cited, no code copied):

- ``--pipeline-model-parallel-layout``: Megatron-Core's grammar
  (megatron/core/transformer/pipeline_parallel_layer_layout.py,
  ``PipelineParallelLayerLayout.parse_str_to_list``, NVIDIA/Megatron-LM@d98e8a6): commas are
  cosmetic; ``(...)*n`` repeats a group (``|`` inside it included) and ``x*n`` one character;
  ``|`` separates virtual stages; ``E`` embedding, ``L`` loss, ``t`` a decoder layer, ``m`` an MTP
  layer. The stage list is in layer order, virtual-stage major (entry ``v*pp + r`` is rank ``r``'s
  chunk ``v``), which is Partita's ``layer_split`` order; ``validate_layer_layout`` requires one
  ``E`` first, one ``L`` last and ``num_layers`` ``t``'s.
- ``--decoder-first/last-pipeline-num-layers``: those counts on the first/last pipeline rank, the
  rest spread evenly over the other ranks, each rank's layers then split evenly over its virtual
  stages (megatron/core/transformer/transformer_block.py ``get_num_layers_to_build``).
- ``--account-for-embedding/loss-in-pipeline-split``: the embedding (loss) counts as one layer
  of the even split, so the first (last) stage builds one decoder layer fewer (same function).
- ``--num-layer-list`` (MindSpeed-LLM, mindspeed_llm/core/transformer/transformer_block.py
  ``get_num_layers_to_build``): the layers of each pipeline rank; one entry per rank.
- ``--noop-layers`` (MindSpeed, mindspeed/features_manager/pipeline_parallel/noop_layers.py): the
  listed layer indices (counted in ``--num-layers``) are identity layers: they occupy a place in
  the split and cost nothing, so the model has ``num_layers - len(noop)`` layers.
- ``--schedules-method dualpipev`` (MindSpeed, mindspeed/core/pipeline_parallel/dualpipev/
  dualpipev_chunks.py ``get_transformer_layer_offset``): rank ``r`` holds two chunks of
  ``num_layers / (2 pp)`` layers, ``[r c, (r+1) c)`` and ``[L - (r+1) c, L - r c)``; read as
  ``schedule="dualpipev"`` with vpp 2, the ``2 pp`` chunks in layer order (chunk ``j`` on rank ``j``,
  or ``2 pp - 1 - j`` past the turn: :func:`partita.plan.chunk_ranks`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import PartitaError

#: Megatron-Core's layer characters (``char2layer_type`` in parse_str_to_list).
LAYOUT_CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}


def parse_pipeline_layout(text: str) -> list[str]:
    """The stages of a ``--pipeline-model-parallel-layout`` string, each as its layer characters.

    Megatron-Core unrolls ``(group)*n`` first (innermost, non-nested groups, one pass) and then
    ``x*n``; ``"Ettt|(tt|)*29,m|L"`` is ``["Ettt"] + ["tt"]*29 + ["m", "L"]``."""
    flat = text.replace(",", "")
    flat = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), flat)
    flat = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), flat)
    stages = flat.split("|")
    for stage in stages:
        bad = sorted(set(stage) - set(LAYOUT_CHARS))
        if bad:
            raise PartitaError(f"--pipeline-model-parallel-layout {text!r}: invalid layer character {bad[0]!r} "
                               f"(Megatron knows {', '.join(LAYOUT_CHARS)}: embedding, loss, decoder, MTP)")
    return stages


def layout_split(text: str, pp: int, num_layers: int | None) -> tuple[tuple[int, ...], int]:
    """(decoder layers per virtual stage, vpp) of a layout, checked as Megatron checks it
    (arguments.py: the stage count divisible by pp; ``validate_layer_layout``: one E first,
    one L last, the decoder count equal to ``--num-layers``)."""
    stages = parse_pipeline_layout(text)
    flat = "".join(stages)
    if len(stages) % pp:
        raise PartitaError(f"--pipeline-model-parallel-layout has {len(stages)} stages, not a multiple of "
                           f"--pipeline-model-parallel-size {pp}")
    if not flat.startswith("E") or not flat.endswith("L") or flat.count("E") != 1 or flat.count("L") != 1:
        raise PartitaError(f"--pipeline-model-parallel-layout {text!r}: Megatron needs exactly one E (embedding) "
                           "as the first layer and one L (loss) as the last")
    split = tuple(stage.count("t") for stage in stages)
    if num_layers is not None and sum(split) != num_layers:
        raise PartitaError(f"--pipeline-model-parallel-layout has {sum(split)} decoder layers (t), "
                           f"--num-layers is {num_layers}")
    return split, len(stages) // pp


@dataclass(frozen=True)
class LayoutFlags:
    """The layout flags of one command line (None / empty where absent)."""

    num_layers: int | None
    pp: int
    vpp: int = 1
    first: int | None = None
    last: int | None = None
    account_embedding: bool = False
    account_loss: bool = False
    num_layer_list: tuple[int, ...] | None = None
    noop: frozenset[int] = frozenset()
    dualpipev: bool = False


def rank_layers(f: LayoutFlags) -> list[int]:
    """Layers (noop ones included) of each pipeline rank, before the virtual split."""
    n, pp = f.num_layers or 0, f.pp
    if f.num_layer_list is not None:
        if len(f.num_layer_list) != pp or sum(f.num_layer_list) != n:
            raise PartitaError(f"--num-layer-list {','.join(map(str, f.num_layer_list))} needs one entry per pipeline "
                               f"rank ({pp}) summing to --num-layers {n}")
        return list(f.num_layer_list)
    if f.first is not None or f.last is not None:
        left = n - (f.first or 0) - (f.last or 0)
        ranks = pp - (f.first is not None) - (f.last is not None)
        if left < 0 or (ranks > 0 and left % ranks) or (ranks == 0 and left):
            raise PartitaError(f"--decoder-first/last-pipeline-num-layers leave {left} of {n} layers for {ranks} "
                               "middle pipeline ranks: Megatron needs them to divide evenly")
        each = left // ranks if ranks else 0
        return [f.first if r == 0 and f.first is not None else f.last if r == pp - 1 and f.last is not None
                else each for r in range(pp)]
    total = n + f.account_embedding + f.account_loss
    if total % pp:
        raise PartitaError(f"--num-layers {n} is not divisible by --pipeline-model-parallel-size {pp} "
                           "(Megatron asserts it; give --decoder-first/last-pipeline-num-layers or a layout)")
    return [total // pp] * pp


def chunk_ranges(f: LayoutFlags) -> list[range]:
    """The layer indices of each virtual stage in pipeline order (noop layers included); with
    dualpipev, rank ``r``'s first chunk at ``r`` and its second at ``pp + r``."""
    if f.dualpipev:
        n = f.num_layers or 0
        c = n // (2 * f.pp)
        if n % (2 * f.pp):
            raise PartitaError(f"--schedules-method dualpipev splits --num-layers {n} into 2 x pp = {2 * f.pp} "
                               "equal chunks; it does not divide")
        return [range(r * c, (r + 1) * c) for r in range(f.pp)] + \
               [range(n - (r + 1) * c, n - r * c) for r in range(f.pp)]
    per_rank = rank_layers(f)
    if any(k % f.vpp for k in per_rank):
        raise PartitaError(f"layers per pipeline rank {per_rank} do not split into {f.vpp} virtual stages")
    chunks = [k // f.vpp for k in per_rank]
    # Embedding/loss counted as a layer: the first (last) chunk builds one decoder layer fewer.
    ranges, start = [], 0
    for v in range(f.vpp):
        for r in range(f.pp):
            size = chunks[r] - (f.account_embedding and v == 0 and r == 0) \
                - (f.account_loss and v == f.vpp - 1 and r == f.pp - 1)
            ranges.append(range(start, start + size))
            start += size
    return ranges


def split_of(f: LayoutFlags) -> tuple[int, ...] | None:
    """``layer_split`` of the flags (real layers per virtual stage), or None where the split is
    Megatron's even one (Partita's default) and no noop layer sits in it."""
    plain = (f.first is None and f.last is None and f.num_layer_list is None and not f.noop and not f.dualpipev
             and not f.account_embedding and not f.account_loss)
    if plain or f.num_layers is None:
        return None
    ranges = chunk_ranges(f)
    if f.dualpipev:  # the V's chunks in layer order: the first pp as they come, the returning pp reversed
        ranges = ranges[:f.pp] + ranges[f.pp:][::-1]
    split = tuple(sum(1 for i in r if i not in f.noop) for r in ranges)
    return None if f.dualpipev and len(set(split)) == 1 else split
