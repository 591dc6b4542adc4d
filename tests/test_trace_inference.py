"""``partita.trace(..., mode="inference")``, ESMFold's chunk-size knob and the length sweep.

Oracles outside the code under test: torch's ``FlopCounterMode`` on a real forward, a peak
derived by hand for a plain MLP, and the resident-set high-water mark of a fresh process
running the real ``esmfold-tiny`` forward (``bench/esmfold_sweep.py``'s measurement: glibc's
mmap threshold fixed, so freed tensors go back to the kernel; the bench's docstring says why).
"""
from __future__ import annotations

import json
from dataclasses import replace
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import partita
from partita.cli import main as partita_main
from partita.errors import PartitaError
from partita.spec.hardware import load_device
from partita.tracing import esmfold
from partita.tracing.inference import trace_inference
from partita.tracing.knobs import ESMFOLD_CHUNK, PairSplit, Setting, dap, fastest_fitting, search, sweep

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 32  # rows per chunk of the trunk's triangle attention
L = 128  # residues: the unchunked trunk's L^3 attention logits dominate (~49 MiB), seconds to run


_MEASURED: dict[tuple[int, int | None], int] = {}


def _measure(seq_len: int, chunk: int | None) -> int:
    """Activation bytes of a real forward, measured in a fresh process by the bench's child
    (its own VmHWM - VmRSS, so processes beside it do not change the figure). The first call
    measures both settings the tests read, (L, None) and (L, CHUNK), in two children started
    together; each figure is measured once per session."""
    if (seq_len, chunk) not in _MEASURED:
        env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src"), "MALLOC_MMAP_THRESHOLD_": "65536",
               "PATH": "/usr/bin:/bin"}
        keys = [k for k in dict.fromkeys([(seq_len, chunk), (L, None), (L, CHUNK)]) if k not in _MEASURED]
        procs = [subprocess.Popen([sys.executable, str(ROOT / "bench" / "esmfold_sweep.py"), "--child", str(n),
                                   str(c)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for n, c in keys]
        try:
            for key, proc in zip(keys, procs):
                out, err = proc.communicate(timeout=600)
                assert proc.returncode == 0, err[-3000:]
                _MEASURED[key] = json.loads(out.strip().splitlines()[-1])["activation_bytes"]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    return _MEASURED[(seq_len, chunk)]


@pytest.fixture(scope="module")
def esm():
    """The meta model, its traces at L without chunking and in CHUNK-row chunks (shared)."""
    model = esmfold.build("esmfold-tiny", "meta")
    cpu = load_device("cpu")
    best, found = search(model, lambda: esmfold.inputs(L), cpu, limit=float("inf"), seq_len=L,
                         knobs=[replace(ESMFOLD_CHUNK, values=(None, CHUNK))])
    assert model.trunk.chunk_size is None  # the model's own value, restored after the search
    return model, cpu, {s.values["trunk.chunk_size"]: s for s in found}


def test_mlp_peak_flops_and_weights():
    """GELU's input and output are alive together (nn.Sequential drops the input after the
    call returns): peak = 2 x B x 4d floats; FLOPs equal torch's count of a real forward."""
    b, d = 8, 64
    model = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    x = torch.randn(b, d)
    spec = partita.trace(model, x, mode="inference")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    assert spec.activation_peak_bytes == 2 * b * 4 * d * 4
    assert spec.flops == counter.get_total_flops() == 2 * 2 * b * d * 4 * d
    assert spec.weights_bytes == sum(p.numel() for p in model.parameters()) * 4
    assert spec.input_bytes == b * d * 4 and spec.peak_at == "1"  # the GELU


def test_esmfold_peak_within_10_percent_of_measured(esm):
    """Predicted (fake tensors, meta weights) vs measured (real weights, fresh process) at L,
    unchunked and chunked."""
    _, _, by_chunk = esm
    for chunk in (None, CHUNK):
        predicted = by_chunk[chunk].trace.activation_peak_bytes
        measured = _measure(L, chunk)
        assert abs(predicted / measured - 1) <= 0.10, (chunk, predicted, measured)
    assert by_chunk[None].trace.peak_at == "trunk.blocks.0.tri_att_start.mha"  # the L^3 logits
    assert by_chunk[None].trace.data_dependent >= 1  # ESM's padding_mask.all(), read as True


def test_chunk_size_chosen_fits_where_default_does_not(esm):
    _, _, by_chunk = esm
    none, chunked = by_chunk[None].trace, by_chunk[CHUNK].trace
    limit = (none.peak_bytes + chunked.peak_bytes) / 2
    assert fastest_fitting(list(by_chunk.values()), limit).values == {"trunk.chunk_size": CHUNK}
    assert fastest_fitting(list(by_chunk.values()), float("inf")).values == {"trunk.chunk_size": None}
    assert by_chunk[None].seconds < by_chunk[CHUNK].seconds  # chunking costs time: why None wins unlimited
    fixed = none.weights_bytes + none.input_bytes
    assert fixed + _measure(L, CHUNK) <= limit < fixed + _measure(L, None)


def test_dap_split_by_hand():
    """Per device: peak - pair + pair / n + one gathered L x L x c operand; two all-gathers and
    two all-to-alls of L^2 c bytes per block."""
    from partita.tracing.inference import InferenceTrace
    t = InferenceTrace(weights_bytes=100, input_bytes=0, activation_peak_bytes=10_000, peak_at="x",
                       pair_bytes_at_peak=8_000, seq_len=10, flops=0.0)
    d = dap(Setting({}, t, 1.0), PairSplit(channels=2, blocks=3), 4, load_device("cpu"))
    assert d.bytes_per_device == 10_100 - 8_000 + 2_000 + 10 * 10 * 2 * 4
    assert d.comm_bytes_per_device == 3 * (2 * 800 * 3 / 4 + 2 * 800 * 3 / 16)


def test_sweep_beyond_one_card(esm):
    """Below the one-card peak, the sweep splits the pair track and each device fits."""
    model, cpu, by_chunk = esm
    trace = by_chunk[None].trace
    limit = 0.6 * trace.peak_bytes
    (row,) = sweep(model, esmfold.inputs, [L], cpu, limit=limit, knobs=())
    assert row.best.devices >= 2 and row.best.bytes_per_device <= limit
    assert row.default.trace.activation_peak_bytes == trace.activation_peak_bytes


def test_bad_input_one_line(capsys):
    with pytest.raises(PartitaError, match="mode='bogus'"):
        partita.trace(nn.Linear(2, 2), torch.zeros(1, 2), mode="bogus")
    with pytest.raises(PartitaError, match="on='x'"):
        trace_inference(nn.Linear(2, 2), torch.zeros(1, 2), on="x")
    assert partita_main(["infer", "--lengths", "0"]) == 2
    assert partita_main(["infer", "--model", "esmfold-huge"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "every length must be >= 1" in err[0] and "esmfold-tiny" in err[1]
