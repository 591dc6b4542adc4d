"""The vocabulary of trace analysis, shared by every reader (Kineto traces in
:mod:`partita.analyze.breakdown`, torch_npu captures in :mod:`partita.analyze.ascend`):
which events are device work and which are collectives, time intervals and their union /
intersection, and the :class:`TraceBreakdown` record every reader returns.

Its own module so that the readers depend on it and not on each other.
"""
from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
COLLECTIVE_KINDS = [
    ("all_to_all", re.compile(r"all_?to_?all|alltoall", re.I)),
    ("reduce_scatter", re.compile(r"reduce_?scatter|reducescatter", re.I)),
    ("all_gather", re.compile(r"all_?gather|allgather", re.I)),
    ("all_reduce", re.compile(r"all_?reduce|allreduce", re.I)),
    ("broadcast", re.compile(r"broadcast", re.I)),
    ("send_recv", re.compile(r"send|recv|sendrecv", re.I)),
    ("barrier", re.compile(r"barrier", re.I)),
]
DEVICE_COMM = re.compile(r"^(nccl|ncclDev|hcom|hccl)|ncclKernel|ncclDevKernel", re.I)
#: expert-parallel all-to-all libraries whose kernels move tokens between ranks themselves:
#: DeepEP (``deep_ep::internode::dispatch``; DeepSeek's own build names its namespace
#: ``dpsk::ep``: ``dpsk::ep::internode::combine``, ``...::notify_dispatch``), and NVSHMEM's
#: collectives (``nvshmemi_*alltoall*``, ``nvshmem_*``). DeepEP's ``get_dispatch_layout``
#: (``dpsk::ep::cuda::``) only counts tokens per rank: computation
EP_COMM = re.compile(r"\b(deep_ep|dpsk::ep)::(internode|intranode|internode_ll|intranode_ll)\w*::|\bnvshmemi?_", re.I)
CPU_COMM = re.compile(r"^(gloo:|c10d::|record_param_comms|nccl:)", re.I)

Interval = tuple[float, float]


def load_trace(path: str | Path) -> dict:
    """A Chrome trace (``.json`` or ``.json.gz``)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def union(intervals: list[Interval]) -> list[Interval]:
    """Merge overlapping intervals."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def length(intervals: list[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Intersection of two sorted, disjoint interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """``a`` minus ``b`` (both merged first)."""
    out = []
    cuts = union(b)
    for start, end in union(a):
        for lo, hi in cuts:
            if hi <= start or lo >= end:
                continue
            if lo > start:
                out.append((start, lo))
            start = max(start, hi)
        if start < end:
            out.append((start, end))
    return out


def clip(intervals: list[Interval], window: list[Interval]) -> list[Interval]:
    return intersect(union(intervals), union(window))


def collective_kind(name: str) -> str:
    if EP_COMM.search(name):
        return "all_to_all"  # DeepEP's dispatch / combine / notify kernels and NVSHMEM's a2a
    for kind, pattern in COLLECTIVE_KINDS:
        if pattern.search(name):
            return kind
    return "other"


def with_bandwidth(transport: dict[str, dict]) -> dict[str, dict]:
    """Each transport's summed ``size_mb`` / ``time_ms`` with its bandwidth (MB/ms = GB/s, as
    msprof's ``Bandwidth(GB/s)`` column), those that moved no bytes left out; shared by the
    msprof readers of the text export and of the database."""
    return {k: {**v, "bandwidth_gb_s": round(v["size_mb"] / v["time_ms"], 3) if v["time_ms"] else None}
            for k, v in transport.items() if v["size_mb"]}


@dataclass
class TraceBreakdown:
    """Where the analysed window's time went (microseconds, as traces record them)."""

    kind: str  # "device" or "cpu"
    window_us: float
    compute_us: float
    communication_us: float
    overlapped_us: float
    exposed_communication_us: float
    memory_us: float
    idle_us: float
    by_collective_us: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    #: communication time per process group, keyed by its global ranks ("0,2"), where the
    #: trace names the group (c10d's record_param_comms / NCCL kernel arguments)
    by_group_us: dict[str, float] = field(default_factory=dict)
    #: communication time per mesh axis, where Partita's ``partita:group:<axis>`` markers
    #: name the gloo threads of each group (``partita profile`` on CPU)
    by_axis_us: dict[str, float] = field(default_factory=dict)
    #: the merged intervals behind the figures, per category ("compute", "memory", and
    #: "comm:<collective>"), clipped to the window - what a timeline plot draws
    timeline: dict[str, list[Interval]] = field(default_factory=dict, repr=False)
    #: torch_npu captures only (:mod:`partita.analyze.ascend`): how the step window was
    #: found, msprof's columns per step, waits, stream roles and idle per stream
    ascend: dict | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "timeline"}
