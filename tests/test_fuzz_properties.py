"""Property-based bad input (issue 16): whatever a user types or writes into a plan, model or
device file, ``partita`` either answers (exit 0, only finite numbers in the output) or refuses
(exit 2, exactly one ``partita: error:`` line) - never a traceback, never a hang, and an input
that breaks a rule written in the docs (a degree below 1, a non-integer size) is never answered.

Every CLI example runs :func:`partita.cli.main` in a forked child of this process (the imports
are shared, so one costs milliseconds; a child still running after :data:`HANG_S` is killed and
the example fails as a hang). Hypothesis runs derandomized (the same examples on every run, so
CI is reproducible) and without its example database (it would write ``.hypothesis/`` into the
working directory). ``bench/fuzz_cli.py`` is the wider, hand-written companion.
"""
from __future__ import annotations

import inspect
import io
import json
import math
import os
import pickle
import re
import select
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import partita.estimate  # noqa: F401  (loaded before forking)
import partita.export  # noqa: F401
from child_io import read_child
from partita.cli import main as partita_main
from partita.errors import PartitaError
from partita.plan import Plan, check

HANG_S = 20.0
ROOT = Path(__file__).resolve().parents[1]
DEVICE = json.loads((ROOT / "src/partita/catalog/devices/h100-sxm.json").read_text())
DEVICE.pop("aliases", None)
MODEL = {"hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 8, "ffn_hidden": 11008, "vocab": 32000}
E = ["estimate", "--model", "llama-7b", "--hardware", "h100-sxm", "--devices", "8"]
SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))

# ------------------------------------------------------------------ running one CLI example


class _Launched(BaseException):
    """Raised in a ``partita train`` child instead of starting torchrun: the input was accepted."""


def _refuse_launch(*args, **kwargs):
    raise _Launched()


def _hang_s(argv: list[str]) -> float:
    """A ``train`` child runs the launcher's checks (0.2 s each measured, torch preloaded); CI
    once saw one take over 20 s with four other gloo processes on the 2 cores: 3x the margin."""
    return HANG_S * (3 if argv[:1] == ["train"] else 1)


_TRAIN_SERVER = """
from __future__ import annotations
import io, json, os, select, signal, sys, time, traceback
""" + inspect.getsource(read_child) + """
import partita.train.supervise as launch
import partita.train.resolve, partita.runtime.parallelize  # what the launcher's checks import: loaded once
from partita.cli import main
class Launched(BaseException): pass
def refuse(*a, **k): raise Launched()
launch.run_watched = refuse
def one(argv):
    out, err = io.StringIO(), io.StringIO()
    sys.stdout, sys.stderr = out, err
    result = {"raised": None}
    try:
        result["rc"] = main(argv)
    except Launched:
        result["rc"] = 0
    except BaseException:
        result["rc"], result["raised"] = 1, traceback.format_exc()
    result["stdout"], result["stderr"] = out.getvalue()[-100000:], err.getvalue()[-10000:]
    return result
def served(argv, hang_s):
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        with os.fdopen(write_fd, "wb") as w:
            w.write(json.dumps(one(argv)).encode())
        os._exit(0)
    os.close(write_fd)
    data = read_child(pid, read_fd, hang_s)
    if data is None:
        return {"rc": None, "hung": True, "raised": None, "stdout": "", "stderr": ""}
    return dict(json.loads(data), hung=False)
real = sys.stdout
real.write("ready\\n")
real.flush()
for line in sys.stdin:
    real.write(json.dumps(served(*json.loads(line))) + "\\n")
    real.flush()
"""
#: The running ``train`` server (:func:`_run_train_fresh`), started on first use.
_SERVER: dict = {}


def _stop_train_server() -> None:
    proc = _SERVER.pop("proc", None)
    if proc is not None:
        proc.kill()
        proc.wait(timeout=30)


def _server_line(proc: subprocess.Popen, timeout_s: float) -> str | None:
    """The server's next output line, or None when none came within ``timeout_s``."""
    if not select.select([proc.stdout], [], [], timeout_s)[0]:
        return None
    return proc.stdout.readline() or None


def _run_train_fresh(argv: list[str]) -> dict:
    """A ``train`` case in a fresh fork of a fresh interpreter, not a fork of pytest: the
    launcher imports torch, and a fork of a pytest process whose earlier tests started
    torch's thread pools can hang in the child (it did in CI, twice, only in full-suite
    runs). The interpreter (a server started on first use, OMP_NUM_THREADS=1, that only
    imports) loads torch and the launcher once and forks one child per case, so each case
    still starts from the same clean state without paying torch's import again; the
    server kills a child still running after :func:`_hang_s` and reports it as a hang."""
    hung = {"rc": None, "hung": True, "raised": None, "stdout": "", "stderr": ""}
    if "proc" not in _SERVER:
        proc = subprocess.Popen([sys.executable, "-c", _TRAIN_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        _SERVER["proc"] = proc
        if _server_line(proc, 300) != "ready\n":
            _stop_train_server()
            return dict(hung, raised="the train server did not start")
    proc = _SERVER["proc"]
    proc.stdin.write(json.dumps([argv, _hang_s(argv)]) + "\n")
    proc.stdin.flush()
    line = _server_line(proc, _hang_s(argv) + 60)
    if line is None or not line.startswith("{"):
        _stop_train_server()
        return hung
    return json.loads(line)


@pytest.fixture(scope="module", autouse=True)
def _train_server():
    """The ``train`` server ends with the module."""
    yield
    _stop_train_server()


def run_cli(argv: list[str], no_launch: bool = False) -> dict:
    """``partita_main(argv)`` in a forked child: rc, stdout, stderr, raised, hung. With
    ``no_launch`` a ``train`` that passes validation stops where torchrun would start (rc 0)."""
    if no_launch and argv[:1] == ["train"]:
        return _run_train_fresh(argv)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read_fd)
        out, err = io.StringIO(), io.StringIO()
        sys.stdout, sys.stderr = out, err
        result: dict = {"raised": None}
        try:
            if no_launch:
                import partita.train.supervise as launch
                launch.run_watched = _refuse_launch
            result["rc"] = partita_main(argv)
        except _Launched:
            result["rc"] = 0
        except BaseException:  # noqa: BLE001 - what escaped main is the finding
            result["rc"], result["raised"] = 1, traceback.format_exc()
        result["stdout"], result["stderr"] = out.getvalue()[-100000:], err.getvalue()[-10000:]
        with os.fdopen(write_fd, "wb") as w:
            w.write(pickle.dumps(result))
        os._exit(0)
    os.close(write_fd)
    data = read_child(pid, read_fd, _hang_s(argv))
    if data is None:
        return {"rc": None, "hung": True, "raised": None, "stdout": "", "stderr": ""}
    result = pickle.loads(data)
    result["hung"] = False
    return result


_NONFINITE = re.compile(r"(?<![A-Za-z])(nan|-?inf|-?infinity)(?![A-Za-z])", re.IGNORECASE)


def _finite_output(text: str) -> bool:
    """No NaN/inf in ``text``: every float of a JSON document, or no nan/inf word in a table."""
    try:
        data = json.loads(text, parse_constant=lambda name: math.nan)
    except ValueError:
        return not _NONFINITE.search(text)
    stack = [data]
    while stack:
        x = stack.pop()
        if isinstance(x, float) and not math.isfinite(x):
            return False
        stack.extend(x.values() if isinstance(x, dict) else x if isinstance(x, list) else ())
    return True


def assert_clean(argv: list[str], must_refuse: bool = False, no_launch: bool = False) -> dict:
    """The property: an answer with finite numbers, or one ``partita: error:`` line and exit 2."""
    r = run_cli(argv, no_launch)
    assert not r["hung"], f"hung for {_hang_s(argv)} s: {argv}"
    assert not r["raised"], f"exception escaped main for {argv}:\n{r['raised']}"
    assert "Traceback" not in r["stderr"] and "internal error" not in r["stderr"], (argv, r["stderr"])
    if r["rc"] == 0:
        assert not must_refuse, f"invalid input accepted: {argv}\n{r['stdout'][:500]}"
        assert _finite_output(r["stdout"]), f"NaN/inf in the output of {argv}:\n{r['stdout'][:2000]}"
        return r
    lines = [ln for ln in r["stderr"].splitlines() if ln.strip()]
    assert r["rc"] == 2 and len(lines) == 1 and lines[0].startswith("partita: error: "), (argv, r["rc"], r["stderr"])
    return r


@pytest.fixture(scope="module")
def folder():
    """One temp folder for the module's files, removed afterwards (no litter in the temp dir)."""
    path = Path(tempfile.mkdtemp(prefix="partita-fuzz-props-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write(folder: Path, name: str, data) -> str:
    path = folder / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


# ------------------------------------------------------------------ strategies
#: Values a careless user puts where a number belongs.
WILD = st.one_of(st.integers(-10 ** 25, 10 ** 25), st.integers(-3, 70), st.floats(allow_nan=False, allow_infinity=False),
                 st.sampled_from([0, -1, 1, 2, 8, 10 ** 30, 2 ** 63, 0.5, 1e308, True, False, None, "", "x", "2",
                                  [], [1], {}, {"a": 1}]))
#: The same as command-line text.
WILD_TEXT = st.one_of(st.integers(-10 ** 25, 10 ** 25).map(str), st.integers(-3, 70).map(str),
                      st.floats().map(repr), st.sampled_from(["nan", "inf", "-inf", "1e400", "", " ", "0x10", "1_0",
                                                              "2.0", "1e3", HUGE := "99999999999999999999"]),
                      st.text(max_size=6))
PLAN_INTS = ("dp", "tp", "pp", "vpp", "cp", "ep", "mbs", "gbs", "seq_len")


def _violates_docs(key: str, value) -> bool:
    """A plan field that breaks a rule of the plan's glossary (a degree or size below 1 or not a
    whole number): whatever the other fields, the plan must be refused."""
    if key in PLAN_INTS:
        return isinstance(value, bool) or not isinstance(value, int) or value < 1
    if key == "zero":
        return isinstance(value, int) and not isinstance(value, bool) and value not in (0, 1, 2, 3)
    return False


# ------------------------------------------------------------------ properties
@pytest.mark.timeout(60)
@settings(max_examples=200, **SETTINGS)
@given(st.lists(st.tuples(st.sampled_from(list(PLAN_INTS) + ["zero", "sp", "recompute", "dtype", "schedule",
                                                             "layer_split", "dp_shard", "tpp", ""]),
                          WILD_TEXT), max_size=6),
       st.sampled_from([None, 1, 8, 12]))
def test_plan_strings_parse_or_refuse(items, world):
    """``Plan.parse`` (train/profile --plan): a valid plan or one PartitaError line, nothing else."""
    text = ",".join(f"{k}={v}" for k, v in items)
    if "," in "".join(v for _, v in items) or "=" in "".join(v for _, v in items):
        return  # the separators themselves: another item, covered by the keys above
    try:
        plan = check(Plan.parse(text, world_size=world))
    except PartitaError as e:
        assert str(e) and "\n" not in str(e), text
        return
    assert plan.world_size >= 1 and plan.gbs % (plan.dp * plan.mbs) == 0, text
    assert all(1 <= getattr(plan, k) for k in PLAN_INTS), text


@pytest.mark.timeout(60)
@settings(max_examples=25, **SETTINGS)
@given(st.dictionaries(st.sampled_from(list(PLAN_INTS) + ["zero", "sp", "recompute", "dtype", "schedule",
                                                          "layer_split", "dp_shard", "grad_dtype"]), WILD, max_size=4))
def test_plan_json_estimate_and_export(folder, patch):
    """A plan file with wild fields: estimate --plan and export answer with finite numbers or refuse
    in one line; a field that breaks the glossary's rules is always refused."""
    plan = {"dp": 8, "tp": 1, "pp": 1, "mbs": 1, "gbs": 64, **patch}
    path = write(folder, "plan.json", plan)
    bad = any(_violates_docs(k, v) for k, v in patch.items())
    assert_clean(E + ["--plan", path, "--json"], must_refuse=bad)
    assert_clean(["export", "--to", "megatron", path], must_refuse=bad)


@pytest.mark.timeout(60)
@settings(max_examples=30, **SETTINGS)
@given(st.sampled_from(sorted(MODEL) + ["head_dim", "activation", "norm", "moe", "position", "tied_embeddings"]),
       WILD)
def test_model_json(folder, key, value):
    """A model file with one wild field: an estimate with finite numbers or one line; a size that
    is not a whole number, or below 1 (below 0 for ffn_hidden, which a MoE-only model leaves 0), is refused."""
    path = write(folder, "model.json", {**MODEL, key: value})
    bad = key in MODEL and (isinstance(value, bool) or not isinstance(value, int) or value < (key != "ffn_hidden"))
    assert_clean(["estimate", "--model", path, "--hardware", "h100-sxm", "--devices", "8", "--global-batch", "64",
                  "--json"], must_refuse=bad)


_FIELDS = [(s, k) for s in ("memory", "intra_node", "inter_node", "peak_tflops") for k in DEVICE[s]] + [
    ("efficiency", k) for k in ("gemm", "gemm_fp8", "attention", "memory_bandwidth", "intra_node_comm", "inter_node_comm",
                                "gemm_half_gflop", "kernel_overhead_us_per_layer", "tp_overlap")]


@pytest.mark.timeout(60)
@settings(max_examples=25, **SETTINGS)
@given(st.sampled_from(_FIELDS + [(None, "cluster"), (None, "extends"), (None, "name"), ("cluster", "nodes")]), WILD)
def test_hardware_json(folder, where, value):
    """A device file with one wild field: finite numbers or one line; a bandwidth or an
    efficiency of 0 or below is refused (it divides a time)."""
    section, key = where
    data = json.loads(json.dumps(DEVICE))
    if section is None:
        data[key] = value
    else:
        data.setdefault(section, {})[key] = value
    path = write(folder, "device.json", data)
    divides = key in ("gbps_per_direction", "hbm_tbps", "gemm", "attention", "memory_bandwidth")
    bad = divides and not isinstance(value, bool) and isinstance(value, (int, float)) and value <= 0
    assert_clean(["estimate", "--model", "llama-7b", "--hardware", path, "--devices", "8", "--global-batch", "64",
                  "--json"], must_refuse=bad)


_INT_FLAGS = ["--tp", "--pp", "--vpp", "--cp", "--ep", "--dp", "--mbs", "--devices", "--devices-per-node",
              "--seq-len", "--global-batch"]


@pytest.mark.timeout(60)
@settings(max_examples=40, **SETTINGS)
@given(st.sampled_from(_INT_FLAGS + ["--tokens", "--layer-split", "--zero", "--set"]), WILD_TEXT)
def test_estimate_flag_values(flag, value):
    """Any text for an estimate flag: finite numbers or one line; a degree or size that is not a
    whole number of at least 1 is refused."""
    argv = E + ["--global-batch", "64", "--json"]
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [f"{flag}={value}"] if flag != "--set" else ["--set", f"efficiency.gemm={value}"]
    bad = flag in _INT_FLAGS and not re.fullmatch(r"\s*\+?\d+\s*", value) or value.strip() in ("0", "+0")
    assert_clean(argv, must_refuse=bad and flag in _INT_FLAGS)


@pytest.mark.timeout(60)
@settings(max_examples=8, **SETTINGS)
@given(st.sampled_from(["--headroom", "--max-memory-gib", "--top", "--tp", "--pp", "--vpp", "--global-batch",
                        "--tokens"]), WILD_TEXT)
def test_plan_flag_values(flag, value):
    """Any text for a plan flag (a small search: llama-7b on 8 devices): finite numbers or one line."""
    assert_clean(["plan", "--model", "llama-7b", "--hardware", "h100-sxm", "--devices", "8", "--global-batch", "64",
                  "--top", "1", "--json", f"{flag}={value}"])


@pytest.mark.timeout(60)
@settings(max_examples=25, **SETTINGS)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz_.=", max_size=24), st.sampled_from(["0.5", "x", "nan", "1", ""]))
def test_set_paths(path, value):
    """``--set`` with any path: applied, or one line naming what is wrong (an unknown field was
    silently ignored before issue 16)."""
    r = assert_clean(E + ["--global-batch", "64", "--json", "--set", f"{path}={value}"])
    if r["rc"] == 0:  # only a real field of a device file is accepted
        section, _, field = path.partition(".")
        from partita.spec.hardware import _SECTIONS
        assert field.strip() in _SECTIONS.get(section.strip(), ()), (path, value)


#: train flags whose values are numbers >= 0 (their bounds in partita.train.config)
_TRAIN_NUMBERS = ["--steps", "--seed", "--lr", "--warmup-steps", "--min-lr", "--max-grad-norm", "--skip-nonfinite",
                  "--momentum", "--weight-decay", "--beta1", "--beta2", "--eps", "--eval-every", "--eval-batches",
                  "--checkpoint-every", "--keep", "--save-hf-shard-mb", "--timeout-s", "--nproc", "--nnodes",
                  "--node-rank", "--max-restarts", "--global-batch", "--seq-len", "--mbs"]


def _negative_or_not_finite(value: str) -> bool:
    try:
        x = float(value.replace("_", "x"))
    except ValueError:
        return False
    return not math.isfinite(x) or x < 0


@pytest.mark.timeout(600)
@settings(max_examples=25, **SETTINGS)
@given(st.sampled_from(_TRAIN_NUMBERS), WILD_TEXT)
def test_train_flag_values(folder, flag, value):
    """Any text for a numeric ``partita train`` flag: refused with one line on the launcher, or
    accepted (the child stops where torchrun would start; no worker runs); a negative or
    non-finite value is never accepted (issue 16: a rank's raw exception before)."""
    argv = ["train", "--model", "tiny-llama", "--steps", "1", "--no-progress", "--run-dir", str(folder / "train-run"),
            f"{flag}={value}"]
    assert_clean(argv, must_refuse=_negative_or_not_finite(value), no_launch=True)
