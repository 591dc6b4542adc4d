"""Devices and clusters, loaded from data files.

A device is a JSON file (``catalog/devices/*.json``); a file may ``"extends"`` another
one (a family such as ``family-nvidia-hopper`` carries the efficiency parameters shared
by its members) and overrides any field. A user's own file works exactly like a
built-in one: ``--hardware my-cluster.json``. A cluster is a device, a number of
devices per node and a number of nodes; any device field can be overridden with
``--set section.field=value``.

Units: TFLOPS = 1e12 FLOP/s dense (no sparsity); bandwidths in GB/s = 1e9 B/s per
direction per device; memory in GiB. Sources for every number are in the files and in
docs/hardware.md.
"""
from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from ..errors import PartitaError, unknown_name
from .collective_fits import CollectiveFit, parse_collective_fits
from .eager_decode import EagerDecode, parse_eager_decode

DEVICES_DIR = Path(__file__).resolve().parent.parent / "catalog" / "devices"

#: Efficiency parameters every device must end up with (after ``extends``), with their meaning.
EFFICIENCY_FIELDS = {
    "gemm": "achievable fraction of the bf16/fp16 peak on large GEMMs",
    "gemm_fp8": "achievable fraction of the fp8 peak on large fp8 GEMMs",
    "attention": "achievable fraction of peak inside fused (flash) attention",
    "memory_bandwidth": "achievable fraction of HBM bandwidth in element-wise kernels",
    "intra_node_comm": "achieved bus bandwidth / link bandwidth inside a node",
    "inter_node_comm": "achieved bus bandwidth / NIC line rate between nodes",
    "gemm_half_gflop": "GEMM size (GFLOP) at which efficiency drops to half of `gemm`",
    "kernel_overhead_us_per_layer": "launch/framework overhead per layer per forward pass",
    "tp_overlap": "fraction of tensor-parallel communication hidden when the plan overlaps it",
}
#: Optional efficiency fields and their defaults. Host-side framework work per layer and
#: micro-batch (forward + backward) that tensor parallelism (DTensor redistribution and
#: sharding propagation) and ZeRO-3/FSDP (hooks, gather/scatter launches) add on top of
#: their collectives. On an accelerator it runs ahead of the device and hides behind
#: kernels (default 0); on a CPU it is on the critical path, and `partita calibrate`
#: measures it.
OPTIONAL_EFFICIENCY_FIELDS = {
    "tp_framework_us_per_layer": 0.0,
    # tp without sequence parallelism (all-reduce instead of reduce-scatter/all-gather
    # DTensor redistributions); absent: tp_framework_us_per_layer stands for it
    "tp_nosp_framework_us_per_layer": 0.0,
    "zero3_framework_us_per_layer": 0.0,
    # the same for pipeline scheduling per micro-batch, expert dispatch, full recompute and
    # ring attention per layer (read by :mod:`partita.cost.overheads`)
    "pp_framework_us_per_microbatch": 0.0,
    # expert dispatch of a local MoE layer (router, per-expert loop, combine; no ep)
    "moe_framework_us_per_layer": 0.0,
    # what expert parallelism adds on top of it (all-to-all dispatch and combine)
    "ep_framework_us_per_layer": 0.0,
    "recompute_framework_us_per_layer": 0.0,
    "cp_framework_us_per_layer": 0.0,
    # fixed cost of one collective call on the critical path (launch, the ring's set-up across
    # the group, the wait) beyond the latency steps of cost/comm.py; read where a framework
    # issues one call per group member (InternEvo's per-owner parameter broadcast, cost/step.py)
    "collective_call_us": 0.0,
}
#: Optional efficiency fields that are fractions in [0, 1], with their defaults.
#: ``comm_overlap``: the share of the communication the cost model overlaps with compute -
#: ZeRO-3/FSDP parameter all-gathers and gradient reduce-scatters, and context parallel's
#: ring K/V exchange - that can really run while the rank computes. On an accelerator they
#: run on their own streams (FSDP prefetches the next unit's gather, Zhao et al. 2023,
#: PyTorch FSDP, sec. 3.3-3.4; ring attention sends the next K/V block during the current
#: one's kernel, Liu et al. 2023, Ring Attention, sec. 3), so all of it can hide (1, the
#: default). On a CPU with gloo the collectives run on the same cores as the compute (a
#: gloo worker thread copying through loopback TCP) and the share is near 0; `partita
#: calibrate` measures it on a zero-3 probe.
OPTIONAL_FRACTION_FIELDS = {"comm_overlap": 1.0}


#: Provenance of an optional fraction no file sets.
DEFAULT_FRACTION_PROVENANCE = ("default: 1 - on an accelerator FSDP's gathers and reduce-scatters and the ring K/V "
                               "exchange run on their own streams beside compute (Zhao et al. 2023 sec. 3.3); "
                               "`partita calibrate` measures it")
#: Provenance of an optional field no file sets.
DEFAULT_PROVENANCE = ("default: 0 - on an accelerator the host-side framework work runs ahead of the "
                      "device and hides behind kernels; `partita calibrate` measures it where it does not")
#: The provenance kinds a device file's ``efficiency_provenance`` entries start with.
PROVENANCE_KINDS = ("fitted", "measured", "vendor", "scaled", "assumed", "default", "override")


@dataclass(frozen=True)
class Efficiency(Mapping):
    """Achievable-efficiency parameters of a device, each with where its number comes from.

    A frozen record (the cost model reads ``device.efficiency.gemm``); it is also a
    read-only mapping, so ``device.efficiency["gemm"]`` and ``dict(device.efficiency)``
    keep working. ``provenance`` holds one line per field: its kind (one of
    :data:`PROVENANCE_KINDS`) and its source - fitted on which data, measured by
    ``partita calibrate``, a vendor figure, assumed, or the default. See
    :data:`EFFICIENCY_FIELDS` for each field's meaning.
    """

    gemm: float
    gemm_fp8: float
    attention: float
    memory_bandwidth: float
    intra_node_comm: float
    inter_node_comm: float
    gemm_half_gflop: float
    kernel_overhead_us_per_layer: float
    tp_overlap: float
    tp_framework_us_per_layer: float = 0.0
    tp_nosp_framework_us_per_layer: float = 0.0
    zero3_framework_us_per_layer: float = 0.0
    pp_framework_us_per_microbatch: float = 0.0
    moe_framework_us_per_layer: float = 0.0
    ep_framework_us_per_layer: float = 0.0
    recompute_framework_us_per_layer: float = 0.0
    cp_framework_us_per_layer: float = 0.0
    collective_call_us: float = 0.0
    comm_overlap: float = 1.0
    provenance: tuple[tuple[str, str], ...] = ()  # (field, "kind: source"), in field order

    def __getitem__(self, key: str) -> float:
        if key not in _EFFICIENCY_NAMES:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_EFFICIENCY_NAMES)

    def __len__(self) -> int:
        return len(_EFFICIENCY_NAMES)

    def source(self, key: str) -> str:
        """Where the value of ``key`` comes from ("kind: source")."""
        return dict(self.provenance).get(key, "assumed: no source recorded")


_EFFICIENCY_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Efficiency) if f.name != "provenance")


@dataclass(frozen=True)
class Device:
    """One accelerator and the node it sits in, with achievable-efficiency parameters."""

    name: str
    description: str
    peak_tflops: dict[str, float | None]
    hbm_gib: float
    usable_gib: float
    hbm_tbps: float
    runtime_reserved_gib: float
    allocator_fragmentation: float
    comm_buffer_mib_per_group: float
    intra_link: str
    intra_topology: str  # "switch" (NVSwitch/UB) or "full-mesh" (HCCS, xGMI)
    intra_gbps: float  # aggregate per direction, one device to all peers
    peer_gbps: float  # one pair of devices, per direction
    devices_per_node: int
    intra_latency_us: float
    inter_link: str
    inter_gbps: float  # per device NIC, per direction
    inter_latency_us: float
    efficiency: Efficiency
    source_file: str
    #: per-collective alpha-beta fits of a calibrated file (``collectives``; none: the datasheet model)
    collective_fits: tuple[CollectiveFit, ...] = ()
    #: ``memory.optimizer_tbps``: the rate of the optimizer step in the cost model's bytes
    #: (:data:`partita.cost.step.ADAM_STEP_BYTES_PER_PARAM`), measured by ``partita calibrate``;
    #: 0 (every built-in device): the element-wise bandwidth ``hbm_tbps x memory_bandwidth``
    optimizer_tbps: float = 0.0
    #: ``memory.read_tbps``: the rate of streaming reads of memory already allocated (weights,
    #: a KV cache), measured by ``partita calibrate`` (:mod:`partita.calibrate.read_rate`);
    #: 0 (every built-in device): the element-wise bandwidth ``hbm_tbps x memory_bandwidth``
    read_tbps: float = 0.0
    #: ``eager_decode``: rates of an eager decode step's kernels (:mod:`.eager_decode`), None unmeasured
    eager_decode: EagerDecode | None = None

    def read_bytes_per_s(self) -> float:
        """Bytes per second of streaming reads: measured where the file says, else the
        element-wise bandwidth (a GPU's HBM reads and copies run at one rate; a CPU's copy into
        fresh pages does not: :mod:`partita.calibrate.read_rate`)."""
        if self.read_tbps > 0:
            return self.read_tbps * 1e12
        return self.hbm_tbps * 1e12 * self.efficiency.memory_bandwidth

    def optimizer_bytes_per_s(self) -> float:
        """Bytes per second of the optimizer step: measured where the file says, else the
        element-wise bandwidth. On a CPU they differ ~4x: calibrate's copy allocates and
        first-touches its output (what an eager op's fresh result pays), while the optimizer
        updates its tensors in place (small-llama AdamW, 4 M parameters: 7.4 ms measured, 33 ms
        at the copy bandwidth)."""
        if self.optimizer_tbps > 0:
            return self.optimizer_tbps * 1e12
        return self.hbm_tbps * 1e12 * self.efficiency.memory_bandwidth

    @cached_property
    def cache_key(self) -> int:
        """A key for the cost model's memo tables, from the device's content (see
        :attr:`partita.spec.model.ModelSpec.cache_key`)."""
        return hash(repr(self))

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` (bf16, fp16, fp8, fp32)."""
        value = self.peak_tflops.get(dtype)
        if not value:
            raise PartitaError(f"hardware {self.name} has no {dtype} peak; choose a dtype it supports "
                               f"({', '.join(k for k, v in self.peak_tflops.items() if v)})")
        return float(value) * 1e12

    def supports(self, dtype: str) -> bool:
        return bool(self.peak_tflops.get(dtype))

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "cache_key"}
        out["efficiency"] = dict(self.efficiency)
        out["efficiency_provenance"] = dict(self.efficiency.provenance)
        out["collective_fits"] = [dict(f.__dict__) for f in self.collective_fits]
        return out


@dataclass(frozen=True)
class Cluster:
    """``nodes`` x ``devices_per_node`` copies of ``device``."""

    device: Device
    devices_per_node: int
    nodes: int

    @property
    def world_size(self) -> int:
        return self.devices_per_node * self.nodes

    def describe(self) -> str:
        return (f"{self.world_size} x {self.device.name} ({self.nodes} node(s) of {self.devices_per_node}, "
                f"{self.device.intra_link} inside, {self.device.inter_link} between)")


def _deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@lru_cache(maxsize=None)
def _builtin_files() -> dict[str, Path]:
    return {p.stem: p for p in sorted(DEVICES_DIR.glob("*.json"))}


@lru_cache(maxsize=None)
def _alias_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for stem, path in _builtin_files().items():
        if stem.startswith("family-"):
            continue
        index[stem.lower()] = stem
        for alias in _read_json(path).get("aliases", []):
            index.setdefault(alias.lower(), stem)
    return index


def builtin_devices() -> list[str]:
    """Names of the built-in devices (families excluded)."""
    return [s for s in _builtin_files() if not s.startswith("family-")]


def _read_json(path: Path) -> dict:
    from ..inputs import read_json
    data = read_json(path, "hardware")  # one-line errors for directory/non-UTF-8/non-JSON/deep/NaN files
    if not isinstance(data, dict):
        raise PartitaError(f"hardware file {path} must hold a JSON object")
    return data


def _resolve_raw(name_or_path: str, seen: tuple[str, ...] = ()) -> tuple[dict, str]:
    """Return the merged raw dict of a device (following ``extends``) and the file it came from."""
    if name_or_path in seen:
        raise PartitaError(f"hardware file extends itself in a loop: {' -> '.join(seen + (name_or_path,))}")
    from ..inputs import path_exists, short
    path = Path(name_or_path)
    if name_or_path.endswith(".json") or path_exists(path):
        if not path_exists(path):
            raise PartitaError(f"hardware file {short(name_or_path)} does not exist")
        raw = _read_json(path)
    else:
        stem = _alias_index().get(name_or_path.lower())
        if stem is None and name_or_path.startswith("family-") and name_or_path in _builtin_files():
            stem = name_or_path
        if stem is None:
            raise unknown_name("hardware", name_or_path, builtin_devices() + list(_alias_index()))
        path = _builtin_files()[stem]
        raw = _read_json(path)
    _check_schema(raw, path)
    raw = dict(raw, efficiency_provenance=_own_provenance(raw, path))
    parent = raw.get("extends")
    if parent is not None and (not isinstance(parent, str) or not parent.strip()):
        raise PartitaError(f"hardware file {path}: extends must be a device name or file, got {parent!r}"[:300])
    if parent:
        base, _ = _resolve_raw(parent, seen + (name_or_path,))
        base.pop("aliases", None)
        raw = _deep_merge(base, {k: v for k, v in raw.items() if k != "extends"})
    return raw, str(path)


#: Top-level keys of a device file besides the sections of :data:`_SECTIONS`.
_TOP_LEVEL = ("name", "description", "extends", "aliases", "sources", "confidence", "calibration",
              "efficiency_provenance", "collectives", "eager_decode")


def _check_schema(raw: dict, path: Path) -> None:
    """Every key of a device file is one the loader reads (a misspelt one would be silently
    ignored), every section an object, with the close names of an unknown key."""
    import difflib

    def unknown(key: str, known: list[str], where: str) -> PartitaError:
        close = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
        return PartitaError(f"hardware file {path}: unknown {where}{key!r}"[:200] + "; "
                            + (f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(known)}"))
    for key in raw:
        if key not in _SECTIONS and key not in _TOP_LEVEL:
            raise unknown(key, list(_SECTIONS) + list(_TOP_LEVEL), "key ")
    for section, names in _SECTIONS.items():
        values = raw.get(section, {})
        if not isinstance(values, dict):
            raise PartitaError(f"hardware file {path}: {section} must be a JSON object of fields, "
                               f"got {values!r}"[:300])
        for key in values:
            if key not in names:
                raise unknown(key, list(names), f"field in {section}: ")
    aliases = raw.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise PartitaError(f"hardware file {path}: aliases must be a list of names, got {aliases!r}"[:300])


def _own_provenance(raw: dict, path: Path) -> dict[str, str]:
    """Provenance of the efficiency fields this file itself sets: its own
    ``efficiency_provenance`` entry, else "measured" for a file `partita calibrate` wrote
    (it carries the raw measurements as a ``calibration`` object), else "assumed"."""
    given = raw.get("efficiency_provenance", {})
    if not isinstance(given, dict):
        raise PartitaError(f"hardware file {path}: efficiency_provenance must map efficiency fields to sources")
    calibrated = isinstance(raw.get("calibration"), dict)
    out = {}
    for key in raw.get("efficiency", {}) or {}:
        text = given.get(key)
        if text is None:
            text = (f"measured: partita calibrate ({path.name})" if calibrated
                    else f"assumed: {path.name} gives no source for it")
        out[key] = str(text)
    return out


def _get(raw: dict, section: str, key: str, source: str, default: Any = None) -> Any:
    value = raw.get(section, {}).get(key, default)
    if value is None:
        raise PartitaError(f"hardware file {source}: missing field {section}.{key}")
    return value


#: No device field is anywhere near this (TFLOPS ~1e4, GB/s ~1e4, GiB ~1e3, us ~1e3); a value
#: beyond it is a typo whose products would overflow the cost model.
_MAX_HARDWARE_VALUE = 1e9


def _number(value: Any, where: str, source: str, low: float = 0.0, high: float = _MAX_HARDWARE_VALUE,
            open_low: bool = False) -> float:
    """``value`` as a finite float in [low, high] ((low, high] with ``open_low``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PartitaError(f"hardware file {source}: {where} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise PartitaError(f"hardware file {source}: {where} must be a finite number, got {value}")
    if value < low or (open_low and value == low) or value > high:
        span = f"{'(' if open_low else '['}{low:g}, {high:g}]"
        if high == _MAX_HARDWARE_VALUE and low == 0 and value < low:
            span = "be more than 0" if open_low else "not be negative"
            raise PartitaError(f"hardware file {source}: {where} must {span}, got {value}")
        raise PartitaError(f"hardware file {source}: {where} must be in {span}, got {value}")
    return float(value)


#: The sections of a device file and the fields each may hold (``--set`` checks its path
#: against these; peak_tflops takes any dtype of :data:`PEAK_DTYPES`).
_SECTIONS: dict[str, tuple[str, ...]] = {
    "memory": ("hbm_gib", "usable_gib", "hbm_tbps", "runtime_reserved_gib", "allocator_fragmentation",
               "comm_buffer_mib_per_group", "optimizer_tbps", "read_tbps"),
    "intra_node": ("link", "topology", "gbps_per_direction", "peer_gbps_per_direction", "devices_per_node",
                   "latency_us"),
    "inter_node": ("link", "gbps_per_direction", "latency_us"),
    "efficiency": tuple(EFFICIENCY_FIELDS) + tuple(OPTIONAL_EFFICIENCY_FIELDS) + tuple(OPTIONAL_FRACTION_FIELDS),
    "peak_tflops": ("bf16", "fp16", "fp8", "fp32", "tf32", "int8", "fp4"),
    "cluster": ("nodes", "devices_per_node"),
}
#: Efficiency fields that are fractions of a peak: in (0, 1] (a time is divided by them).
_FRACTIONS = ("gemm", "attention", "memory_bandwidth", "intra_node_comm", "inter_node_comm")


def _check_overrides(raw: dict, overrides: dict) -> None:
    """Refuse a ``--set`` path the device file has no field for, naming the close ones
    (a misspelt path would otherwise be silently ignored)."""
    import difflib
    for section, values in overrides.items():
        if section not in _SECTIONS:
            close = difflib.get_close_matches(section, list(_SECTIONS), n=3, cutoff=0.5)
            raise PartitaError(f"--set {section}.*: {section!r} is not a section of a device file; "
                               + (f"did you mean {', '.join(close)}?" if close else
                                  f"sections: {', '.join(_SECTIONS)}"))
        known = set(_SECTIONS[section]) | set(raw.get(section) or {})
        for name in values:
            if name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.5)
                raise PartitaError(f"--set {section}.{name}: no field {name!r} in {section}; "
                                   + (f"did you mean {', '.join(section + '.' + c for c in close)}?" if close
                                      else f"its fields: {', '.join(sorted(known))}"))


class SetOverrides(dict):
    """Overrides from ``--set``: :func:`load_device` checks their paths against the device
    schema (a plain dict of overrides may carry any device field, e.g. calibrate's name)."""


def parse_overrides(pairs: list[str] | None) -> dict:
    """Turn ``["inter_node.gbps_per_direction=25", ...]`` into a nested dict of overrides."""
    out: dict = SetOverrides()
    for pair in pairs or []:
        if "=" not in pair or "." not in pair.split("=", 1)[0]:
            raise PartitaError(f"override {pair!r} must look like section.field=value, "
                               "e.g. inter_node.gbps_per_direction=25")
        key, value = pair.split("=", 1)
        section, field_name = (s.strip() for s in key.split(".", 1))
        if not section or not field_name or "." in field_name:
            raise PartitaError(f"override {pair!r} must look like section.field=value with one dot, "
                               "e.g. efficiency.gemm=0.6")
        try:
            parsed: Any = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        out.setdefault(section, {})[field_name] = parsed
    return out


def load_device(name_or_path: str, overrides: dict | None = None) -> Device:
    """Load a built-in device by name/alias, or a user's JSON file, applying ``overrides``."""
    raw, source = _resolve_raw(name_or_path)
    if overrides:
        if isinstance(overrides, SetOverrides):
            _check_overrides(raw, overrides)
        raw = _deep_merge(raw, overrides)
        for key in (overrides.get("efficiency") or {}):
            raw["efficiency_provenance"][key] = "override: set when loading (--set efficiency.%s=...)" % key
    efficiency = _efficiency(raw, source)
    for section, key in ((None, "name"), (None, "description"), ("intra_node", "link"), ("inter_node", "link")):
        value = (raw if section is None else raw.get(section, {})).get(key)
        if value is not None and not isinstance(value, str):
            raise PartitaError(f"hardware file {source}: {section + '.' if section else ''}{key} must be a string, "
                               f"got {value!r}"[:300])
    peaks = raw.get("peak_tflops")
    if not isinstance(peaks, dict) or not any(peaks.values()):
        raise PartitaError(f"hardware file {source}: peak_tflops must map dtypes to TFLOPS, e.g. {{\"bf16\": 989}}")
    mem = raw.get("memory", {})
    hbm = _number(_get(raw, "memory", "hbm_gib", source), "memory.hbm_gib", source, open_low=True)
    topology = _get(raw, "intra_node", "topology", source, "switch")
    if topology not in ("switch", "full-mesh"):
        raise PartitaError(f"hardware file {source}: intra_node.topology must be 'switch' or 'full-mesh', got {topology!r}")
    intra = _number(_get(raw, "intra_node", "gbps_per_direction", source), "intra_node.gbps_per_direction", source,
                    open_low=True)
    return Device(
        name=str(raw.get("name", Path(source).stem)),
        description=str(raw.get("description", "")),
        peak_tflops={k: (None if v is None else _number(v, f"peak_tflops.{k}", source)) for k, v in peaks.items()},
        hbm_gib=hbm,
        usable_gib=_number(mem.get("usable_gib", hbm), "memory.usable_gib", source, high=hbm, open_low=True),
        hbm_tbps=_number(_get(raw, "memory", "hbm_tbps", source), "memory.hbm_tbps", source, open_low=True),
        optimizer_tbps=_number(mem.get("optimizer_tbps", 0.0), "memory.optimizer_tbps", source),
        read_tbps=_number(mem.get("read_tbps", 0.0), "memory.read_tbps", source),
        runtime_reserved_gib=_number(mem.get("runtime_reserved_gib", 1.0), "memory.runtime_reserved_gib", source,
                                     high=_number(mem.get("usable_gib", hbm), "memory.usable_gib", source)),
        allocator_fragmentation=_number(mem.get("allocator_fragmentation", 0.05), "memory.allocator_fragmentation", source,
                                        high=0.99),
        comm_buffer_mib_per_group=_number(mem.get("comm_buffer_mib_per_group", 0), "memory.comm_buffer_mib_per_group", source),
        intra_link=str(raw.get("intra_node", {}).get("link", "intra-node link")),
        intra_topology=topology,
        intra_gbps=intra,
        peer_gbps=_number(raw.get("intra_node", {}).get("peer_gbps_per_direction") or intra,
                          "intra_node.peer_gbps_per_direction", source, open_low=True),
        devices_per_node=_count(_get(raw, "intra_node", "devices_per_node", source, 8), "intra_node.devices_per_node", source),
        intra_latency_us=_number(raw.get("intra_node", {}).get("latency_us", 10), "intra_node.latency_us", source),
        inter_link=str(raw.get("inter_node", {}).get("link", "network")),
        inter_gbps=_number(_get(raw, "inter_node", "gbps_per_direction", source), "inter_node.gbps_per_direction", source,
                           open_low=True),
        inter_latency_us=_number(raw.get("inter_node", {}).get("latency_us", 20), "inter_node.latency_us", source),
        efficiency=efficiency,
        source_file=source,
        collective_fits=parse_collective_fits(raw.get("collectives"), source),
        eager_decode=parse_eager_decode(raw.get("eager_decode"), source),
    )


def _count(value: Any, where: str, source: str, high: int = 1 << 20) -> int:
    """A whole number in 1..high (devices per node, nodes)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise PartitaError(f"hardware file {source}: {where} must be a whole number from 1 to {high:,}, got {value!r}")
    return value


def _efficiency(raw: dict, source: str) -> Efficiency:
    """The efficiency record of a merged device dict: every required field, the optional
    ones with their defaults, and each field's provenance."""
    eff = dict(raw.get("efficiency", {}))
    given = raw.get("efficiency_provenance", {})
    values: dict[str, float] = {}
    provenance: dict[str, str] = {}
    for key in EFFICIENCY_FIELDS:
        if key not in eff:
            raise PartitaError(f"hardware file {source}: missing efficiency.{key} ({EFFICIENCY_FIELDS[key]})")
        values[key] = _number(eff[key], f"efficiency.{key}", source, high=1.0 if key in _FRACTIONS + ("gemm_fp8", "tp_overlap")
                              else _MAX_HARDWARE_VALUE, open_low=key in _FRACTIONS)
        provenance[key] = given.get(key, "assumed: no source recorded")
    for key, default in OPTIONAL_EFFICIENCY_FIELDS.items():
        values[key] = _number(eff.get(key, default), f"efficiency.{key}", source)
        provenance[key] = given.get(key, DEFAULT_PROVENANCE) if key in eff else DEFAULT_PROVENANCE
    for key, default in OPTIONAL_FRACTION_FIELDS.items():
        values[key] = _number(eff.get(key, default), f"efficiency.{key}", source, high=1.0)
        provenance[key] = given.get(key, DEFAULT_FRACTION_PROVENANCE) if key in eff else DEFAULT_FRACTION_PROVENANCE
    return Efficiency(**values, provenance=tuple((k, provenance[k]) for k in _EFFICIENCY_NAMES))


def make_cluster(hardware: str, devices: int | None = None, devices_per_node: int | None = None,
                 overrides: dict | None = None) -> Cluster:
    """A cluster of ``devices`` devices of type ``hardware``.

    ``devices_per_node`` defaults to the device file's node size; a cluster file may
    also carry ``"cluster": {"nodes": N, "devices_per_node": K}``.
    """
    device = load_device(hardware, overrides)
    raw_cluster = {}
    if hardware.endswith(".json"):
        raw_cluster = dict(_read_json(Path(hardware)).get("cluster", {}) or {})
    raw_cluster.update((overrides or {}).get("cluster") or {})  # --set cluster.nodes=4
    for key in ("nodes", "devices_per_node"):
        if key in raw_cluster:
            _count(raw_cluster[key], f"cluster.{key}", hardware)
    per_node = devices_per_node or int(raw_cluster.get("devices_per_node", device.devices_per_node))
    if per_node <= 0:
        raise PartitaError(f"--devices-per-node must be positive, got {per_node}")
    if devices is None:
        devices = int(raw_cluster.get("nodes", 1)) * per_node
    if devices <= 0:
        raise PartitaError(f"--devices must be positive, got {devices}")
    if devices < per_node:
        per_node = devices
    if devices % per_node:
        raise PartitaError(f"--devices {devices} is not a whole number of nodes of {per_node}; "
                           f"use a multiple of {per_node} or set --devices-per-node")
    return Cluster(device=device, devices_per_node=per_node, nodes=devices // per_node)
