"""80 % intervals on ``partita serve``'s TTFT, TPOT and throughput, from published serving runs.

Where the numbers come from. ``bench/serve_published.py`` predicts every row of
``data/published_serving.csv`` (published vLLM, SGLang and TensorRT-LLM benchmarks, each with
its source and quoted line) with the serving model - nothing is fitted on those rows, so every
residual is out of sample - and stores the sorted log residuals ``r = ln(measured /
predicted)`` per metric in ``catalog/serve_intervals.json``. Planning only reads that table.

The interval is split conformal, equal-tailed, exactly as :mod:`partita.uncertainty` builds
the training intervals (Vovk et al. 2005; Lei et al. 2018, "Distribution-free predictive
inference for regression", sec. 2.2): ``[pred x exp(r_(lo)), pred x exp(r_(hi))]`` with the
order statistics ``lo = floor((n + 1) 0.1)`` and ``hi = ceil((n + 1) 0.9)`` of the metric's
``n`` residuals. If the next deployment errs like the published ones did, the interval holds
its figure with probability >= 80 %; the coverage measured leave-one-source-out is stored
beside the residuals (``loso_coverage``) and quoted in docs/serve.md. A residual table that
does not straddle 0 gives an interval that does not contain the point estimate: the model
is biased on that metric, and the interval says by how much.

Throughput residuals (``out_tok_s``) bound the capacity and the goodput alike (both are the
layout's saturated output rate, in requests or tokens).
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..uncertainty import LEVEL, Residuals

INTERVALS_FILE = Path(__file__).resolve().parents[1] / "catalog" / "serve_intervals.json"
#: the metrics with residuals: time to first token, time per output token, output tokens/s
METRICS = ("ttft_s", "tpot_s", "out_tok_s")


def bounds_from(values: list[float] | tuple[float, ...], level: float = LEVEL) -> tuple[float, float]:
    """Split-conformal log bounds of a sample of residuals (:meth:`Residuals.bounds`)."""
    return Residuals("sample", tuple(sorted(values))).bounds(level)


@lru_cache(maxsize=2)
def _table(path: str) -> dict[str, Any]:
    raw = json.loads(Path(path).read_text())
    raw["residuals"] = {m: Residuals(m, tuple(sorted(c["residuals"])), int(c.get("sources", 0)))
                        for m, c in raw["metrics"].items()}
    return raw


def table(path: Path | None = None) -> dict[str, Any]:
    """The stored residual table (``catalog/serve_intervals.json``), read once."""
    return _table(str(path or INTERVALS_FILE))


def _scaled(value: float, metric: str, tab: dict[str, Any]) -> list[float] | None:
    if value is None or not (0 < value < float("inf")):
        return None
    lo, hi = tab["residuals"][metric].bounds(tab["level"])
    import math
    return [value * math.exp(lo), value * math.exp(hi)]


def serve_interval(ttft_s: float, tpot_s: float, capacity_rps: float, goodput: float,
                   path: Path | None = None) -> dict[str, Any]:
    """The 80 % interval of one layout's figures (None where the figure is not finite)."""
    tab = table(path)
    cov = tab.get("loso_coverage", {}).get("all", {})
    return {"level": tab["level"],
            "ttft_s": _scaled(ttft_s, "ttft_s", tab),
            "tpot_s": _scaled(tpot_s, "tpot_s", tab),
            "capacity_rps": _scaled(capacity_rps, "out_tok_s", tab),
            "goodput_tokens_per_s_per_device": _scaled(goodput, "out_tok_s", tab),
            "rows": {m: len(tab["residuals"][m].values) for m in METRICS},
            "loso_coverage": (cov.get("inside", 0) / cov["rows"]) if cov.get("rows") else None,
            "method": "split conformal on out-of-sample residuals of published serving benchmarks "
                      "(data/published_serving.csv, bench/serve_published.py)"}
