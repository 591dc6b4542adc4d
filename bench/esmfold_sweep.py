"""ESMFold inference on CPU: predicted (``partita.trace`` inference mode) vs measured peak memory.

    python bench/esmfold_sweep.py                       # lengths 64 128 192 256, no chunking
    python bench/esmfold_sweep.py --lengths 96 160 --chunk-at 256

The model is ``esmfold-tiny`` (:mod:`partita.tracing.esmfold`: random weights, no download).
Each measurement runs in a **fresh subprocess** (one thread): it builds the model, runs one
warm-up forward at 8 residues (lazy initialisation of torch's CPU kernels), resets the
kernel's resident-set high-water mark (``echo 5 > /proc/self/clear_refs`` zeroes ``VmHWM``,
Linux >= 4.0, proc(5)), reads ``VmRSS``, runs the forward under ``torch.inference_mode`` and
reads ``VmHWM``, with glibc's mmap threshold fixed (:data:`FIXED_MMAP`) and, beside it, with
glibc's defaults. Measured activation peak = ``VmHWM - VmRSS before``: the pages the forward
really touched at its worst moment, whatever allocated them - torch's tensors, BLAS/oneDNN
workspaces, malloc's fragmentation (glibc returns blocks above its mmap threshold to the
kernel on free, smaller ones stay in its heap and are reused). The prediction counts only
tensors. Weights and inputs are counted identically on both sides (they exist before the
baseline), so the comparison is on the activation peak; totals are printed too.

The chunk-size check: at ``--chunk-at`` residues, a memory limit halfway between the default
(no chunking) predicted peak and the lowest chunked one; :func:`partita.tracing.knobs.search`
picks the fastest setting under it, and both that setting and the default are measured.
Time: measured wall time of the forward vs the roofline of ``catalog/devices/cpu.json``
(reported, not asserted: a shared 2-core VM).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 2 ** 20


def _status(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def child(seq_len: int, chunk: int | None) -> dict:
    """Measure one forward in this (fresh) process."""
    import torch
    torch.set_num_threads(1)
    from partita.tracing import esmfold
    model = esmfold.build("esmfold-tiny", "cpu")
    model.trunk.set_chunk_size(chunk)
    with torch.inference_mode():
        model(torch.randint(0, 20, (1, 8)))
        ids = torch.randint(0, 20, (1, seq_len))
        Path("/proc/self/clear_refs").write_text("5")
        before = _status("VmRSS")
        start = time.perf_counter()
        out = model(ids)
        seconds = time.perf_counter() - start
        peak = _status("VmHWM")
        del out
    return {"activation_bytes": peak - before, "seconds": seconds}


#: glibc malloc's mmap threshold fixed at 64 KiB (mallopt(3), M_MMAP_THRESHOLD via its environment
#: variable): every tensor above it is its own mapping, returned to the kernel when freed, so the
#: high-water mark is the pages of the tensors alive at once - the analogue of
#: ``torch.cuda.max_memory_allocated``. By default glibc raises the threshold to the largest block
#: freed so far (up to 32 MiB) and keeps later blocks of that size in its heap after free: the
#: analogue of ``max_memory_reserved``, printed beside it.
FIXED_MMAP = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def measure(seq_len: int, chunk: int | None, fixed_mmap: bool = True, timeout: float = 900) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"), **(FIXED_MMAP if fixed_mmap else {}))
    run = subprocess.run([sys.executable, __file__, "--child", str(seq_len), str(chunk)], env=env,
                         capture_output=True, text=True, timeout=timeout, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def predict(model, seq_len: int, chunk: int | None):
    from partita.tracing import esmfold
    from partita.tracing.inference import trace_inference
    model.trunk.set_chunk_size(chunk)
    return trace_inference(model, esmfold.inputs(seq_len), seq_len=seq_len)


def _row(seq_len: int, chunk, trace, cpu) -> tuple[str, float]:
    measured, glibc = measure(seq_len, chunk), measure(seq_len, chunk, fixed_mmap=False)
    err = trace.activation_peak_bytes / measured["activation_bytes"] - 1
    fixed = trace.weights_bytes + trace.input_bytes
    return (f"{seq_len:>5} {str(chunk):>6} {trace.activation_peak_bytes / MIB:>9.1f} "
            f"{measured['activation_bytes'] / MIB:>9.1f} {100 * err:>+6.1f}% {glibc['activation_bytes'] / MIB:>10.1f} "
            f"{trace.peak_bytes / MIB:>9.1f} {(fixed + measured['activation_bytes']) / MIB:>9.1f} "
            f"{trace.seconds(cpu):>7.2f} {glibc['seconds']:>7.2f}  {trace.peak_at}"), err


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 192, 256])
    parser.add_argument("--chunk-at", type=int, default=256)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(int(args.child[0]), None if args.child[1] == "None" else int(args.child[1]))))
        return 0
    sys.path.insert(0, str(ROOT / "src"))
    from partita.spec.hardware import load_device
    from partita.tracing import esmfold
    from partita.tracing.knobs import fastest_fitting, search
    cpu, model = load_device("cpu"), esmfold.build("esmfold-tiny", "meta")
    print("activation peak: predicted | measured (fixed mmap threshold) | error | measured (glibc default); "
          "totals add weights + input")
    print("    L  chunk  pred MiB  meas MiB    err glibc MiB  pred tot  meas tot  pred s  meas s  peak at (predicted)")
    errors = []
    for seq_len in args.lengths:
        line, err = _row(seq_len, None, predict(model, seq_len, None), cpu)
        errors.append(abs(err))
        print(line, flush=True)
    print(f"activation peak |error|: max {100 * max(errors):.1f} %, mean {100 * sum(errors) / len(errors):.1f} %")
    L = args.chunk_at
    default = predict(model, L, None)
    _, found = search(model, lambda: esmfold.inputs(L), cpu, limit=float("inf"), seq_len=L)
    lowest = min(s.trace.peak_bytes for s in found)
    limit = (default.peak_bytes + lowest) / 2
    best = fastest_fitting(found, limit)
    print(f"\nchunk size at L={L}, limit {limit / MIB:.1f} MiB (halfway between the default and the lowest peak):")
    for s in found:
        print(f"  {s.label():<24} predicted peak {s.trace.peak_bytes / MIB:>8.1f} MiB  time {s.seconds:>6.2f} s"
              f"{'  <- chosen' if best is not None and s.values == best.values else ''}")
    chunk = best.values["trunk.chunk_size"]
    fixed = default.weights_bytes + default.input_bytes
    m_best, m_default = measure(L, chunk), measure(L, None)
    print(f"measured peak: chunk {chunk}: {(fixed + m_best['activation_bytes']) / MIB:.1f} MiB, "
          f"default (no chunking): {(fixed + m_default['activation_bytes']) / MIB:.1f} MiB; "
          f"chosen fits and default does not: "
          f"{fixed + m_best['activation_bytes'] <= limit < fixed + m_default['activation_bytes']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
