"""Launcher-side checks of the training inputs, before any worker starts (issue 16).

A bad data file, tokenizer or directory found by a rank costs a process group, a rank's
raw exception and exit 1; found here it is one ``partita: error:`` line and exit 2. Each
check reads only what it must (a ``.npy`` header and its values memory-mapped, a
tokenizer parsed once).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from ..errors import PartitaError


def writable_dir(path: str | Path, flag: str) -> Path:
    """``path`` as a directory this process can write (created when missing)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise PartitaError(f"{flag} {p} is a file; give a directory (it is created when missing)")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PartitaError(f"{flag} {p}: cannot create the directory ({e.strerror}); give a writable directory") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise PartitaError(f"{flag} {p} is not writable by this user; give a writable directory")
    return p


def default_run_dir(base: str | Path = "runs") -> Path:
    """``runs/<UTC timestamp>`` in the working directory (a suffix when two runs share a second)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    candidate = Path(base) / stamp
    n = 1
    while candidate.exists():
        candidate = Path(base) / f"{stamp}-{n}"
        n += 1
    return candidate


def check_token_file(path: Path, flag: str, vocab: int | None) -> None:
    """A ``.npy`` of token ids: 1-D, integer, non-negative, at least two tokens, ids < vocab."""
    import numpy as np
    try:
        tokens = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise PartitaError(f"{flag} {path}: not a readable .npy array of token ids ({e})") from None
    if not isinstance(tokens, np.ndarray) or tokens.ndim != 1:
        shape = getattr(tokens, "shape", "?")
        raise PartitaError(f"{flag} {path}: token ids must be a 1-D array, got shape {shape}")
    if tokens.dtype.kind not in "iu":
        raise PartitaError(f"{flag} {path}: token ids must be integers, got dtype {tokens.dtype}")
    if tokens.size < 2:
        raise PartitaError(f"{flag} {path}: holds {tokens.size} token(s); training needs at least a sequence")
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0:
        raise PartitaError(f"{flag} {path}: token id {low} is negative; ids must be in [0, vocabulary)")
    if vocab is not None and high >= vocab:
        raise PartitaError(f"{flag} {path}: token id {high} >= the model's vocabulary {vocab}")


def check_tokenizer(path: str, flag: str = "--tokenizer") -> None:
    p = Path(path)
    if not p.is_file():
        raise PartitaError(f"{flag} {path} is not a file; give a Hugging Face tokenizer.json")
    try:
        from tokenizers import Tokenizer
        Tokenizer.from_file(str(p))
    except ImportError:
        raise PartitaError("text data needs the tokenizers package: pip install 'partita[runtime]'") from None
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
        reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise PartitaError(f"{flag} {path} is not a Hugging Face tokenizer.json ({reason})") from None


def check_data(path: str | None, flag: str, vocab: int | None) -> None:
    """--data / --eval-data: exists; a ``.npy`` is a valid token array."""
    if not path:
        return
    p = Path(path)
    if not p.exists():
        raise PartitaError(f"{flag} {path} does not exist")
    if p.suffix == ".npy":
        check_token_file(p, flag, vocab)
    elif p.is_dir() and not any(f.suffix in (".txt", ".jsonl") for f in p.rglob("*")):  # data.py's formats
        raise PartitaError(f"{flag} {path}: no .txt or .jsonl files inside; give a text file or a directory of them")
    elif p.is_file() and p.stat().st_size == 0:
        raise PartitaError(f"{flag} {path} is empty; give a file with text to train on")
    elif p.is_file():
        try:
            with open(p, "rb") as f:
                f.read(1)
        except OSError as e:
            raise PartitaError(f"{flag} {path}: cannot read it ({e.strerror})") from None


def check_inputs(config, vocab: int | None) -> None:
    """Every file and directory a run reads or writes, checked before it starts."""
    check_data(config.data, "--data", vocab)
    check_data(config.eval_data, "--eval-data", vocab)
    if config.tokenizer:
        check_tokenizer(config.tokenizer)
    elif config.model and (Path(config.model) / "tokenizer.json").is_file():
        check_tokenizer(str(Path(config.model) / "tokenizer.json"), "--model's tokenizer.json")
    if config.checkpoint_dir:
        writable_dir(config.checkpoint_dir, "--checkpoint-dir")
    if config.save_hf:
        out = Path(config.save_hf)
        if out.exists() and not out.is_dir():
            raise PartitaError(f"--save-hf {out} is a file; give a directory")
        writable_dir(out.parent if not out.exists() else out, "--save-hf")
    if config.tensorboard:
        from .evaluate import tensorboard_available
        if not tensorboard_available():
            raise PartitaError("--tensorboard needs the tensorboard package: pip install 'partita[tensorboard]'")
        writable_dir(config.tensorboard, "--tensorboard")
