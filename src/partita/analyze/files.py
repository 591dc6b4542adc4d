"""Reading profiler traces that Partita did not record, with one-line errors.

``partita analyze`` takes torch.profiler / Kineto Chrome traces (``.json`` or ``.json.gz``;
``torch_npu.profiler`` writes the same format) from any framework, one file per rank or a
directory of them. Every way such an input can be wrong - missing, an empty directory, not
JSON, a truncated gzip, JSON that is not a Chrome trace, too large - becomes a
:class:`PartitaError` naming the file and what was expected.

Size is bounded before parsing: ``json`` holds the whole document in memory (about 5-10x
the text), so a trace larger than ``max_bytes`` of (decompressed) text is refused with the
limit and how to raise it, rather than swapping the machine for minutes.
"""
from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import PartitaError
from .ascend_db import find_db, is_db, load_db_trace

#: default limit on the traces' JSON text together (decompressed). Measured on this 2-core
#: machine: 165 MB (810k events) load in 8-30 s and analyse in 15-35 s more with ~1 GB of
#: memory, so 512 MB stays within a few minutes and a few GB
DEFAULT_MAX_MB = 512
#: file names a directory is searched for (Kineto writes ``*.pt.trace.json[.gz]``)
TRACE_SUFFIXES = (".json", ".json.gz")


#: torch_npu's output folder inside each ``*_ascend_pt`` capture, and its Chrome trace
ASCEND_OUTPUT = "ASCEND_PROFILER_OUTPUT"
ASCEND_TRACE = "trace_view.json"
#: Kineto's own file names, looked for recursively when a directory holds no trace itself
KINETO_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
#: where msprof (without torch_npu) writes its msprof_*.db
MSPROF_OUTPUT = "mindstudio_profiler_output"


@dataclass
class RankTrace:
    """One rank's trace: where it came from, its rank and the parsed document; for a
    torch_npu capture, its ``*_ascend_pt`` folder and ``ASCEND_PROFILER_OUTPUT``."""

    path: str
    rank: int
    trace: dict
    capture: str | None = None
    msprof_dir: str | None = None


def _ascend_traces(path: Path) -> list[Path]:
    """The ``trace_view.json`` of torch_npu captures at or under ``path``: the
    ``ASCEND_PROFILER_OUTPUT`` folder itself, one ``*_ascend_pt`` folder, or a cluster
    directory of them (searched recursively)."""
    if path.name == ASCEND_OUTPUT:
        if not (path / ASCEND_TRACE).is_file():
            db = find_db(path)  # the export_type=db capture (partita.analyze.ascend_db)
            if db is not None:
                return [db]
            raise PartitaError(f"{path} holds no {ASCEND_TRACE} nor ascend_pytorch_profiler_<rank>.db (export the "
                               "torch_npu profile with export_type='text' or 'db')")
        return [path / ASCEND_TRACE]
    if (path / ASCEND_OUTPUT).is_dir():
        return _ascend_traces(path / ASCEND_OUTPUT)
    return [t for d in sorted(path.rglob(ASCEND_OUTPUT)) if d.is_dir() and ((d / ASCEND_TRACE).is_file() or find_db(d))
            for t in _ascend_traces(d)] or sorted(p for p in path.rglob(f"{MSPROF_OUTPUT}/*.db") if is_db(p))


def find_trace_files(inputs: list[str]) -> list[Path]:
    """The trace files named or held by ``inputs``: torch_npu captures (recursively), else a
    directory's own trace files, else Kineto's ``*.pt.trace.json[.gz]`` under it."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = _ascend_traces(path)
            if not found:
                found = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
                               and not p.name.endswith(".summary.json"))
            if not found:
                found = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(KINETO_SUFFIXES))
            if not found:
                raise PartitaError(f"{item} holds no trace files (*.json or *.json.gz from torch.profiler, or "
                                   f"*_ascend_pt/{ASCEND_OUTPUT}/{ASCEND_TRACE} from torch_npu)")
            files += found
        elif path.exists():
            files.append(path)
        else:
            raise PartitaError(f"{item}: no such file or directory")
    return files


def _read_text(path: Path, max_bytes: int, what: str = "") -> bytes:
    """The file's bytes, decompressed when gzip (by its magic number, whatever its name),
    at most ``max_bytes`` of them."""
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
        opener = gzip.open if magic == b"\x1f\x8b" else open
        with opener(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except (EOFError, zlib.error, gzip.BadGzipFile):
        raise PartitaError(f"{path} is a truncated or corrupt gzip file (re-copy or re-export the trace)") from None
    except IsADirectoryError:
        raise PartitaError(f"{path} is a directory") from None
    except OSError as e:
        raise PartitaError(f"cannot read {path}: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise PartitaError(_too_big(path, what or f"holds more than {max_bytes // 2**20} MB of trace JSON"))
    return data


def _too_big(path: Path, what: str) -> str:
    """The one line for a trace past the --max-mb budget (JSON text and profiler databases alike)."""
    return (f"{path} {what} (the limit keeps the analysis within memory and minutes; raise it with --max-mb, "
            "or profile fewer steps)")


def load_chrome_trace(path: str | Path, max_bytes: int = DEFAULT_MAX_MB * 2**20, what: str = "") -> dict:
    """A Chrome trace as a dict with a ``traceEvents`` list (the JSON array form of the
    format is accepted and wrapped), with its size in bytes under ``"_bytes"``."""
    path = Path(path)
    data = _read_text(path, max_bytes, what)
    try:
        doc = json.loads(data)
    except UnicodeDecodeError:
        raise PartitaError(f"{path} is not a JSON text file (a torch.profiler Chrome trace is expected)") from None
    except json.JSONDecodeError as e:
        what = "ends early (truncated?)" if e.pos >= len(data.rstrip()) else f"{e.msg} at line {e.lineno}"
        raise PartitaError(f"{path} is not valid JSON: {what} (a torch.profiler Chrome trace is expected)") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise PartitaError(f"{path} is JSON but not a Chrome trace (no traceEvents list of events; "
                           "export one with torch.profiler's export_chrome_trace or tensorboard_trace_handler)")
    doc = normalise_npu_trace(doc)
    doc["_bytes"] = len(data)
    if not any(e.get("ph") == "X" for e in doc["traceEvents"]):
        raise PartitaError(f"{path} is a Chrome trace without any complete ('X') events with a time to analyse")
    return doc


def _number(value):
    """A timestamp/duration as a float (torch_npu writes them as strings, e.g. "1699529623106750.125")."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return value


def normalise_npu_trace(doc: dict) -> dict:
    """Make a ``torch_npu.profiler`` ``trace_view.json`` read like a Kineto GPU trace, in place.

    Its device work sits in the process named ``Ascend Hardware``, one thread per stream,
    without a ``cat``; timestamps may be strings. Those events become ``cat: kernel`` with
    ``args.stream`` = the thread id, so both conventions see NPU kernels on streams (HCCL's
    ``hcom_*`` kernels count as communication under Partita's conventions; HTA knows only
    NCCL's names, so under ``--conventions hta`` they count as computation, as HTA would)."""
    events = doc["traceEvents"]
    hardware = {e.get("pid") for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
                and isinstance(e.get("args"), dict) and e["args"].get("name") == "Ascend Hardware"}
    kept = []
    for e in events:
        for key in ("ts", "dur"):
            if isinstance(e.get(key), str):
                e[key] = _number(e[key])
        if not isinstance(e.get("args", {}), dict):
            e["args"] = {}
        for key in ("ph", "cat", "name", "pid", "tid"):  # strings or numbers, as the format says
            if e.get(key) is not None and not isinstance(e[key], (str, int, float)):
                e[key] = str(e[key])
        if e.get("ph") == "X" and not all(isinstance(e.get(k), (int, float)) and not isinstance(e.get(k), bool)
                                          and math.isfinite(e[k]) for k in ("ts", "dur")):
            continue  # a complete event without a usable time: nothing to measure
        kept.append(e)
        if hardware and e.get("ph") == "X" and e.get("pid") in hardware and e.get("cat") not in (
                "kernel", "gpu_memcpy", "gpu_memset"):
            found = re.search(r"\d+", str(e.get("tid")))
            args = e.setdefault("args", {})
            e["cat"] = "kernel"
            args.setdefault("stream", int(found.group()) if found else 0)
    doc["traceEvents"] = kept
    return doc


def _rank_of(path: Path, doc: dict, position: int) -> int:
    """``distributedInfo.rank`` (Kineto), else ``rank<N>`` in the file name, else the position."""
    info = doc.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    found = re.search(r"rank[_-]?(\d+)", path.name, re.IGNORECASE)
    return int(found.group(1)) if found else position


def ascend_capture(path: Path) -> tuple[Path, Path] | None:
    """(the ``*_ascend_pt`` folder, its ``ASCEND_PROFILER_OUTPUT``) of a torch_npu trace file."""
    path = Path(path).resolve()
    if path.parent.name == ASCEND_OUTPUT:
        return path.parent.parent, path.parent
    return None


def ascend_rank(capture: Path) -> int | None:
    """The rank torch_npu recorded for a capture: ``rank_id`` in ``profiler_info_<N>.json``
    (else the ``N`` of its name; ``-1``, a run without torch.distributed, is rank 0)."""
    for info in sorted(capture.glob("profiler_info*.json")):
        try:
            doc = json.loads(info.read_text())
            rank = doc.get("rank_id") if isinstance(doc, dict) else None
        except (OSError, ValueError):
            rank = None
        if not isinstance(rank, int):
            found = re.search(r"profiler_info_(\d+)\.json$", info.name)
            rank = int(found.group(1)) if found else None
        if isinstance(rank, int):
            return max(rank, 0)
    return None


def _span(doc: dict) -> tuple[float, float] | None:
    times = [(e["ts"], e["ts"] + e["dur"]) for e in doc["traceEvents"]
             if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]
    return (min(a for a, _ in times), max(b for _, b in times)) if times else None


def _profiler_config(capture: str) -> dict | None:
    """The profiler settings a capture's ``profiler_info*.json`` recorded (the same on every
    rank of a job: torch_npu.profiler is configured once in the training script)."""
    for info in sorted(Path(capture).glob("profiler_info*.json")):
        try:
            doc = json.loads(info.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("config"), dict):
            return doc["config"]
    return None


def _check_one_job(traces: list[RankTrace]) -> None:
    """torch_npu captures of one job were recorded together, with one profiler setting: their
    time spans overlap and their ``profiler_info`` configs are equal. Refuse (one line)
    captures that are not - ranks of different runs."""
    configs = [(rt, _profiler_config(rt.capture)) for rt in traces if rt.capture]
    configs = [(rt, c) for rt, c in configs if c is not None]
    for rt, config in configs[1:]:
        if config != configs[0][1]:
            raise PartitaError(f"{rt.capture} and {configs[0][0].capture} are not from one job: they were recorded "
                               "with different profiler settings (profiler_info*.json); give the *_ascend_pt "
                               "folders of one run")
    spans = [(rt, _span(rt.trace)) for rt in traces if rt.capture]
    spans = [(rt, s) for rt, s in spans if s]
    if len(spans) < 2:
        return
    first = min(spans, key=lambda x: x[1][1])   # the capture that ends first
    last = max(spans, key=lambda x: x[1][0])    # the capture that starts last
    if last[1][0] > first[1][1]:
        gap = (last[1][0] - first[1][1]) / 1e6
        raise PartitaError(f"{last[0].capture} and {first[0].capture} are not from one job: their captures do not "
                           f"overlap in time ({gap:.1f} s apart); give the *_ascend_pt folders of one run")


def load_rank_traces(inputs: list[str], max_mb: int = DEFAULT_MAX_MB) -> list[RankTrace]:
    """Every trace of ``inputs``, one per rank, sorted by rank; ``max_mb`` bounds them together.
    The rank of a torch_npu capture is the one it recorded, never the order of the arguments."""
    out: list[RankTrace] = []
    seen: dict[int, str] = {}
    budget = max_mb * 2**20
    files = find_trace_files(inputs)
    for i, path in enumerate(files):
        if path.suffix == ".db":  # torch_npu's export_type=db: its tables rebuilt as trace_view.json's events
            # its file size is charged to the same budget: the rebuilt events grow with it
            size = path.stat().st_size
            if size > budget:
                raise PartitaError(_too_big(path, f"holds more than {max_mb} MB of trace data" if not out else
                                            f"takes the {len(out) + 1} traces past {max_mb} MB together"))
            budget -= size
            doc = normalise_npu_trace(load_db_trace(path))
        else:
            doc = load_chrome_trace(path, budget, "" if not out else f"takes the {len(out) + 1} traces past "
                                                                     f"{max_mb} MB of JSON together")
            budget -= doc.pop("_bytes")
        capture = ascend_capture(path)
        capture_dir = msprof_dir = None
        if capture:
            capture_dir, msprof_dir = str(capture[0]), str(capture[1])
            rank = ascend_rank(capture[0])
            if rank is None:
                if len(files) > 1:
                    raise PartitaError(f"{capture[0]} has no profiler_info_<rank>.json saying which rank it is "
                                       "(copy the whole *_ascend_pt folder)")
                rank = 0
        else:
            rank = _rank_of(path, doc, i)
        out.append(RankTrace(str(path), rank, doc, capture_dir, msprof_dir))
    _check_one_job(out)   # first: captures of two runs are "not from one job", whatever their ranks
    for rt in out:
        if rt.rank in seen:
            raise PartitaError(f"{rt.path} and {seen[rt.rank]} are both rank {rt.rank}: give the traces of one run "
                               "(one file per rank)")
        seen[rt.rank] = rt.path
    return sorted(out, key=lambda r: r.rank)
