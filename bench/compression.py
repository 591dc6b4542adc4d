"""Gradient communication knobs on real text (issue 17): tiny-llama, 2 gloo processes,
the same initialisation and data for every knob; prints final loss vs uncompressed, the
data-parallel bytes per step (measured from torch.profiler traces, beside the cost
model's prediction) and the step time side by side, and writes a plotly HTML plot of the
loss curves.

    python bench/compression.py [--steps 200] [--out bench/compression.html]
    python bench/compression.py --search-speed [--repeats 3]

``--search-speed`` times what the gradient-knob post-pass (partita.search.comm_knobs) adds
to the layout search on bench/search_speed.py's four scenarios: the search, then the
``default`` (bf16) and ``lossy`` (bf16 + PowerSGD) post-passes on its top 5 plans, each
scenario in a fresh process (cold memos, as a user's ``partita plan``), median of the repeats.

The text is the Python standard library's source (as tests/test_checkpoint_resume.py
uses: real text every installation has), BPE-tokenized to the model's 256-token
vocabulary by partita.train.data. Knobs: none (fp32 all-reduce), grad_dtype=bf16,
PowerSGD rank 4 (zero 0, DDP; --all adds rank 1). All runs autocast in bf16 so that only the
reduction differs (bf16 autocast on CPU is ~4x slower than fp32 - the
run is sized to finish in a few minutes on a loaded 2-core machine). Final loss = mean of the last 20 steps' losses (one step's loss on a
8-sequence batch is noisy). Step times are wall-clock medians on a shared machine:
compare them side by side only (`uptime` is printed).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KNOBS = {
    "none": "",
    "bf16": "grad_dtype=bf16",
    "powersgd-r4": "grad_compression=powersgd,powersgd_rank=4",
}
#: with --all: PowerSGD rank 1 as well (a fourth run)
EXTRA = {"powersgd-r1": "grad_compression=powersgd,powersgd_rank=1"}
BASE = "dp=2,zero=0,dtype=bf16,gbs=8,mbs=4,seq_len=64"
LR = 3e-3
#: the issue's acceptance bounds on the final loss relative to the uncompressed run
BOUNDS = {"bf16": 0.01, "powersgd-r4": 0.05}


# ------------------------------------------------------------------ worker (under torchrun)
def _worker(tokens: str, steps: int, out: str, knobs: dict) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from partita.models.builder import build_named_model
    from partita.plan import Plan
    from partita.runtime.compression import powersgd_state_numel, trace_collective_bytes
    from partita.runtime.parallelize import parallelize
    from partita.train.data import PackedTokens

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = {}
    for knob, extra in knobs.items():
        plan = Plan.parse(",".join(filter(None, [BASE, extra])), world_size=2)
        data = PackedTokens(tokens, plan.seq_len, seed=0, vocab=256)
        pm = parallelize(build_named_model("tiny-llama", 0), plan,
                         make_optimizer=lambda ps: torch.optim.AdamW(ps, lr=LR, foreach=False))
        losses, times, per_step = [], [], {}
        for step in range(steps):
            x, y = data.rank_batch(step, plan, rank)
            profiling = step in (10, 11)
            ctx = profile(activities=[ProfilerActivity.CPU], record_shapes=True) if profiling else None
            if ctx:
                ctx.__enter__()
            t0 = time.perf_counter()
            losses.append(pm.train_step(x, y))
            times.append(time.perf_counter() - t0)
            if ctx:
                ctx.__exit__(None, None, None)
                path = Path(out).parent / f"trace_{knob}_{step}_{rank}.json"
                ctx.export_chrome_trace(str(path))
                for coll, v in trace_collective_bytes(json.loads(path.read_text())).items():
                    e = per_step.setdefault(coll, {"bytes": 0.0, "calls": 0.0})
                    e["bytes"] += v["bytes"] / 2
                    e["calls"] += v["calls"] / 2
        state = powersgd_state_numel(pm.compression_state)
        if state:  # P and Q are all-reduced in future callbacks the profiler does not record
            per_step["all_reduce"]["bytes"] += 4 * (state["p_memory_dict"] + state["q_memory_dict"])
        results[knob] = {"plan": plan.to_dict(), "losses": losses, "step_s": times, "per_step": per_step}
        dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------ driver
def _predicted_bytes(plan_dict: dict) -> float:
    from partita.cost.memory import dp_gradient_bytes
    from partita.plan import Plan
    from partita.spec.load import load_model
    return dp_gradient_bytes(load_model("tiny-llama"), Plan.from_dict(plan_dict))["wire"]


def _report(results: dict, steps: int) -> list[str]:
    base = statistics.fmean(results["none"]["losses"][-20:])
    lines = [f"tiny-llama, {steps} steps on stdlib text, 2 gloo ranks, AdamW lr {LR}, {BASE}",
             f"{'knob':<13}{'final loss':>11}{'vs none':>9}{'bound':>7}{'dp bytes/step':>15}{'predicted':>11}"
             f"{'pred/meas':>10}{'step ms':>9}"]
    for knob, r in results.items():
        final = statistics.fmean(r["losses"][-20:])
        measured = r["per_step"].get("all_reduce", {}).get("bytes", 0.0) - 8  # minus the loss average
        predicted = _predicted_bytes(r["plan"])
        bound = BOUNDS.get(knob)
        rel = final / base - 1
        verdict = "" if bound is None else ("ok" if abs(rel) <= bound else "OVER")
        lines.append(f"{knob:<13}{final:>11.4f}{rel:>+9.2%}{(f'{bound:.0%} ' + verdict) if bound else '':>7}"
                     f"{measured:>15,.0f}{predicted:>11,.0f}{predicted / measured:>10.3f}"
                     f"{statistics.median(r['step_s'][5:]) * 1e3:>9.1f}")
    return lines


def _plot(results: dict, path: str) -> None:
    import plotly.graph_objects as go
    fig = go.Figure()
    for knob, r in results.items():
        fig.add_trace(go.Scatter(y=r["losses"], name=knob, mode="lines"))
    fig.update_layout(title="tiny-llama on real text: loss per step by gradient communication knob",
                      xaxis_title="step", yaxis_title="training loss")
    fig.write_html(path, include_plotlyjs="cdn")


_SEARCH_RUN = """
import copy, json, sys, time
from partita.search import search_plans
from partita.search.comm_knobs import parse_grad_knobs, try_comm_knobs
from partita.spec.hardware import make_cluster
from partita.spec.load import load_model
name, hw, n, gbs, seq = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
model, cluster = load_model(name), make_cluster(hw, n)
t0 = time.perf_counter()
result = search_plans(model, cluster, gbs, seq)
out = {"search": time.perf_counter() - t0}
for preset in ("default", "lossy"):
    r = copy.copy(result)
    r.plans = list(result.plans)
    t0 = time.perf_counter()
    try_comm_knobs(r, parse_grad_knobs(preset))
    out[preset] = time.perf_counter() - t0
    out[preset + "_best"] = r.best.plan.summary()
print(json.dumps(out))
"""


def search_speed(repeats: int) -> None:
    """The search and the knob post-passes on bench/search_speed.py's scenarios (module docstring)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from search_speed import SCENARIOS
    print("load average:", ", ".join(f"{x:.1f}" for x in os.getloadavg()))
    print(f"{'scenario':36s} {'search s':>8s} {'+default ms':>11s} {'+lossy ms':>9s}  best with lossy")
    for sc in SCENARIOS:
        runs = [json.loads(subprocess.run([sys.executable, "-c", _SEARCH_RUN, *map(str, sc)], capture_output=True,
                                          text=True, timeout=300, check=True).stdout) for _ in range(repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in ("search", "default", "lossy")}
        print(f"{' '.join(map(str, sc)):36s} {med['search']:8.3f} {med['default'] * 1e3:11.1f} "
              f"{med['lossy'] * 1e3:9.1f}  {runs[0]['lossy_best']}")
    print("load average:", ", ".join(f"{x:.1f}" for x in os.getloadavg()))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--search-speed":
        search_speed(int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--repeats" else 3)
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], int(sys.argv[3]), sys.argv[4], {**KNOBS, **(EXTRA if sys.argv[5] == "all" else {})})
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", default="bench/compression.html", help="the plot (plotly HTML)")
    ap.add_argument("--all", action="store_true", help="also PowerSGD rank 1")
    args = ap.parse_args()
    from partita.train.data import stdlib_corpus, tokenize_to_file
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    with tempfile.TemporaryDirectory(prefix="partita-compression-") as tmp:
        tokens = tokenize_to_file(str(stdlib_corpus(Path(tmp) / "corpus.txt")), 256, tmp)
        out = Path(tmp) / "results.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               f"--log-dir={Path(tmp) / 'logs'}", __file__, "--worker", str(tokens), str(args.steps), str(out),
               "all" if args.all else "main"]
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
        if proc.returncode:
            print(proc.stdout[-3000:], proc.stderr[-5000:])
            return 1
        results = json.loads(out.read_text())
    print("\n".join(_report(results, args.steps)))
    _plot(results, args.out)
    print(f"plot: {args.out}; wall {time.time() - t0:.0f} s;",
          "uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
