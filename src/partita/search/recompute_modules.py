"""Megatron's selective-recompute module lists as search candidates (issue 33 follow-up).

Under Megatron-LM and MindSpeed-LLM, ``--recompute-granularity selective`` reruns whole modules,
``--recompute-modules`` names them (NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553
megatron/core/transformer/transformer_config.py l.560-575 and l.1940-1962: default ``["core_attn"]``;
allowed core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts, and three modules of
architectures Partita does not model). The layout search prices its selective candidates with the
default, ``core_attn`` (:func:`partita.cost.frameworks.selective_modules`), so a layout that fits only
with full recompute never meets the cheaper lists Megatron users set for exactly that case - the
DeepSeek-V3 proxy of Megatron-LM's tests runs ``mla_up_proj moe_act``, Megatron-MoE-ModelZoo's
best practices ``mla_up_proj moe_act layernorm`` and similar.

The layout search walks the lists as recompute settings (``SearchSpace.module_lists``,
:meth:`partita.search.engine._Search._try_modules`): every ZeRO family of a layout whose first fit
recomputes (selective with the default list, or full) also gets its selective plan with the first list
of :func:`candidate_lists` that fits - the lists are cumulative, so it reruns the least of those that
fit - and, while a list fits only at risk (P(fit) < 1), the next ones, ranked by the search's own key
(step time over P(fit)). With ``--recompute selective`` a layout whose default list does not fit is
kept when a list does. Its lower bound is the plan with the cheapest list, never below the layout's
bound without recompute (a list only adds recompute time), so the branch and bound stays exact.
Before (commit 77ad19c) only the best plans of a search without the lists were re-estimated with them,
which missed a layout outside those plans whose list plan ranks first, and a layout that fits only with
a list under ``--recompute selective``. :func:`try_module_lists` is what is left of that pass: the
why-not line, and the variants for a search run without the lists. Plans without recompute are left
alone: recomputing more only adds time. The lists are cumulative, cheapest rerun first - the norms (the
layer's cheapest saved tensors to rebuild: element-wise), then the attention core (or MLA's
up-projections), then the MLP's activation (``moe_act`` in MoE layers, Megatron accepts it only with
grouped GEMM, Partita's MoE plans' kernel), the shared experts, the whole MLP or MoE block - each
a list that Megatron's validation accepts for the model (:func:`partita.plan.validate` holds the
same rules: moe_act needs a MoE model, mla_up_proj MLA).

Only under megatron / mindspeed (:data:`partita.cost.frameworks.MODULE_SELECTIVE_FRAMEWORKS`), and
never when the user's own list is carried (``--recompute-modules`` or a script's): that list is the
user's choice. The plan exports as the flags Megatron reads (``--recompute-granularity selective
--recompute-modules ...``, :mod:`partita.export.megatron`).
"""
from __future__ import annotations

from .. import uncertainty as unc
from ..cost.frameworks import MODULE_SELECTIVE_FRAMEWORKS, selective_modules
from ..estimate import Estimate, estimate
from ..plan import validate
from .result import SearchResult


def candidate_lists(model) -> list[str]:
    """The module lists tried for ``model`` (module docstring), canonical comma strings, cumulative."""
    attn = ["mla_up_proj"] if getattr(model, "mla", None) else ["core_attn"]
    moe = getattr(model, "moe", None)
    steps: list[list[str]] = [["layernorm"], ["layernorm", *attn]]
    if moe:
        steps.append([*steps[-1], "moe_act"])
        if getattr(moe, "shared_experts", 0):
            steps.append([*steps[-1], "shared_experts"])
        steps.append(["layernorm", *attn, "moe"])
    else:
        steps.append([*steps[-1], "mlp"])
    return list(dict.fromkeys(",".join(sorted(s)) for s in steps))


#: the modules MindSpeed-LLM's Megatron (core_v0.12.1 transformer_config.py) accepts in
#: ``--recompute-modules``; the same list :data:`partita.export.megatron.MINDSPEED_RECOMPUTE_MODULES`
#: writes against (kept here: search/ must not import export/, tests/test_search_recompute_modules.py
#: checks the two agree)
MINDSPEED_MODULES = frozenset({"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe"})
#: Megatron's ``--fp8-recipe`` values that accept moe_act / layernorm recompute (transformer_config.py;
#: :data:`partita.export.megatron.FP8_RECIPES`, checked equal by the same test)
MEGATRON_FP8_RECIPES = frozenset({"tensorwise", "mxfp8"})


def framework_refuses(plan, model) -> bool:
    """Whether the framework would refuse ``plan``'s module list though :func:`partita.plan.validate`
    passes it - the rules :mod:`partita.export.megatron` raises on, so that the search never proposes
    a list its export cannot write: MindSpeed-LLM's Megatron core_v0.12.1 has no ``shared_experts``
    (transformer_config.py there: core_attn, moe_act, layernorm, mla_up_proj, mlp, moe); MindSpeed-LLM
    refuses grouped GEMM (which moe_act needs) beside ``--use-ascend-mc2``, written for tp > 1 with
    sequence parallelism in a MoE model unless DualPipeV's ``--moe-fb-overlap`` keeps grouped GEMM; with
    fp8 Megatron's default delayed recipe refuses moe_act and layernorm recompute (transformer_config.py)."""
    modules = set(plan.recompute_modules.split(",")) if plan.recompute_modules else set()
    if plan.framework == "mindspeed":
        if modules - set(MINDSPEED_MODULES):
            return True
        if "moe_act" in modules and model.moe and plan.tp > 1 and plan.sp \
                and not (plan.schedule == "dualpipev" and plan.ep > 1):
            return True
    return plan.dtype == "fp8" and bool({"moe_act", "layernorm"} & modules) \
        and plan.fp8_recipe not in MEGATRON_FP8_RECIPES


def applies(framework: str | None, options: dict) -> bool:
    """Whether the post-pass runs: a module-level framework and no module list the user chose."""
    return (framework or "megatron") in MODULE_SELECTIVE_FRAMEWORKS and not options.get("recompute_modules")


def try_module_lists(result: SearchResult, pool: int, keep: int | None = None) -> list[str]:
    """Add the module-list variants of the best ``pool`` plans that are admitted, rank above their
    plan and are not ranked already, re-rank (keeping ``keep`` plans, default as many as given) and
    return one "why not" line: the best module-list plan of the ranking against its layout without a
    list. A search run with ``SearchSpace.module_lists`` (``partita plan`` under megatron/mindspeed)
    has tried each layout's lists itself (:meth:`partita.search.engine._Search._try_modules`), so there
    the variants add nothing and only the line is left; a search run without them gets them here."""
    if not result.plans:
        return []
    top = keep or len(result.plans)
    model = result.model
    lists = candidate_lists(model)
    ranked_plans = {e.plan for e in result.plans}
    found: list[tuple[Estimate, Estimate]] = []  # (variant, its plan)
    for base in result.plans[:pool]:
        if base.plan.recompute == "none":
            continue
        for modules in lists:
            plan = base.plan.with_(recompute="selective", recompute_layers=0, recompute_modules=modules)
            if plan == base.plan or plan in ranked_plans or validate(plan, model) or framework_refuses(plan, model):
                continue
            est = _admitted(result, plan)
            if est.fits and _key(est) < _key(base):
                found.append((est, base))
    best_of: dict[int, tuple[Estimate, Estimate]] = {}
    for est, base in sorted(found, key=lambda pair: _key(pair[0])):
        best_of.setdefault(id(base), (est, base))  # the best list per plan
    if best_of:
        ranked = sorted(list(result.plans) + [est for est, _ in best_of.values()], key=_key)
        result.plans = ranked[:top]
    best = next((e for e in result.plans if e.plan.recompute == "selective" and e.plan.recompute_modules), None)
    if best is None:
        return []
    base = next((b for e, b in best_of.values() if e is best), None) or _without_list(result, best)
    if base is None:
        return []
    return [f"recompute selective --recompute-modules {best.plan.recompute_modules.replace(',', ' ')} "
            f"({best.plan.summary()}): {best.step_time_s / base.step_time_s - 1:+.1%} step time, peak "
            f"{best.peak_memory_gib:.1f} GiB vs {base.peak_memory_gib:.1f} GiB with recompute {base.plan.recompute}"
            + (f" ({base.plan.recompute_modules or 'core_attn'})" if base.plan.recompute == "selective" else "")
            + (f":{base.plan.recompute_layers}" if base.plan.recompute_layers else "")]


def _admitted(result: SearchResult, plan) -> Estimate:
    """``plan``'s estimate judged as the search judges its own (limit and ``--min-p-fit``)."""
    est = estimate(result.model, result.cluster, plan)
    est.memory_limit, est.min_p_fit = result.limit, result.min_p_fit
    return est


def _without_list(result: SearchResult, est: Estimate) -> Estimate | None:
    """What the module-list plan ``est`` replaces: its layout's best admitted plan without a list -
    the ranking's, else the framework's default selective recompute or, failing that, full."""
    layout = est.plan.with_(recompute="none", recompute_modules="", recompute_layers=0)
    same = [e for e in result.plans if not e.plan.recompute_modules and e.plan.recompute != "none"
            and e.plan.with_(recompute="none", recompute_layers=0) == layout]
    if same:
        return min(same, key=_key)
    for plan in (layout.with_(recompute="selective"), layout.with_(recompute="full")):
        other = _admitted(result, plan)
        if other.fits:
            return other
    return None


def modules_shown(plan) -> str:
    """The ``--recompute-modules`` list a plan's row names (``partita plan``'s table, cli/render.py):
    the plan's own list where its recompute is selective and the list is not what the framework runs
    without one (Megatron-Core's default ``core_attn``, :func:`partita.cost.frameworks.selective_modules`),
    comma-separated in the plan's canonical (sorted) order; else "" (nothing to say)."""
    if plan.recompute != "selective" or not plan.recompute_modules:
        return ""
    modules = selective_modules(plan.framework, "selective", plan.recompute_modules)
    if modules == selective_modules(plan.framework, "selective", ""):
        return ""
    return plan.recompute_modules


def _key(e: Estimate) -> float:
    return unc.risk_adjusted(e.step_time_s, e.p_fit)  # the search's own ranking key
