"""``partita calibrate --from-profile RUN_DIR``: refine a hardware file from real runs.

A `partita train` or `partita profile` run directory holds its plan (``plan.json``), its
configuration (``train.json``) and rank 0's step times (``metrics.jsonl``). A run whose
plan uses exactly one parallel mechanism beyond data parallelism (tp, zero 3, pp, ep,
cp, full recompute; none: the base per-layer overhead, or on a MoE model the local expert
dispatch) measures that mechanism's
framework field exactly as the calibration micro-runs do
(:func:`.fit.fit_overheads`), on the run's own model and shapes: the steps
after the first are the repeats. A run mixing mechanisms cannot separate them and is
reported, not used. (Profiled steps carry the profiler's own overhead: prefer plain
`partita train` runs where the run dir is kept.)
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import PartitaError
from .fit import MECHANISMS, RUNTIME_FRAMEWORK, fit_overheads

#: A run dir's plan and configuration (partita.train.config's PLAN_FILE / TRAIN_FILE: named
#: here, since train imports calibrate and the reverse would be a package cycle).
PLAN_FILE, TRAIN_FILE = "plan.json", "train.json"


def mechanism_of(plan, moe: bool = False) -> str | None:
    """The one mechanism beyond data parallelism ``plan`` uses ("base" for none; "moe" for
    none on a MoE model, whose run measures the local expert dispatch), or None for several."""
    used = [m for m, on in (("tp" if plan.sp else "tp_nosp", plan.tp > 1), ("zero3", plan.zero >= 3), ("pp", plan.pp > 1), ("ep", plan.ep > 1),
                            ("cp", plan.cp > 1), ("recompute", plan.recompute == "full")) if on]
    return used[0] if len(used) == 1 else (("moe" if moe else "base") if not used else None)


def read_run(run_dir: str) -> dict:
    """A run dir's plan, model and steady step times (every step after the first)."""
    from ..plan import Plan
    d = Path(run_dir)
    for f in (PLAN_FILE, TRAIN_FILE, "metrics.jsonl"):
        if not (d / f).is_file():
            raise PartitaError(f"--from-profile {run_dir}: no {f} there; give a `partita train` or `profile` run dir")
    plan = Plan.load(d / PLAN_FILE)
    try:
        model = json.loads((d / TRAIN_FILE).read_text()).get("model")
        times = [json.loads(line)["step_time_s"] for line in (d / "metrics.jsonl").read_text().splitlines()
                 if line.startswith("{") and '"step_time_s"' in line]
    except (ValueError, AttributeError, KeyError) as e:
        raise PartitaError(f"--from-profile {run_dir}: unreadable {TRAIN_FILE} or metrics.jsonl ({e}"[:200] + ")")
    if not isinstance(model, str):
        raise PartitaError(f"--from-profile {run_dir}: {TRAIN_FILE} names no model; give a `partita train` run dir")
    if len(times) < 3:
        raise PartitaError(f"--from-profile {run_dir}: {len(times)} steps recorded; give a run of 3 steps or more")
    return {"plan_obj": plan, "plan": plan.summary(), "model": model, "samples": times[1:], "dir": str(d)}


def refine_from_runs(base: str, run_dirs: list[str], name: str | None) -> dict:
    """A device file extending ``base`` whose framework fields are re-measured on the runs."""
    from ..estimate import estimate
    from ..spec.hardware import Cluster, load_device
    from ..spec.load import load_model
    device = load_device(base)
    known = {f: getattr(device.efficiency, f) for f in MECHANISMS.values()}

    def predict(run: dict, efficiency: dict[str, float]) -> float:
        dev = load_device(base, overrides={"efficiency": efficiency})
        plan = run["plan_obj"].with_(framework=RUNTIME_FRAMEWORK)  # the run dir is Partita's runtime
        return estimate(load_model(run["model"]), Cluster(device=dev, nodes=1, devices_per_node=plan.world_size),
                        plan).step_time_s
    out = {"name": name or f"{device.name}-refined", "extends": base, "efficiency": {}, "efficiency_provenance": {},
           "calibration": {"terms": {}, "skipped": []}}
    for run_dir in run_dirs:
        run = read_run(run_dir)
        mech = mechanism_of(run["plan_obj"], load_model(run["model"]).moe is not None)
        if mech is None:
            out["calibration"]["skipped"].append(f"{run_dir}: {run['plan']} mixes mechanisms")
            continue
        terms = fit_overheads({mech: run}, predict, known)
        for field, term in terms.items():
            term["method"] = f"from run {run_dir} ({run['plan']}, {run['model']}): " + term["method"].split(": ", 1)[1]
            out["calibration"]["terms"][f"efficiency.{field}"] = {k: v for k, v in term.items()}
            out["efficiency"][field] = known[field] = max(term["value"], 0.0)
            out["efficiency_provenance"][field] = (f"measured: partita calibrate --from-profile, {term['value']:.4g} "
                                                   f"+- {term['spread']:.2g} us over {term['repeats']} steps of {run_dir}")
    return out
