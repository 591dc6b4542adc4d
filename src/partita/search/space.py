"""The search space and its pruning rules, each stated.

* tp: powers of two up to the node size (a tp group crossing nodes puts every
  layer's all-reduce on the network; it is still evaluated once, to explain why not);
  must divide heads and KV heads.
* cp: powers of two while each rank keeps >= ``min_tokens_per_cp_rank`` (2048) tokens:
  a ring-attention hop moves K/V linear in s/cp but hides behind attention work
  quadratic in s/cp, so short shards expose it (Megatron recommends CP for long
  sequences; the published layouts use cp with >= 4096 tokens per rank).
* pp: any divisor of the remaining devices up to the layer count; uneven layer counts
  get an exact min-max split (:func:`best_split`).
* vpp: when pp > 1 and the micro-batch count is a multiple of pp (Megatron's
  interleaving constraint), every value whose virtual stages split the layers evenly, or
  evenly with the embedding and the loss counted as a layer each; a deep pipeline whose
  layer count allows neither gets one uneven value
  (:func:`partita.search.layouts.virtual_stages`).
* schedule: interleaved 1F1B with vpp > 1, else 1F1B; with vpp 2 and at least 2 pp
  micro-batches also DualPipeV (``dualpipev``: the same two chunks per rank placed in a V,
  its bubble a third of 1F1B's and its overlapped forward/backward pairs hiding the MoE
  all-to-all, :mod:`partita.cost.pipeline`), where the framework runs it. ``--schedule``
  fixes it (dualpipev: vpp 2).
* ep: divisors of dp*cp that divide the expert count (MoE only), and - with
  ``fold_ep`` - divisors of tp*dp*cp beyond them: ep folded into tp (Megatron-Core's MoE
  parallel folding, expert tensor parallel 1; :func:`partita.plan.ep_folded`).
* etp (expert tensor parallel): 1, and with ``fold_ep``, a MoE model and ep > 1 the powers
  of two up to tp that divide tp*dp*cp/ep and the expert FFN
  (:func:`partita.search.layouts.expert_tensor_degrees`): it divides the expert states by
  etp at the cost of a per-layer token all-gather / reduce-scatter over the etp group.
* sp: always on with tp > 1 - it keeps tp's communication volume and cuts activation
  memory by tp (Korthikanti et al. 2022), so it dominates sp off.
* zero: 1 (distributed optimizer) and 2 cost the same time as 0 in our model and use
  less memory, so 0 is only used when there is no data parallelism; 3 trades time for
  memory and is tried when allowed.
* recompute: none, selective and full; with ``partial_recompute`` also full recompute of
  the fewest layers per stage/chunk that fit (``recompute_layers``).
* the user's fixed choices (``SearchSpace.options``, :data:`CARRIED_CHOICES`): a launch
  script's (or the flags') ``optimizer_offload``, ``moment_dtype`` and ``recompute_modules``
  are carried by every candidate, as precision and framework are, so the search prices its
  proposals as ``partita estimate`` prices the script. The module list applies to the
  candidates with recompute selective (Megatron reads ``--recompute-modules`` only with
  ``--recompute-granularity selective``, megatron/training/arguments.py); candidates with
  recompute none or full run without it (:func:`carried_plan`). Offload or narrower moments
  need Megatron's distributed optimizer, so under megatron/mindspeed a layout without data
  parallelism takes zero 1 instead of 0 (:func:`least_zero`).
* mbs: every divisor of the per-replica batch up to ``max_tokens_per_microbatch``
  (128k) tokens per micro-batch; larger micro-batches only add activation memory once
  the GEMMs are saturated. mbs 1 always (sequences beyond 128k tokens: NeMo's 256k-1M
  context-parallel runs).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

from ..plan import Plan
from ..uncertainty import DEFAULT_HEADROOM


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, found up to sqrt(n) (a global batch of 2^24 took
    100 s with a scan up to n; issue 16)."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def powers_of_two(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


@dataclass
class SearchSpace:
    """Constraints a user sets; ``None`` means search it."""

    tp: int | None = None
    pp: int | None = None
    vpp: int | None = None
    #: the pipeline schedule every candidate runs (None: 1f1b / interleaved-1f1b, and dualpipev
    #: beside interleaved-1f1b where it is valid)
    schedule: str | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None
    dp: int | None = None
    mbs: int | None = None
    zero: int | None = None
    recompute: str | None = None
    dtype: str = "bf16"
    allow_zero3: bool = True
    allow_recompute: bool = True
    max_memory_gib: float | None = None
    memory_headroom: float = DEFAULT_HEADROOM  # none by default: P(fit) carries the model's error (partita.uncertainty)
    max_tokens_per_microbatch: int = 131072
    #: plan options every candidate carries (framework settings, not searched): grad_dtype,
    #: tp_comm_overlap (on by default: production Megatron/NeMo runs use --tp-comm-overlap,
    #: MindSpeed its MC2 fusion), overlap_grad_reduce, overlap_param_gather
    options: dict = field(default_factory=lambda: {"tp_comm_overlap": True})
    max_vpp: int = 32
    #: search ep values folded into tp (ep not dividing dp*cp) and etp > 1; the runtime's own
    #: search (``--plan auto``) turns it off: Partita's runtime carves ep out of dp*cp only
    #: and runs etp 1
    fold_ep: bool = True
    min_tokens_per_cp_rank: int = 2048
    #: "recompute just enough": a layout that fits only with selective or full recompute
    #: also gets its full-recompute plan with the fewest recomputed layers per stage that
    #: fit (``recompute_layers``, :meth:`partita.search.engine._Search._try_partial`). On by
    #: default: tests/test_search.py's brute-force oracle enumerates every recompute_layers.
    partial_recompute: bool = True
    #: Megatron's ``--recompute-modules`` lists as recompute settings (issue 33 follow-up,
    #: :mod:`partita.search.recompute_modules`): every layout whose ZeRO family first fits with
    #: recompute (selective or full) also gets its selective plan with the first of
    #: :func:`~partita.search.recompute_modules.candidate_lists` that fits. Off by default (the
    #: brute-force oracle of tests/test_search.py enumerates none); ``partita plan`` turns it on
    #: under megatron / mindspeed unless ``--no-module-lists`` or the user's own list is carried.
    module_lists: bool = False


#: plan fields a user fixes for every candidate, that the search never varies (issue 33: a
#: script's own layout, priced by ``estimate --from-script`` with them, was called "does not fit"
#: by ``plan --from-script`` whose candidates were priced without them)
CARRIED_CHOICES = ("optimizer_offload", "moment_dtype", "recompute_modules")

#: the communication overlaps a launch script turns on or leaves off (Megatron ``--tp-comm-overlap`` /
#: MindSpeed ``--use-ascend-mc2``, ``--overlap-grad-reduce``, ``--overlap-param-gather``; DeepSpeed
#: ``overlap_comm``; torchtitan async TP), read by the importers into these plan fields. ``plan
#: --from-script`` carries them as the script's choices (:func:`script_overlaps`); ``--free-overlaps``
#: lets the search use its own (:attr:`SearchSpace.options`: tensor-parallel overlap on, the plan's
#: defaults for the others). Issue 33: before, every candidate ran with the overlaps on while the
#: script's own layout was priced with them off, so the comparison priced a knob, not a layout.
OVERLAP_CHOICES = ("tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather")


def script_overlaps(plan: Plan) -> dict:
    """The overlap fields (:data:`OVERLAP_CHOICES`) a script's ``plan`` chose, where its layout
    makes the flag act: ``tp_comm_overlap`` with tp > 1; ``overlap_grad_reduce`` with data (or
    context) parallelism; ``overlap_param_gather`` with it and a sharded optimizer (Megatron-LM
    arguments.py: "--overlap-param-gather only supported with distributed optimizer ..."). A flag
    the layout gives nothing to do (``--tp-comm-overlap`` absent from a tp 1 script) is no choice,
    so candidates that need it take the search's default."""
    out: dict = {}
    if plan.tp > 1:
        out["tp_comm_overlap"] = plan.tp_comm_overlap
    if plan.dp * plan.cp > 1:
        out["overlap_grad_reduce"] = plan.overlap_grad_reduce
        if plan.zero >= 1:
            out["overlap_param_gather"] = plan.overlap_param_gather
    return out


def carried_plan(plan: Plan) -> Plan:
    """``plan`` as the framework runs it: a ``recompute_modules`` list carried from the
    user's choices is dropped where the candidate's recompute is not selective (Megatron
    uses ``--recompute-modules`` only with selective granularity; the cost model reads the
    list only then, cost/activations.py, so the plan is priced the same either way, and a
    plan with the list and recompute full would fail :func:`partita.plan.validate`)."""
    if plan.recompute_modules and plan.recompute != "selective":
        return plan.with_(recompute_modules="")
    return plan


def least_zero(options: dict) -> int:
    """The ZeRO stage of a layout without data parallelism (dp*cp 1): 0, or 1 where the
    carried choices need Megatron's distributed optimizer - optimizer offload or moments
    not in fp32 under megatron/mindspeed (Megatron-Core raises '--use-precision-aware-optimizer
    only supported with distributed optimizer', megatron/core/optimizer/__init__.py; with one
    data-parallel rank zero 1 shards nothing, so it prices as zero 0 otherwise)."""
    framework = options.get("framework", "megatron")
    needs = options.get("optimizer_offload", 0) or options.get("moment_dtype", "fp32") != "fp32"
    return 1 if needs and framework in ("megatron", "mindspeed") else 0


def fixed_vpp_problem(space: SearchSpace, model_name: str, layers: int, devices: int | None = None,
                      depths: Sequence[int] | None = None) -> str | None:
    """Why the user's fixed ``vpp`` admits no layout, in one line, or None. Every one of the
    ``pp * vpp`` model chunks holds at least one layer, the embedding and the loss counting as
    one each at the ends (Megatron's ``--account-for-embedding/loss-in-pipeline-split``), so
    ``pp * vpp <= layers + 2`` - the rule :func:`.layouts.structures` enumerates by. A value
    that breaks it for every pipeline the user allows is never enumerated, and the search
    alone would explain its empty result with an unrelated candidate's reason (a tp that
    does not divide the KV heads), so it is said first, with the vpp values whose chunks
    split the layers evenly (``layers`` or ``layers + 2`` a multiple of ``pp * vpp``, the
    values :func:`.layouts.virtual_stages` searches).

    ``depths``: the pp values the search can reach on ``devices`` under the fixed tp, cp and
    dp (:func:`.layouts.pipeline_depths`, the same rules the enumeration follows); with pp
    free the rule is checked at the shallowest of them above 1, and when there is none - 8
    devices with tp 8, or 7 devices and a 4-layer model - that is said instead, since every
    structure the search has left is pp 1 (before, the empty search said "no layout divides
    the devices and the global batch"). Without ``depths`` a free pp is taken to reach 2."""
    vpp, pp = space.vpp, space.pp
    if not vpp or vpp == 1:
        return None
    if pp == 1:
        return f"vpp {vpp} needs pp > 1 (virtual stages interleave a pipeline)"
    deeper = sorted(p for p in depths or () if p > 1)
    if not pp and depths and not deeper and devices:
        return _only_pp1(space, model_name, layers, devices)
    least = pp or (deeper[0] if deeper else 2)  # the shallowest pipeline a free pp can take
    if least * vpp <= layers + 2:
        return None
    most = (layers + 2) // least
    chunks = f"{least * vpp} model chunks" if pp else f"at least {least * vpp} model chunks (pp >= {least})"
    head = (f"vpp {vpp} makes {chunks} of {model_name}'s {layers} layers: every chunk needs a layer (pp*vpp at most "
            f"{layers + 2}, the embedding and the loss counted as a layer each)")
    if most < 2:
        return f"{head}; pp {least} leaves no room for interleaving: use vpp 1 or a smaller pp"
    even = [v for v in range(2, most + 1) if layers % (least * v) == 0 or (layers + 2) % (least * v) == 0]
    uneven = "vpp 2 splits" if most == 2 else f"vpp 2..{most} split"
    fix = (f"the vpp values that split the layers evenly with pp {least}: {', '.join(map(str, even))}" if even else
           f"no vpp > 1 splits them evenly with pp {least} ({uneven} them unevenly)")
    return f"{head}, so vpp <= {most} with pp {least}{'' if pp else ' (the shallowest pipeline)'}; {fix}"


def _only_pp1(space: SearchSpace, model_name: str, layers: int, devices: int) -> str:
    """The one line for a fixed vpp > 1 where the devices and the fixed degrees leave only pp
    1 (:func:`fixed_vpp_problem`), naming what would leave a pipeline: a smaller fixed degree
    where the devices alone allow a pp in 2..layers (tp, cp and dp free include 1 each), else
    vpp 1 or another device count."""
    vpp = space.vpp
    fixed = [(name, value) for name, value in (("tp", space.tp), ("cp", space.cp), ("dp", space.dp))
             if value and value > 1]
    units = f"{devices} device{'s' if devices != 1 else ''}"
    with_ = f" with {' and '.join(f'{k} {v}' for k, v in fixed)}" if fixed else ""
    verb = "leaves" if devices == 1 and not fixed else "leave"
    head = f"vpp {vpp} needs pp > 1, but {units}{with_} {verb} only pp 1"
    if fixed and any(2 <= d <= layers for d in divisors(devices)):
        return f"{head}: use vpp 1 or a smaller {' or '.join(k for k, _ in fixed)}"
    if devices == 1:
        return f"{head}: use vpp 1 or more devices"
    return (f"{head} (pp divides the devices and is at most {model_name}'s {layers} layers): use vpp 1 or a "
            f"device count with a divisor from 2 to {layers}")


@lru_cache(maxsize=65536)
def best_split(layers: int, chunks: int, first_extra: float, last_extra: float) -> tuple[int, ...]:
    """Exact contiguous split of ``layers`` unit-cost layers into ``chunks`` stages that
    minimises the slowest stage, where the first and last stages also carry
    ``first_extra`` / ``last_extra`` (embedding, output layer + loss) in layer units.

    The optimum max-stage cost is ``T*``: the smallest T for which stage i can take
    ``floor(T - extra_i)`` layers and the capacities sum to ``layers``. Capacities are
    monotone in T, so a binary search over the candidate values of T (each a whole
    number of layers plus an end's extra) finds ``T*`` exactly; layers are then handed
    out up to capacity, middle stages first.
    """
    if chunks == 1:
        return (layers,)
    extras = [first_extra] + [0.0] * (chunks - 2) + [last_extra]

    def capacity(t: float) -> list[int]:
        return [max(0, int(t - x + 1e-9)) for x in extras]

    candidates = sorted({n + x for x in set(extras) for n in range(0, layers + 1)})
    lo, hi = 0, len(candidates) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(capacity(candidates[mid])) >= layers:
            hi = mid
        else:
            lo = mid + 1
    caps = capacity(candidates[lo])
    # hand out layers as evenly as the capacities allow: start from the capacity and
    # remove the surplus from the stages with the most slack first
    split = list(caps)
    surplus = sum(split) - layers
    order = sorted(range(chunks), key=lambda i: (-(split[i] + extras[i]), i))
    while surplus > 0:
        for i in order:
            if surplus and split[i] > (1 if 0 < i < chunks - 1 else 0):
                split[i] -= 1
                surplus -= 1
        order = sorted(range(chunks), key=lambda i: (-(split[i] + extras[i]), i))
    if min(split[1:-1] or [1]) < 1:
        return ()
    return tuple(split)
