"""``partita serve``'s prefill and decode step times against measured forwards on this CPU.

    python bench/serve_vs_measure.py [--hardware cpu] [--repeats 5] [--nproc 2] [--timeout-s 900]
    python bench/serve_vs_measure.py --calibrate --nproc 2   # calibrate first, in the same run

A small Llama-shaped transformers model (fp32, eager attention, transformers' DynamicCache)
runs forward only, one thread per process, as the CPU device file describes (one core per
process):

* prefill: one prompt of P tokens into an empty cache, logits of the last token only
  (``logits_to_keep=1``, as ``generate`` and the serving engines compute them);
* decode: B sequences after a prefill of L tokens, one token each per step, the cache
  growing - the median over the steps of one run.

Layouts: ``tp1`` in this process; with ``--nproc 2`` also ``tp2`` (one replica over two gloo
processes, Partita's runtime tensor parallel) and ``dp2`` (two replicas, one per process),
each run by ``torchrun`` on ``bench/serve_measure_worker.py``. A time is read on calibrate's
busy clock, the wall-clock minus the time the thread waited on the run queue, a tp step on its
collective clock (``critical_busy_s``; the worker's docstring): on a shared machine, what the
forward would take with the cores to itself; the raw wall-clock is printed beside it, and the
summary on the earlier tp clock (the smaller rank's own busy time) below it. Beside each decode case: the MB a step touched for the first
time (the kernel's minor faults x the page size, median over the steps) and the MB the planner
prices as first-touched (:func:`partita.serve.latency.decode_kv_fresh_bytes` x layers: every
``cat`` / ``repeat_kv`` result on a file without the ``eager_decode`` rates, none on one with
them). Every process that runs the forwards first calls :func:`steady_heap` (glibc: no mmap, no
heap trimming): after the warm-up step a step's tensors land in pages the process touched
before, as a serving engine's do; under glibc's defaults the heap's history decided it
(docs/serve.md, issue 37).

Each is predicted by :func:`partita.serve.latency.prefill_time` and
:func:`partita.serve.latency.decode_stage_time` for the layout in fp32 on the device file
(``--hardware``: the built-in ``cpu`` file, or the one ``partita calibrate`` writes for this
machine) with the ``partita`` framework entry (eager kernels and transformers' cache, as the
measured runtime runs them). Prints predicted and measured side by side, the ratio, the median
and worst absolute error, and the load average (the figures move with it on a shared
machine). ``--calibrate`` runs ``partita calibrate --nproc 2`` first and predicts with the
file it writes: the device figures and the measurements then come from the same minutes of
the machine's load. Timings belong here, not in tests.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch
import transformers

from partita.calibrate.busy_clock import seconds_per_call
from partita.serve.latency import decode_kv_fresh_bytes, decode_stage_time, prefill_time
from partita.serve.memory import kv_bytes_per_token_layer
from partita.serve.workload import Layout
from partita.spec.hardware import load_device
from partita.spec.hf_config import parse_hf_config

CONFIG = dict(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=4, max_position_embeddings=4096, tie_word_embeddings=False)
PREFILL = (64, 256, 1024)
DECODE = ((1, 256), (8, 256), (8, 1024), (32, 512))  # (batch, context)
#: bytes per page of the kernel's fault count
PAGE = os.sysconf("SC_PAGE_SIZE")
#: layouts measured: (name, tp, replicas); tp2 and dp2 need ``--nproc 2``
LAYOUTS = (("tp1", 1, 1), ("tp2", 2, 1), ("dp2", 1, 2))


#: mallopt(3) parameters (glibc malloc.h): ``M_TRIM_THRESHOLD``, ``M_MMAP_MAX``
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4


def steady_heap() -> bool:
    """Make the process's host allocator reuse its pages, as a serving engine's memory does;
    True where glibc took the settings (False elsewhere: the allocator left as it is).

    Why: an eager decode step allocates its K/V anew (``DynamicLayer.update``'s ``torch.cat``,
    ``repeat_kv``'s copies), and under glibc's defaults whether those tensors get pages the
    process has touched before depends on the heap's history, not on the step: a request of at
    least the dynamic ``M_MMAP_THRESHOLD`` (raised to each freed mmapped chunk's size, capped at
    32 MiB) is mmapped fresh when no free heap chunk fits, and free memory at the heap's top
    beyond ``M_TRIM_THRESHOLD`` is given back to the kernel and faults again when the heap
    regrows. Measured in the bench's long-lived process (issue 37, docs/serve.md): decode batch
    8 at context 1024 first-touched 0-143 MB a step and batch 32 at context 512 0-287 MB, from
    run to run at the same shapes, moving the step by up to 1.7x. A serving engine does not see
    this: it preallocates its KV cache and its allocator keeps freed blocks (vLLM's block pool;
    PyTorch's caching allocator on an accelerator never returns a block to the driver between
    steps). ``M_MMAP_MAX = 0`` serves every request from the heap and the largest
    ``M_TRIM_THRESHOLD`` never shrinks it, so after the warm-up step every allocation of a
    step lands in pages the process already touched - what the serve model prices
    (:func:`partita.serve.latency.decode_kv_fresh_bytes`: none on a file with the
    ``eager_decode`` rates). Call it before the model is built."""
    path = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(path) if path else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        return False
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1))


def case_list() -> list[tuple[str, int, int]]:
    """(kind, P or B, 0 or L) of every case, prefill first."""
    return [("prefill", p, 0) for p in PREFILL] + [("decode", b, ctx) for b, ctx in DECODE]


def build_model() -> transformers.LlamaForCausalLM:
    """The bench's model, the same weights in every process (seed 0)."""
    config = transformers.LlamaConfig(**CONFIG, attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def model_spec():
    """Partita's view of the bench's model (the same config)."""
    return parse_hf_config(transformers.LlamaConfig(**CONFIG).to_dict(), "bench", "LlamaForCausalLM")


def predict(spec, device, tp: int, kind: str, a: int, b: int, repeats: int) -> float:
    """Seconds the serve model predicts for one case on a ``tp``-way replica (fp32, eager runtime)."""
    layout = Layout(tp, 1, 1, kv_dtype="fp32", dtype="fp32")
    if kind == "prefill":
        return prefill_time(spec, device, layout, a, tp, framework="partita")
    # the cache grows by one token a step: the mean context over the warm-up and timed steps
    return decode_stage_time(spec, device, layout, a, b + (repeats + 1) / 2, tp, framework="partita")


def predicted_fresh_mb(spec, device, tp: int, kind: str, a: int, b: int, repeats: int) -> float:
    """MB a decode step writes into first-touched pages by the serve model (0 for prefill)."""
    if kind == "prefill":
        return 0.0
    layout = Layout(tp, 1, 1, kv_dtype="fp32", dtype="fp32")
    kv = a * (b + (repeats + 1) / 2) * kv_bytes_per_token_layer(spec, layout)
    return decode_kv_fresh_bytes(spec, device, tp, "partita", kv) * spec.layers / 1e6


def measure_here(repeats: int) -> dict:
    """The tp1 cases in this process (the worker's timing, no peer)."""
    import serve_measure_worker as worker
    model = build_model()
    rows = []
    for kind, a, b in case_list():
        local = worker.measure_case(model, kind, a, b, repeats, a * 7 + b)
        rows.append({"kind": kind, "a": a, "b": b, "busy_s": statistics.median(t[0] for t in local),
                     "wall_s": statistics.median(t[1] for t in local), "faults": statistics.median(t[2] for t in local)})
    return {"mode": "tp1", "rows": rows, "load": os.getloadavg()[0]}


def busy_clone_rate(repeats: int) -> float:
    """Bytes/s of the clone ``partita calibrate`` times for ``memory.hbm_tbps`` (64 MB fp32,
    read + write, into first-touched pages), timed here on calibrate's loop before the forwards
    (and before :func:`steady_heap`, under which the clone would reuse its pages): the file's
    figure comes from the minutes calibrate ran, at that load."""
    x = torch.randn(16_000_000)
    return 2 * x.numel() * x.element_size() / statistics.median(seconds_per_call(x.clone, max(repeats, 5)))


def _summary(rows: list[dict], key: str) -> str:
    errors = [abs(r[key] / r["measured_s"] - 1) for r in rows]
    return f"median |error| {statistics.median(errors) * 100:.0f} %, worst {max(errors) * 100:.0f} %"


def measure_torchrun(mode: str, repeats: int, timeout_s: float) -> dict:
    """The cases of ``mode`` (tp or dp) on two gloo processes; raises on failure or timeout."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, f"{mode}.json")
        worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve_measure_worker.py")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", worker,
               "--mode", mode, "--repeats", str(repeats), "--out", out, "--timeout-s", str(timeout_s)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode != 0 or not os.path.exists(out):
            raise SystemExit(f"{mode} workers failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        with open(out) as f:
            data = json.load(f)
    data["mode"] = f"{mode}2"
    return data


def calibrate(out: str, timeout_s: float) -> None:
    """``partita calibrate --nproc 2 -o out`` (its own timeout, and this one around it)."""
    print(f"calibrating: partita calibrate --nproc 2 -o {out} (load average {os.getloadavg()[0]:.1f})", flush=True)
    cmd = [sys.executable, "-m", "partita", "calibrate", "--nproc", "2", "-o", out, "--timeout-s", str(int(timeout_s))]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 60)
    if done.returncode != 0:
        raise SystemExit(f"partita calibrate failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hardware", default="cpu")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--nproc", type=int, default=1, choices=(1, 2), help="2: also tp2 and dp2 on gloo")
    ap.add_argument("--timeout-s", type=float, default=900, help="per torchrun launch")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--calibrate", metavar="OUT", nargs="?", const="serve_vs_measure_calibrated.json",
                    help="run `partita calibrate --nproc 2 -o OUT` first and predict with OUT")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.calibrate:
        calibrate(args.calibrate, args.timeout_s)
        args.hardware = args.calibrate
    device, spec = load_device(args.hardware), model_spec()
    clone = busy_clone_rate(args.repeats)  # into fresh pages: before steady_heap, which reuses them
    heap = steady_heap()  # calibrate's subprocess ran under glibc's defaults
    measures = [lambda: measure_here(args.repeats)]
    if args.nproc == 2:
        measures += [lambda: measure_torchrun("tp", args.repeats, args.timeout_s),
                     lambda: measure_torchrun("dp", args.repeats, args.timeout_s)]
    tps = {name: tp for name, tp, _ in LAYOUTS}
    print(f"{'layout':<7}{'case':<22}{'predicted ms':>14}{'measured ms':>13}{'wall ms':>10}{'pred/meas':>11}{'load':>6}"
          f"{'fresh MB pred/meas':>20}", flush=True)
    rows = []
    for measure in measures:  # each layout's rows printed as soon as they are measured
        run = measure()
        for r in run["rows"]:
            pred = predict(spec, device, tps[run["mode"]], r["kind"], r["a"], r["b"], args.repeats)
            name = f"P={r['a']}" if r["kind"] == "prefill" else f"B={r['a']} L={r['b']}"
            fresh = predicted_fresh_mb(spec, device, tps[run["mode"]], r["kind"], r["a"], r["b"], args.repeats)
            touched = r["faults"] * PAGE / 1e6
            rows.append({"layout": run["mode"], "case": f"{r['kind']} {name}", "predicted_s": pred,
                         "measured_s": r["busy_s"], "wall_s": r["wall_s"], "load": run["load"],
                         "fresh_mb_predicted": fresh, "fresh_mb_measured": touched,
                         "busy_min_s": r.get("busy_min_s", r["busy_s"])})
            print(f"{run['mode']:<7}{r['kind'] + ' ' + name:<22}{pred * 1e3:>14.2f}{r['busy_s'] * 1e3:>13.2f}"
                  f"{r['wall_s'] * 1e3:>10.1f}{pred / r['busy_s']:>11.2f}{run['load']:>6.1f}"
                  f"{fresh:>11.0f} /{touched:>6.0f}", flush=True)
    busy_dev = load_device(args.hardware, {"memory": {"hbm_tbps": clone / 1e12}})
    for r in rows:
        kind, rest = r["case"].split(" ", 1)
        ab = dict(x.split("=") for x in rest.split())
        a, b = (int(ab["P"]), 0) if kind == "prefill" else (int(ab["B"]), int(ab["L"]))
        r["predicted_busy_memory_s"] = predict(spec, busy_dev, tps[r["layout"]], kind, a, b, args.repeats)
    print(f"{_summary(rows, 'predicted_s')} over "
          f"{len(rows)} cases; hardware {device.name} ({device.source_file}); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; 1 thread per process; heap steady: {heap}")
    earlier = [{**r, "measured_s": r["busy_min_s"]} for r in rows]  # tp read on each rank's own busy clock
    print(f"on the earlier clock (tp: the smaller rank's busy time): {_summary(earlier, 'predicted_s')}")
    if device.eager_decode is not None:  # the eager decode step's rates calibrate measured
        e = device.eager_decode
        print("the file's eager_decode: GEMM GFLOP/s by rows " + ", ".join(f"{m}: {r / 1e9:.1f}" for m, r in e.gemm_by_rows)
              + f"; attention at q_len 1 {e.attention_bytes_per_s / 1e9:.2f} GB/s; host {e.host_s_per_layer * 1e3:.2f} "
              f"ms/layer + {e.host_s_per_step * 1e3:.2f} ms/step; read {device.read_bytes_per_s() / 1e9:.2f} GB/s")
    print(f"the file's clone rate {device.hbm_tbps * 1e3:.2f} GB/s; the same clone timed before the forwards "
          f"{clone / 1e9:.2f} GB/s; predicted with it: {_summary(rows, 'predicted_busy_memory_s')} "
          f"(" + ", ".join(f"{r['predicted_busy_memory_s'] / r['measured_s']:.2f}" for r in rows) + ")")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"hardware": device.source_file, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
