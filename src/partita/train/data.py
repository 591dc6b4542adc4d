"""Training data: synthetic batches (the demo default) or real text, tokenized and packed.

``--data`` takes a text file, a directory of ``.txt`` / ``.jsonl`` files (``{"text": ...}``
per line), or a pre-tokenized token file (``.npy`` of integers, memory-mapped). Text is
tokenized with a Hugging Face ``tokenizer.json`` (``--tokenizer``) or a byte-level BPE
trained on the corpus itself with the ``tokenizers`` library, once: the token ids are
cached next to the run as ``.npy`` and memory-mapped by every rank.

Packing: documents are joined with an end-of-text token and cut into sequences of
``seq_len + 1`` tokens (inputs and shifted targets). Step ``k`` uses global sequences
``k*gbs ... k*gbs + gbs - 1`` of a per-epoch permutation fixed by the seed; each
data-parallel rank reads only its contiguous share. The position in the data is
therefore ``step * gbs`` sequences - the checkpoint stores it.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

from ..errors import PartitaError
from ..plan import Plan
from ..runtime.batches import dp_index, dp_shard, synthetic_batch  # noqa: F401  (re-exported for the worker)


def stdlib_corpus(path: Path, megabytes: float = 1.5) -> Path:
    """Write a few MB of real text that every Python installation ships - the standard
    library's source files, in name order - to ``path``: the corpus of the tests and
    benches that train on text, with nothing to download."""
    src = Path(os.__file__).parent
    out, size = [], 0
    for f in sorted(src.glob("*.py")):
        text = f.read_text(errors="replace")
        out.append(text)
        size += len(text)
        if size > megabytes * 1e6:
            break
    path.write_text("\n".join(out))
    return path


def _read_texts(path: Path) -> list[str]:
    files = sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".jsonl")) if path.is_dir() else [path]
    if not files:
        raise PartitaError(f"--data {path}: no .txt or .jsonl files inside")
    texts = []
    for f in files:
        if f.suffix == ".jsonl":
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                if line.strip():
                    try:
                        texts.append(json.loads(line)["text"])
                    except (ValueError, KeyError, TypeError):
                        raise PartitaError(f"{f}:{n}: each .jsonl line must be an object with a \"text\" field "
                                          "(or, for SFT, \"messages\" / \"instruction\" + \"output\")") from None
        else:
            texts.append(f.read_text(errors="replace"))
    return texts


def train_tokenizer(texts: list[str], vocab: int):
    """A byte-level BPE of ``vocab`` tokens trained on ``texts`` (tokenizers library)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # the end-of-text token needs one id beyond the 256 byte symbols; a 256-token model gets plain bytes
    specials = ["<|endoftext|>"] if vocab > len(alphabet) else []
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=alphabet)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def tokenize_to_file(data: str, vocab: int, out_dir: str, tokenizer: str | None = None) -> Path:
    """Tokenize ``data`` once into ``out_dir/tokens-<hash>.npy`` (reused if present)."""
    path = Path(data)
    if not path.exists():
        raise PartitaError(f"--data {data} does not exist")
    if path.suffix == ".npy":
        return path
    key = _cache_key(path, vocab, tokenizer)
    out = Path(out_dir) / f"tokens-{key}.npy"
    if out.exists():
        return out
    texts = _read_texts(path)
    if tokenizer:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(tokenizer)
    else:
        tok = train_tokenizer(texts, vocab)
        tok.save(str(Path(out_dir) / f"tokenizer-{key}.json"))
    if tok.get_vocab_size() > vocab:
        raise PartitaError(f"tokenizer has {tok.get_vocab_size()} tokens but the model's vocabulary is {vocab}")
    eot = tok.token_to_id("<|endoftext|>")
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        if eot is not None:
            ids.append(eot)
    dtype = np.uint16 if vocab <= 65535 else np.uint32
    tmp = out.with_suffix(".tmp.npy")
    np.save(tmp, np.asarray(ids, dtype=dtype))
    os.replace(tmp, out)
    return out


def _cache_key(path: Path, vocab: int, tokenizer: str | None) -> str:
    return hashlib.sha256(f"{path.resolve()}|{vocab}|{tokenizer}|{path.stat().st_mtime}".encode()).hexdigest()[:16]


def tokenizer_used(data: str, vocab: int, out_dir: str, tokenizer: str | None) -> str | None:
    """The tokenizer file that turned ``data`` into tokens: ``tokenizer``, or the BPE
    :func:`tokenize_to_file` trained on it (so held-out text is tokenized the same way)."""
    path = Path(data)
    if tokenizer or path.suffix == ".npy" or not path.exists():
        return tokenizer
    trained = Path(out_dir) / f"tokenizer-{_cache_key(path, vocab, tokenizer)}.json"
    return str(trained) if trained.is_file() else None


class PackedTokens:
    """Fixed-length training sequences over a memory-mapped token array."""

    def __init__(self, token_file: str | Path, seq_len: int, seed: int, vocab: int):
        self.tokens = np.load(token_file, mmap_mode="r")
        self.seq_len, self.seed = seq_len, seed
        self.n = (len(self.tokens) - 1) // seq_len
        if self.n < 1:
            raise PartitaError(f"{token_file}: {len(self.tokens)} tokens do not fill one sequence of {seq_len}")
        if int(self.tokens.max(initial=0)) >= vocab:
            raise PartitaError(f"{token_file}: token id {int(self.tokens.max())} >= model vocabulary {vocab}")
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms = {epoch: np.random.default_rng(self.seed + epoch).permutation(self.n)}
        return self._perms[epoch]

    def sequences(self, start: int, count: int) -> torch.Tensor:
        """Global sequences ``start .. start+count-1`` as a (count, seq_len+1) tensor."""
        rows = []
        for g in range(start, start + count):
            idx = self._perm(g // self.n)[g % self.n]
            rows.append(np.asarray(self.tokens[idx * self.seq_len: idx * self.seq_len + self.seq_len + 1], dtype=np.int64))
        return torch.from_numpy(np.stack(rows))

    def rank_batch(self, step: int, plan: Plan, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's share of step ``step``'s global batch: only its rows are read."""
        per = plan.gbs // plan.dp
        data = self.sequences(step * plan.gbs + dp_index(plan, rank) * per, per)
        return data[:, :-1], data[:, 1:]
