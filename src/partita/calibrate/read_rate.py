"""The streaming read rate ``partita calibrate`` writes as ``memory.read_tbps``.

Why a second memory rate beside the clone (``memory.hbm_tbps``): a decode step is bound by
reading memory that already exists - the weights, the KV cache - while calibrate's clone
writes into a freshly allocated 64 MB tensor. On a GPU the caching allocator hands back the
same pages and reads and copies run at one HBM rate; on a CPU an allocation that large is
served by ``mmap`` (glibc's ``M_MMAP_THRESHOLD`` caps at 32 MiB on 64-bit, mallopt(3)), so
each clone first-touches 16 k fresh pages and the page faults, not the bus, set its rate.
Measured on the 2-core development VM, one thread, run-queue wait subtracted: clone of
64 MB 2.8 GB/s, ``copy_`` into an existing 64 MB tensor 9.9 GB/s, a sum over it 9.0 GB/s,
the decode's weight GEMV (``x @ W``, 64 MB) 12.7 GB/s; clones of 1-16 MB (heap, no fresh
pages) 7.9 GB/s. The serving model (:func:`partita.serve.latency.read_bandwidth`) prices a
decode step's reads with this rate. Writes into pages the allocator hands back run at it too (an
eager decode step's ``cat`` and ``repeat_kv`` results under glibc's 32 MiB mmap cap: ``cat``
and ``copy_`` of 8-17 MB at 6.0-6.4 GB/s per byte written, a read and a write per byte, beside
a sum at 12.8-14.6 GB/s in the same minute); :func:`partita.serve.latency.decode_kv_seconds`
prices them at the first-touch rate on a file without the ``eager_decode`` rates, for the reason
its docstring gives, and at this rate on a file with them (first touch only above glibc's 32 MiB
mmap cap: :func:`partita.serve.latency.eager_kv_seconds`, docs/serve.md).

The measurement: ``x.sum()`` over a 64 MB tensor (larger than a CPU's last-level cache and a
GPU's L2, so the bytes come from memory), bytes read / seconds per call. On a CPU each call's
time is its wall-clock minus the time the thread waited on the run queue
(:func:`.busy_clock.seconds_per_call`, as every other calibrated rate): on a machine other jobs
share, the rate the reads run at while they run, not the share of the cores the process got.
"""
from __future__ import annotations

from collections.abc import Callable

from .busy_clock import seconds_per_call

#: bytes of the tensor read: above a CPU's last-level cache and a GPU's L2
READ_BYTES = 64_000_000


def measure_read_rate(device, dtype, sync: Callable[[], None], repeats: int) -> list[float]:
    """Bytes/s of a sum over :data:`READ_BYTES` of ``dtype`` on ``device``, one per repeat."""
    import torch
    elem = torch.empty((), dtype=dtype).element_size()
    x = torch.randn(READ_BYTES // elem, device=device, dtype=dtype)
    seconds = seconds_per_call(lambda: (x.sum(), sync()), repeats)
    return [x.numel() * elem / t for t in seconds]


def read_rate_fields(samples: list[float]) -> tuple[float, dict]:
    """(``memory.read_tbps``, its term record) from the per-repeat rates in bytes/s."""
    from .fit import summarize
    term = summarize([b / 1e12 for b in samples], "TB/s",
                     "sum over a 64 MB tensor (read only), run-queue wait subtracted on CPU")
    return term["value"], term
