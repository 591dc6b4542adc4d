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

After the layout search, each of the best plans (:data:`partita.search.comm_knobs.KNOB_POOL` of them)
that recomputes (selective with the default list, or full) is re-estimated with each list of
:func:`candidate_lists` for the model; a variant joins the ranking when it is admitted as the search
admits plans (``P(fit) >= --min-p-fit`` against the same limit) and ranks above the plan it is a
variant of by the search's own key (step time over P(fit)). Plans without recompute are left alone:
recomputing more only adds time. The lists are cumulative, cheapest rerun first - the norms (the
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
from ..cost.frameworks import MODULE_SELECTIVE_FRAMEWORKS
from ..estimate import Estimate, estimate
from ..plan import validate
from .engine import SearchResult


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


def applies(framework: str | None, options: dict) -> bool:
    """Whether the post-pass runs: a module-level framework and no module list the user chose."""
    return (framework or "megatron") in MODULE_SELECTIVE_FRAMEWORKS and not options.get("recompute_modules")


def try_module_lists(result: SearchResult, pool: int, keep: int | None = None) -> list[str]:
    """Add the module-list variants of the best ``pool`` plans that are admitted and rank above their
    plan, re-rank (keeping ``keep`` plans, default as many as given) and return one "why not" line."""
    if not result.plans:
        return []
    top = keep or len(result.plans)
    model = result.model
    lists = candidate_lists(model)
    found: list[tuple[Estimate, Estimate]] = []  # (variant, its plan)
    for base in result.plans[:pool]:
        if base.plan.recompute == "none":
            continue
        for modules in lists:
            plan = base.plan.with_(recompute="selective", recompute_layers=0, recompute_modules=modules)
            if plan == base.plan or validate(plan, model):
                continue
            est = estimate(model, result.cluster, plan)
            est.memory_limit, est.min_p_fit = result.limit, result.min_p_fit
            if est.fits and _key(est) < _key(base):
                found.append((est, base))
    if not found:
        return []
    best_of = {}
    for est, base in sorted(found, key=lambda pair: _key(pair[0])):
        best_of.setdefault(id(base), (est, base))  # the best list per plan
    ranked = sorted(list(result.plans) + [est for est, _ in best_of.values()], key=_key)
    result.plans = ranked[:top]
    est, base = min(best_of.values(), key=lambda pair: _key(pair[0]))
    return [f"recompute selective --recompute-modules {est.plan.recompute_modules.replace(',', ' ')} "
            f"({est.plan.summary()}): {est.step_time_s / base.step_time_s - 1:+.1%} step time, peak "
            f"{est.peak_memory_gib:.1f} GiB vs {base.peak_memory_gib:.1f} GiB with recompute {base.plan.recompute}"
            + (f" ({base.plan.recompute_modules or 'core_attn'})" if base.plan.recompute == "selective" else "")]


def _key(e: Estimate) -> float:
    return unc.risk_adjusted(e.step_time_s, e.p_fit)  # the search's own ranking key
