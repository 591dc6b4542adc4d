"""The ``eager_decode`` rates (:mod:`partita.calibrate.decode_rates`) from ``partita calibrate``
to the serving model's eager decode step (:mod:`partita.serve.latency`).

Oracles outside the code under test: torch's ``FlopCounterMode`` (the FLOPs of the timed GEMMs
and of a real decode step's linear layers), transformers' own ``eager_attention_forward`` (what
the attention rate times), the bytes torch's ``bmm`` kernels read in a real decode step (a
dispatch mode over transformers' Llama), and transformers' ``DynamicCache`` length (the host
timing steps the cache as the bench's worker does). No timing assertions: the timed calls are
replaced by a clock that returns a fixed work rate, so a rate's meaning is checked, not a speed.
"""
from __future__ import annotations

import types

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from partita.calibrate import decode_rates
from partita.calibrate.hardware_file import hardware_file
from partita.cli.calibrate import print_terms
from partita.errors import PartitaError
from partita.serve.latency import decode_stage_time
from partita.serve.workload import Layout
from partita.spec.hardware import load_device
from partita.spec.hf_config import parse_hf_config

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
LAYOUT = Layout(1, 1, 1, kv_dtype="fp32", dtype="fp32")


def _section(gemm: float = 10.0, attention: float = 8e-3, **host) -> dict:
    """An ``eager_decode`` section with one GEMM rate for every row count."""
    return {"eager_decode": {"gemm_gflops_by_rows": {"1": gemm, "64": gemm}, "attention_tbps": attention, **host}}


def test_calibrate_writes_the_section_and_the_loader_reads_it():
    """A calibration with the eager-decode measurements writes the medians of the repeats; the
    loader turns them into rates, interpolated linearly in log(rows) between measured rows."""
    m = {"device": "cpu", "dtype": "fp32", "world": 1, "repeats": 3,
         "gemm": [{"class": "square", "shape": [256, 256, 256], "gflop": 2 * 256 ** 3 / 1e9, "seconds": 1e-3,
                   "samples": [1e-3] * 3}],
         "copy": [3.0e9] * 3, "read": [1.0e10] * 3, "runtime": {},
         "eager_decode": {"gemm_rows": {"1": [6e9, 7e9, 8e9], "8": [12e9] * 3, "64": [24e9] * 3},
                          "attention": [7e9, 8e9, 9e9],
                          "host_step": {"1": [2.4e-3] * 3, "4": [5.7e-3, 5.8e-3, 5.9e-3]}}}
    out = hardware_file(m, "cpu", "synthetic")
    print_terms(out)  # `partita calibrate` prints every term it wrote (a scalar value each)
    section = out["eager_decode"]
    assert section["gemm_gflops_by_rows"] == pytest.approx({"1": 7.0, "8": 12.0, "64": 24.0})
    assert section["attention_tbps"] == pytest.approx(8e-3)
    # a line through (1 layer, 2.4 ms) and (4 layers, 5.8 ms): 1.133 ms a layer, 1.267 ms a step
    assert section["host_us_per_layer"] == pytest.approx(3400 / 3)
    assert section["host_us_per_step"] == pytest.approx(2400 - 3400 / 3)
    e = load_device("cpu", {"eager_decode": section}).eager_decode
    assert e.gemm_flops_per_s(8) == pytest.approx(12e9) and e.gemm_flops_per_s(0.5) == pytest.approx(7e9)
    assert e.gemm_flops_per_s(2 ** 1.5) == pytest.approx(9.5e9)  # half-way between 1 and 8 in log rows
    assert e.gemm_flops_per_s(1000) == pytest.approx(24e9)
    assert e.attention_bytes_per_s == pytest.approx(8e9)
    assert load_device("cpu").eager_decode is None


@pytest.mark.parametrize("bad, says", [
    ({"gemm_gflops_by_rows": {"x": 1.0}, "attention_tbps": 1e-3}, "gemm_gflops_by_rows must map row counts"),
    ({"gemm_gflops_by_rows": {"1": -1.0}, "attention_tbps": 1e-3}, "gemm_gflops_by_rows must map row counts"),
    ({"gemm_gflops_by_rows": {"1": 1.0}, "attention_tbps": "fast"}, "attention_tbps must be a number"),
    ({"gemm_gflops_by_rows": {"1": 1.0}, "attention_tbps": 1e-3, "host_us_per_step": -2}, "host_us_per_step must"),
    ({"gemm_gflops_by_rows": {"1": 1.0}, "attention_tbps": 1e-3, "speed": 1}, "must be an object with keys"),
])
def test_a_bad_section_is_refused_in_one_line(bad, says):
    with pytest.raises(PartitaError) as err:
        load_device("cpu", {"eager_decode": bad})
    assert says in str(err.value) and "\n" not in str(err.value)


def _rate_clock(counter):
    """A stand-in for ``seconds_per_call``: runs ``fn`` once under ``counter()`` and returns
    the seconds a machine doing 1e9 units of the counter's work per second would take."""
    def seconds_per_call(fn, repeats, min_time=0.05):
        with counter() as c:
            fn()
        return [c.work / 1e9] * repeats
    return seconds_per_call


class _Flops(FlopCounterMode):
    def __init__(self):
        super().__init__(display=False)

    @property
    def work(self) -> float:
        return self.get_total_flops()


def test_gemm_rate_is_torch_flops_over_seconds(monkeypatch):
    """Each row count's rate is the FLOPs torch counts in the timed calls over their seconds:
    on a clock that gives 1 s per GFLOP every rate reads 1 GFLOP/s."""
    monkeypatch.setattr(decode_rates, "seconds_per_call", _rate_clock(_Flops))
    monkeypatch.setattr(decode_rates, "GEMM_HIDDEN", (64, 96))  # the sizes change no FLOP count's meaning
    rates = decode_rates.measure_gemm_rows(torch.device("cpu"), torch.float32, lambda: None, 2)
    assert sorted(rates) == list(decode_rates.GEMM_ROWS)
    assert all(r == pytest.approx([1e9, 1e9], rel=1e-9) for r in rates.values())


def test_attention_timed_is_transformers_eager_attention():
    """The timed attention computes what transformers' ``eager_attention_forward`` computes
    for one query row (no mask, no dropout, no GQA expansion), through the same kernels."""
    from transformers.models.llama.modeling_llama import eager_attention_forward
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 1, 16), torch.randn(2, 4, 40, 16), torch.randn(2, 4, 40, 16)
    module = types.SimpleNamespace(num_key_value_groups=1, training=False)
    theirs, _ = eager_attention_forward(module, q, k, v, None, scaling=16 ** -0.5)
    ours = decode_rates.eager_attention(q, k, v)
    torch.testing.assert_close(ours.transpose(1, 2), theirs, rtol=1e-6, atol=1e-6)
    from torch.profiler import ProfilerActivity, profile

    def kernels(fn):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        return {e.name for e in prof.events() if e.name in ("aten::bmm", "aten::_softmax", "aten::mul")}
    assert kernels(lambda: decode_rates.eager_attention(q, k, v)) == kernels(
        lambda: eager_attention_forward(module, q, k, v, None, scaling=16 ** -0.5))


def test_host_timing_steps_the_cache_as_the_bench_does(monkeypatch):
    """Each timed call is one decode step of one token: the cache transformers keeps grows by
    one per call (3 warm-up steps after the prompt, then the timed one)."""
    lengths = []

    def clock(fn, repeats, min_time=0.05):
        fn()
        lengths.append(fn)
        return [1e-3] * repeats
    monkeypatch.setattr(decode_rates, "seconds_per_call", clock)
    seen = []
    real = transformers.DynamicCache.update

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        out = real(self, key_states, value_states, layer_idx, *args, **kwargs)
        if layer_idx == 0:
            seen.append(out[0].shape[-2])
        return out
    monkeypatch.setattr(transformers.DynamicCache, "update", update)
    out = decode_rates.measure_host_step(torch.device("cpu"), torch.float32, lambda: None, 2)
    assert sorted(out) == list(decode_rates.HOST_LAYERS)
    first = decode_rates.HOST_CONTEXT
    assert seen == [first, first + 1, first + 2, first + 3, first + 4] * len(decode_rates.HOST_LAYERS)


class _KVReads(TorchDispatchMode):
    """Bytes the ``bmm`` kernels read from K/V-shaped inputs (a dim of the context length and
    one of the head size)."""

    def __init__(self, context: int, head: int):
        super().__init__()
        self.context, self.head, self.bytes = context, head, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.bmm.default:
            for t in args:
                if self.context in t.shape and self.head in t.shape:
                    self.bytes += t.numel() * t.element_size()
        return func(*args, **(kwargs or {}))


def _decode_oracles(kv_heads: int, batch: int, context: int) -> tuple[float, float]:
    """(bytes the attention's ``bmm``s read, FLOPs of the linear layers) of one decode step of
    transformers' eager tiny Llama after a prefill of ``context`` tokens."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**TINY, "num_key_value_heads": kv_heads}, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).eval()
    cache = transformers.DynamicCache(config=config)
    head = TINY["hidden_size"] // TINY["num_attention_heads"]
    with torch.no_grad():
        model(input_ids=torch.randint(0, 256, (batch, context)), cache=cache, use_cache=True)
        reads = _KVReads(context + 1, head)
        with reads, FlopCounterMode(display=False) as flops:
            model(input_ids=torch.randint(0, 256, (batch, 1)), cache=cache, use_cache=True, logits_to_keep=1)
    counts = flops.get_flop_counts()["Global"]
    linear = sum(n for op, n in counts.items() if "bmm" not in str(op))
    return reads.bytes, linear


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_decode_step_prices_the_attention_reads_and_the_gemms_at_the_measured_rates(kv_heads):
    """Two files that differ only in the eager attention rate: one decode step differs by the
    bytes transformers' ``bmm``s read (K and V expanded to the query width) x (1/r1 - 1/r2);
    only in the GEMM rate: by the FLOPs torch counts in the step's linear layers x (1/g1 - 1/g2)."""
    batch, context = 3, 40
    bmm_bytes, gemm_flops = _decode_oracles(kv_heads, batch, context)
    spec = parse_hf_config(transformers.LlamaConfig(**{**TINY, "num_key_value_heads": kv_heads}).to_dict(), "tiny",
                           "LlamaForCausalLM")
    fast = {"memory": {"read_tbps": 1e3}}  # weights and the cache's other passes cost ~nothing

    def step(**section):
        return decode_stage_time(spec, load_device("cpu", {**fast, **_section(**section)}), LAYOUT, batch,
                                 context + 1, 1, "partita")
    r1, r2 = 1e-6, 4e-6  # TB/s: far below everything else
    assert step(attention=r1) - step(attention=r2) == pytest.approx(bmm_bytes * (1 / (r1 * 1e12) - 1 / (r2 * 1e12)),
                                                                    rel=1e-6)
    g1, g2 = 1e-3, 4e-3  # GFLOP/s
    assert step(gemm=g1) - step(gemm=g2) == pytest.approx(gemm_flops * (1 / (g1 * 1e9) - 1 / (g2 * 1e9)), rel=1e-6)


def test_host_time_is_per_layer_and_per_step_and_engines_are_unchanged():
    """The measured host times replace the training micro-runs' per-layer launch overhead for
    the eager runtime (layers x per layer + per step); an engine's decode step ignores the
    section (a captured graph, fused paged attention)."""
    spec = parse_hf_config(transformers.LlamaConfig(**TINY).to_dict(), "tiny", "LlamaForCausalLM")
    base = load_device("cpu", _section())
    timed = load_device("cpu", _section(host_us_per_layer=1000.0, host_us_per_step=700.0))
    layers = TINY["num_hidden_layers"]
    overhead = base.efficiency.kernel_overhead_us_per_layer * 1e-6
    diff = decode_stage_time(spec, timed, LAYOUT, 2, 50, 1, "partita") - decode_stage_time(spec, base, LAYOUT, 2, 50,
                                                                                          1, "partita")
    assert diff == pytest.approx(layers * (1e-3 - overhead) + 0.7e-3, rel=1e-9)
    plain = load_device("cpu")
    for dev in (base, timed):
        assert decode_stage_time(spec, dev, LAYOUT, 2, 50, 1, "vllm") == decode_stage_time(spec, plain, LAYOUT, 2, 50,
                                                                                            1, "vllm")
