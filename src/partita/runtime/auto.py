"""``parallelize(model, "auto", ...)``: search the best plan for this world size and machine.

The search is the planner's own (:func:`partita.search.search_plans`) over the model's
spec, on the hardware file of the machine: ``calibrated.json`` in the working directory
(written by ``partita calibrate``) when present, else the built-in device of the detected
device type. Fixed fields (``"auto,gbs=8,mbs=1"``) constrain the search; ``gbs`` and
``seq_len`` are required inputs of the search and default to ``world_size`` sequences of
the model's usual 2048 tokens. Every rank runs the same deterministic search, so all pick
the same plan without communicating.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from ..errors import PartitaError
from ..plan import Plan
from ..spec.model import ModelSpec

CALIBRATED = "calibrated.json"
#: plan fields the search space can fix (SearchSpace attributes of the same name)
_SPACE_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "dp", "mbs", "zero", "recompute", "dtype")


def model_spec_of(model: nn.Module) -> ModelSpec:
    """The planner's view of a built model: reference Transformers from their config, HF
    models from their ``config.json`` fields (:func:`partita.spec.hf_config.parse_hf_config`)."""
    from ..models.registry import family_of
    return family_of(model).spec_of(model)


def default_hardware(device_type: str) -> str:
    """``calibrated.json`` here if present, else the built-in file named by the device type."""
    if Path(CALIBRATED).is_file():
        return CALIBRATED
    from ..spec.hardware import builtin_devices
    if device_type in builtin_devices():
        return device_type
    raise PartitaError(f"--plan auto: no {CALIBRATED} here and no built-in hardware file for {device_type!r}; "
                       "run `partita calibrate` or pass hardware=<file or device name>")


def parse_auto(text: str) -> dict[str, str]:
    """``"auto,gbs=8,mbs=1"`` -> {"gbs": "8", "mbs": "1"}."""
    items = [p.strip() for p in text.split(",") if p.strip()]
    if not items or items[0] != "auto":
        raise PartitaError(f"plan {text!r}: an automatic plan starts with 'auto'")
    fixed = {}
    for item in items[1:]:
        if "=" not in item:
            raise PartitaError(f"plan item {item!r} must be key=value, e.g. mbs=1")
        key, value = (s.strip() for s in item.split("=", 1))
        fixed[key] = value
    return fixed


def choose_plan(model: nn.Module, world_size: int, text: str = "auto", device_type: str = "cpu",
                hardware: str | None = None) -> tuple[Plan, str]:
    """The best plan the search finds for ``model`` on ``world_size`` devices of this machine,
    and a report naming it and the runner-up with the reason it lost."""
    from ..search import SearchSpace, search_plans
    from ..spec.hardware import make_cluster
    fixed = parse_auto(text)
    gbs = int(fixed.pop("gbs", world_size))
    seq_len = int(fixed.pop("seq_len", 2048))
    unknown = sorted(set(fixed) - set(_SPACE_FIELDS))
    if unknown:
        raise PartitaError(f"--plan auto: cannot fix {', '.join(unknown)}; fixable: gbs, seq_len, {', '.join(_SPACE_FIELDS)}")
    space: dict[str, Any] = {k: (v if k in ("recompute", "dtype") else int(v)) for k, v in fixed.items()}
    hardware = hardware or default_hardware(device_type)
    cluster = make_cluster(hardware, world_size)
    spec, search_space = model_spec_of(model), SearchSpace(fold_ep=False, **space)
    result, refused = _runnable_plans(model, lambda top: search_plans(spec, cluster, gbs, seq_len, search_space, top=top))
    if result.best is None:
        why = f"; the faster {refused[0]}" if refused else ""
        raise PartitaError(f"--plan auto: no plan this runtime runs fits {world_size} x {cluster.device.name} "
                           f"(gbs={gbs}, seq_len={seq_len}){why}; try a smaller mbs or seq_len")
    report = _report(result, hardware)
    if refused:
        report += f"\nskipped {len(refused)} faster plan(s) this runtime does not run for this model, e.g. {refused[0]}"
    return result.best.plan, report


#: how many of the search's best plans are checked against the runtime's limits, tried in
#: turn while fewer than two of them pass (0: every fitting plan; branch and bound
#: evaluates more layouts for a larger count, so the common case stays cheap)
_TOPS = (8, 64, 0)


def _runnable_plans(model: nn.Module, search) -> tuple[Any, list[str]]:
    """The search's result (``search(top)``) keeping only the plans :func:`.parallelize.runtime_check`
    accepts for ``model`` (a planner layout this runtime refuses, e.g. HF MoE ep with tp, is
    never chosen), and "plan: reason" for each faster plan it dropped."""
    from dataclasses import replace

    from .limits import runtime_check
    for top in _TOPS:
        result = search(top)
        runnable, refused = [], []
        for estimate in result.plans:
            try:
                runtime_check(estimate.plan, model)
                runnable.append(estimate)
            except PartitaError as err:
                if not runnable:
                    refused.append(f"{estimate.plan.summary()}: {str(err).removeprefix('plan not runnable: ')}")
        if len(runnable) >= 2 or top == 0 or len(result.plans) < top:
            return replace(result, plans=runnable), refused
    raise AssertionError("unreachable: the last count searches every plan")


def _report(result, hardware: str) -> str:
    """Chosen plan and runner-up, each with its predicted step time and peak memory; the
    reason the runner-up lost is the step-time ratio (the search ranks fitting plans by it)."""
    def describe(e) -> str:
        return f"{e.plan.summary()}  ({e.step_time_s * 1e3:.3f} ms/step, peak {e.peak_memory_gib:.3f} GiB)"
    best = result.plans[0]
    lines = [f"auto plan on {hardware} x {result.cluster.world_size}: {describe(best)}"]
    if len(result.plans) > 1:
        second = result.plans[1]
        lines.append(f"runner-up: {describe(second)} - {second.step_time_s / best.step_time_s:.3f}x the step time")
    else:
        lines.append("runner-up: none (no other plan fits)")
    return "\n".join(lines)


#: plan fields an automatic plan of a traced model can fix (search_traced's knobs)
_TRACED_FIELDS = ("tp", "pp", "dp", "mbs", "zero", "recompute", "dtype")


def choose_traced_plan(model: nn.Module, world_size: int, text: str = "auto", device_type: str = "cpu",
                       hardware: str | None = None, example_inputs: Any = None,
                       tp_plan: dict[str, str] | None = None) -> tuple[Plan, str]:
    """``parallelize(model, "auto")`` for a model Partita does not know (issue 19): trace it on
    one example micro-batch (``example_inputs`` or ``model.partita_example_inputs``; the
    model's own parameters are not touched, see :func:`partita.trace`), search the traced
    space (:func:`partita.search.traced.search_traced`) for ``world_size`` devices of this
    machine, and return the fastest fitting plan the traced runtime can run and a report.
    ``gbs`` defaults to one example batch per device; ``seq_len`` does not apply (a sample
    is the unit)."""
    from types import SimpleNamespace

    from ..search.traced import search_traced
    from ..spec.hardware import make_cluster
    from ..tracing import trace
    fixed = parse_auto(text)
    unknown = sorted(set(fixed) - {"gbs", *_TRACED_FIELDS})
    if unknown:
        raise PartitaError(f"auto plan of a traced model: cannot fix {', '.join(unknown)}; fixable: gbs, "
                           f"{', '.join(_TRACED_FIELDS)}")
    inputs = example_inputs if example_inputs is not None else getattr(model, "partita_example_inputs", None)
    if inputs is None:
        raise PartitaError(f"parallelize({type(model).__name__}, 'auto') needs one example micro-batch to trace: "
                           "set model.partita_example_inputs = <inputs> (or pass example_inputs=)")
    spec = trace(model, inputs, tp_plan=tp_plan or getattr(model, "partita_tp_plan", None))
    gbs = int(fixed.pop("gbs", world_size * spec.batch))
    space: dict[str, Any] = {k: (v if k in ("recompute", "dtype") else int(v)) for k, v in fixed.items()}
    dtype = space.pop("dtype", "bf16")
    hardware = hardware or default_hardware(device_type)
    cluster = make_cluster(hardware, world_size)
    result = search_traced(spec, cluster, gbs, dtype=dtype, top=1 << 30, **space)
    plans = result.plans  # the traced runtime runs every plan search_traced returns (pp with tp and any zero)
    if not plans:
        raise PartitaError(f"auto plan: no plan of {spec.name} fits {world_size} x "
                           f"{cluster.device.name} (gbs={gbs}); try a smaller mbs or recompute=full")
    return plans[0].plan, _report(SimpleNamespace(plans=plans, cluster=cluster), hardware)
