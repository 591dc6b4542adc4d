"""Supervised fine-tuning data: chat JSONL, loss on the assistant's tokens, packed rows.

Input: a ``.jsonl`` file, one sample per line, in either common form::

    {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
    {"instruction": "...", "input": "..." (optional), "output": "...", "system": "..." (optional)}

(the second is Alpaca's / LLaMA-Factory's: it becomes a user turn ``instruction`` + a blank
line + ``input``, and an assistant turn ``output``).

Formatting is the tokenizer's own chat template (``transformers``' ``apply_chat_template``,
from the model directory's ``tokenizer_config.json`` / ``chat_template.jinja``, or the
``--tokenizer`` directory): Partita writes no template of its own.

Which tokens carry loss (labels = -100 everywhere else): the assistant's. Found two ways:

* a template with ``{% generation %}`` blocks: transformers' own
  ``return_assistant_tokens_mask=True`` (what TRL's ``assistant_only_loss`` uses);
* any other template: by prefix lengths. For assistant turn ``i`` the conversation up to
  turn ``i - 1`` rendered with ``add_generation_prompt=True`` is a prefix of the one up to
  turn ``i``; the tokens between the two lengths are that turn's answer, end-of-turn token
  included (LLaMA-Factory's and FastChat's route). A template whose tokenization is not
  prefix-stable there is refused in one line rather than masked wrongly.

Packing: each sample becomes (inputs, shifted targets, positions 0..L-2); samples are laid
into rows of ``seq_len`` tokens in file order, first come first placed, a sample that does
not fit the row's rest starting the next row (the rest is padding: target -100, positions
from 0, its own document). Position ids restart at 0 for every sample, and the model's
attention is block-diagonal per sample: for Hugging Face models transformers builds that
mask itself from position ids that restart (``masking_utils.find_packed_sequence_indices``;
flash-attention's varlen path reads the same position ids), and Partita's sequence-parallel
stage builds the same block-diagonal causal mask explicitly (:func:`document_mask`). A
sample longer than ``seq_len`` is truncated (counted, reported). ``packing=False`` puts
one sample per row.

Epochs: the rows are shuffled per epoch with ``seed + epoch`` and step ``k`` reads global
rows ``k * gbs ...``: a run longer than the data starts the next epoch (as
:class:`~partita.train.data.PackedTokens` does).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import torch

from ..errors import PartitaError
from ..plan import Plan
from ..runtime.batches import dp_index
from ..runtime.hf_pipeline import document_mask  # noqa: F401  (the mask of packed rows)

IGNORE = -100
GENERATION_TAG = re.compile(r"{%-?\s*generation\s*-?%}")
ROLES = ("system", "user", "assistant", "tool")


def is_sft_file(path: str | Path) -> bool:
    """Whether ``path`` is a chat / instruction JSONL (its first sample has ``messages`` or
    ``instruction``), not a ``{"text": ...}`` pre-training file."""
    p = Path(path)
    if p.suffix != ".jsonl" or not p.is_file():
        return False
    with p.open(errors="replace") as f:
        for line in f:
            if line.strip():
                try:
                    first = json.loads(line)
                except ValueError:
                    return False
                return isinstance(first, dict) and ("messages" in first or "instruction" in first)
    return False


def _conversation(obj, where: str) -> list[dict]:
    """One line's sample as a messages list (checked: roles, contents, an assistant turn)."""
    if not isinstance(obj, dict):
        raise PartitaError(f"{where}: a sample must be a JSON object with \"messages\" or \"instruction\"/\"output\"")
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise PartitaError(f"{where}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}} objects")
    elif "instruction" in obj:
        if "output" not in obj:
            raise PartitaError(f"{where}: an \"instruction\" sample needs an \"output\" (the answer to learn)")
        user = str(obj["instruction"]) + (f"\n\n{obj['input']}" if obj.get("input") else "")
        msgs = ([{"role": "system", "content": str(obj["system"])}] if obj.get("system") else []) + \
            [{"role": "user", "content": user}, {"role": "assistant", "content": str(obj["output"])}]
    else:
        raise PartitaError(f"{where}: a sample needs \"messages\" (a chat) or \"instruction\" + \"output\"; "
                           f"it has {sorted(obj)[:5]}")
    for m in msgs:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise PartitaError(f"{where}: each message needs a \"role\" in {ROLES} and a string \"content\", "
                               f"got {str(m)[:80]}")
    if not any(m["role"] == "assistant" for m in msgs):
        raise PartitaError(f"{where}: the conversation has no assistant turn (nothing to learn)")
    return msgs


def read_samples(path: str | Path) -> list[list[dict]]:
    """The conversations of a chat / instruction JSONL file (one-line errors with file:line)."""
    p = Path(path)
    if not p.is_file():
        raise PartitaError(f"--data {path} does not exist")
    out = []
    for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise PartitaError(f"{p}:{n}: not JSON ({e})") from None
        out.append(_conversation(obj, f"{p}:{n}"))
    if not out:
        raise PartitaError(f"--data {path}: the file holds no samples")
    return out


def load_chat_tokenizer(source: str | Path):
    """The transformers tokenizer (with its chat template) of a model or tokenizer directory,
    or of the directory holding a ``tokenizer.json``; offline."""
    from transformers import AutoTokenizer
    path = Path(source)
    path = path.parent if path.is_file() else path
    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise PartitaError(f"cannot load a tokenizer from {path}: {str(e).splitlines()[0][:200]}") from None
    if not getattr(tok, "chat_template", None):
        raise PartitaError(f"the tokenizer in {path} has no chat template (tokenizer_config.json \"chat_template\" "
                           "or chat_template.jinja); chat / instruction data is formatted with the model's own "
                           "template")
    return tok


def _render(tok, msgs: list[dict], gen: bool = False) -> list[int]:
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def assistant_mask(tok, msgs: list[dict]) -> tuple[list[int], list[int]]:
    """(token ids of the whole conversation, 1 on the assistant's tokens else 0)."""
    if GENERATION_TAG.search(tok.chat_template):  # {% generation %} blocks: transformers' own mask
        out = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        return list(out["input_ids"]), [int(v) for v in out["assistant_masks"]]
    ids = _render(tok, msgs)
    mask = [0] * len(ids)
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        before, upto = _render(tok, msgs[:i], gen=True), _render(tok, msgs[:i + 1])
        if upto[:len(before)] != before or ids[:len(upto)] != upto:
            raise PartitaError("the chat template does not tokenize prefix-stably around an assistant turn; "
                               "add {% generation %} ... {% endgeneration %} around the assistant content "
                               "so the assistant tokens can be found")
        for j in range(len(before), len(upto)):
            mask[j] = 1
    return ids, mask


def sample_arrays(ids: list[int], mask: list[int], seq_len: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """(inputs, targets) of one sample, truncated to ``seq_len``; targets are the next
    token where that token is the assistant's, else -100. Also whether it was truncated."""
    x = np.asarray(ids[:-1], dtype=np.int64)
    y = np.where(np.asarray(mask[1:], dtype=bool), np.asarray(ids[1:], dtype=np.int64), IGNORE)
    return x[:seq_len], y[:seq_len], len(x) > seq_len


def pack(samples: list[tuple[np.ndarray, np.ndarray]], seq_len: int, pad_id: int,
         packing: bool = True) -> dict[str, np.ndarray]:
    """Rows of ``seq_len`` tokens: ``inputs``, ``targets``, ``positions`` (restarting at 0
    per sample and for the padding). ``packing=False``: one sample per row."""
    rows: list[list[tuple[np.ndarray, np.ndarray]]] = [[]]
    used = 0
    for x, y in samples:
        if rows[-1] and (not packing or used + len(x) > seq_len):
            rows.append([])
            used = 0
        rows[-1].append((x, y))
        used += len(x)
    n = len(rows)
    out = {"inputs": np.full((n, seq_len), pad_id, np.int64), "targets": np.full((n, seq_len), IGNORE, np.int64),
           "positions": np.zeros((n, seq_len), np.int64)}
    for r, row in enumerate(rows):
        at = 0
        for x, y in row:
            out["inputs"][r, at:at + len(x)], out["targets"][r, at:at + len(x)] = x, y
            out["positions"][r, at:at + len(x)] = np.arange(len(x))
            at += len(x)
        out["positions"][r, at:] = np.arange(seq_len - at)
    return out


def encode_file(data: str | Path, tok, seq_len: int, packing: bool = True) -> dict[str, np.ndarray]:
    """Every sample of ``data`` formatted, masked and packed (plus ``truncated``: a count)."""
    samples, truncated = [], 0
    for msgs in read_samples(data):
        ids, mask = assistant_mask(tok, msgs)
        x, y, cut = sample_arrays(ids, mask, seq_len)
        truncated += cut
        if (y != IGNORE).any():
            samples.append((x, y))
    if not samples:
        raise PartitaError(f"--data {data}: no sample keeps an assistant token within seq_len {seq_len}")
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    out = pack(samples, seq_len, int(pad), packing)
    out["truncated"] = np.asarray(truncated)
    out["samples"] = np.asarray(len(samples))
    return out


def encode_to_file(data: str, tokenizer: str | None, seq_len: int, out_dir: str, vocab: int) -> Path:
    """Encode ``data`` once into ``out_dir/sft-<hash>.npz`` (reused if present)."""
    if not tokenizer:
        raise PartitaError("chat / instruction data needs the model's tokenizer: --model DIR with tokenizer files, "
                           "or --tokenizer DIR")
    p = Path(data)
    key = hashlib.sha256(f"{p.resolve()}|{p.stat().st_mtime}|{tokenizer}|{seq_len}".encode()).hexdigest()[:16]
    out = Path(out_dir) / f"sft-{key}.npz"
    if out.exists():
        return out
    arrays = encode_file(p, load_chat_tokenizer(tokenizer), seq_len)
    top = int(arrays["inputs"].max())
    if top >= vocab:
        raise PartitaError(f"the tokenizer gives token id {top} but the model's vocabulary is {vocab}")
    tmp = out.with_suffix(".tmp.npz")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, out)
    return out


class SftRows:
    """Packed SFT rows (``inputs``, ``targets``, ``positions``), read by step like PackedTokens."""

    def __init__(self, arrays, seed: int):
        self.inputs, self.targets, self.positions = (torch.from_numpy(np.asarray(arrays[k]))
                                                     for k in ("inputs", "targets", "positions"))
        self.seed, self.n = seed, self.inputs.shape[0]
        self.truncated = int(arrays["truncated"]) if "truncated" in arrays else 0
        self._perms: dict[int, np.ndarray] = {}

    @classmethod
    def load(cls, path: str | Path, seed: int) -> "SftRows":
        with np.load(path) as f:
            return cls({k: f[k] for k in f.files}, seed)

    def rows(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Global rows ``start .. start+count-1`` (epoch ``g // n`` shuffled by ``seed + epoch``)."""
        idx = []
        for g in range(start, start + count):
            epoch = g // self.n
            if epoch not in self._perms:
                self._perms = {epoch: np.random.default_rng(self.seed + epoch).permutation(self.n)}
            idx.append(int(self._perms[epoch][g % self.n]))
        return self.inputs[idx], self.targets[idx], self.positions[idx]

    def rank_batch(self, step: int, plan: Plan, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This data-parallel rank's share of step ``step``'s global batch."""
        per = plan.gbs // plan.dp
        return self.rows(step * plan.gbs + dp_index(plan, rank) * per, per)


def build_chat_tokenizer(out_dir: str | Path, texts: list[str], vocab: int,
                         template: str | None = None) -> Path:
    """A small byte-level BPE tokenizer with a ChatML chat template (``{% generation %}``
    around the answers), trained on ``texts`` offline and saved as a transformers tokenizer
    directory: for tests and demos without the Hugging Face hub."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    template = template or CHATML_GENERATION
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=template, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.save_pretrained(str(out_dir))
    return Path(out_dir)


#: ChatML (Qwen's format) with ``{% generation %}`` marking the assistant's answers
CHATML_GENERATION = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}"
    "{% else %}{{ m['content'] }}<|im_end|>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
#: the same format without the markers (assistant tokens found by prefix lengths)
CHATML = CHATML_GENERATION.replace("{% generation %}", "").replace("{% endgeneration %}", "")


def evaluate_sft(pm, batches) -> float:
    """Held-out loss of packed SFT rows ((inputs, targets, positions) per batch), defined as
    the training loss is - the mean over micro-batches (and data-parallel ranks, and
    ``batches``) of each micro-batch's mean cross-entropy over its assistant tokens - less
    MoE load-balancing losses (train/evaluate.py: one definition on every layout). Packed
    rows under context parallel are refused (``PACKED_CP``)."""
    from .evaluate import evaluate
    return evaluate(pm, batches)
