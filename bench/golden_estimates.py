"""Record a fixed, broad set of estimates and search results as a golden file.

    python bench/golden_estimates.py            # rewrite tests/data/golden_estimates.json
    python bench/golden_estimates.py --check    # compare with the file, print what moved

Why: a refactor of the cost model or the search must not change a single number. The
file holds every output of :func:`partita.estimate.estimate` (time parts, per-stage
terms, every rank's memory breakdown, the search's memory and bound functions) for ~50
plans over dense / MoE / MLA presets and every knob (tp, pp, vpp, cp, ep, zero,
recompute, sp, dtype, tp_comm_overlap, layer_split, schedule), on several devices, and
the top 8 plans (every field) plus the "why not" lines of the four search benchmark
scenarios (bench/search_speed.py). Floats are stored with their full ``repr``, so
``tests/test_golden_estimates.py`` compares them with ``==``. A change that is meant to
move numbers regenerates the file in the same commit and says what moved.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from partita.cost.memory import peak_memory, peak_memory_ladder
from partita.cost.step import step_time_lower_bound
from partita.estimate import estimate
from partita.plan import Plan
from partita.search import SearchSpace, search_plans
from partita.search.engine import infeasible_message
from partita.search.explain import why_not
from partita.spec.hardware import make_cluster
from partita.spec.load import load_model

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "data" / "golden_estimates.json"

#: (model, hardware, devices, plan fields); dp is derived from the device count.
ESTIMATE_CASES: list[tuple[str, str, int, dict[str, Any]]] = [
    # dense, Ascend
    ("llama3-8b", "ascend-910b2", 8, dict(tp=1, gbs=64, mbs=1, seq_len=4096, zero=1)),
    ("llama3-8b", "ascend-910b2", 8, dict(tp=2, sp=True, gbs=64, mbs=2, seq_len=4096, zero=2)),
    ("llama3-8b", "ascend-910b2", 8, dict(tp=8, sp=True, gbs=64, mbs=1, seq_len=8192, recompute="selective")),
    ("llama3-8b", "ascend-910b2", 8, dict(tp=4, sp=False, gbs=32, mbs=1, seq_len=4096, recompute="full", zero=0)),
    ("llama3-8b", "ascend-910b2", 16, dict(tp=8, sp=True, gbs=64, mbs=1, seq_len=4096, tp_comm_overlap=True)),
    ("llama-65b", "ascend-910b2", 512, dict(tp=8, pp=4, sp=True, gbs=2048, mbs=1, seq_len=2048, tp_comm_overlap=True)),
    ("llama-65b", "ascend-910b2", 512, dict(tp=8, pp=8, vpp=2, sp=True, gbs=2048, mbs=1, seq_len=2048,
                                             schedule="interleaved-1f1b", recompute="selective")),
    ("llama-65b", "ascend-910b2", 256, dict(tp=8, pp=8, sp=True, gbs=512, mbs=2, seq_len=2048, zero=3)),
    ("llama-65b", "ascend-910b2", 512, dict(tp=4, pp=4, cp=2, sp=True, gbs=1024, mbs=1, seq_len=8192, recompute="full")),
    ("llama2-70b", "ascend-910b2", 64, dict(tp=8, pp=8, sp=True, gbs=128, mbs=1, seq_len=4096, grad_dtype="bf16")),
    ("qwen2.5-7b", "ascend-910b2", 16, dict(tp=2, sp=True, gbs=32, mbs=1, seq_len=4096, overlap_grad_reduce=False,
                                            overlap_param_gather=False)),
    ("qwen2.5-72b", "ascend-910b3", 128, dict(tp=8, pp=4, sp=True, gbs=256, mbs=1, seq_len=4096, zero=1,
                                               recompute="selective")),
    ("llama3-8b", "ascend-910c", 16, dict(tp=4, cp=2, sp=True, gbs=16, mbs=1, seq_len=16384)),
    # dense, NVIDIA
    ("gpt3-175b", "h100-sxm", 1024, dict(tp=8, pp=8, sp=True, gbs=1536, mbs=1, seq_len=2048, tp_comm_overlap=True)),
    ("gpt3-175b", "h100-sxm", 1024, dict(tp=8, pp=16, vpp=2, sp=True, gbs=1536, mbs=1, seq_len=2048,
                                          schedule="interleaved-1f1b", recompute="selective")),
    ("gpt3-175b", "h100-sxm", 512, dict(tp=8, pp=8, sp=True, gbs=512, mbs=1, seq_len=2048, dtype="fp8")),
    ("gpt3-175b", "a100-80gb", 1024, dict(tp=8, pp=16, sp=False, gbs=1536, mbs=1, seq_len=2048, recompute="full",
                                           schedule="gpipe")),
    ("gpt3-175b", "h100-sxm", 1024, dict(tp=4, pp=8, sp=True, gbs=1024, mbs=2, seq_len=2048, schedule="zero-bubble")),
    ("llama3-70b", "h100-sxm", 64, dict(tp=8, pp=1, sp=True, gbs=64, mbs=1, seq_len=8192, zero=3, recompute="full")),
    ("llama3-70b", "h100-sxm", 128, dict(tp=8, pp=4, cp=2, sp=True, gbs=128, mbs=1, seq_len=16384)),
    ("llama3-70b", "h200", 256, dict(tp=4, pp=4, cp=4, sp=True, gbs=64, mbs=1, seq_len=32768, recompute="selective",
                                      tp_comm_overlap=True)),
    ("llama3-405b", "h100-sxm", 2048, dict(tp=8, pp=16, sp=True, gbs=2048, mbs=1, seq_len=8192,
                                            layer_split=(7,) + (8,) * 14 + (7,))),
    ("llama3-405b", "h100-sxm", 1024, dict(tp=8, pp=8, vpp=2, sp=True, gbs=512, mbs=1, seq_len=8192,
                                            schedule="interleaved-1f1b", layer_split=(7,) + (8,) * 14 + (7,))),
    ("llama3-8b", "h100-sxm", 8, dict(tp=1, gbs=32, mbs=4, seq_len=8192, zero=3, recompute="selective")),
    ("llama3-8b", "h100-sxm", 8, dict(tp=1, gbs=32, mbs=2, seq_len=8192, dtype="fp8", zero=2)),
    ("llama3-8b", "a100-40gb", 16, dict(tp=2, sp=True, gbs=64, mbs=1, seq_len=4096, dtype="fp16")),
    ("llama2-7b", "a100-80gb", 8, dict(tp=1, gbs=8, mbs=1, seq_len=4096, dtype="fp32", zero=0)),
    ("llama-13b", "h800", 32, dict(tp=2, pp=2, sp=True, gbs=64, mbs=2, seq_len=4096, zero=2, grad_dtype="bf16")),
    ("llama3-8b", "mi300x", 8, dict(tp=2, sp=True, gbs=32, mbs=2, seq_len=8192)),
    ("llama3-70b", "b200", 64, dict(tp=8, pp=2, sp=True, gbs=128, mbs=1, seq_len=8192, dtype="fp8",
                                     tp_comm_overlap=True)),
    ("llama3-8b", "h20", 16, dict(tp=4, sp=True, gbs=32, mbs=1, seq_len=8192)),
    # MoE / MLA
    ("mixtral-8x7b", "h100-sxm", 64, dict(tp=2, pp=4, ep=8, sp=True, gbs=256, mbs=1, seq_len=4096)),
    ("mixtral-8x7b", "ascend-910b2", 64, dict(tp=4, pp=2, ep=4, sp=True, gbs=128, mbs=1, seq_len=4096,
                                               recompute="selective", zero=3)),
    ("mixtral-8x22b", "ascend-910b2", 256, dict(tp=4, pp=8, ep=8, sp=True, gbs=1024, mbs=1, seq_len=4096,
                                                 recompute="full")),
    ("mixtral-8x22b", "ascend-910b2", 256, dict(tp=2, pp=8, vpp=7, ep=8, sp=True, gbs=1024, mbs=1, seq_len=4096,
                                                 schedule="interleaved-1f1b", tp_comm_overlap=True)),
    ("deepseek-v3", "h800", 2048, dict(tp=1, pp=16, ep=64, gbs=15360, mbs=1, seq_len=4096,
                                        layer_split=(4,) + (4,) * 14 + (1,))),
    ("deepseek-v3", "h800", 2048, dict(tp=2, pp=8, vpp=2, ep=32, cp=2, sp=True, gbs=15360, mbs=1, seq_len=4096,
                                        schedule="interleaved-1f1b", recompute="selective",
                                        layer_split=(3,) + (4,) * 14 + (2,))),
    ("qwen3-30b-a3b", "h100-sxm", 16, dict(tp=1, ep=8, gbs=64, mbs=2, seq_len=4096, zero=3)),
    ("qwen3-235b-a22b", "ascend-910b2", 512, dict(tp=4, pp=8, ep=16, sp=True, gbs=512, mbs=1, seq_len=4096,
                                                   layer_split=(11,) + (12,) * 6 + (11,), recompute="full")),
    ("qwen3-235b-a22b", "h100-sxm", 128, dict(tp=2, pp=4, cp=2, ep=8, sp=True, gbs=128, mbs=1, seq_len=16384,
                                               layer_split=(23, 24, 24, 23), tp_comm_overlap=True)),
    # tiny / CPU
    ("tiny-llama", "cpu", 4, dict(tp=2, sp=True, gbs=8, mbs=1, seq_len=64, dtype="fp32")),
    ("tiny-llama", "cpu", 4, dict(tp=1, pp=2, gbs=8, mbs=1, seq_len=64, dtype="fp32", zero=3)),
    ("tiny-llama", "cpu", 8, dict(tp=2, pp=2, sp=True, gbs=8, mbs=1, seq_len=64, dtype="fp32", recompute="full",
                                  zero=3)),
    ("tiny-llama", "cpu", 4, dict(tp=1, pp=2, vpp=2, gbs=8, mbs=1, seq_len=64, dtype="fp32",
                                  schedule="interleaved-1f1b")),
    ("tiny-moe", "cpu", 4, dict(tp=1, ep=4, gbs=8, mbs=1, seq_len=64, dtype="fp32", recompute="selective")),
    ("tiny-moe", "cpu", 4, dict(tp=2, ep=2, sp=True, gbs=8, mbs=2, seq_len=64, dtype="fp32", zero=2)),
    ("small-llama", "cpu", 4, dict(tp=1, cp=2, gbs=8, mbs=1, seq_len=128, dtype="fp32", zero=0)),
    ("small-llama", "ascend-910b2", 8, dict(tp=2, pp=2, sp=True, gbs=16, mbs=2, seq_len=512, recompute="selective")),
    ("llama3-8b", "ascend-910b4", 8, dict(tp=2, sp=True, gbs=16, mbs=1, seq_len=4096, recompute="full", zero=3)),
    ("llama3-8b", "ascend-910b1", 8, dict(tp=8, sp=True, gbs=8, mbs=1, seq_len=32768, recompute="selective")),
    ("llama3-8b", "h100-sxm", 8, dict(tp=1, gbs=8, mbs=1, seq_len=131072, recompute="full", zero=3)),
]

#: The four scenarios of bench/search_speed.py: (model, hardware, devices, global batch, seq).
SEARCH_CASES = [
    ("gpt3-175b", "h100-sxm", 1024, 1536, 2048),
    ("llama-65b", "ascend-910b2", 512, 2048, 2048),
    ("deepseek-v3", "h800", 2048, 15360, 4096),
    ("mixtral-8x22b", "ascend-910b2", 256, 1024, 4096),
]
#: Small searches that exercise fixed knobs and the "nothing fits" message.
SEARCH_EXTRA = [
    ("llama3-70b", "h100-sxm", 64, 64, 8192, dict(tp=8)),
    ("tiny-moe", "cpu", 8, 16, 256, dict(dtype="fp32")),
    ("llama3-405b", "h100-sxm", 8, 8, 8192, dict()),  # nothing fits
]

LADDER_STEPS = [(rc, z) for rc in ("none", "selective", "full") for z in (0, 1, 2, 3)]


def _plan(devices: int, fields: dict[str, Any]) -> Plan:
    fields = dict(fields)
    dp = devices // (fields.get("tp", 1) * fields.get("pp", 1) * fields.get("cp", 1))
    if "layer_split" in fields:
        fields["layer_split"] = tuple(fields["layer_split"])
    return Plan(dp=dp, **fields)


def record_estimate(model_name: str, hardware: str, devices: int, fields: dict[str, Any]) -> dict[str, Any]:
    """Every number the cost model gives for one plan."""
    model, cluster = load_model(model_name), make_cluster(hardware, devices)
    plan = _plan(devices, fields)
    est = estimate(model, cluster, plan)
    out = est.to_dict()
    out["memory_all_ranks"] = [{"rank": m.rank, "parts": dict(m.parts), "total": m.total} for m in est.memory]
    out["stages"] = [{"rank": s.rank, "parts": dict(s.parts), "flops": s.flops, "forward": s.forward,
                      "backward": s.backward} for s in est.time.stages]
    out["peak_memory"] = list(peak_memory(model, cluster.device, est.plan))
    ladder = peak_memory_ladder(model, cluster.device, est.plan.with_(zero=1, recompute="none"), LADDER_STEPS)
    out["peak_memory_ladder"] = [[rc, z, *ladder[(rc, z)]] for rc, z in LADDER_STEPS]
    out["step_time_lower_bound"] = step_time_lower_bound(model, cluster, est.plan)
    return out


def record_search(model_name: str, hardware: str, devices: int, gbs: int, seq: int,
                  space_fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """The top 8 plans (every field), the counters and the "why not" lines of one search."""
    model, cluster = load_model(model_name), make_cluster(hardware, devices)
    result = search_plans(model, cluster, gbs, seq, SearchSpace(**(space_fields or {})), top=8)
    out: dict[str, Any] = {
        "plans": [e.to_dict() for e in result.plans],
        "candidates_evaluated": result.candidates_evaluated,
        "candidates_pruned": result.candidates_pruned,
        "candidates_bounded": result.candidates_bounded,
        "memory_limit_gib": result.memory_limit_gib,
        "attempts": len(result.attempts),
        "invalid": len(result.invalid),
        "alternatives": {k: list(v) for k, v in result.alternatives.items()},
        "why_not": why_not(result),
    }
    if not result.plans:
        out["infeasible"] = infeasible_message(result)
    return out


def record_all() -> dict[str, Any]:
    estimates = [{"case": [m, hw, n, f], "result": record_estimate(m, hw, n, f)} for m, hw, n, f in ESTIMATE_CASES]
    searches = [{"case": [m, hw, n, gbs, seq, {}], "result": record_search(m, hw, n, gbs, seq)}
                for m, hw, n, gbs, seq in SEARCH_CASES]
    searches += [{"case": [m, hw, n, gbs, seq, f], "result": record_search(m, hw, n, gbs, seq, f)}
                 for m, hw, n, gbs, seq, f in SEARCH_EXTRA]
    return {"estimates": estimates, "searches": searches}


def _normalise(data: Any) -> Any:
    """Through JSON and back: tuples become lists, as in the stored file (floats keep their repr)."""
    return json.loads(json.dumps(data))


def diff(old: Any, new: Any, path: str = "") -> list[str]:
    """Every leaf that differs, with the relative change of numbers."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            if k not in old or k not in new:
                out.append(f"{path}/{k}: {'added' if k not in old else 'removed'}")
            else:
                out += diff(old[k], new[k], f"{path}/{k}")
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [line for i, (a, b) in enumerate(zip(old, new)) for line in diff(a, b, f"{path}[{i}]")]
    if old == new:
        return []
    if isinstance(old, float) and isinstance(new, (int, float)) and old:
        return [f"{path}: {old!r} -> {new!r} ({new / old - 1:+.3%})"]
    return [f"{path}: {old!r} -> {new!r}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the stored file instead of writing it")
    args = parser.parse_args()
    data = _normalise(record_all())
    if args.check:
        lines = diff(json.loads(GOLDEN.read_text()), data)
        print("\n".join(lines) if lines else "bit-identical")
        return 1 if lines else 0
    GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN} ({len(data['estimates'])} estimates, {len(data['searches'])} searches)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
