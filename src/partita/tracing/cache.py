"""On-disk cache of traced specs for ``partita plan --model module:factory`` (no torch import).

Tracing is cheap (about 0.5 s of CPU for the SD-XL UNet), but building the model needs
its library: importing torch and diffusers costs about 4 s of CPU, far more than the trace
itself. A repeated ``partita plan`` of the same factory, shapes and TP plan reads the spec
it traced last time and never imports torch. The key is a SHA-256 over

* the factory (``module:function``), the resolved path and the bytes of its module file;
* the ``--example-input`` and ``--tp-plan`` texts;
* the installed versions of torch and the model libraries (``importlib.metadata``);
* the bytes of Partita's tracing code and traced-spec format (a change re-traces).

The key is computed before anything is imported, so it cannot name the other files the
factory's module imports (a user's own model package, edited in place). Those are recorded
when the model is built (torch imported then anyway): every module in ``sys.modules`` whose
source file lies outside the interpreter's stdlib and site-packages and outside Partita's own
package (:func:`loaded_sources`), stored beside the entry as ``<key>.sources`` with each
file's size, mtime and SHA-256. A lookup re-hashes them (no import) and treats the entry as
missing when any one changed or vanished (:func:`cached_path`). Still not seen: data files the
factory reads (a config JSON) and edits of an editable install of Partita outside
``tracing/`` (its version is not bumped by an edit); ``--no-trace-cache`` or
``PARTITA_TRACE_CACHE=off`` traces again. Location: ``$PARTITA_TRACE_CACHE``, else
``$XDG_CACHE_HOME/partita/traces``, else ``~/.cache/partita/traces``.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import site
import sys
import sysconfig
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


def _library_roots() -> tuple[Path, ...]:
    """Directories whose modules are not the user's: the stdlib and site-packages (each install
    scheme's, the ``site`` module's list, the user site), and Partita's own package."""
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= set(getattr(site, "getsitepackages", list)())
    roots.add(getattr(site, "getusersitepackages", lambda: None)())
    found = {Path(r).resolve() for r in roots if r}
    return tuple(found | {_OWN.parent})


def loaded_sources() -> list[str]:
    """Source files of the imported modules that are the user's own (see the module docstring):
    called after the factory built its model, so everything it imported is in ``sys.modules``.
    A superset of the factory's imports (a test runner's files too): more misses, never a
    stale hit."""
    roots, found = _library_roots(), set()
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if not name or not name.endswith(".py"):
            continue
        path = Path(name).resolve()
        if {"site-packages", "dist-packages"} & set(path.parts) or any(path.is_relative_to(r) for r in roots):
            continue
        if path.is_file():
            found.add(str(path))
    return sorted(found)


def _stamp(path: str) -> list | None:
    """[size, mtime_ns, sha256] of a file, or None when it cannot be read."""
    try:
        data, st = Path(path).read_bytes(), os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, hashlib.sha256(data).hexdigest()]


def _sources_current(record: Path) -> bool:
    """Whether every file listed in a ``<key>.sources`` record still has its recorded bytes
    (size and SHA-256 compared; the mtime is kept for a reader, a ``touch`` alone is no change)."""
    try:
        recorded = json.loads(record.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(recorded, dict):
        return False
    for path, stamp in recorded.items():
        now = _stamp(path) if isinstance(stamp, list) and len(stamp) == 3 else None
        if now is None or now[0] != stamp[0] or now[2] != stamp[2]:
            return False
    return True


def cached_path(key: str | None) -> Path | None:
    """The file of a cached trace, if it exists and the sources recorded with it are unchanged."""
    root = cache_dir()
    if key is None or root is None:
        return None
    path = root / f"{key}.json"
    if not path.is_file() or not _sources_current(root / f"{key}.sources"):
        return None
    return path


def _write(root: Path, name: str, text: str) -> None:
    """Write one file atomically (a concurrent reader never sees half of it)."""
    fd, tmp = tempfile.mkstemp(dir=root, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, root / name)


def store(key: str | None, text: str, sources: list[str] | None = None) -> Path | None:
    """Write a traced spec's JSON under ``key`` and the stamps of the ``sources`` it was built
    from (:func:`loaded_sources`); returns the path, or None when caching is off or the
    directory is not writable. The record goes last: an entry without one is a miss."""
    root = cache_dir()
    if key is None or root is None:
        return None
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / f"{key}.sources").unlink(missing_ok=True)
        _write(root, f"{key}.json", text)
        stamps = {p: _stamp(p) for p in sources or ()}
        _write(root, f"{key}.sources", json.dumps({p: s for p, s in stamps.items() if s is not None}))
    except OSError:
        return None
    return root / f"{key}.json"
