"""Memory timeline and allocator fragmentation from a trace's ``[memory]`` events.

With ``profile_memory=True`` torch.profiler (and torch_npu.profiler) records one instant
event per allocation and free, ``name: "[memory]"``, whose arguments carry the caching
allocator's running totals after the event: ``Total Allocated`` (bytes in live tensors)
and ``Total Reserved`` (bytes the allocator holds from the device), with ``Device Type`` /
``Device Id`` and the signed ``Bytes`` of the event.

Fragmentation is read the way PyTorch's memory docs describe the caching allocator:
reserved-but-unallocated bytes are cached blocks that the next allocations may not fit
into. We report, per device, the peaks, the reserved-minus-allocated bytes at the moment of
peak reservation, and ``fragmentation = 1 - allocated / reserved`` at that moment (0 = every
reserved byte holds a tensor) - the same ratio ``partita profile`` reports from
``torch.cuda.memory_stats`` on its own runs.
"""
from __future__ import annotations

#: torch's c10::DeviceType numbers that the profiler writes as ``Device Type``
DEVICE_TYPES = {0: "cpu", 1: "cuda", 9: "xpu", 20: "privateuse1"}
#: points kept per device in the timeline (the extremes are always kept)
MAX_POINTS = 400


def _device(args: dict) -> str:
    kind = args.get("Device Type")
    name = DEVICE_TYPES.get(kind, str(kind)) if isinstance(kind, int) else str(kind or "device")
    if name == "privateuse1":
        name = "npu"  # torch_npu registers itself as the PrivateUse1 backend
    index = args.get("Device Id", 0)
    return name if isinstance(index, int) and index < 0 else f"{name}:{index}"  # CPU events carry id -1


def _thin(points: list[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
    """At most about MAX_POINTS points, keeping each bucket's highest allocation."""
    if len(points) <= MAX_POINTS:
        return points
    size = -(-len(points) // MAX_POINTS)
    return [max(points[i:i + size], key=lambda p: p[1]) for i in range(0, len(points), size)]


def _peaks(points: list[tuple[float, float, float]]) -> dict:
    """One device's summary of its time-sorted ``(t_us, allocated, reserved)`` points: the
    peaks, the reserved-but-unallocated bytes and fragmentation at peak reservation (a tie on
    reserved goes to the higher allocation), and the thinned timeline from the first point."""
    t0 = points[0][0]
    peak_reserved = max(points, key=lambda p: (p[2], p[1]))
    return {
        "events": len(points),
        "peak_allocated_bytes": max(p[1] for p in points),
        "peak_reserved_bytes": peak_reserved[2],
        "unallocated_at_peak_reserved_bytes": peak_reserved[2] - peak_reserved[1],
        "fragmentation_at_peak_reserved": (1 - peak_reserved[1] / peak_reserved[2]) if peak_reserved[2] else None,
        "timeline": [[t - t0, a, r] for t, a, r in _thin(points)],
    }


def component_peaks(series: dict[str, dict[str, list[tuple[float, float, float]]]], source: str,
                    app_peak_reserved: dict[str, float]) -> dict[str, dict]:
    """Per device, :func:`_peaks` of one component of msprof's memory records
    ``{device: {component: [(t_us, allocated, reserved)]}}`` - the one body behind
    ``memory_record.csv`` (:func:`partita.analyze.ascend.read_memory_record`) and the profiler
    database's ``MEMORY_RECORD`` (:func:`partita.analyze.ascend_db.read_db_memory`).

    The component is the PyTorch allocator's, ``PTA``; ``PTA+GE``, then ``APP`` (the whole
    process), where a capture has no PTA rows; else the first one recorded. ``source`` is
    with ``{}`` replaced by the component chosen (``"memory_record.csv ({})"``; replaced, not
    ``str.format``-ed: the label holds the user's file name); ``app_peak_reserved``
    holds each device's whole-process peak where one was recorded (None elsewhere). Adds
    ``source``, ``peak_unallocated_bytes`` and ``app_peak_reserved_bytes`` to :func:`_peaks`'s
    fields, in the order the two readers have always written them."""
    out = {}
    for device, parts in sorted(series.items()):
        component = next((c for c in ("PTA", "PTA+GE", "APP") if parts.get(c)), next(iter(parts)))
        points = sorted(parts[component])
        peaks = _peaks(points)
        timeline = peaks.pop("timeline")
        out[device] = {"events": peaks.pop("events"), "source": source.replace("{}", component), **peaks,
                       "peak_unallocated_bytes": max(p[2] - p[1] for p in points),
                       "app_peak_reserved_bytes": app_peak_reserved.get(device),
                       "timeline": timeline}
    return out


def memory_timeline(trace: dict) -> dict[str, dict]:
    """Per device: peaks (bytes), fragmentation at peak reservation and a thinned timeline
    ``[[t_us, allocated, reserved], ...]`` (t from the device's first memory event).
    Empty when the trace recorded no memory events."""
    series: dict[str, list[tuple[float, float, float]]] = {}
    for e in trace.get("traceEvents", []):
        if e.get("name") != "[memory]" or not isinstance(e.get("args"), dict) or e.get("ts") is None:
            continue
        args = e["args"]
        try:
            allocated, reserved = float(args.get("Total Allocated", 0)), float(args.get("Total Reserved", 0))
        except (TypeError, ValueError):
            continue
        series.setdefault(_device(args), []).append((float(e["ts"]), allocated, reserved))
    return {device: _peaks(sorted(points)) for device, points in sorted(series.items())}
