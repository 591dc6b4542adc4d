"""The trace cache sees edits in the user's own package, not only in the factory's file
(issue 19: ``partita plan --model pkg.module:factory`` must not plan a stale model).

Oracles: the parameter count of the model the factory builds, summed from its tensors here,
and the cache's own hit/miss line; the edit is made to a module the factory imports
(directly and through a second module), never to the factory's file.
"""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

import pytest
import torch

from partita.cli.main import main
from partita.models.llama import Transformer, TransformerConfig
from partita.tracing import cache

FACTORY = ("from partita.models.llama import Transformer, TransformerConfig\n"
           "from .shapes import LAYERS, DIM\n"
           "def tiny():\n    return Transformer(TransformerConfig(layers=LAYERS, hidden=DIM, heads=4, kv_heads=4))\n")


def _params(layers: int, dim: int) -> int:
    with torch.device("meta"):
        model = Transformer(TransformerConfig(layers=layers, hidden=dim, heads=4, kv_heads=4))
    return sum(p.numel() for p in model.parameters())


def _plan(argv: list[str]) -> tuple[int, str, str]:
    for name in [m for m in sys.modules if m == "userpkg" or m.startswith("userpkg.")]:
        del sys.modules[name]  # a fresh `partita plan` process imports the package anew
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.timeout(240)
def test_cache_sees_edits_in_imported_modules(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PARTITA_TRACE_CACHE", str(tmp_path / "cache"))
    pkg = tmp_path / "userpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "factory.py").write_text(FACTORY)
    (pkg / "shapes.py").write_text("from .widths import DIM\nLAYERS = 4\n")
    (pkg / "widths.py").write_text("DIM = 64\n")
    saved = tmp_path / "saved.json"
    argv = ["plan", "--model", "userpkg.factory:tiny", "--example-input", "1,32:int64", "--hardware", "h100-sxm",
            "--devices", "8", "--global-batch", "16", "--save-trace", str(saved)]
    key = cache.trace_key("userpkg.factory:tiny", ["1,32:int64"], None)
    total = lambda: json.loads(saved.read_text())["total_params"]  # noqa: E731

    rc, out, err = _plan(argv)
    assert rc == 0 and "(traced in" in out and total() == _params(4, 64), out + err
    rc, out, err = _plan(argv)
    assert rc == 0 and "trace read from the cache" in out, out + err

    (pkg / "shapes.py").write_text("from .widths import DIM\nLAYERS = 2\n")  # same size, same second
    assert cache.cached_path(key) is None  # the lookup itself sees the edit, before any import
    rc, out, err = _plan(argv)
    assert rc == 0 and "(traced in" in out and "2 x Block" in out and total() == _params(2, 64), out + err
    assert cache.cached_path(key) is not None

    (pkg / "widths.py").write_text("DIM = 96\n")  # imported only through shapes.py
    assert cache.cached_path(key) is None
    rc, out, err = _plan(argv)
    assert rc == 0 and "(traced in" in out and total() == _params(2, 96) != _params(2, 64), out + err

    code = ("import sys; from partita.cli.main import main; rc = main(sys.argv[1:]); "
            "print('TORCH', 'torch' in sys.modules); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, *argv[:-2]], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0 and "trace read from the cache" in proc.stdout, proc.stdout + proc.stderr
    assert "TORCH False" in proc.stdout, proc.stdout

    (pkg / "widths.py").unlink()  # a recorded file gone: a miss (the factory's import then fails)
    assert cache.cached_path(key) is None


@pytest.mark.timeout(120)
def test_tracing_pauses_the_collector_and_gives_it_back(tmp_path, monkeypatch):
    """The cyclic collector is off while the factory imports and builds (``_collector_paused``:
    the first-run time of issue 19) and on again afterwards, after a trace and after a factory
    that raises; ``python -m partita`` (the console entry, ``gc.freeze`` before exit) keeps the
    command's exit code and its one-line error."""
    import gc
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PARTITA_TRACE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "gcprobe.py").write_text(
        "import gc\nSEEN = []\n"
        "from partita.models.llama import Transformer, TransformerConfig\n"
        "def tiny():\n    SEEN.append(gc.isenabled())\n"
        "    return Transformer(TransformerConfig(layers=2, hidden=64, heads=4, kv_heads=4))\n"
        "def broken():\n    SEEN.append(gc.isenabled())\n    raise ValueError('bad config')\n")
    argv = ["plan", "--example-input", "1,32:int64", "--hardware", "h100-sxm", "--devices", "8",
            "--global-batch", "16", "--no-trace-cache"]
    sys.modules.pop("gcprobe", None)
    assert gc.isenabled()
    rc, out, err = _plan([*argv, "--model", "gcprobe:tiny"])
    assert rc == 0 and "(traced in" in out, out + err
    rc, out, err = _plan([*argv, "--model", "gcprobe:broken"])
    assert rc == 2 and err.count("\n") == 1 and "the factory raised ValueError: bad config at gcprobe.py:9" in err, \
        out + err
    assert sys.modules["gcprobe"].SEEN == [False, False] and gc.isenabled()
    sys.modules.pop("gcprobe", None)

    proc = subprocess.run([sys.executable, "-m", "partita", *argv, "--model", "gcprobe:nosuch"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "has no function nosuch" in proc.stderr, \
        proc.stdout + proc.stderr
