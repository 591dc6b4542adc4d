"""``partita analyze`` on real torch_npu captures exported as SQLite (``export_type=db``).

The captures are real public data (``tests/data/ascend_db_msinsight_2rank``, see its SOURCES.md:
Ascend/msinsight's test data, 2 ranks, HCCL all_reduce, profiler Level1). Oracles, all outside
the code under test:

* msprof's own per-step summary of the same capture, ``analysis.db`` ``StepTraceTime``
  (``step_trace_time.csv`` of the text export), read here with plain SQL;
* the capture's own tables read here with plain SQL (``COMMUNICATION_OP``, ``MEMORY_RECORD``);
* the text export of the same job (``../shared/data/npu_traces/msinsight_2rank_2025/level1``,
  recorded with the same profiler settings but ``export_type=text``, half an hour earlier):
  the allocator's peaks and the stream roles, which do not change between two runs of it, read
  by the text reader.
"""
import sqlite3
from pathlib import Path

import pytest

from partita.analyze.ranks import analyze_traces
from partita.cli.main import main
from partita.errors import PartitaError

DATA = Path(__file__).parent / "data" / "ascend_db_msinsight_2rank" / "level1"
TEXT = Path(__file__).parents[2] / "shared" / "data" / "npu_traces" / "msinsight_2rank_2025" / "level1"
COLUMNS = {"computing_us": "computing", "communication_not_overlapped_us": "communication_not_overlapped",
           "overlapped_us": "overlapped", "communication_us": "communication", "free_us": "free",
           "window_us": "stage"}


def _out(rank: int) -> Path:
    return DATA / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT"


def _sql(path: Path, query: str) -> list[tuple]:
    """Plain SQL on a capture, opened read-only and immutable so that no -shm / -wal file is left
    beside it (``with sqlite3.connect(..)`` commits but does not close)."""
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module")
def job():
    return analyze_traces([str(DATA)])[0]


@pytest.mark.parametrize("rank", [0, 1])
def test_step_figures_match_msprof_step_trace_time(job, rank):
    """Per step: computing, communication (not) overlapped, free and the step equal msprof's
    StepTraceTime within 0.01 % of the step (measured: 0.002 %; a kernel task without a
    COMPUTE_TASK_INFO row counted as computation would put computing 0.026 % over)."""
    r = next(x for x in job["ranks"] if x["rank"] == rank)
    rows = _sql(_out(rank) / "analysis.db", "SELECT step, computing, communication_not_overlapped, overlapped, "
                                              "communication, free, stage FROM StepTraceTime")
    assert len(rows) == 1 and r["ascend"]["step_window"] == "device tasks launched in each ProfilerStep"
    theirs = dict(zip(("step", *COLUMNS.values()), rows[0]))
    mine = {p["step"]: p for p in r["ascend"]["per_step"]}[int(theirs["step"])]
    for ours, msprof in COLUMNS.items():
        assert abs(mine[ours] - theirs[msprof]) <= 1e-4 * theirs["stage"], (ours, mine[ours], theirs[msprof])
    # msprof's summary is also shown beside, as the text export's step_trace_time.csv is
    assert r["msprof"]["step_trace_time"][0]["computing_us"] == pytest.approx(theirs["computing"])
    assert r["window_us"] == mine["window_us"]
    assert r["exposed_communication_us"] == mine["communication_not_overlapped_us"]


@pytest.mark.parametrize("rank", [0, 1])
def test_communication_is_the_hccl_operations(job, rank):
    """All of it is all_reduce (hcom_allReduce_*), as long as COMMUNICATION_OP's operations
    (they do not overlap one another) and as msprof's CommAnalyzerTime elapse times (ms)."""
    r = next(x for x in job["ranks"] if x["rank"] == rank)
    db = _out(rank) / f"ascend_pytorch_profiler_{rank}.db"
    ops = _sql(db, "SELECT s.value, o.startNs, o.endNs FROM COMMUNICATION_OP o JOIN STRING_IDS s ON o.opName = s.id")
    assert len(ops) == 4 and all(name.startswith("hcom_allReduce_") for name, _, _ in ops)
    total_us = sum(b - a for _, a, b in ops) / 1e3
    assert list(r["by_collective_us"]) == ["all_reduce"]
    assert r["by_collective_us"]["all_reduce"] == pytest.approx(total_us, rel=1e-5)
    elapse_ms = sum(x for (x,) in _sql(_out(rank) / "analysis.db", "SELECT elapse_time FROM CommAnalyzerTime"))
    assert r["communication_us"] == pytest.approx(elapse_ms * 1e3, rel=1e-4)
    assert r["msprof"]["communication"]["operations"] == 4
    assert r["ascend"]["hccl_operations"] == 4


def test_same_job_as_the_text_export(job):
    """Against the text export of the same job read by the text reader: the same PyTorch
    allocator peaks (PTA rows; deterministic between two runs of one job), the same rows, the
    same communication stream and operations, and one step, 50."""
    text = analyze_traces([str(TEXT)])[0]
    for rank in (0, 1):
        r = next(x for x in job["ranks"] if x["rank"] == rank)
        t = next(x for x in text["ranks"] if x["rank"] == rank)
        mine, theirs = r["memory"][f"npu:{rank}"], t["memory"][f"npu:{rank}"]
        assert mine["source"] == f"ascend_pytorch_profiler_{rank}.db MEMORY_RECORD (PTA)"
        for key in ("events", "peak_allocated_bytes", "peak_reserved_bytes", "unallocated_at_peak_reserved_bytes"):
            assert mine[key] == theirs[key], key
        assert r["ascend"]["communication_streams"] == t["ascend"]["communication_streams"] == [4]
        assert r["ascend"]["hccl_operations"] == t["ascend"]["hccl_operations"]
        assert [p["step"] for p in r["ascend"]["per_step"]] == [p["step"] for p in t["ascend"]["per_step"]] == [50]
        # the app (whole process) peak is NPU_MEM's 'app' rows, above the allocator's
        ((app,),) = _sql(_out(rank) / f"ascend_pytorch_profiler_{rank}.db",
                         "SELECT max(hbm) FROM NPU_MEM m JOIN STRING_IDS s ON m.type = s.id WHERE s.value = 'app'")
        assert mine["app_peak_reserved_bytes"] == app > mine["peak_reserved_bytes"]


def test_every_way_of_naming_the_capture(job):
    """The cluster folder, one *_ascend_pt folder, its ASCEND_PROFILER_OUTPUT and the .db file
    itself give the same rank (from profiler_info_<rank>.json) and figures."""
    r1 = next(x for x in job["ranks"] if x["rank"] == 1)
    for path in (DATA / "rank1_ascend_pt", _out(1), _out(1) / "ascend_pytorch_profiler_1.db"):
        (r,) = analyze_traces([str(path)])[0]["ranks"]
        assert r["rank"] == 1 and r["window_us"] == r1["window_us"] and r["compute_us"] == r1["compute_us"]


def test_text_and_db_captures_of_different_runs_are_refused():
    with pytest.raises(PartitaError, match="not from one job"):
        analyze_traces([str(TEXT / "rank0_ascend_pt"), str(DATA / "rank1_ascend_pt")])


def _cli_error(capsys, path: Path) -> str:
    rc = main(["analyze", str(path)])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    return err


def test_bad_databases_are_one_line_errors(tmp_path, capsys):
    out = tmp_path / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    assert "nor ascend_pytorch_profiler_<rank>.db" in _cli_error(capsys, out)
    db = out / "ascend_pytorch_profiler_0.db"
    db.write_text("not a database")
    assert "is not an SQLite database" in _cli_error(capsys, out)
    db.unlink()
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE STRING_IDS (id INTEGER PRIMARY KEY, value TEXT)")
    con.close()
    assert "has no TASK table" in _cli_error(capsys, tmp_path)
    with sqlite3.connect(db) as con:   # the tables, without a device task (a CPU-only profile)
        con.execute("CREATE TABLE TASK (startNs INTEGER, endNs INTEGER, deviceId INTEGER, connectionId INTEGER, "
                    "globalTaskId INTEGER, streamId INTEGER, taskType INTEGER)")
    con.close()
    assert "holds no device tasks" in _cli_error(capsys, db)
    # msprof's summary database alone is not a capture
    assert "has no TASK or STRING_IDS table" in _cli_error(capsys, _out(0) / "analysis.db")


def test_a_database_of_several_devices_is_refused(tmp_path, capsys):
    """msprof's own msprof_*.db may hold every device of a node; merging them would add one
    device's tasks to another's, so it is one line (torch_npu exports one database per rank)."""
    out = tmp_path / "PROF_1" / "mindstudio_profiler_output"
    out.mkdir(parents=True)
    with sqlite3.connect(out / "msprof_20250101.db") as con:
        con.execute("CREATE TABLE STRING_IDS (id INTEGER PRIMARY KEY, value TEXT)")
        con.execute("CREATE TABLE TASK (startNs INTEGER, endNs INTEGER, deviceId INTEGER, connectionId INTEGER, "
                    "globalTaskId INTEGER, streamId INTEGER, taskType INTEGER)")
        con.executemany("INSERT INTO TASK VALUES (?, ?, ?, 0, ?, 2, 0)", [(0, 10, 0, 1), (5, 20, 3, 2)])
    con.close()
    assert "holds the tasks of 2 devices (0, 3)" in _cli_error(capsys, tmp_path)


def test_reading_a_capture_leaves_no_files_beside_it(tmp_path):
    """torch_npu's databases are in WAL mode (header bytes 18-19, the read/write format versions,
    are 2 = WAL: https://www.sqlite.org/fileformat2.html#database_header); a plain SQLite open of
    one creates ``-shm`` / ``-wal`` files beside it. Reading a copy must leave the directory
    listing exactly as it was."""
    import shutil
    copy = tmp_path / "capture"
    shutil.copytree(DATA, copy)
    db = next(copy.rglob("ascend_pytorch_profiler_0.db"))
    assert db.read_bytes()[18:20] == b"\x02\x02"
    before = sorted(p.relative_to(copy) for p in copy.rglob("*"))
    assert len(analyze_traces([str(copy)])[0]["ranks"]) == 2
    assert sorted(p.relative_to(copy) for p in copy.rglob("*")) == before


def test_the_databases_count_against_max_mb(capsys):
    """--max-mb bounds the captures together, a database by its file size as a JSON trace by its
    text: the two ranks' databases are 0.82 + 0.73 MiB on disk (``ls -l``), so 1 MB takes one
    rank and refuses both, in one line."""
    sizes = [p.stat().st_size for p in sorted(DATA.rglob("ascend_pytorch_profiler_*.db"))]
    assert max(sizes) < 2**20 < sum(sizes)
    assert main(["analyze", "--max-mb", "1", str(DATA / "rank0_ascend_pt")]) == 0
    capsys.readouterr()
    assert main(["analyze", "--max-mb", "1", str(DATA)]) == 2
    err = capsys.readouterr().err.strip()
    assert "takes the 2 traces past 1 MB together" in err and "--max-mb" in err and "\n" not in err
