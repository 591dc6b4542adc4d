"""Fine-tuning data: how many of a step's token slots a variable-length dataset fills, and
how long an epoch takes (``--seq-lengths``, ``--epochs``; issue 36).

A plan trains ``gbs`` sequences of ``seq_len`` tokens per step. SFT samples are shorter and
vary; two ways to fill the sequences:

* **padded** - one sample per sequence, padded to ``seq_len`` (longer ones truncated, as
  LLaMA-Factory's ``cutoff_len`` does): the useful fraction is ``sum(min(L, S)) / (N S)``;
* **packed** - several whole samples per sequence (attention kept within each sample:
  position ids reset per sample), placed by best-fit decreasing (each sample, longest
  first, into the fullest sequence it still fits; LLaMA-Factory's ``packing`` /
  ``neat_packing`` use a greedy knapsack of the same kind): the useful fraction is
  ``sum(min(L, S)) / (B S)`` over the ``B`` sequences used.

The lengths come from a file (one token count per line, or JSONL whose lines are a number
or an object with a ``length``, ``num_tokens``, ``n_tokens``, ``tokens`` or ``input_ids``
field) or from a summary ``p50=480,p90=1400[,mean=612][,samples=50000]``: then the lengths
are the quantiles of the log-normal through p50 and p90 (``sigma = ln(p90/p50) / 1.2816``,
1.2816 the standard normal's 90th percentile), a shape the token counts of instruction
datasets roughly follow; ``mean`` (when given) sets the tokens per epoch.

Days for the dataset: ``epochs x sequences per epoch / gbs`` steps at the plan's step time.
"""
from __future__ import annotations

import bisect
import json
import math
from pathlib import Path
from typing import NamedTuple

from ..errors import PartitaError

#: Quantile points that stand for a summary's distribution, and the most samples packed one
#: by one (beyond, an evenly spaced subsample of the sorted lengths stands for them).
SUMMARY_POINTS = 4000
MAX_PACKED = 200_000
_Z90 = 1.2815515655446004  # the standard normal's 90th percentile
_LENGTH_KEYS = ("length", "num_tokens", "n_tokens", "tokens", "input_ids")


class SeqLengths(NamedTuple):
    """A dataset's sample lengths in tokens (or quantiles standing for them), its sample
    count and mean length, and where they came from (for messages)."""

    lengths: tuple[int, ...]
    samples: int
    mean: float
    source: str


def read_seq_lengths(text: str) -> SeqLengths:
    """The ``--seq-lengths`` value: a summary ``p50=..,p90=..`` or a file of lengths."""
    if "=" in text and not Path(text).exists():
        return _summary(text)
    path = Path(text)
    if not path.is_file():
        raise PartitaError(f"--seq-lengths {text}: no such file; give a file of token counts (one per line or "
                           "JSONL) or a summary such as p50=480,p90=1400,samples=50000")
    lengths = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if line.strip():
            lengths.append(_length(line, f"--seq-lengths {text} line {n}"))
    if not lengths:
        raise PartitaError(f"--seq-lengths {text}: no lengths in the file; give one token count per line")
    return SeqLengths(tuple(lengths), len(lengths), sum(lengths) / len(lengths), str(path))


def _length(line: str, where: str) -> int:
    try:
        value = json.loads(line)
    except ValueError:
        value = line.strip()
    if isinstance(value, dict):
        key = next((k for k in _LENGTH_KEYS if k in value), None)
        if key is None:
            raise PartitaError(f"{where}: an object needs one of the fields {', '.join(_LENGTH_KEYS)}")
        value = value[key]
    if isinstance(value, list):
        value = len(value)
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise PartitaError(f"{where}: {str(value)[:40]!r} is not a token count; give a positive integer") from None
    if isinstance(value, bool) or number <= 0 or number != float(value):
        raise PartitaError(f"{where}: {str(value)[:40]!r} is not a token count; give a positive integer")
    return number


def _summary(text: str) -> SeqLengths:
    fields = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, _, value = item.partition("=")
        try:
            fields[key.strip().lower()] = float(value)
        except ValueError:
            raise PartitaError(f"--seq-lengths {text}: {item!r} must be key=number") from None
    unknown = sorted(set(fields) - {"p50", "p90", "mean", "samples"})
    if unknown or "p50" not in fields or "p90" not in fields:
        raise PartitaError(f"--seq-lengths {text}: a summary needs p50 and p90 (and may give mean, samples), "
                           f"e.g. p50=480,p90=1400,samples=50000" + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
    p50, p90 = fields["p50"], fields["p90"]
    if not 0 < p50 <= p90 or not all(math.isfinite(v) and v > 0 for v in fields.values()):
        raise PartitaError(f"--seq-lengths {text}: needs 0 < p50 <= p90 and positive values")
    sigma = math.log(p90 / p50) / _Z90
    points = [_lognormal_quantile(p50, sigma, (i + 0.5) / SUMMARY_POINTS) for i in range(SUMMARY_POINTS)]
    lengths = tuple(max(1, round(x)) for x in points)
    mean = fields.get("mean", p50 * math.exp(sigma * sigma / 2))
    samples = int(fields.get("samples", SUMMARY_POINTS))
    return SeqLengths(lengths, samples, mean, "summary " + text)


def _lognormal_quantile(median: float, sigma: float, q: float) -> float:
    return median * math.exp(sigma * _normal_quantile(q))


def _normal_quantile(q: float) -> float:
    """The standard normal's quantile (Acklam's rational approximation, relative error < 1.2e-9)."""
    a = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02,
         -3.066479806614716e+01, 2.506628277459239e+00)
    b = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01,
         -1.328068155288572e+01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00,
         4.374664141464968e+00, 2.938163982698783e+00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00)
    if q < 0.02425 or q > 1 - 0.02425:
        t = math.sqrt(-2 * math.log(min(q, 1 - q)))
        x = (((((c[0] * t + c[1]) * t + c[2]) * t + c[3]) * t + c[4]) * t + c[5]) / \
            ((((d[0] * t + d[1]) * t + d[2]) * t + d[3]) * t + 1)
        return x if q < 0.5 else -x
    t = q - 0.5
    r = t * t
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * t / \
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


def packed_sequences(lengths: list[int], seq_len: int) -> int:
    """Sequences of ``seq_len`` that best-fit decreasing packs ``lengths`` (each at most
    ``seq_len``) into: each length, longest first, goes into the sequence with the least room
    that still holds it, else a new one."""
    room: list[int] = []  # free tokens of each open sequence, sorted
    used = 0
    for n in sorted(lengths, reverse=True):
        i = bisect.bisect_left(room, n)
        if i < len(room):
            left = room.pop(i) - n
        else:
            used += 1
            left = seq_len - n
        if left > 0:
            bisect.insort(room, left)
    return used


class Packing(NamedTuple):
    """What a dataset makes of a plan's sequences (module docstring)."""

    tokens_per_epoch: float  # sum(min(L, S)): the tokens trained on per epoch
    padded_sequences: float  # one sample per sequence
    packed_sequences: float  # best-fit decreasing
    truncated: float  # samples longer than the sequence (cut to it)
    seq_len: int

    @property
    def padded_efficiency(self) -> float:
        return self.tokens_per_epoch / (self.padded_sequences * self.seq_len)

    @property
    def packed_efficiency(self) -> float:
        return self.tokens_per_epoch / (self.packed_sequences * self.seq_len)


def packing(data: SeqLengths, seq_len: int) -> Packing:
    """:class:`Packing` of ``data`` at ``seq_len``: the packed fraction from its lengths (an
    evenly spaced subsample of at most :data:`MAX_PACKED` of them), scaled to its sample count;
    a summary's ``mean`` (when given) sets the tokens, cut to the sequence."""
    cut = sorted(min(n, seq_len) for n in data.lengths)
    sample = cut[::max(1, math.ceil(len(cut) / MAX_PACKED))]
    packed_fill = sum(sample) / (packed_sequences(sample, seq_len) * seq_len)
    kept = sum(cut) / len(cut)
    if len(data.lengths) != data.samples or data.mean != sum(data.lengths) / len(data.lengths):
        kept = min(kept * data.mean / (sum(data.lengths) / len(data.lengths)), seq_len)
    tokens = kept * data.samples
    truncated = sum(1 for n in data.lengths if n > seq_len) * data.samples / len(cut)
    return Packing(tokens, float(data.samples), tokens / (packed_fill * seq_len), truncated, seq_len)


def days_for(step_time_s: float, gbs: int, sequences: float, epochs: float) -> float:
    """Days for ``epochs`` passes over ``sequences`` sequences at ``gbs`` per step."""
    return epochs * sequences / gbs * step_time_s / 86400
