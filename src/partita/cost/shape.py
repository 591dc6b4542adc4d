"""The frozen shapes the cost formulas take instead of the whole :class:`~partita.plan.Plan`.

Shapes are NamedTuples: immutable records with named fields whose hashing and equality
run in C (the search looks them up ~10^5 times per run). Each memo table holds one
shape type, so two shapes never compare as plain tuples.

Each formula depends on a handful of plan fields; it receives exactly those, as a
frozen record, and its memo key is that record (:func:`.memo.memoised`). A formula
therefore cannot read a field its cache key misses, and the search, which evaluates
thousands of plans that share these shapes, computes each term once per shape.

* :class:`LayerShape` - one layer's forward cost and activation bytes on one rank
  (degrees that split the layer, the micro-batch, precision);
* :class:`CollectiveSpans` - where the per-micro-batch collectives' groups sit on the
  node/network topology;
* :class:`StageShape` - a pipeline stage's per-micro-batch terms (the layer shape plus
  recompute, overlap and spans);
* :class:`ParamShape` - how a rank's parameters are split (tp, ep, pipelined);
* :class:`Zero3Shape` - ZeRO-3's per-micro-batch gather/scatter traffic of one rank.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from ..plan import Plan, ep_folded, group_span
from .frameworks import FRAMEWORKS, selective_modules


class LayerShape(NamedTuple):
    """What one layer's per-micro-batch cost on one rank depends on."""

    tp: int
    cp: int
    ep: int
    mbs: int
    seq_len: int
    sp: bool
    dtype: str
    framework: str = "megatron"  # cost/frameworks.py: what the layer saves and recomputes
    etp: int = 1  # expert tensor parallel: each routed expert's FFN split etp ways (plan.py)
    sample_len: int = 0  # packed samples' sum(L^2)/sum(L): the attention span per sample (plan.py; 0: seq_len)
    attention: str = "fused"  # plan.attention: "unfused" prices the score matrix (compute.unfused_attention_core)
    fp8_recipe: str = "tensorwise"  # plan.fp8_recipe: where torchao casts a tp input (compute.fp8_tp_gathered)

    @property
    def tokens(self) -> float:
        """Tokens this rank's GEMMs see per micro-batch (cp splits the sequence; SP
        gathers the tp shards back before each GEMM)."""
        return self.mbs * self.seq_len / self.cp


def layer_shape(plan: Plan) -> LayerShape:
    return LayerShape(plan.tp, plan.cp, plan.ep, plan.mbs, plan.seq_len, plan.sp, plan.dtype, plan.framework, plan.etp,
                      plan.sample_len, plan.attention, plan.fp8_recipe)


class CollectiveSpans(NamedTuple):
    """Where the per-micro-batch collectives run: the tp, ep and etp groups as (members per
    node, nodes), and whether a cp or pp neighbour sits on another node."""

    tp: tuple[int, int]
    cp_crosses: bool
    ep: tuple[int, int]
    pp_crosses: bool
    etp: tuple[int, int] = (1, 1)  # the expert tensor-parallel group: etp consecutive ranks
    cp: tuple[int, int] = (1, 1)  # the cp group (its all-gather form, cost/frameworks.py)


@lru_cache(maxsize=65536)
def collective_spans(pp: int, dp: int, cp: int, tp: int, ep: int, devices_per_node: int,
                     etp: int = 1) -> CollectiveSpans:
    """The spans of :class:`CollectiveSpans`, from :func:`partita.plan.axis_ranks` (with
    etp > 1 the ep group's members are etp apart and the etp group is etp consecutive
    ranks: Megatron-Core's expert order ``tp-ep-dp-pp``)."""
    plan = Plan(pp=pp, dp=dp, cp=cp, tp=tp, ep=ep, etp=etp)
    return CollectiveSpans(group_span(plan, "tp", devices_per_node), group_span(plan, "cp", devices_per_node)[1] > 1,
                           group_span(plan, "ep", devices_per_node), group_span(plan, "pp", devices_per_node)[1] > 1,
                           group_span(plan, "etp", devices_per_node) if etp > 1 else (1, 1),
                           group_span(plan, "cp", devices_per_node) if cp > 1 else (1, 1))


class StageShape(NamedTuple):
    """What a pipeline stage's per-micro-batch terms depend on (see :mod:`.step`)."""

    layer: LayerShape
    recompute: str
    tp_comm_overlap: bool
    pipelined: bool  # pp > 1: stages exchange activations
    spans: CollectiveSpans
    modules: frozenset = frozenset()  # Megatron modules selective recomputes (frameworks.selective_modules)


def stage_shape(plan: Plan, devices_per_node: int) -> StageShape:
    spans = collective_spans(plan.pp, plan.dp, plan.cp, plan.tp, plan.ep, devices_per_node, plan.etp)
    # the plan's tp overlap counts only where the framework can run it (cost/frameworks.py)
    overlap = plan.tp_comm_overlap and FRAMEWORKS[plan.framework].tp_comm_overlap
    return StageShape(layer_shape(plan), plan.recompute, overlap, plan.pp > 1, spans,
                      selective_modules(plan.framework, plan.recompute, plan.recompute_modules))


class ParamShape(NamedTuple):
    """How a rank's parameters are split: tp divides dense weights, ep x etp the routed
    experts (ep the expert count, etp each expert's FFN); with a pipeline the last stage
    keeps its own copy of a tied embedding."""

    tp: int
    ep: int
    pipelined: bool
    etp: int = 1


def param_shape(plan: Plan) -> ParamShape:
    return ParamShape(plan.tp, plan.ep, plan.pp > 1, plan.etp)


def _hsdp_shard(plan: Plan) -> int:
    """dp ranks one shard group holds (all of dp unless HSDP: ``0 < dp_shard < dp``)."""
    return plan.dp_shard if 0 < plan.dp_shard < plan.dp else plan.dp


def expert_dp_span(plan: Plan, devices_per_node: int) -> tuple[int, int]:
    """Span of the expert data-parallel group (dp*cp*tp/(ep*etp) ranks; with HSDP the shard
    group's dp_shard*cp*tp/(ep*etp), torchtitan's ``efsdp``): see :func:`_expert_dp_span_of`."""
    return _expert_dp_span_of(_hsdp_shard(plan), plan.cp, plan.tp, plan.ep, devices_per_node, ep_folded(plan),
                              plan.etp)


def shard_span(plan: Plan, devices_per_node: int) -> tuple[int, int]:
    """Span of the group the dense states are sharded over: dp x cp, or with HSDP the
    ``dp_shard x cp`` consecutive members of it (mesh order pp, dp, cp, tp: stride tp)."""
    return _span_of(plan.tp, _hsdp_shard(plan) * plan.cp, devices_per_node)


def replica_span(plan: Plan, devices_per_node: int) -> tuple[int, int]:
    """Span of the HSDP replica group: the ``dp / dp_shard`` ranks holding the same shard,
    ``dp_shard x cp x tp`` apart ((1, 1) without HSDP)."""
    shard = _hsdp_shard(plan)
    return _span_of(shard * plan.cp * plan.tp, plan.dp // shard, devices_per_node)


@lru_cache(maxsize=65536)
def _span_of(stride: int, size: int, dpn: int) -> tuple[int, int]:
    """(members per node, nodes) of ``size`` ranks ``stride`` apart from rank 0."""
    if size <= 1:
        return 1, 1
    nodes = len({(i * stride) // dpn for i in range(size)})
    return max(1, size // nodes), nodes


@lru_cache(maxsize=65536)
def _expert_dp_span_of(dp: int, cp: int, tp: int, ep: int, dpn: int, folded: bool = False,
                       etp: int = 1) -> tuple[int, int]:
    """Expert data-parallel members are ``tp x ep`` apart when ep lies inside dp x cp (stride
    tp), and ``ep`` apart when ep is folded over consecutive ranks of tp x cp x dp
    (:func:`partita.plan.axis_stride`: Megatron-Core's expert rank order with etp 1).
    With expert tensor parallel (etp > 1) the group has ``dp*cp*tp / (ep*etp)`` members
    ``etp x ep`` apart: Megatron-Core's expert RankGenerator, order ``tp-ep-dp-pp``, puts
    etp innermost, then ep, then the expert data-parallel axis
    (megatron/core/parallel_state.py, ``expert_decoder_rank_generator``)."""
    size = dp * cp * tp // (ep * etp)
    if size <= 1:
        return 1, 1
    if etp > 1:
        stride = etp * ep
    else:
        stride = (ep if folded else ep * tp) if ep > 1 else 1
    nodes = len({(i * stride) // dpn for i in range(size)})
    return max(1, size // nodes), nodes


class Zero3Shape(NamedTuple):
    """What ZeRO-3's per-micro-batch gather/scatter traffic of one rank depends on."""

    params: ParamShape
    dtype: str
    grad_dtype: str
    dp_span: tuple[int, int]  # the dense weights' shard group (dp x cp; HSDP: dp_shard x cp)
    expert_dp_span: tuple[int, int]
    replica_span: tuple[int, int] = (1, 1)  # HSDP: the groups holding the same shard


def zero3_shape(plan: Plan, devices_per_node: int) -> Zero3Shape:
    return Zero3Shape(param_shape(plan), plan.dtype, plan.grad_dtype, shard_span(plan, devices_per_node),
                      expert_dp_span(plan, devices_per_node), replica_span(plan, devices_per_node))
