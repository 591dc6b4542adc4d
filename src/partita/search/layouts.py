"""The search space enumerated: every structural layout (tp, cp, pp, dp, ep, mbs, vpp and
its layer split) with its ladder of memory-saving settings and the lower bound of the
step time of any plan it can produce. The rules that shape the space are stated in
:mod:`.space`; :mod:`.engine` searches it.

The exact bound (:func:`step_time_lower_bound`) costs a walk over the layout's rank
shapes and its optimizer floor; most layouts of a large space are never reached by the
branch and bound, so :class:`LayoutQueue` first files each layout under a cheaper bound
that is never above the exact one (:func:`cheap_bound`) and computes the exact bound only
when the layout comes up - the order in which layouts come out is still exactly the
order of their exact bounds.
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

from ..cost.compute import layer_forward, output_forward
from ..cost.pipeline import pipeline_time_of
from ..cost.shape import LayerShape, StageShape, layer_shape, stage_shape
from ..cost.step import async_send, stage_terms, step_time_lower_bound
from ..plan import RECOMPUTE, Plan, automatic_split, balanced_split, validate
from ..spec.hardware import Cluster
from ..spec.model import ModelSpec
from .capabilities import capabilities, ends_lighter_split, layout_problem, setting_problem
from .space import SearchSpace, best_split, carried_plan, divisors, least_zero, powers_of_two

#: memory-saving settings (recompute, zero) in order of cost: ZeRO <= 2, then ZeRO-3
LADDER = [("none", 1), ("none", 2), ("selective", 1), ("selective", 2), ("full", 1), ("full", 2)]
LADDER_Z3 = [("none", 3), ("selective", 3), ("full", 3)]
RECOMPUTE_ORDER = {mode: i for i, mode in enumerate(RECOMPUTE)}  # none < selective < full (plan.py's order)
EXPLAINED_KNOBS = ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "recompute", "zero")
LADDER_KNOBS = ("recompute", "zero")  # the memory-saving knobs walked per layout, in ladder-step order


def pipelines(model: ModelSpec, cluster: Cluster, seq: int, space: SearchSpace, cross_node_tp: bool,
              refused: list[str] | None = None) -> Iterator[tuple[int, int, int]]:
    """Every (tp, cp, pp) the rules of :mod:`.space` allow before the batch and vpp are
    looked at, deepest pipeline first: what :func:`structures` enumerates from, and what
    :func:`pipeline_depths` reads the reachable pp values off (one copy of the rules). A tp
    that does not divide the attention or KV heads is refused - as
    :func:`partita.plan.validate` refuses it in an estimate (no KV replication is modelled)
    - with the reason appended to ``refused``."""
    n, dpn = cluster.world_size, cluster.devices_per_node
    tps = [space.tp] if space.tp else [t for t in powers_of_two(dpn * (2 if cross_node_tp else 1)) if n % t == 0]
    for tp in tps:
        if model.heads % tp or (not model.mla and model.kv_heads % tp):
            if refused is not None:
                refused.append(f"tp={tp}: " + ("; ".join(e for e in validate(Plan(tp=tp), model)
                                                         if "heads" in e)))
            continue
        cps = [space.cp] if space.cp else [c for c in powers_of_two(n // tp) if seq // c >= space.min_tokens_per_cp_rank
                                           and seq % (2 * c) == 0 or c == 1]
        for cp in cps:
            if (n // tp) % cp:
                continue
            rest = n // (tp * cp)
            # deepest pipeline first: memory per rank only grows as pp shrinks (see search_plans)
            pps = [space.pp] if space.pp else sorted((p for p in divisors(rest) if p <= model.layers), reverse=True)
            for pp in pps:
                if rest % pp or (space.dp and rest // pp != space.dp):
                    continue
                yield tp, cp, pp


def pipeline_depths(model: ModelSpec, cluster: Cluster, seq: int, space: SearchSpace,
                    cross_node_tp: bool) -> tuple[int, ...]:
    """The pp values the search can reach on ``cluster`` under the user's fixed degrees, in
    increasing order (:func:`pipelines`, whatever vpp is fixed): what
    :func:`.space.fixed_vpp_problem` checks a fixed vpp against, since a fixed vpp > 1 drops
    every pp 1 structure (pp 1 has no virtual stages)."""
    return tuple(sorted({pp for _, _, pp in pipelines(model, cluster, seq, space, cross_node_tp)}))


def structures(model: ModelSpec, cluster: Cluster, gbs: int, seq: int, space: SearchSpace, cross_node_tp: bool,
               refused: list[str] | None = None):
    """Every (tp, cp, pp, dp, ep, mbs, vpp) the rules of :mod:`.space` allow, in an order
    that helps memory dominance (deepest pipeline and largest ep first): each of
    :func:`pipelines` (which appends refused tps to ``refused``) with the dp, ep, mbs and
    vpp the global batch and the layers allow."""
    n = cluster.world_size
    for tp, cp, pp in pipelines(model, cluster, seq, space, cross_node_tp, refused):
        if space.vpp and space.vpp > 1 and pp == 1:  # a fixed vpp > 1 needs a pipeline
            continue
        dp = n // (tp * cp * pp)
        if gbs % dp:
            continue
        per_replica = gbs // dp
        mbss = [space.mbs] if space.mbs else [b for b in divisors(per_replica)
                                              if b == 1 or b * seq <= space.max_tokens_per_microbatch]
        eps = [1]
        if model.moe:  # largest first: less expert memory, so a failure prunes the smaller ones
            eps = [space.ep] if space.ep else expert_degrees(model.moe.num_experts, tp if space.fold_ep else 1,
                                                             dp * cp)
        vpps = [1]
        if pp > 1:
            vpps = ([space.vpp] if space.vpp <= (model.layers + 2) // pp else []) if space.vpp \
                else virtual_stages(model.layers, pp, space.max_vpp)  # (a fixed vpp: only pipelines it splits)
        for ep in eps:
            for mbs in mbss:
                m = per_replica // mbs
                for vpp in vpps:
                    if vpp > 1 and m % pp and not (vpp == 2 and m >= 2 * pp):  # DualPipeV: any m >= 2 pp
                        continue
                    yield tp, cp, pp, dp, ep, mbs, vpp


def expert_degrees(experts: int, tp: int, dp_cp: int) -> list[int]:
    """The ep values of a (tp, dp x cp) structure, largest first: the divisors of
    tp x dp x cp that divide the routed-expert count - carved out of data x context
    parallel where they divide dp x cp, else folded into tp (Megatron-Core's MoE parallel
    folding; :func:`partita.plan.ep_folded`)."""
    return sorted((e for e in divisors(tp * dp_cp) if experts % e == 0), reverse=True)


def expert_tensor_degrees(model: ModelSpec, space: SearchSpace, tp: int, dp_cp: int, ep: int) -> list[int]:
    """The etp values of a (tp, dp x cp, ep) structure: 1, and - for a MoE model under
    ``fold_ep`` whose ep cannot grow (the user fixed it, or it is the structure's largest,
    :func:`expert_degrees`) - etp = tp where tp divides ``tp*dp*cp/ep`` and the expert FFN
    (:func:`partita.plan.validate`'s rules).

    Why these: etp divides a rank's expert states by etp, as a larger ep would, but adds a
    per-layer token all-gather / reduce-scatter over the etp group; where ep can still grow
    it reaches the same expert memory without that traffic, so etp is searched where it
    cannot (few experts: Mixtral, Grok-1 ETP=4 with EP=8; ep = all experts: Llama-4
    Maverick ETP=4 with EP=128, NVIDIA's published layouts, both etp = tp). etp = tp only:
    the etp group is then exactly a tp group (Megatron-Core's expert order ``tp-ep-dp-pp``
    puts etp consecutive ranks innermost), on the link tp already uses; values between 1 and
    tp (``partita estimate --etp``, or ``SearchSpace.etp``) are left out to keep the search's
    size (4x the MoE layouts with tp = 8 cost Mixtral's benchmark about a quarter more
    time). So etp adds one layout only to the structures with the largest ep and tp > 1."""
    if space.etp:
        return [space.etp]
    if not (model.moe and space.fold_ep and ep > 1 and tp > 1):
        return [1]
    if not space.ep and ep != expert_degrees(model.moe.num_experts, tp, dp_cp)[0]:
        return [1]
    per_stage = tp * dp_cp // ep
    etp = tp if per_stage % tp == 0 and model.moe.expert_ffn_hidden % tp == 0 else 1
    return [1, etp] if etp > 1 else [1]


#: Pipelines at least this deep get an uneven vpp when the layers allow no even one
#: (:func:`virtual_stages`).
UNEVEN_VPP_MIN_PP = 8


@lru_cache(maxsize=4096)
def virtual_stages(layers: int, pp: int, max_vpp: int) -> list[int]:
    """The vpp values searched for a pipeline of ``pp`` ranks: 1, every v whose ``pp v``
    virtual stages split the layers evenly - or evenly once the embedding and the loss
    count as a layer each (Megatron's ``--account-for-embedding/loss-in-pipeline-split``)
    - and, for a deep pipeline (pp >= :data:`UNEVEN_VPP_MIN_PP`) whose layer count allows
    no such v > 1 (DeepSeek-V3's 61 layers: 61 and 63 have no even factor), one uneven
    interleaving: the most virtual stages, a power of two in all, that keep at least two
    layers each (the embedding and the loss counted as one), split by
    :func:`partita.plan.automatic_split` (Megatron-LM interleaves DeepSeek-V3's 61 layers
    unevenly, e.g. pp 8 x vpp 4 with ``--pipeline-model-parallel-layout``). Models with
    few layers get every v whose splits are all tried (:func:`few_splits`).

    Why so few uneven values: every vpp value adds a layout to each of the pipeline's
    structures, and on memory-bound models (DeepSeek-V3 on 2048 H800) the bound rules out
    few of them - each value searched for every pp cost +41 % memory evaluations there.
    Interleaving pays where the bubble ``(pp - 1) / (vpp m)`` is large: deep pipelines."""
    top = min(max_vpp, (layers + 2) // pp)
    even = [v for v in range(1, top + 1) if v == 1 or layers % (pp * v) == 0 or (layers + 2) % (pp * v) == 0
            or few_splits(layers, pp * v)]
    if len(even) > 1 or pp < UNEVEN_VPP_MIN_PP:
        return even
    v = 1
    while 2 * v <= top and (2 * v * pp) & (2 * v * pp - 1) == 0 and 2 * (2 * v * pp) <= layers + 2:
        v *= 2
    if v == 1:  # pp itself not a power of two: the most virtual stages keeping two layers each
        v = max(1, min(top, (layers + 2) // (2 * pp)))
    return [1, v] if v > 1 and automatic_split(layers, pp * v) is not None else [1]


def _output_in_layers(model: ModelSpec, cluster: Cluster, plan: Plan) -> float:
    """The output layer's time in units of the last layer's (2 decimals), what the
    min-max split balances the last stage against."""
    shape = layer_shape(plan)
    layer = layer_forward(model, cluster.device, shape, bool(model.moe) and model.moe_flags[-1]).time
    out = output_forward(model, cluster.device, shape).time
    return round(out / layer, 2) if layer else 0.0


@lru_cache(maxsize=65536)
def _min_max_split(layers: int, chunks: int, last_extra: float) -> tuple[int, ...] | None:
    split = best_split(layers, chunks, 0.0, last_extra)
    if split and layers % chunks == 0 and max(split) >= layers // chunks:
        return None  # even split is as good
    return split or None


@dataclass
class Layout:
    """One structural layout (degrees, mbs, vpp, split) with its memory-saving ladder and
    the lower bound of every plan it can produce."""

    plan: Plan
    ladder: list[tuple[str, int]]
    bound: float | None  # the exact lower bound; None until the layout comes up in its queue
    rankable: bool
    knob_values: tuple[tuple[str, object], ...]  # every (knob, value) its plans can have
    done: bool = False
    key: float = 0.0  # a bound <= ``bound`` (:func:`cheap_bound`): the layout's place until it is refined
    #: the least time any of its plans that fit can take, as far as the search knows: its
    #: bound, raised once the memory of its recompute-free settings is known
    floor: float = 0.0
    waiting: bool = False  # its memory is known, its ladder not walked yet (see _Search.evaluate)
    index: int = 0  # enumeration order: ties in the queue keep it
    #: the memory of every setting, once the search has computed it (see _Search.evaluate)
    peaks: dict | None = None
    resolved: set = frozenset()  # knob values whose best plan here the first pass settled
    #: the structure's own split (even or min-max); False for the other splits tried when
    #: there are few (memory dominance reasons about the former only)
    primary: bool = True
    #: ``stage_terms`` of its plan (the same for every split and setting without recompute), when built with it
    terms: tuple | None = None


#: Relative slack taken off the cheap bound, so that rounding (the exact bound sums the
#: same terms in another order) never puts it above the exact one.
_CHEAP_SLACK = 1e-9


def cheap_bound(model: ModelSpec, cluster: Cluster, plan: Plan, total: float | None = None) -> float:
    """A lower bound of :func:`step_time_lower_bound` that needs no layer split and no
    walk over rank shapes: the per-micro-batch terms of every layer, both ends and every
    rank's pipeline constant sum to the same total ``T`` whatever the split, the slowest
    rank takes at least ``T / pp``, and the pipeline time ``m s + (T - s) / v`` (zero-
    bubble: a third of the fill/drain) does not fall as the slowest stage ``s`` grows
    (``m >= 1 >= 1 / v``); what follows the pipeline (>= 0) is left out. Checked against
    the exact bound on whole spaces in tests/test_search.py."""
    total = cheap_total(model, cluster, plan) if total is None else total
    hidden = 2 * plan.grad_accum * async_send(model, cluster, plan)  # sends only delaying their receiver
    return (pipeline_time_of(total, total / plan.pp, plan.grad_accum, plan.vpp, plan.schedule) - hidden) * (1 - _CHEAP_SLACK)


def cheap_total(model: ModelSpec, cluster: Cluster, plan: Plan, times: tuple | None = None) -> float:
    """``T`` of :func:`cheap_bound`: the same for every vpp and layer split of a structure
    (the stage terms depend on its stage shape only), so the search computes it once per
    stage shape and pp (:meth:`_LayoutBuilder._terms_and_total`). ``times``:
    ``stage_terms(...)[1]`` when the caller has it."""
    times = stage_terms(model, cluster, plan)[1] if times is None else times
    moe = model.moe_layers
    return ((model.layers - moe) * times.dense + moe * times.moe + times.embedding + times.output
            + plan.pp * times.per_stage)


class LayoutQueue:
    """The layouts in order of their exact lower bound (ties in enumeration order, as a
    stable sort would leave them), computed on demand: a heap keyed by the cheap bound
    until a layout is popped, then by its exact bound. A layout popped with its exact
    bound comes before every layout left, whose keys - and so exact bounds - are no
    smaller. Iterating again starts from the first layout.

    Layouts whose tp group crosses nodes (not ranked unless the user fixed tp) are built
    only when :meth:`with_cross_node` asks for them: they matter only to explain a tp
    value beyond the node, or when nothing else fits."""

    def __init__(self, model: ModelSpec, cluster: Cluster, layouts: list[Layout],
                 deferred: "_LayoutBuilder | None" = None):
        self.model, self.cluster, self.layouts = model, cluster, layouts
        for i, lay in enumerate(layouts):
            lay.index = i
        self._heap = [(lay.floor if lay.bound is not None else lay.key, i, lay) for i, lay in enumerate(layouts)]
        heapq.heapify(self._heap)
        self._ordered: list[Layout] = []
        self._deferred = deferred

    @property
    def deferred_values(self) -> set[tuple[str, object]]:
        """The (knob, value) pairs of the layouts not built yet."""
        return self._deferred.values if self._deferred else set()

    @property
    def deferred_structures(self) -> list[tuple]:
        """The structures not built yet (never evaluated)."""
        return self._deferred.pending if self._deferred else []

    def with_cross_node(self, build: bool) -> "LayoutQueue":
        """A new queue of the layouts not evaluated yet, in bound order from the start,
        with the deferred cross-node layouts built and added when ``build``."""
        rest = [lay for lay in self.layouts if not lay.done]
        extra = self._deferred.build() if build and self._deferred else []
        queue = LayoutQueue(self.model, self.cluster, rest + extra, None if build else self._deferred)
        queue.layouts = self.layouts + extra  # every layout, for the counts
        return queue

    def _pop_next(self) -> bool:
        heap = self._heap
        while heap:
            key, i, lay = heapq.heappop(heap)
            if lay.bound is None:
                lay.bound = lay.floor = step_time_lower_bound(self.model, self.cluster, lay.plan, terms=lay.terms)
                heapq.heappush(heap, (lay.bound, i, lay))
            else:
                self._ordered.append(lay)
                return True
        return False

    def push(self, layout: Layout) -> None:
        """Put a layout back under its (raised) floor; iteration meets it again in order."""
        heapq.heappush(self._heap, (layout.floor, layout.index, layout))

    def __iter__(self) -> Iterator[Layout]:
        i = 0
        while i < len(self._ordered) or self._pop_next():
            yield self._ordered[i]
            i += 1


#: Models of at most this many layers (the tiny reference and test models) get every
#: contiguous layer split tried, up to :data:`FEW_SPLITS` per (pp, vpp): there an empty
#: first or last stage (only the embedding or the loss) can be what makes a pipeline fit
#: or run faster, and a handful of layers leaves few splits. Larger models get the even or
#: min-max split only (trying all would multiply the space).
FEW_LAYERS = 8
FEW_SPLITS = 64


def few_splits(layers: int, chunks: int) -> bool:
    """Whether the search tries every split (:func:`all_splits`, whose count is at most
    the number of cut-point choices checked here)."""
    return 1 < chunks and layers <= FEW_LAYERS and math.comb(layers + 1, chunks - 1) <= FEW_SPLITS


def all_splits(layers: int, chunks: int) -> list[tuple[int, ...]]:
    """Every contiguous split of ``layers`` into ``chunks`` virtual stages that plan
    validation accepts: at least one layer in every middle stage, the first and last
    (which also hold the embedding and the loss) possibly empty. Stars and bars over
    ``layers + 2`` units, one of each end's being the embedding or the loss."""
    out = []
    for cuts in itertools.combinations(range(1, layers + 2), chunks - 1):
        bounds = (0,) + cuts + (layers + 2,)
        parts = [bounds[i + 1] - bounds[i] for i in range(chunks)]
        parts[0] -= 1
        parts[-1] -= 1
        if min(parts) >= 0:
            out.append(tuple(parts))
    return out


def _ladder(space: SearchSpace, dp: int, cp: int) -> list[tuple[str, int]]:
    allow_z3 = space.allow_zero3 and dp * cp > 1
    ladder = [step for step in LADDER + (LADDER_Z3 if allow_z3 else [])
              if (not space.recompute or step[0] == space.recompute)
              and (space.allow_recompute or step[0] == "none")]
    low = least_zero(space.options)  # 1 where the carried choices need the distributed optimizer
    ladder = [(rc, low if dp * cp == 1 and z < 3 else z) for rc, z in ladder]
    return [step for step in dict.fromkeys(ladder) if space.zero is None or step[1] == space.zero]


class _LayoutBuilder:
    """Builds :class:`Layout` records from structures (what depends on few fields is
    computed once per value: the search's hot loop runs over thousands of layouts)."""

    def __init__(self, model: ModelSpec, cluster: Cluster, global_batch: int, seq_len: int, space: SearchSpace,
                 invalid: list[str]):
        self.model, self.cluster, self.space, self.invalid = model, cluster, space, invalid
        ladders = {replicated: _ladder(space, 2 if replicated else 1, 1) for replicated in (False, True)}
        self.ladders = ladders
        self.ladder_values = {replicated: tuple([("recompute", rc) for rc in dict.fromkeys(rc for rc, _ in ladder)]
                                                + [("zero", z) for z in dict.fromkeys(z for _, z in ladder)])
                              for replicated, ladder in ladders.items()}
        # the cost terms of many structures, each keyed by the cost model's frozen shape
        # record its formula is memoised on (:mod:`partita.cost.shape`), so that every plan
        # field the formula reads is in the key (tests/test_search_cache_keys.py)
        self.output_ratio: dict[LayerShape, float] = {}  # _output_in_layers per layer shape
        #: per stage shape: stage_terms(...) and cheap_total by pp (:meth:`_terms_and_total`)
        self.stage_terms: dict[StageShape, tuple[tuple, dict[int, float]]] = {}
        self.explained = tuple(k in EXPLAINED_KNOBS for k in ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs"))
        self._etps: dict[tuple[int, int, int, int], list[int]] = {}  # etps() per (tp, cp, dp, ep)
        # every field the structure does not set, once (Plan.with_ is a dict update)
        self.proto = Plan(gbs=global_batch, seq_len=seq_len, dtype=space.dtype, **space.options)
        self.pending: list[tuple] = []  # deferred structures
        self.values: set[tuple[str, object]] = set()
        #: what the framework named (``options["framework"]``) can run (:mod:`.capabilities`);
        #: None without one: the reference search, unrestricted
        self.caps = capabilities(space.options.get("framework"))

    def defer(self, structure: tuple) -> None:
        self.pending.append(structure)
        tp, cp, pp, dp, ep, mbs, vpp = structure
        if self.ladders[dp * cp > 1]:
            self.values.update((("tp", tp), ("pp", pp), ("vpp", vpp), ("cp", cp), ("ep", ep), ("mbs", mbs))
                               + tuple(("etp", etp) for etp in self.etps(tp, cp, dp, ep) if "etp" in EXPLAINED_KNOBS)
                               + self.ladder_values[dp * cp > 1])

    def build(self) -> list[Layout]:
        out = [lay for structure in self.pending for lay in self.layouts(structure)]
        self.pending, self.values = [], set()
        return out

    def etps(self, tp: int, cp: int, dp: int, ep: int) -> list[int]:
        """The expert tensor-parallel degrees of a structure (:mod:`.space`, ``etp``)."""
        key = (tp, cp, dp, ep)
        out = self._etps.get(key)
        if out is None:
            out = self._etps[key] = expert_tensor_degrees(self.model, self.space, tp, cp * dp, ep)
        return out

    def layouts(self, structure: tuple) -> list[Layout]:
        """The layouts of one structure, for each expert tensor-parallel degree it allows
        (:meth:`etps`)."""
        tp, cp, pp, dp, ep, mbs, vpp = structure
        return [lay for etp in self.etps(tp, cp, dp, ep) for sched in self.schedules(structure)
                for lay in self._layouts(structure, etp, sched)]

    def schedules(self, structure: tuple) -> tuple[str, ...]:
        """The pipeline schedules tried on a structure (:mod:`.space`, ``schedule``): the
        user's, else 1F1B (interleaved with vpp > 1), and DualPipeV beside it where it is
        valid (vpp 2, at least 2 pp micro-batches) and the framework runs it."""
        tp, cp, pp, dp, ep, mbs, vpp = structure
        if self.space.schedule == "dualpipev" and pp == 1:
            return ()  # the user asked for a pipeline schedule
        if self.space.schedule and pp > 1:
            return (self.space.schedule,)
        m = self.proto.gbs // (dp * mbs)
        out = ("interleaved-1f1b",) if vpp > 1 and m % pp == 0 else ("1f1b",) if vpp == 1 else ()
        if vpp == 2 and m >= 2 * pp and (self.caps is None or self.caps.dualpipev):
            out += ("dualpipev",)
        return out

    def _layouts(self, structure: tuple, etp: int, schedule: str = "") -> list[Layout]:
        """The layouts of one structure and etp: one per layer split tried (the even or
        min-max split; every split when there are few, :func:`few_splits`), invalid ones
        left out with the reason in ``invalid``."""
        model, cluster = self.model, self.cluster
        tp, cp, pp, dp, ep, mbs, vpp = structure
        replicated = dp * cp > 1
        ladder = self.ladders[replicated]
        if not ladder:
            return []
        sp = tp > 1 and (self.caps is None or self.caps.sp)
        base = self.proto.with_(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, sp=sp,
                                zero=1 if replicated else least_zero(self.space.options),
                                mbs=mbs, schedule=schedule or ("interleaved-1f1b" if vpp > 1 else "1f1b"), etp=etp)
        ladder_values = self.ladder_values[replicated]
        if self.caps is not None:  # the settings the framework runs on this layout
            problems = [setting_problem(self.caps, base.with_(recompute=rc, zero=z), model) for rc, z in ladder]
            if all(problems):
                self.invalid.append(f"{base.with_(recompute=ladder[0][0], zero=ladder[0][1]).summary()}: {problems[0]}")
                return []
            ladder = [st for st, problem in zip(ladder, problems) if problem is None]
            ladder_values = tuple([("recompute", rc) for rc in dict.fromkeys(rc for rc, _ in ladder)]
                                  + [("zero", z) for z in dict.fromkeys(z for _, z in ladder)])
        shape = stage_shape(base, cluster.devices_per_node)
        plans = [self._primary(base, shape.layer)]
        if pp * vpp > 1:
            if few_splits(model.layers, pp * vpp):
                first = plans[0].stage_layers(model.layers)
                plans += [base.with_(layer_split=s) for s in all_splits(model.layers, pp * vpp) if s != first]
        out = []
        terms, total = self._terms_and_total(base, shape)
        # no setting of the layout is faster than its terms with no recompute (base has none)
        pairs = (("tp", tp), ("pp", pp), ("vpp", vpp), ("cp", cp), ("ep", ep), ("etp", etp), ("mbs", mbs))
        knobs = tuple(kv for kv, keep in zip(pairs, self.explained) if keep) + ladder_values
        for i, plan in enumerate(plans):
            errs = validate(carried_plan(plan), model, cluster.world_size)  # modules: for its selective settings
            if not errs and self.caps is not None:
                errs = [e for e in (layout_problem(self.caps, plan, model),) if e]
            if errs:
                self.invalid.append(f"{plan.summary()}: {errs[0]}")
                continue
            out.append(Layout(plan, ladder, None, bool(self.space.tp) or tp <= cluster.devices_per_node, knobs,
                              key=cheap_bound(model, cluster, plan, total), primary=i == 0, terms=terms))
        return out

    def _terms_and_total(self, base: Plan, shape: StageShape | None = None) -> tuple[tuple, float]:
        """``stage_terms(model, cluster, base)`` and :func:`cheap_total` of ``base``,
        memoised on the plan's stage shape (:func:`.cost.shape.stage_shape`, ``shape`` when
        the caller has it) - the record :func:`.cost.step.stage_terms` is itself memoised
        on, so the key holds every plan field the terms read - and, for the total, on pp
        (the per-stage constant counts once per pipeline rank). Saves the cost model's
        lookup with the model and device keys."""
        shape = stage_shape(base, self.cluster.devices_per_node) if shape is None else shape
        # DualPipeV's terms also read pp and the micro-batch count (the hidden all-to-all share)
        key = (shape, base.pp, base.grad_accum) if base.schedule == "dualpipev" else shape
        entry = self.stage_terms.get(key)
        if entry is None:
            entry = self.stage_terms[key] = (stage_terms(self.model, self.cluster, base), {})
        terms, totals = entry
        total = totals.get(base.pp)
        if total is None:
            total = totals[base.pp] = cheap_total(self.model, self.cluster, base, terms[1])
        return terms, total

    def _output_ratio(self, base: Plan, shape: LayerShape | None = None) -> float:
        """:func:`_output_in_layers` of ``base``, memoised on its layer shape (``shape``
        when the caller has it: what the layer and output-layer times it divides read of
        the plan)."""
        shape = layer_shape(base) if shape is None else shape
        ratio = self.output_ratio.get(shape)
        if ratio is None:
            ratio = self.output_ratio[shape] = _output_in_layers(self.model, self.cluster, base)
        return ratio

    def _primary(self, base: Plan, layer: LayerShape) -> Plan:
        """The structure's own layout (``primary``): its even or min-max split (``layer``:
        ``base``'s layer shape)."""
        model, chunks = self.model, base.pp * base.vpp
        if self.caps is not None and chunks > 1 and self.caps.split in ("even", "ends"):
            return self._framework_split(base, layer)
        if chunks > 1 and (model.layers % chunks == 0 or (model.layers + 2) % chunks == 0
                           or not few_splits(model.layers, chunks)):
            split = self._split(base, layer)
            if split is not None:
                return base.with_(layer_split=split)
        return base

    def _framework_split(self, base: Plan, layer: LayerShape) -> Plan:
        """The primary layout under a framework whose splits are restricted
        (:attr:`.capabilities.Capabilities.split`): even where the layers divide and the
        framework cannot take a list (DeepSpeed); the search's own split where the framework
        takes it, else torchtitan's lighter ends
        (:func:`.capabilities.ends_lighter_split`). A split the framework cannot run is
        refused with its reason by :func:`.capabilities.layout_problem`."""
        model, chunks, kind = self.model, base.pp * base.vpp, self.caps.split
        if model.layers % chunks == 0 and kind == "even":
            return base
        split = self._split(base, layer)  # None: the layers divide evenly and nothing beats that
        plan = base.with_(layer_split=split) if split else base
        if kind == "ends" and layout_problem(self.caps, plan, model):
            ends = ends_lighter_split(model.layers, chunks)
            return base.with_(layer_split=ends) if ends else plan
        return plan

    def _split(self, base: Plan, layer: LayerShape) -> tuple[int, ...] | None:
        """The layer split of a pipelined layout: even when possible, else the exact
        min-max split (vpp = 1; the last stage also carries the output layer) or
        Megatron's embedding-aware balanced split (vpp > 1)."""
        model, pp, vpp = self.model, base.pp, base.vpp
        if vpp > 1:
            return None if model.layers % (pp * vpp) == 0 else balanced_split(model.layers, pp * vpp)
        return _min_max_split(model.layers, pp, self._output_ratio(base, layer))


def layouts_by_bound(model: ModelSpec, cluster: Cluster, global_batch: int, seq_len: int, space: SearchSpace,
                     cross_node_tp: bool, invalid: list[str]) -> LayoutQueue:
    """Every valid layout, cheapest lower bound first; the cross-node tp ones (never
    ranked unless the user fixed tp) deferred until :meth:`LayoutQueue.with_cross_node`."""
    builder = _LayoutBuilder(model, cluster, global_batch, seq_len, space, invalid)
    layouts = []
    for structure in structures(model, cluster, global_batch, seq_len, space, cross_node_tp, invalid):
        if not space.tp and structure[0] > cluster.devices_per_node:
            builder.defer(structure)
            continue
        layouts += builder.layouts(structure)
    return LayoutQueue(model, cluster, layouts, builder)
