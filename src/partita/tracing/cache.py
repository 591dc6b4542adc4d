"""On-disk cache of traced specs for ``partita plan --model module:factory`` (no torch import).

Tracing is cheap (about 0.5 s of CPU for the SD-XL UNet), but building the model needs
its library: importing torch and diffusers costs about 4 s of CPU, far more than the trace
itself. A repeated ``partita plan`` of the same factory, shapes and TP plan reads the spec
it traced last time and never imports torch. The key is a SHA-256 over

* the factory (``module:function``), the resolved path and the bytes of its module file;
* the ``--example-input`` and ``--tp-plan`` texts;
* the installed versions of torch and the model libraries (``importlib.metadata``);
* the bytes of Partita's tracing code and traced-spec format (a change re-traces).

Known gap: a change in another file the factory's module imports (a user's own model
package, edited in place) is not seen; ``--no-trace-cache`` or ``PARTITA_TRACE_CACHE=off``
traces again. Location: ``$PARTITA_TRACE_CACHE``, else ``$XDG_CACHE_HOME/partita/traces``,
else ``~/.cache/partita/traces``.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

#: distributions whose version changes what a factory builds (the ones examples use and timm)
_LIBRARIES = ("torch", "diffusers", "transformers", "timm")
_OWN = Path(__file__).resolve().parent


def cache_dir() -> Path | None:
    """Where traces are kept; None when caching is off (``PARTITA_TRACE_CACHE=off`` or ``0``)."""
    env = os.environ.get("PARTITA_TRACE_CACHE")
    if env is not None:
        return None if env.strip().lower() in ("", "0", "off", "no", "false") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "partita" / "traces"


def _module_file(module_name: str) -> Path | None:
    """The factory module's source file, found without executing it (as ``--model`` imports it:
    the current directory first)."""
    sys.path.insert(0, os.getcwd())
    importlib.invalidate_caches()
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError, AttributeError):
        return None
    finally:
        sys.path.pop(0)
    origin = getattr(spec, "origin", None) if spec else None
    return Path(origin).resolve() if origin and Path(origin).is_file() else None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def trace_key(factory: str, example_inputs: list[str] | None, tp_plan: str | None) -> str | None:
    """The cache key of one ``--model module:factory`` trace; None when the module's file is
    not found (then nothing is cached and the factory's own import reports the problem)."""
    source = _module_file(factory.partition(":")[0])
    if source is None:
        return None
    own = sorted(_OWN.glob("*.py")) + [_OWN.parent / "spec" / "traced.py"]
    digest = hashlib.sha256()
    digest.update(json.dumps([factory, str(source), example_inputs or [], tp_plan or "",
                              [(d, _version(d)) for d in _LIBRARIES]]).encode())
    for path in [source, *own]:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cached_path(key: str | None) -> Path | None:
    """The file of a cached trace, if it exists."""
    root = cache_dir()
    if key is None or root is None:
        return None
    path = root / f"{key}.json"
    return path if path.is_file() else None


def store(key: str | None, text: str) -> Path | None:
    """Write a traced spec's JSON under ``key`` (atomically: a concurrent reader never sees half
    a file); returns the path, or None when caching is off or the directory is not writable."""
    root = cache_dir()
    if key is None or root is None:
        return None
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=root, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, root / f"{key}.json")
    except OSError:
        return None
    return root / f"{key}.json"
