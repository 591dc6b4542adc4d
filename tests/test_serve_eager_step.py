"""An eager runtime's step on a file with the ``eager_decode`` rates (:mod:`partita.serve.eager_step`)
and the bench's steady heap (``bench/serve_vs_measure.steady_heap``).

Oracles outside the code under test: the kernel's minor-fault counter (``getrusage``) for the
pages an allocation first-touches; torch's ``FlopCounterMode`` and a dispatch mode over
transformers' own ``eager_attention_forward`` and Llama forward for the FLOPs, softmax elements
and score bytes the prefill prices. Rates are set by the test, so a term's meaning is checked,
not a speed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from partita.serve import eager_step
from partita.serve.latency import decode_kv_fresh_bytes, prefill_time
from partita.serve.workload import Layout
from partita.spec.hardware import load_device
from partita.spec.hf_config import parse_hf_config

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
LAYOUT = Layout(1, 1, 1, kv_dtype="fp32", dtype="fp32")

#: a child process: faults of the second of two 40 MB allocations (each filled, then freed),
#: under glibc's defaults, then again after steady_heap()
_FAULTS = r"""
import json, resource, sys
sys.path.insert(0, sys.argv[1])
import torch
from serve_vs_measure import steady_heap

def second_faults():
    out = []
    for _ in range(2):
        f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        x = torch.empty(10_000_000)
        x.fill_(1.0)
        out.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0)
        del x
    return out[1]

default = second_faults()
took = steady_heap()
second_faults()  # the heap grows once
print(json.dumps({"default": default, "took": took, "steady": second_faults()}))
"""


def test_steady_heap_hands_a_freed_tensors_pages_to_the_next():
    """Under glibc's defaults a 40 MB tensor (above the 32 MiB mmap cap) first-touches fresh
    pages each time it is allocated; after ``steady_heap`` the next one lands in the pages the
    last one freed - the kernel's fault counter says so."""
    done = subprocess.run([sys.executable, "-c", _FAULTS, BENCH], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    faults = json.loads(done.stdout.strip().splitlines()[-1])
    assert faults["took"] is True
    assert faults["default"] > 2000  # >= 8 MB of 4 KiB pages of the 40 MB touched anew
    assert faults["steady"] < 50


def _eager_file(gemm: float, softmax: float, read: float):
    """The CPU file with one ``F.linear`` rate (GFLOP/s) at every row count up to 1024, a
    softmax rate (G elements/s) and a read rate (GB/s)."""
    rows = {str(m): gemm for m in (1, 64, 256, 1024)}
    return load_device("cpu", {"eager_decode": {"gemm_gflops_by_rows": rows, "attention_tbps": 8e-3,
                                                "softmax_gelems": softmax},
                               "memory": {"read_tbps": read / 1e3}})


class _Scores(TorchDispatchMode):
    """Softmax elements, and bytes read + written by the other ops whose output is as large as
    the score matrix (``numel``), skipping the matmuls (priced at the GEMM rate)."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.softmax, self.bytes = numel, 0, 0

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if isinstance(out, torch.Tensor) and out.numel() == self.numel and name not in ("bmm", "mm", "view",
                                                                                         "_unsafe_view", "expand",
                                                                                         "clone", "_to_copy"):
            if name == "_softmax":
                self.softmax += out.numel()
            else:
                ins = [a for a in args if isinstance(a, torch.Tensor)]
                self.bytes += sum(t.numel() * t.element_size() for t in ins) + out.numel() * out.element_size()
        return out


@pytest.mark.parametrize("prompt", [24, 48])  # not 16: repeat_kv's copies (heads x P x d) would match the scores
def test_prefill_attention_prices_transformers_eager_attention(prompt):
    """A layer's eager prefill attention: the FLOPs torch counts in transformers'
    ``eager_attention_forward`` (mask included, both halves of the scores) at the GEMM rate,
    its softmax's elements at the softmax rate, and the bytes its other score-sized ops read
    and write at the read rate."""
    from transformers.models.llama.modeling_llama import eager_attention_forward
    heads, kv_heads, d = 4, 2, 16
    q = torch.randn(1, heads, prompt, d)
    k, v = torch.randn(1, kv_heads, prompt, d), torch.randn(1, kv_heads, prompt, d)
    mask = torch.triu(torch.full((prompt, prompt), float("-inf")), 1)[None, None]
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, training=False)
    with FlopCounterMode(display=False) as flops:
        eager_attention_forward(module, q, k, v, mask, scaling=d ** -0.5)
    counted = _Scores(heads * prompt * prompt)
    with counted:
        eager_attention_forward(module, q, k, v, mask, scaling=d ** -0.5)
    spec = parse_hf_config(transformers.LlamaConfig(**{**TINY, "hidden_size": heads * d}).to_dict(), "t",
                           "LlamaForCausalLM")
    dev = _eager_file(gemm=10.0, softmax=0.5, read=4.0)
    priced = eager_step.prefill_attention(spec, dev, 1, 4, prompt)
    want = flops.get_total_flops() / 10e9 + counted.softmax / 0.5e9 + counted.bytes / 4e9
    assert priced == pytest.approx(want, rel=1e-9)


def test_prefill_gemms_run_at_the_measured_rate_for_the_prompts_rows():
    """Changing the file's ``F.linear`` rate moves a prefill by the FLOPs torch counts in
    transformers' Llama forward (its linears and attention matmuls; the one logits row is
    priced on the calibrated curve) over the two rates."""
    prompt = 64
    config = transformers.LlamaConfig(**TINY, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad(), FlopCounterMode(display=False) as flops:
        model(input_ids=torch.zeros(1, prompt, dtype=torch.long), use_cache=False, logits_to_keep=1)
    layers = flops.get_total_flops() - 2 * TINY["hidden_size"] * TINY["vocab_size"]
    spec = parse_hf_config(config.to_dict(), "t", "LlamaForCausalLM")
    slow, fast = (prefill_time(spec, _eager_file(g, 0.5, 4.0), LAYOUT, prompt, 1, "partita") for g in (5.0, 20.0))
    assert slow - fast == pytest.approx(layers * (1 / 5e9 - 1 / 20e9), rel=1e-9)


def test_a_file_with_the_rates_prices_no_first_touch_and_others_keep_theirs():
    """With the heap steady no K/V byte of a decode step is priced as first-touched; a file
    without the ``eager_decode`` rates keeps pricing every ``cat`` / ``repeat_kv`` result so."""
    spec = parse_hf_config(transformers.LlamaConfig(**TINY).to_dict(), "t", "LlamaForCausalLM")
    kv = 64e6
    assert decode_kv_fresh_bytes(spec, _eager_file(10.0, 0.5, 4.0), 1, "partita", kv) == 0.0
    # TINY: n_rep 2 - the two cat results (1/2 each) and repeat_kv's two copies (1 each)
    assert decode_kv_fresh_bytes(spec, load_device("cpu"), 1, "partita", kv) == pytest.approx(3 * kv)
