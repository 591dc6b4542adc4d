"""``partita serve``'s prefill and decode step times against measured forwards on this CPU.

    python bench/serve_vs_measure.py [--hardware cpu] [--repeats 5] [--threads 1]

A small Llama-shaped transformers model (fp32, eager attention, transformers' DynamicCache)
runs forward only, one thread, as the CPU device file describes (one core per process):

* prefill: one prompt of P tokens, ``use_cache=True`` (the cache the decode reads);
* decode: B sequences after a prefill of L tokens, one token each per step, the cache
  growing - the median over the steps of one run.

Times are the process's CPU time (one thread: the forward's time without the waits other
processes on a shared machine impose); ``--wall`` for wall-clock.

Each is predicted by :func:`partita.serve.latency.prefill_time` and
:func:`partita.serve.latency.decode_stage_time` for ``Layout(1, 1, 1, dtype="fp32")`` on the
device file (``--hardware``: the built-in ``cpu`` file, or the one ``partita calibrate``
writes for this machine), with the eager framework entry (``partita``: unfused element-wise
kernels, as transformers runs them). Prints predicted and measured side by side, the ratio
and the median absolute error, and the load average (the figures move with it on a shared
machine). Timings belong here, not in tests.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import transformers

from partita.serve.latency import decode_stage_time, prefill_time
from partita.serve.workload import Layout
from partita.spec.hardware import load_device
from partita.spec.hf_config import parse_hf_config

CONFIG = dict(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=4, max_position_embeddings=4096, tie_word_embeddings=False)
PREFILL = (64, 256, 1024)
DECODE = ((1, 256), (8, 256), (8, 1024), (32, 512))  # (batch, context)
#: the process's CPU time by default: with one thread it is the forward's time without the
#: waits a shared machine's other processes impose (``--wall`` measures wall-clock instead)
CLOCK = time.process_time


def _model():
    config = transformers.LlamaConfig(**CONFIG, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    return model, parse_hf_config(config.to_dict(), "bench", "LlamaForCausalLM")


def _ids(batch: int, length: int) -> torch.Tensor:
    return torch.randint(0, CONFIG["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(batch))


def measure_prefill(model, length: int, repeats: int) -> float:
    ids = _ids(1, length)
    times = []
    with torch.no_grad():
        model(input_ids=ids, use_cache=True)  # warm-up
        for _ in range(repeats):
            start = CLOCK()
            model(input_ids=ids, use_cache=True)
            times.append(CLOCK() - start)
    return statistics.median(times)


def measure_decode(model, batch: int, context: int, steps: int) -> float:
    with torch.no_grad():
        cache = model(input_ids=_ids(batch, context), use_cache=True).past_key_values
        step = _ids(batch, 1)
        times = []
        for i in range(steps + 1):
            start = CLOCK()
            model(input_ids=step, cache=cache, use_cache=True)
            if i:  # the first step warms up
                times.append(CLOCK() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hardware", default="cpu")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--wall", action="store_true", help="wall-clock time instead of the process's CPU time")
    args = ap.parse_args()
    global CLOCK
    if args.wall:
        CLOCK = time.perf_counter
    torch.set_num_threads(args.threads)
    device = load_device(args.hardware)
    model, spec = _model()
    layout = Layout(1, 1, 1, kv_dtype="fp32", dtype="fp32")
    rows = []
    for length in PREFILL:
        pred = prefill_time(spec, device, layout, length, 1, framework="partita")
        rows.append((f"prefill P={length}", pred, measure_prefill(model, length, args.repeats)))
    for batch, context in DECODE:
        pred = decode_stage_time(spec, device, layout, batch, context + args.repeats / 2, 1)
        rows.append((f"decode B={batch} L={context}", pred, measure_decode(model, batch, context, args.repeats)))
    print(f"{'case':<24}{'predicted ms':>14}{'measured ms':>14}{'pred/meas':>11}")
    for name, pred, meas in rows:
        print(f"{name:<24}{pred * 1e3:>14.2f}{meas * 1e3:>14.2f}{pred / meas:>11.2f}")
    errors = [abs(p / m - 1) for _, p, m in rows]
    print(f"median |error| {statistics.median(errors) * 100:.0f} %, worst {max(errors) * 100:.0f} %; "
          f"hardware {device.name} ({device.source_file}); load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores; {args.threads} thread(s); {'wall-clock' if args.wall else 'process CPU'} time")


if __name__ == "__main__":
    main()
