"""Writing a file the user named (``--report``, ``-o``, ``--save-trace``): the one helper
every command's output file goes through, beside :mod:`partita.inputs` (which reads).

* **One line on failure.** Any ``OSError`` (a name too long, a full disk, a folder that
  went away, a read-only file system) becomes a :class:`PartitaError`
  ``cannot write FLAG PATH: REASON``, never an internal error.
* **Nothing lost on a crash.** A regular file is written whole or not at all: the text goes
  into a temporary file in the same folder, is flushed to disk, and replaces the target in
  one ``os.replace``; an existing file keeps its permissions. Whatever stops the write (a
  full disk, Ctrl-C) leaves the old file as it was and no temporary file behind. What is not
  a regular file (``/dev/stdout``, a FIFO, a device) is written in place; a symlink's target
  is replaced, the link kept.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import PartitaError
from .inputs import short


def cannot_write(flag: str, path: str | Path, error: BaseException) -> PartitaError:
    """The one-line error for ``error`` raised writing ``path`` (given with ``flag``)."""
    reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return PartitaError(f"cannot write {flag} {short(str(path), 200)}: {reason}")


def write_output(path: str | Path, text: str, flag: str) -> Path:
    """Write ``text`` (UTF-8) to ``path``, which the user gave with ``flag``; returns the path.
    Raises :class:`PartitaError` naming the flag, the path and the OS's reason."""
    path = Path(path)
    try:
        target = Path(os.path.realpath(path))  # a symlink: replace the file it names, keep the link
        regular = not target.exists() or target.is_file()
    except (OSError, ValueError) as e:
        raise cannot_write(flag, path, e) from None
    try:
        if regular:
            _replace_whole(target, text.encode("utf-8"))
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    except (OSError, ValueError) as e:
        raise cannot_write(flag, path, e) from None
    return path


def _replace_whole(target: Path, data: bytes) -> None:
    """``data`` into a temporary file beside ``target``, on disk, then renamed over it."""
    try:
        mode = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask  # what open(target, "w") would create
    fd, tmp = tempfile.mkstemp(prefix=".partita-", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
