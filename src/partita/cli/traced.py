"""``partita plan`` / ``partita estimate`` for any PyTorch model, traced (issue 19).

``--model module.path:factory`` names a function returning an ``nn.Module`` (or a
``(module, example_inputs)`` or ``(module, example_inputs, tp_plan)`` tuple); it is
called under ``torch.device("meta")``, so no memory is used and no weights are drawn.
``--example-input`` gives each input's shape (and dtype), e.g. ``2,4,128,128``
(positional) or ``encoder_hidden_states=2,77,2048`` (keyword), ``:int64`` for ids.
``--model traced.json`` reads a spec written by ``partita.trace(...).to_json(path)``.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import re
import sys
import time

from ..errors import PartitaError

_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_DTYPES = ("float32", "bfloat16", "float16", "int64", "int32", "bool")


def add_trace_args(p: argparse.ArgumentParser) -> None:
    """The flags of a traced model (used with ``--model module.path:factory``)."""
    p.add_argument("--example-input", action="append", metavar="[NAME=]D0,D1,...[:DTYPE]",
                   help="with --model module:factory: one example input's shape (repeat per input); "
                        "NAME= passes it by keyword, :DTYPE one of " + ", ".join(_DTYPES) + " (default float32)")
    p.add_argument("--tp-plan", metavar="JSON",
                   help="with --model module:factory: tensor-parallel plan, e.g. "
                        "'{\"attention.wq\": \"colwise\", \"attention.wo\": \"rowwise\"}'")
    p.add_argument("--save-trace", metavar="FILE.json",
                   help="with --model module:factory: also write the traced spec; --model FILE.json plans "
                        "from it without tracing again (a large model's trace takes seconds)")
    p.add_argument("--no-trace-cache", action="store_true",
                   help="with --model module:factory: trace again instead of reading the trace cached by an "
                        "earlier run of the same factory, inputs and TP plan (PARTITA_TRACE_CACHE=off: never cache)")


def is_traced(args: argparse.Namespace) -> bool:
    """Whether ``--model`` names a factory to trace or a traced-spec JSON file."""
    from ..spec.traced import is_traced_file
    model = getattr(args, "model", None) or ""
    return bool(_FACTORY.match(model)) or is_traced_file(model)


def _parse_input(text: str):
    """(name or None, shape, torch dtype) of one ``--example-input``."""
    import torch
    name, _, rest = text.rpartition("=") if "=" in text else ("", "", text)
    shape_text, _, dtype = rest.partition(":")
    dtype = dtype or "float32"
    if dtype not in _DTYPES:
        raise PartitaError(f"--example-input {text!r}: dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    try:
        shape = tuple(int(d) for d in shape_text.split(",") if d.strip())
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise PartitaError(f"--example-input {text!r}: give positive dimensions separated by commas, e.g. 2,3,224,224")
    return name or None, shape, getattr(torch, dtype)


def _example_inputs(texts: list[str]):
    import torch
    args, kwargs = [], {}
    for text in texts:
        name, shape, dtype = _parse_input(text)
        t = torch.zeros(shape, dtype=dtype, device="meta")
        if name:
            kwargs[name] = t
        else:
            args.append(t)
    return kwargs if kwargs and not args else (tuple(args) if not kwargs else _mixed(args, kwargs))


def _mixed(args, kwargs):
    raise PartitaError("--example-input: give all inputs by position or all by NAME=, not both")


def _factory(path: str):
    module_name, _, attr = path.partition(":")
    sys.path.insert(0, os.getcwd())  # absolute: a finder cached for "." would list an earlier directory
    importlib.invalidate_caches()
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise PartitaError(f"--model {path}: cannot import {module_name} ({e}); give module.path:function "
                           "importable from the current directory or the environment") from None
    finally:
        sys.path.pop(0)
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise PartitaError(f"--model {path}: {module_name} has no function {attr}")
    return factory


def load_traced(args: argparse.Namespace):
    """The :class:`TracedSpec` that ``--model`` names: read from JSON, from the trace cache
    (:mod:`partita.tracing.cache`: no torch import), or traced now (and cached)."""
    from ..spec.traced import TracedSpec, is_traced_file
    from ..tracing import cache
    if is_traced_file(args.model):
        return TracedSpec.load(args.model)
    key = cache.trace_key(args.model, args.example_input, args.tp_plan)
    hit = None if getattr(args, "no_trace_cache", False) else cache.cached_path(key)
    spec = None
    if hit is not None:
        try:
            spec = TracedSpec.load(hit)
            args.trace_cached = str(hit)
        except PartitaError:  # a damaged cache file (a disk filled mid-write elsewhere): trace again
            spec = None
    if spec is None:
        spec = _trace_factory(args)
        cache.store(key, spec.to_json(), cache.loaded_sources())  # the files the factory imported
    if getattr(args, "save_trace", None):
        from ..outputs import write_output
        write_output(args.save_trace, spec.to_json() + "\n", "--save-trace")
    return spec


def _trace_factory(args: argparse.Namespace):
    """Build ``--model module:factory`` on the meta device and trace it; ``args.build_s`` keeps
    the seconds spent importing torch and the model's library and building it (the header
    shows them beside the trace's own time: on a first run they are most of it)."""
    with _collector_paused():
        start = time.perf_counter()

        import torch

        from ..tracing import trace
        factory = _factory(args.model)
        with torch.device("meta"):
            try:
                built = factory()
            except Exception as e:  # noqa: BLE001 - the user's code failed, not ours: say so in one line
                raise PartitaError(f"--model {args.model}: the factory raised {type(e).__name__}: {e}"
                                   f"{_where(e)}; call it in Python to see the traceback") from None
        args.build_s = time.perf_counter() - start
        return _trace_built(args, built, trace)


def _where(e: BaseException) -> str:
    """`` at file.py:line`` of the innermost frame that raised ``e``."""
    import traceback
    frames = traceback.extract_tb(e.__traceback__)
    return f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while torch and the model's library import and the
    model is built and traced. Imports create hundreds of thousands of long-lived objects
    (modules, classes, functions); each 700 allocations start a collection that walks them and
    frees nothing. Measured on SD-XL (2-core VM): importing torch + diffusers 3.2 s -> 2.6 s.
    Reference counting still frees everything acyclic; the collector runs again afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _trace_built(args: argparse.Namespace, built, trace):
    """Check what the factory returned and trace it (the inputs: the factory's, or --example-input)."""
    import json

    import torch
    model, inputs, tp_plan = (tuple(built) + (None, None))[:3] if isinstance(built, tuple) else (built, None, None)
    if not isinstance(model, torch.nn.Module):
        raise PartitaError(f"--model {args.model}: the factory returned {type(model).__name__}, not a torch.nn.Module")
    if args.example_input:
        inputs = _example_inputs(args.example_input)
    if inputs is None:
        raise PartitaError(f"--model {args.model}: give --example-input shapes (or return (model, inputs) "
                           "from the factory)")
    if args.tp_plan:
        try:
            tp_plan = json.loads(args.tp_plan)
        except ValueError as e:
            raise PartitaError(f"--tp-plan: not JSON ({e}); e.g. '{{\"attention.wq\": \"colwise\"}}'") from None
    return trace(model, inputs, tp_plan=tp_plan, name=args.model.rpartition(":")[2], on="meta")


def _cluster(args: argparse.Namespace):
    from ..spec.hardware import make_cluster, parse_overrides
    return make_cluster(args.hardware, args.devices, args.devices_per_node, parse_overrides(args.overrides))


def _header(spec, cluster, gbs: int, seconds: float, cached: str | None = None,
            build_s: float | None = None) -> list[str]:
    units = f"{spec.layers} x {spec.block_class or 'block'}" if spec.blocks else "no repeated blocks"
    how = f"trace read from the cache {cached} in {seconds:.2f} s" if cached else \
        f"traced in {seconds:.2f} s" + (f" = {build_s:.2f} s importing torch and the model's library and building "
                                       f"it on meta + {seconds - build_s:.2f} s tracing" if build_s is not None else "")
    return [f"{spec.name} ({how}: {spec.total_params / 1e9:.3g} B parameters, "
            f"{spec.train_flops_per_sample() / 1e12:.3g} TFLOP per sample forward+backward, {units}"
            f"{', pipeline-able' if spec.pipeline else ''}{', TP plan' if spec.tp_capable else ''})",
            f"on {cluster.describe()}; global batch {gbs} samples"]


def breakdown(est) -> list[str]:
    """Memory and time breakdown lines of one estimate."""
    from ..cost.memory import GIB
    peak = est.peak_rank
    lines = [f"memory per device (rank {peak.rank}): " + ", ".join(
        f"{k} {v / GIB:.2f}" for k, v in peak.parts.items() if v) + f" -> {peak.total / GIB:.1f} GiB; {est.memory_verdict}"]
    lines.append(f"time per step {est.step_time_s * 1e3:.1f} ms: " + ", ".join(
        f"{k} {v * 1e3:.1f}" for k, v in est.time.parts.items() if v) + " (ms)")
    lines.append(f"{est.tokens_per_s_per_device:.2f} samples/s per device, MFU {est.mfu:.1%}")
    return lines


def cmd_plan_traced(args: argparse.Namespace) -> int:
    """``partita plan --model module:factory ...``: trace, search, print."""
    from ..search.traced import search_traced
    start = time.perf_counter()
    spec = load_traced(args)
    traced_s = time.perf_counter() - start
    cluster = _cluster(args)
    gbs = args.global_batch
    result = search_traced(spec, cluster, gbs, dtype=args.dtype or "bf16", headroom=args.headroom,
                           cap_gib=args.max_memory_gib, top=args.top, tp=args.tp, pp=args.pp, dp=args.dp,
                           mbs=args.mbs, zero=args.zero, recompute=args.recompute)
    if not result.plans:
        small = result.smallest
        raise PartitaError(f"no plan of {spec.name} fits {result.memory_limit_gib:.1f} GiB per device: the smallest, "
                           f"{small.plan.summary()}, needs {small.peak_memory_gib:.1f} GiB")
    for line in _header(spec, cluster, gbs, traced_s, getattr(args, "trace_cached", None),
                        getattr(args, "build_s", None)):
        print(line)
    print(f"search: {result.evaluated} plans in {result.search_time_s:.2f} s, {len(result.plans)} shown "
          f"(memory limit {result.memory_limit_gib:.1f} GiB)")
    print(f"{'#':>2}  {'plan':<32} {'step s':>8} {'samples/s/dev':>13} {'peak GiB':>8} {'MFU':>6}")
    for i, e in enumerate(result.plans, 1):
        print(f"{i:>2}  {e.plan.summary():<32} {e.step_time_s:>8.3f} {e.tokens_per_s_per_device:>13.2f} "
              f"{e.peak_memory_gib:>8.1f} {e.mfu:>6.1%}")
    print("plan 1:")
    for line in breakdown(result.best):
        print("  " + line)
    for line in result.why_not:
        print(line)
    print(f"(total {time.perf_counter() - start:.2f} s including tracing)")
    return 0


def cmd_estimate_traced(args: argparse.Namespace) -> int:
    """``partita estimate --model module:factory ...``: one plan's breakdown."""
    from ..estimate import estimate
    from ..plan import Plan
    from .plan_flags import read_plan_arg
    spec = load_traced(args)
    cluster = _cluster(args)
    if getattr(args, "plan", None):
        plan = read_plan_arg(args.plan, cluster.world_size)
    else:
        tp, pp = args.tp or 1, args.pp or 1
        if args.global_batch is None:
            raise PartitaError("--global-batch (samples per step) is required")
        plan = Plan(dp=args.dp or max(1, cluster.world_size // (tp * pp)), tp=tp, pp=pp,
                    zero=1 if args.zero is None else args.zero, mbs=args.mbs or 1, gbs=args.global_batch,
                    seq_len=1, recompute=args.recompute or "none", dtype=args.dtype or "bf16")
    est = estimate(spec, cluster, plan)
    for line in _header(spec, cluster, plan.gbs, 0.0)[1:]:
        print(line)
    print(f"plan {est.plan.summary()}")
    for line in breakdown(est):
        print(line)
    return 0
