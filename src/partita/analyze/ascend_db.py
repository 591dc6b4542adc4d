"""torch_npu / msprof captures exported as SQLite (``ExportType.Db``), read like the text export.

With ``experimental_config=_ExperimentalConfig(export_type=ExportType.Db)`` torch_npu's profiler
writes, per rank, ``ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_{rank}.db`` (and an
``analysis.db`` with msprof's own summaries) instead of ``trace_view.json`` and the CSV files;
``msprof`` alone writes ``mindstudio_profiler_output/msprof_*.db`` with the same device tables.
MindStudio recommends the DB export for large runs (one file, no multi-GB JSON).

How it is read: the tables are turned into the events ``trace_view.json`` would hold for the
same capture, and that document goes through :func:`partita.analyze.ascend.analyze_ascend`
unchanged - one reading of a torch_npu capture, whichever export it came from. The tables and
columns used, as the real captures in Ascend/msinsight @ 4e16fca1f118458ce8820e9fe9c3cd323db35707
``test/data/pytorch/db/level{0,1,2}/rank{0,1}_ascend_pt/ASCEND_PROFILER_OUTPUT/`` hold them
(schema version 1.0.0 in ``META_DATA``), and as msinsight's own DB reader joins them
(``server/src/modules/defs/DbSqlDefs.h``, ``GetConnectionCatSql``, same commit):

* ``STRING_IDS(id, value)``: every name column of the other tables is an id into it;
* ``TASK(startNs, endNs, globalTaskId, streamId, taskType, connectionId)``: every device task
  (ns); ``taskType`` is the runtime's (``KERNEL_AIVEC``, ``EVENT_WAIT``, ``MEMCPY_ASYNC``,
  ``Notify Wait``, ``SDMA``, ...) -> an ``Ascend Hardware`` event on thread ``Stream N``;
* ``COMPUTE_TASK_INFO(globalTaskId, name, taskType)``: the kernel's op name and the task type
  ``trace_view.json`` shows (``AI_CORE``, ``AI_VECTOR_CORE``, ``MIX_AIV``, ``DSA_SQE``);
* ``COMMUNICATION_TASK_INFO(globalTaskId, name, taskType, planeId)``: HCCL's own tasks
  (``Notify_Wait``, ``Notify_Record``, ``Memcpy``, ``Reduce_Inline``) named by their
  collective (``hcom_allReduce__210_0_1``);
* ``COMMUNICATION_OP(opName, startNs, endNs, groupName, connectionId, algType, count,
  dataType)``: the collective operations -> the ``HCCL`` process, ``Group <g> Communication``;
* ``PYTORCH_API(startNs, endNs, name, connectionId)`` (``ProfilerStep#N`` among the names) and
  ``CONNECTION_IDS(id, connectionId)``: a host op's ``connectionId`` is an ``id`` there, whose
  ``connectionId`` values are those of the tasks / operations it launched - the
  ``torch_to_npu`` flows of ``trace_view.json`` (msinsight's ``async_npu`` connections);
* ``OVERLAP_ANALYSIS(startNs, endNs, type)``: msprof's own lanes, ``type`` 0..3 = Computing,
  Communication, Communication(Not Overlapped), Free (msinsight
  ``server/src/modules/defs/CommonDefs.h`` ``OVERLAP_TYPES``, same commit);
* ``MEMORY_RECORD(component, timestamp, totalAllocated, totalReserved, deviceId)`` (bytes, ns;
  components ``PTA``, ``GE``, ``PTA+GE``) and ``NPU_MEM(type, hbm, timestampNs)`` (``app``: the
  whole process) - ``memory_record.csv``'s rows;
* ``analysis.db``: ``StepTraceTime(step, computing, communication_not_overlapped, overlapped,
  communication, free, stage, bubble, preparing)`` (us) is ``step_trace_time.csv``;
  ``CommAnalyzerTime(hccl_op_name, elapse_time, ...)`` (ms) and ``CommAnalyzerBandwidth``
  are ``communication.json``.

Known gaps: the ``Plane N`` threads of the HCCL process are not rebuilt (the analysis uses the
operations); ``op_statistic`` / ``kernel_details`` have no DB counterpart read here.
"""
from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from ..errors import PartitaError
from .events import collective_kind, with_bandwidth

#: the database torch_npu writes per rank, and the one ``msprof`` writes
TORCH_NPU_DB = "ascend_pytorch_profiler*.db"
MSPROF_DB = "msprof_*.db"
#: msprof's summaries beside torch_npu's database
ANALYSIS_DB = "analysis.db"
#: without these tables there is nothing to measure
REQUIRED = ("TASK", "STRING_IDS")
#: OVERLAP_ANALYSIS.type -> the lane's name (msinsight CommonDefs.h OVERLAP_TYPES)
OVERLAP_TYPES = ("Computing", "Communication", "Communication(Not Overlapped)", "Free")
#: runtime task types of kernels (TASK.taskType); one without a COMPUTE_TASK_INFO row is not drawn
KERNEL_TASK = re.compile(r"^(KERNEL_|AI_CORE|AI_VECTOR|AI_CPU|MIX_)", re.I)
#: made-up process ids of the rebuilt trace (only their names matter to the reader)
PID_HARDWARE, PID_HCCL, PID_OVERLAP, PID_HOST = 1, 2, 3, 4


def is_db(path: Path) -> bool:
    """A torch_npu / msprof profiler database by its name (``analysis.db`` is a summary only)."""
    return path.suffix == ".db" and (path.match(TORCH_NPU_DB) or path.match(MSPROF_DB))


def _connect(path: Path) -> sqlite3.Connection:
    """Open the capture read-only and ``immutable``: torch_npu writes its databases in WAL mode,
    and a plain (even ``mode=ro``) open of a WAL database creates ``-shm`` / ``-wal`` files beside
    the user's file (SQLite's URI docs, https://www.sqlite.org/uri.html#uriimmutable: immutable
    means no locking and no change detection, so no side files; a finished capture does not change).
    ``as_uri`` percent-encodes a path holding ``?`` or ``#``."""
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error:
        raise PartitaError(f"{path} is not an SQLite database (a torch_npu profiler export with "
                           "export_type=db is expected)") from None
    return con


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _column(con: sqlite3.Connection, table: str, column: str) -> str:
    """``column`` where the table has it, else NULL (schema versions differ: msprof-only
    databases lack COMMUNICATION_OP's algType / count / dataType)."""
    have = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
    return column if column in have else "NULL"


def _rows(con: sqlite3.Connection, sql: str, path: Path) -> list[tuple]:
    try:
        return con.execute(sql).fetchall()
    except sqlite3.Error as e:
        raise PartitaError(f"{path}: cannot read its profiler tables ({e}); was it written by a torch_npu "
                           "profiler with export_type=db?") from None


def _us(ns) -> float:
    """ns (an integer, or text as PYTORCH_API stores it) -> us, as trace_view.json writes them."""
    return int(ns) / 1000.0


def _event(pid: int, tid: int, name: str, start_ns, end_ns, args: dict | None = None) -> dict:
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": _us(start_ns),
            "dur": (int(end_ns) - int(start_ns)) / 1000.0, "args": args or {}}


def _meta(pid: int, tid: int | None, kind: str, name: str) -> dict:
    e = {"ph": "M", "pid": pid, "name": kind, "args": {"name": name}}
    if tid is not None:
        e["tid"] = tid
    return e


def load_db_trace(path: str | Path) -> dict:
    """The events ``trace_view.json`` would hold for this database (see the module docstring),
    as a Chrome trace dict for :func:`partita.analyze.ascend.analyze_ascend`."""
    path = Path(path)
    con = _connect(path)
    try:
        tables = _tables(con)
        missing = [t for t in REQUIRED if t not in tables]
        if missing:
            raise PartitaError(f"{path} has no {' or '.join(missing)} table: not a torch_npu/msprof profiler "
                               "database with device tasks (profile with ProfilerActivity.NPU)")
        devices = [d for (d,) in _rows(con, "SELECT DISTINCT deviceId FROM TASK", path)]
        if len(devices) > 1:
            listed = ", ".join(map(str, sorted(devices)))
            raise PartitaError(f"{path} holds the tasks of {len(devices)} devices ({listed}); "
                               "Partita reads one device per database, as torch_npu exports one per rank")
        names = dict(_rows(con, "SELECT id, value FROM STRING_IDS", path))
        s = lambda i: names.get(i, "" if i is None else str(i))  # noqa: E731
        compute = {}
        if "COMPUTE_TASK_INFO" in tables:
            compute = {g: (s(n), s(t)) for g, n, t in
                       _rows(con, "SELECT globalTaskId, name, taskType FROM COMPUTE_TASK_INFO", path)}
        comm_tasks = {}
        if "COMMUNICATION_TASK_INFO" in tables:
            comm_tasks = {g: (s(n), s(t)) for g, n, t in
                          _rows(con, "SELECT globalTaskId, name, taskType FROM COMMUNICATION_TASK_INFO", path)}
        events: list[dict] = [_meta(PID_HARDWARE, None, "process_name", "Ascend Hardware")]
        streams: set[int] = set()
        connected: dict[int, tuple[int, int, float]] = {}
        for start, end, gid, stream, ttype, conn in _rows(
                con, "SELECT startNs, endNs, globalTaskId, streamId, taskType, connectionId FROM TASK", path):
            runtime_type = s(ttype)
            if gid not in compute and gid not in comm_tasks and KERNEL_TASK.match(runtime_type):
                continue  # a kernel msprof has no op for: not in trace_view.json, not in its Computing
            name, task_type = compute.get(gid) or comm_tasks.get(gid) or (runtime_type, runtime_type)
            if gid in comm_tasks:  # trace_view.json shows HCCL tasks by the runtime's type (Notify Wait, SDMA)
                task_type = runtime_type
            streams.add(stream)
            events.append(_event(PID_HARDWARE, stream, name, start, end, {"Task Type": task_type}))
            if gid in compute:
                connected[conn] = (PID_HARDWARE, stream, events[-1]["ts"])
        if not streams:
            raise PartitaError(f"{path} holds no device tasks (TASK is empty): nothing to analyse (profile with "
                               "ProfilerActivity.NPU)")
        events += [_meta(PID_HARDWARE, t, "thread_name", f"Stream {t}") for t in sorted(streams)]
        if "COMMUNICATION_OP" in tables:
            events.append(_meta(PID_HCCL, None, "process_name", "HCCL"))
            groups: dict[int, int] = {}
            extra = ", ".join(_column(con, "COMMUNICATION_OP", c) for c in ("algType", "count", "dataType"))
            query = f"SELECT opName, startNs, endNs, groupName, connectionId, {extra} FROM COMMUNICATION_OP"
            for name, start, end, group, conn, alg, count, dtype in _rows(con, query, path):
                tid = groups.setdefault(group, len(groups))
                events.append(_event(PID_HCCL, tid, s(name), start, end,
                                     {"alg_type": s(alg), "count": count, "data_type": dtype}))
                connected[conn] = (PID_HCCL, tid, events[-1]["ts"])
            events += [_meta(PID_HCCL, tid, "thread_name", f"Group {s(g)} Communication") for g, tid in groups.items()]
        if "OVERLAP_ANALYSIS" in tables:
            events.append(_meta(PID_OVERLAP, None, "process_name", "Overlap Analysis"))
            events += [_meta(PID_OVERLAP, i, "thread_name", lane) for i, lane in enumerate(OVERLAP_TYPES)]
            events += [_event(PID_OVERLAP, t, OVERLAP_TYPES[t], a, b) for a, b, t in
                       _rows(con, "SELECT startNs, endNs, type FROM OVERLAP_ANALYSIS", path) if 0 <= t < 4]
        if "PYTORCH_API" in tables:
            events += _host_events(con, path, s, tables, connected)
    finally:
        con.close()
    return {"traceEvents": events}


def _host_events(con: sqlite3.Connection, path: Path, s, tables: set[str],
                 connected: dict[int, tuple[int, int, float]]) -> list[dict]:
    """The ``ProfilerStep#N`` spans and the ``torch_to_npu`` flows (host op start -> the device
    task or HCCL operation it launched), as trace_view.json draws them."""
    events = [_meta(PID_HOST, None, "process_name", "Python")]
    steps = _rows(con, "SELECT p.startNs, p.endNs, s.value FROM PYTORCH_API p JOIN STRING_IDS s ON p.name = s.id "
                       "WHERE s.value LIKE 'ProfilerStep#%'", path)
    events += [_event(PID_HOST, 0, name, a, b) for a, b, name in steps]
    if "CONNECTION_IDS" not in tables:
        return events
    flows = _rows(con, "SELECT p.startNs, c.connectionId FROM PYTORCH_API p JOIN CONNECTION_IDS c "
                       "ON p.connectionId = c.id", path)
    for start, conn in flows:
        target = connected.get(conn)
        if target is None:
            continue
        events.append({"ph": "s", "cat": "async_npu", "name": "torch_to_npu", "id": conn, "pid": PID_HOST,
                       "tid": 0, "ts": _us(start)})
        events.append({"ph": "f", "cat": "async_npu", "name": "torch_to_npu", "id": conn, "pid": target[0],
                       "tid": target[1], "ts": target[2], "bp": "e"})
    return events


# --- msprof's summaries ------------------------------------------------------------------------

def find_db(output_dir: Path) -> Path | None:
    """The profiler database in an ``ASCEND_PROFILER_OUTPUT`` (or ``mindstudio_profiler_output``)."""
    found = sorted(p for p in Path(output_dir).glob("*.db") if is_db(p))
    return found[0] if found else None


def read_db_outputs(output_dir: str | Path) -> dict:
    """msprof's summaries from the DB export, in the shapes of
    :func:`partita.analyze.ascend.read_msprof_outputs`: ``step_trace_time`` and
    ``communication`` from ``analysis.db``; ``memory_record`` from the profiler database."""
    d = Path(output_dir)
    out: dict = {}
    if (d / ANALYSIS_DB).is_file():
        con = _connect(d / ANALYSIS_DB)
        try:
            tables = _tables(con)
            if "StepTraceTime" in tables:
                out["step_trace_time"] = _step_trace_time(con, d / ANALYSIS_DB)
            if "CommAnalyzerTime" in tables:
                out["communication"] = _communication(con, d / ANALYSIS_DB, tables)
        finally:
            con.close()
    db = find_db(d)
    if db is not None:
        memory = read_db_memory(db)
        if memory:
            out["memory_record"] = memory
    return {k: v for k, v in out.items() if v}


def _step_trace_time(con: sqlite3.Connection, path: Path) -> list[dict]:
    fields = ("computing_us", "communication_not_overlapped_us", "overlapped_us", "communication_us", "free_us",
              "window_us", "bubble_us", "preparing_us")
    rows = _rows(con, "SELECT step, computing, communication_not_overlapped, overlapped, communication, free, "
                      "stage, bubble, preparing FROM StepTraceTime", path)
    out = []
    for step, *values in rows:
        step = str(step or "")
        out.append({"step": int(step) if step.isdigit() else step or None,
                    **{k: (float(v) if v is not None else None) for k, v in zip(fields, values)}})
    return out


def _communication(con: sqlite3.Connection, path: Path, tables: set[str]) -> dict:
    """``CommAnalyzerTime``: elapsed time per collective kind (ms -> us), as communication.json."""
    by_kind: dict[str, float] = {}
    rows = _rows(con, "SELECT hccl_op_name, elapse_time FROM CommAnalyzerTime", path)
    for name, elapse in rows:
        if str(name).startswith("Total") or elapse is None:
            continue
        kind = collective_kind(str(name).split("@")[0])
        by_kind[kind] = by_kind.get(kind, 0.0) + float(elapse) * 1e3
    transport: dict[str, dict] = {}
    if "CommAnalyzerBandwidth" in tables:
        for name, link, size, time in _rows(con, "SELECT hccl_op_name, transport_type, transit_size, transit_time "
                                                 "FROM CommAnalyzerBandwidth", path):
            if str(name).startswith("Total"):
                continue
            t = transport.setdefault(str(link), {"size_mb": 0.0, "time_ms": 0.0})
            t["size_mb"] += float(size or 0.0)
            t["time_ms"] += float(time or 0.0)
    transport = with_bandwidth(transport)
    operations = sum(1 for name, _ in rows if not str(name).startswith("Total"))
    return {"operations": operations, "by_collective_us": dict(sorted(by_kind.items())), "transport": transport}


def read_db_memory(path: str | Path) -> dict[str, dict]:
    """``MEMORY_RECORD`` (and ``NPU_MEM``'s ``app`` rows) in the shape of
    :func:`partita.analyze.ascend.read_memory_record`; bytes and ns in the database."""
    from .memory import component_peaks
    path = Path(path)
    con = _connect(path)
    try:
        tables = _tables(con)
        if "MEMORY_RECORD" not in tables:
            return {}
        names = dict(_rows(con, "SELECT id, value FROM STRING_IDS", path)) if "STRING_IDS" in tables else {}
        series: dict[str, dict[str, list]] = {}
        for comp, ts, alloc, reserved, device in _rows(
                con, "SELECT component, timestamp, totalAllocated, totalReserved, deviceId FROM MEMORY_RECORD", path):
            series.setdefault(f"npu:{device}", {}).setdefault(names.get(comp, str(comp)), []).append(
                (_us(ts), float(alloc or 0), float(reserved or 0)))
        app: dict[str, list[float]] = {}
        if "NPU_MEM" in tables:
            for kind, hbm, device in _rows(con, "SELECT type, hbm, deviceId FROM NPU_MEM", path):
                if str(names.get(kind, kind)).lower() == "app":
                    app.setdefault(f"npu:{device}", []).append(float(hbm or 0))
    finally:
        con.close()
    return component_peaks(series, path.name + " MEMORY_RECORD ({})", {d: max(v) for d, v in app.items()})
