"""The rates of an eager decode step's kernels: the device file's ``eager_decode`` section.

Why: a decode step that transformers runs eagerly (the ``partita`` serving framework:
``DynamicCache``, eager attention) spends its time in two kinds of kernels the calibrated
training curves do not describe (measured op by op on the 2-core development VM, docs/serve.md,
issue 37):

* GEMMs with ``M`` = the batch rows (1-64; a prefill's tokens, 256-1024): ``F.linear`` runs at 7 GFLOP/s at one row, 12 at 8,
  21 at 32, 26-30 at 64-128 (weights of 16 MB, beyond the 8 MiB L3) - a rate set by the rows a
  weight tile is reused for, not by the GEMM's FLOP count the training curve is indexed by;
* attention at a query length of one: ``matmul(q, k^T)``, ``softmax``, ``matmul(p, v)`` read
  the cached K and V through 64-256 small GEMVs at 7.0-8.5 GB/s, 0.55-0.65 of a ``sum``'s
  streaming read rate (``memory.read_tbps``) in the same minute.

The measurement, each timed on calibrate's busy clock (:func:`.busy_clock.seconds_per_call`):

* :data:`GEMM_ROWS` x :data:`GEMM_HIDDEN`: ``F.linear`` of ``[M, h]`` by a ``[4h, h]`` weight (the
  MLP's up projection, calibrate's ``wide`` class at ``M`` rows); the rate at ``M`` is the
  FLOPs of both sizes over their summed time;
* :data:`ATTENTION_SHAPE`: transformers' ``eager_attention_forward`` at q_len 1 without the mask
  (``matmul``, ``* scaling``, ``softmax`` in fp32, ``matmul``) on K and V of 16.8 MB each in
  fp32 (above a CPU's last-level cache); the rate is the bytes of K and V over the time;
* the host time: decode steps (batch 1, ``DynamicCache``, eager attention, ``logits_to_keep=1``,
  as bench/serve_measure_worker.py runs them) of a transformers Llama of hidden size 64
  (:data:`HOST_CONFIG`: its kernels take microseconds, the step is the Python and dispatch
  around them) with :data:`HOST_LAYERS` decoder layers; the slope over the layers is the host
  time per layer, the rest the host time per step. Skipped (the fields absent) where
  transformers is not installed;
* :data:`SOFTMAX_SHAPE`: ``torch.softmax`` in fp32 over the last dim (eager prefill attention's
  scores: heads x query rows x keys, 16.8 MB); the rate is elements over the time. On the
  development VM it is bound by the ``exp``, ~0.4 G elements/s on one thread, where its two
  passes at the read rate would take a quarter of the time (prefill of 1024 tokens, torch's
  profiler: ``_softmax`` 21 ms a layer, issue 37).
"""
from __future__ import annotations

from collections.abc import Callable

from .busy_clock import seconds_per_call

#: rows of the timed GEMMs (a decode step's batch per attention group; 256 and 1024: a prefill's
#: prompt tokens, where the calibrated curve, one rate per GFLOP fitted over square and wide
#: classes up to h 1024, read 30.7 GFLOP/s while ``mm`` at a 256- and 1024-token prefill's shapes
#: ran at 35-36 under torch's profiler on the development VM, issue 37)
GEMM_ROWS = (1, 2, 4, 8, 16, 32, 64, 256, 1024)
#: ``h`` of the ``[M, h] x [h, 4h]`` GEMMs (calibrate's square / skinny / wide classes go to 1024)
GEMM_HIDDEN = (512, 1024)
#: (batch, heads, context, head dim) of the timed attention
ATTENTION_SHAPE = (8, 8, 1024, 64)
#: the host-time model: a Llama whose kernels are negligible beside their dispatch (GQA as the
#: bench's model: ``repeat_kv`` copies)
HOST_CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False)
#: decoder layers of the two host-time models
HOST_LAYERS = (1, 4)
#: prompt tokens before the timed steps (the cache grows by one a step)
HOST_CONTEXT = 16
#: (heads, query rows, keys) of the timed softmax: above a CPU's last-level cache in fp32
SOFTMAX_SHAPE = (8, 512, 1024)


def measure_gemm_rows(device, dtype, sync: Callable[[], None], repeats: int) -> dict[int, list[float]]:
    """``{rows: [FLOP/s per repeat]}`` of ``F.linear`` over :data:`GEMM_HIDDEN` (module docstring)."""
    import torch
    import torch.nn.functional as F
    weights = [torch.randn(4 * h, h, device=device, dtype=dtype) for h in GEMM_HIDDEN]
    out: dict[int, list[float]] = {}
    for m in GEMM_ROWS:
        flops, seconds = 0.0, [0.0] * repeats
        for w in weights:
            x = torch.randn(m, w.shape[1], device=device, dtype=dtype)
            times = seconds_per_call(lambda: (F.linear(x, w), sync()), repeats, min_time=0.02)
            flops += 2.0 * m * w.shape[0] * w.shape[1]
            seconds = [s + t for s, t in zip(seconds, times)]
        out[m] = [flops / s for s in seconds]
    return out


def eager_attention(q, k, v):
    """transformers' ``eager_attention_forward`` (modeling_llama.py) without mask and dropout:
    the scores, scaled, softmaxed in fp32 and cast back, times V."""
    import torch
    scores = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


def measure_attention(device, dtype, sync: Callable[[], None], repeats: int) -> list[float]:
    """Bytes of K + V per second through :func:`eager_attention` at q_len 1, one per repeat."""
    import torch
    b, heads, ctx, d = ATTENTION_SHAPE
    q = torch.randn(b, heads, 1, d, device=device, dtype=dtype)
    k, v = (torch.randn(b, heads, ctx, d, device=device, dtype=dtype) for _ in range(2))
    moved = 2 * k.numel() * k.element_size()
    return [moved / t for t in seconds_per_call(lambda: (eager_attention(q, k, v), sync()), repeats)]


def measure_softmax(device, sync: Callable[[], None], repeats: int) -> list[float]:
    """Elements per second of fp32 ``torch.softmax`` over :data:`SOFTMAX_SHAPE`'s last dim,
    one per repeat (eager attention softmaxes in fp32 whatever the model's dtype)."""
    import torch
    x = torch.randn(*SOFTMAX_SHAPE, device=device, dtype=torch.float32)
    return [x.numel() / t for t in seconds_per_call(lambda: (torch.softmax(x, dim=-1), sync()), repeats)]


def measure_host_step(device, dtype, sync: Callable[[], None], repeats: int) -> dict[int, list[float]] | None:
    """``{layers: [seconds per decode step per repeat]}`` of the :data:`HOST_CONFIG` Llama
    (module docstring); None without transformers."""
    try:
        import transformers
    except ImportError:
        return None
    import torch
    out = {}
    for layers in HOST_LAYERS:
        config = transformers.LlamaConfig(**HOST_CONFIG, num_hidden_layers=layers, attn_implementation="eager")
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
        cache = transformers.DynamicCache(config=config)
        with torch.no_grad():
            model(input_ids=torch.zeros(1, HOST_CONTEXT, dtype=torch.long, device=device), cache=cache,
                  use_cache=True, logits_to_keep=1)
            step = torch.zeros(1, 1, dtype=torch.long, device=device)
            for _ in range(3):  # the first steps set up lazily (rotary tables, mask helpers)
                model(input_ids=step, cache=cache, use_cache=True, logits_to_keep=1)
            out[layers] = seconds_per_call(lambda: (model(input_ids=step, cache=cache, use_cache=True,
                                                          logits_to_keep=1), sync()), repeats, min_time=0.02)
    return out


def measure_eager_decode(device, dtype, sync: Callable[[], None], repeats: int) -> dict:
    """The raw measurements calibrate records (``raw.eager_decode``)."""
    host = measure_host_step(device, dtype, sync, repeats)
    return {"gemm_rows": {str(m): r for m, r in measure_gemm_rows(device, dtype, sync, repeats).items()},
            "attention": measure_attention(device, dtype, sync, repeats),
            "softmax": measure_softmax(device, sync, repeats),
            **({"host_step": {str(n): t for n, t in host.items()}} if host else {})}


def host_fields(host: dict[str, list[float]]) -> tuple[float, float]:
    """(microseconds per layer, per step) from the median step time of the two layer counts:
    a line through the two points."""
    import statistics
    (n0, t0), (n1, t1) = sorted((int(n), statistics.median(t)) for n, t in host.items())
    per_layer = max((t1 - t0) / (n1 - n0), 0.0)
    return per_layer * 1e6, max(t0 - n0 * per_layer, 0.0) * 1e6


def eager_decode_fields(raw: dict) -> tuple[dict, dict]:
    """(the file's ``eager_decode`` section, its term records) from :func:`measure_eager_decode`'s
    output: the median of the repeats, GFLOP/s by rows and TB/s."""
    from .fit import summarize
    terms = {f"eager_decode.gemm_rows_{m}": summarize([r / 1e9 for r in rates], "GFLOP/s",
                                                      f"F.linear [{m}, h] x [h, 4h], h in {GEMM_HIDDEN}")
             for m, rates in raw["gemm_rows"].items()}
    terms["eager_decode.attention"] = summarize([b / 1e12 for b in raw["attention"]], "TB/s",
                                                f"eager attention at q_len 1, (batch, heads, context, head dim) "
                                                f"{ATTENTION_SHAPE}: bytes of K + V / s")
    section = {"gemm_gflops_by_rows": {m: terms[f"eager_decode.gemm_rows_{m}"]["value"] for m in raw["gemm_rows"]},
               "attention_tbps": terms["eager_decode.attention"]["value"]}
    if raw.get("softmax"):
        terms["eager_decode.softmax"] = summarize([e / 1e9 for e in raw["softmax"]], "G elements/s",
                                                  f"torch.softmax fp32 over the last dim of {SOFTMAX_SHAPE}")
        section["softmax_gelems"] = terms["eager_decode.softmax"]["value"]
    if raw.get("host_step"):
        section["host_us_per_layer"], section["host_us_per_step"] = host_fields(raw["host_step"])
        for key, what in (("host_us_per_layer", "slope"), ("host_us_per_step", "intercept")):
            terms[f"eager_decode.{key}"] = {
                "value": section[key], "spread": 0.0, "repeats": len(next(iter(raw["host_step"].values()))),
                "unit": "us", "method": f"decode steps of a hidden-64 Llama with {HOST_LAYERS} layers (transformers, "
                                        f"eager, DynamicCache), medians: the line's {what}"}
    return section, terms
