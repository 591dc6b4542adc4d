"""80 % intervals on ``partita serve``'s TTFT, TPOT and throughput, from published serving runs.

Where the numbers come from. ``bench/serve_published.py`` predicts every row of
``data/published_serving.csv`` (published vLLM, vLLM-Ascend, SGLang, MindIE, TensorRT-LLM and
torchair benchmarks on GPUs and Ascend NPUs, each with its source and quoted line) with the
serving model - nothing is fitted on those rows, so every residual is out of sample - and
stores the sorted log residuals ``r = ln(measured / predicted)`` per metric in
``catalog/serve_intervals.json``. Planning only reads that table. A published saturated
figure is a finite burst's (the script prices its drain, :func:`.queueing.burst_rate`), so the
saturated output-rate residuals measure the step-time model's error, not the burst's; the
capacity ``partita serve`` shows is the steady state and takes those residuals.

The interval is split conformal with the absolute log residual as its score - Lei et al.
2018, "Distribution-free predictive inference for regression", sec. 2.2 (their split
conformal takes ``|Y - mu(X)|``; here ``|ln(measured / predicted)|``, a factor either way;
Vovk et al. 2005): ``[pred / exp(d), pred x exp(d)]`` with ``d`` the ``ceil(n q)``-th smallest
``|r|``, ``q = 0.8 (n_eff + 1) / n_eff``, counted in effective rows (Kish's n_eff of the
residuals clustered by source, as issue 33 defines the training intervals): with
``n_eff = n`` it is the ``ceil((n + 1) 0.8)``-th; with few independent sources ``d`` moves out
to the largest residual. Not equal-tailed, as :mod:`partita.uncertainty` builds the training
intervals: the serving sources err with both signs by source (the 910B4 torchair prefill 20-35 %
slow, the engines served through an API server 20-40 % fast), so a held-out source's sign is
not the others' - an equal-tailed TTFT interval built without the torchair rows lay wholly
above them (leave-one-source-out TTFT coverage 64 %), while the absolute score covers a
source that errs the other way by as much as the others do. If the next deployment errs by
a factor like the published ones did, the interval holds its figure with probability >=
80 %; the coverage measured leave-one-source-out is stored beside the residuals
(``loso_coverage``) and quoted in docs/serve.md.

Residual classes (:data:`CLASSES`): TTFT; TPOT at a sustained rate; TPOT at saturation; the
saturated output rate, which bounds the capacity and the goodput alike (both are the layout's
saturated output rate, in requests or tokens). A figure at a sustained rate and one with
every request queued at once err differently (the model's prefill queue and batching are
tested in the second), so one class does not borrow the other's residuals.
"""
from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..uncertainty import LEVEL, Residuals, effective_rows

INTERVALS_FILE = Path(__file__).resolve().parents[1] / "catalog" / "serve_intervals.json"
#: the metrics published rows measure: time to first token, time per output token, output tokens/s
METRICS = ("ttft_s", "tpot_s", "out_tok_s")
#: the residual classes the intervals use: a figure at a sustained rate (TTFT, TPOT) is not
#: exchangeable with one at saturation (every request at once, a static batch), so they are
#: kept apart; the capacity and goodput are saturated output rates
CLASSES = ("ttft_s", "tpot_s", "tpot_s_saturated", "out_tok_s_saturated")
SATURATED = ("saturated", "static_batch")


def interval_class(metric: str, scenario: str) -> str | None:
    """The residual class of a published figure (None: no interval uses it)."""
    name = metric + ("_saturated" if scenario in SATURATED and metric != "ttft_s" else "")
    return name if name in CLASSES else None


def residuals_of(name: str, by_source: dict[str, list[float]]) -> Residuals:
    """A class's residuals grouped by source, counted in effective rows (Kish's n_eff,
    :func:`partita.uncertainty.effective_rows`): rows of one source repeat one error, so the
    finite-sample correction counts sources' worth of rows, as the training intervals do."""
    values = tuple(sorted(x for v in by_source.values() for x in v))
    return Residuals(name, values, sum(1 for v in by_source.values() if v), effective_rows(by_source))


def absolute_bounds(res: Residuals, level: float = LEVEL) -> tuple[float, float]:
    """Split-conformal log bounds ``(-d, d)`` on the absolute residual (module docstring):
    ``d`` is the ``ceil(n q)``-th smallest ``|r|``, ``q = level (n_eff + 1) / n_eff``, the
    largest past the sample - with ``n_eff = n`` the ``ceil((n + 1) level)``-th (Lei et al.
    2018 sec. 2.2)."""
    mags = sorted(abs(x) for x in res.values)
    n, units = len(mags), res.units
    k = math.ceil(n * level * (units + 1) / units - 1e-9)
    d = mags[min(max(k, 1), n) - 1]
    return -d, d


def bounds_from(by_source: dict[str, list[float]], level: float = LEVEL) -> tuple[float, float]:
    """Split-conformal log bounds of residuals grouped by source (:func:`absolute_bounds`)."""
    return absolute_bounds(residuals_of("sample", by_source), level)


@lru_cache(maxsize=2)
def _table(path: str) -> dict[str, Any]:
    raw = json.loads(Path(path).read_text())
    raw["residuals"] = {m: Residuals(m, tuple(sorted(c["residuals"])), int(c.get("sources", 0)),
                                     float(c.get("effective", 0.0)))
                        for m, c in raw["metrics"].items()}
    return raw


def table(path: Path | None = None) -> dict[str, Any]:
    """The stored residual table (``catalog/serve_intervals.json``), read once."""
    return _table(str(path or INTERVALS_FILE))


def _scaled(value: float, cls: str, tab: dict[str, Any]) -> list[float] | None:
    if value is None or not 0 < value < math.inf:
        return None
    lo, hi = absolute_bounds(tab["residuals"][cls], tab["level"])
    return [value * math.exp(lo), value * math.exp(hi)]


def serve_interval(ttft_s: float, tpot_s: float, capacity_rps: float, goodput: float, stable: bool = True,
                   path: Path | None = None) -> dict[str, Any]:
    """The 80 % interval of one layout's figures (None where the figure is not finite). TTFT
    and TPOT of a layout that sustains the rate take the sustained-rate residuals; an
    overloaded layout's TPOT (shown near its capacity) the saturated ones."""
    tab = table(path)
    cov = tab.get("loso_coverage", {}).get("all", {})
    return {"level": tab["level"],
            "ttft_s": _scaled(ttft_s, "ttft_s", tab),
            "tpot_s": _scaled(tpot_s, "tpot_s" if stable else "tpot_s_saturated", tab),
            "capacity_rps": _scaled(capacity_rps, "out_tok_s_saturated", tab),
            "goodput_tokens_per_s_per_device": _scaled(goodput, "out_tok_s_saturated", tab),
            "rows": {c: len(tab["residuals"][c].values) for c in CLASSES},
            "loso_coverage": (cov.get("inside", 0) / cov["rows"]) if cov.get("rows") else None,
            "method": "split conformal on out-of-sample residuals of published serving benchmarks "
                      "(data/published_serving.csv, bench/serve_published.py)"}
