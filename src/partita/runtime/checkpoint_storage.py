"""The bytes of a checkpoint on disk: checksums taken while writing, the manifest, atomic files.

Why checksums at all: ``torch.load`` does not check the CRCs of the zip records inside a
``.distcp`` file, so a bad disk or a partial copy that keeps the zip structure loads as
garbage (NaN losses) without an error. Every file a rank writes therefore goes through
:class:`_HashingStream`, which feeds each buffer to ``zlib.crc32`` on its way to the
file - no second read. ``zlib.crc32`` (stdlib, CRC-32/ISO-HDLC, the zip/PNG CRC) runs at
about 2 GB/s on one core here, fast enough that crc32c or xxhash (new dependencies) are
not needed; ``bench/checkpoint_integrity.py`` measures what it costs.

The hook point is DCP's ``FileSystemWriter``: its ``_write_files_from_queue`` opens every
data file with ``self.fs.create_stream(path, "wb")`` and ``finish`` writes ``.metadata``
the same way (as ``.metadata.tmp``, then ``self.fs.rename``), so replacing ``self.fs`` with
:class:`HashingFileSystem` sees every byte DCP writes (torch 2.13,
``torch/distributed/checkpoint/filesystem.py``).

The manifest (:data:`MANIFEST`) lists every file of the checkpoint with its size and
CRC-32; it is written last, atomically (tmp file, fsync, ``os.replace``, fsync of the
directory), so its presence marks the checkpoint complete. It carries its own CRC-32
(``manifest_crc32``) so a damaged manifest is told apart from a damaged data file.
"""
from __future__ import annotations

import io
import json
import os
import threading
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

MANIFEST = "MANIFEST.json"
MANIFEST_FORMAT = "partita-checkpoint"
MANIFEST_VERSION = 1
LEGACY_MARKER = "COMMITTED"  # completion marker of checkpoints written before manifests
READ_CHUNK = 8 << 20  # bytes per read when verifying; large enough that crc32 dominates the loop


@dataclass
class FileRecord:
    """What one rank wrote into one file of a checkpoint."""
    size: int
    crc32: int
    rank: int

    def to_json(self) -> dict:
        return {"size": self.size, "crc32": f"{self.crc32:08x}", "rank": self.rank}


class _HashingStream(io.RawIOBase):
    """A write-only stream that forwards to ``raw`` and keeps the running size and CRC-32
    of everything written. Sequential only: a seek would make the CRC describe bytes that
    are not the file's, so it is refused (DCP and ``torch.save`` never seek when writing)."""

    def __init__(self, raw: io.IOBase) -> None:
        super().__init__()
        self.raw = raw
        self.size = 0
        self.crc = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        n = self.raw.write(view)
        n = view.nbytes if n is None else n
        self.crc = zlib.crc32(view[:n], self.crc)
        self.size += n
        return n

    def tell(self) -> int:
        return self.raw.tell()

    def seekable(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.raw.fileno()

    def flush(self) -> None:
        if not self.raw.closed:
            self.raw.flush()

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()  # IOBase.close flushes first
        finally:
            self.raw.close()


class HashingFileSystem(FileSystem):
    """DCP's local file system, recording size and CRC-32 of every file written through it."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self.records: dict[str, FileRecord] = {}
        self._lock = threading.Lock()  # DCP may write files from several threads

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode and "a" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with super().create_stream(path, mode) as raw:
            stream = _HashingStream(raw)
            yield stream
        with self._lock:
            self.records[Path(path).name] = FileRecord(stream.size, stream.crc, self.rank)

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(path, new_path)
        with self._lock:
            record = self.records.pop(Path(path).name, None)
            if record is not None:
                self.records[Path(new_path).name] = record


class ChecksummingWriter(FileSystemWriter):
    """``FileSystemWriter`` whose files are checksummed as they are written; after
    ``dcp.save`` returns, :attr:`records` maps file name -> :class:`FileRecord` for the files
    this rank wrote (rank 0 also has ``.metadata``)."""

    def __init__(self, path: str | os.PathLike, rank: int, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.fs = HashingFileSystem(rank)

    @property
    def records(self) -> dict[str, FileRecord]:
        return dict(self.fs.records)


def file_crc32(path: Path, buf: bytearray | None = None) -> tuple[int, int]:
    """(size, CRC-32) of a file, read in :data:`READ_CHUNK` pieces into one reused buffer."""
    buf = buf if buf is not None else bytearray(READ_CHUNK)
    view = memoryview(buf)
    crc, size = 0, 0
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(view)
            if not n:
                return size, crc
            crc = zlib.crc32(view[:n], crc)
            size += n


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file inside ``path`` durable (POSIX: fsync the directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # platforms without directory file descriptors
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_bytes_durably(path: Path, data: bytes) -> None:
    """Write ``path`` atomically: a tmp file, fsync, ``os.replace``, fsync of the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _canonical_json(obj: dict) -> bytes:
    return json.dumps(obj, indent=1, sort_keys=True).encode()


def build_manifest(step: int, world_size: int, records: dict[str, FileRecord], meta: dict) -> dict:
    """The manifest dict: format, version, step, world size, checksum kind, files, meta,
    and ``manifest_crc32``, the CRC-32 of the canonical JSON of all the other fields."""
    body = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "step": step, "world_size": world_size,
            "checksum": "crc32", "files": {name: records[name].to_json() for name in sorted(records)},
            "meta": meta}
    return {**body, "manifest_crc32": f"{zlib.crc32(_canonical_json(body)):08x}"}


class ManifestError(ValueError):
    """The manifest is missing, unreadable or inconsistent; the message says which."""


def read_manifest(path: Path) -> dict:
    """The manifest of checkpoint directory ``path``, checked against its own CRC-32."""
    try:
        manifest = json.loads((path / MANIFEST).read_bytes())
    except FileNotFoundError:
        raise ManifestError(f"{MANIFEST}: missing") from None
    except (OSError, ValueError) as e:
        raise ManifestError(f"{MANIFEST}: unreadable ({type(e).__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ManifestError(f"{MANIFEST}: not a Partita checkpoint manifest")
    body = {k: v for k, v in manifest.items() if k != "manifest_crc32"}
    if manifest.get("manifest_crc32") != f"{zlib.crc32(_canonical_json(body)):08x}":
        raise ManifestError(f"{MANIFEST}: its own checksum does not match (edited or damaged)")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files or not all(
            isinstance(r, dict) and isinstance(r.get("size"), int) and isinstance(r.get("crc32"), str)
            for r in files.values()):
        raise ManifestError(f"{MANIFEST}: no valid file list")
    return manifest


def check_sizes(path: Path, manifest: dict) -> list[str]:
    """Files of the manifest that are missing or of another size than recorded (a stat each,
    no read): the check that what was just written is what the manifest says."""
    bad = []
    for name, rec in manifest["files"].items():
        try:
            size = (path / name).stat().st_size
        except OSError:
            bad.append(f"{name}: missing")
            continue
        if size != rec["size"]:
            bad.append(f"{name}: {size} bytes, manifest says {rec['size']}")
    return bad
