"""Error bars and the one meaning of "fits": 80 % intervals, ``P(fit)`` and the memory limit.

Where the numbers come from. ``bench/fit_intervals.py`` predicts every published run of
``data/published_runs.csv`` out of sample - step time with the efficiency constants
refitted on the *other* sources (``bench/fit.py``'s leave-one-source-out), peak memory
with the memory model (no memory constant is fitted on those rows) - and stores, per
feature class of the plan (:func:`step_classes`, :func:`memory_class_names`), the sorted
log residuals ``r = ln(measured / predicted)`` and their effective sample size in
``catalog/intervals.json``. Planning only reads that table: no fit runs at planning time,
nothing imports torch.

The method: split conformal prediction (Vovk et al. 2005; Lei et al. 2018, "Distribution-free
predictive inference for regression", JASA 113, sec. 2.2; Angelopoulos & Bates 2021, "A gentle
introduction to conformal prediction", sec. 1-2), its finite-sample correction counted in
*effective* rows. Rows of one source share its accounting, its software version and its
errors (the torchao Llama4-Scout memory rows are all 25 % under, the mxfp8 rows all 17 %
over), so they are not exchangeable with each other - the sources are closer to it (a new run
comes from a new source). Each class's residuals carry ``n_eff``, Kish's effective sample size
of the clustered rows (:func:`effective_rows`): near the number of sources when a source's rows
repeat one error, near the number of rows when they scatter independently.

* **80 % interval** (equal-tailed): ``[pred * exp(r_lo), pred * exp(r_hi)]``, ``r_hi`` the
  ``ceil(n q)``-th smallest of the class's ``n`` residuals with ``q = 0.9 (n_eff + 1) / n_eff``,
  ``r_lo`` its mirror image (:meth:`Residuals.bounds`; with ``n_eff = n`` the order statistics
  ``floor((n + 1) 0.1)`` and ``ceil((n + 1) 0.9)``). With ``n_eff < 9``, ``q > 1`` and the ends
  are the extreme residuals: for ``k`` exchangeable sources a new one falls within their range
  with probability ``(k - 1) / (k + 1)`` (7/9 at k = 8, the memory table).
* **P(fit)** = P(true peak <= limit) = P(r <= ln(limit / predicted)) = F(ln(limit / pred)),
  F the empirical CDF of the class's memory residuals (plotting positions
  ``(j / n) n_eff / (n_eff + 1)`` - ``j / (n + 1)`` when every row counts - linear between
  them; 0 below the smallest, 1 at and above the largest). No normal is
  assumed: the memory residuals are skewed (a cluster of MoE runs under-predicted by 25 %).
* A class stands alone when it has at least :data:`MIN_ROWS` residuals from
  :data:`MIN_SOURCES` sources and ``n_eff >= 9`` (:data:`MIN_EFFECTIVE`, the stated floor:
  below it the class's 80 % ends fall outside its sample); among the plan's classes that do,
  the best informed (largest ``n_eff``: its ends rest on the most evidence, where a thin class's
  are pushed out by its finite-sample correction - choosing the widest covered 89 % held out,
  the best informed 84 %); none: all rows pooled, whose ``n_eff`` may itself be below 9
  (memory: 8) - then the pooled extremes, stated as above.
* **Coverage is measured out of sample the same way** (``bench/fit_intervals.py``,
  :func:`fit_intervals.loso_coverage`): each source's rows against the intervals built from
  the other sources' residuals only, so no source's own rows set its interval. The figures
  are in docs/accuracy.md ("Error bars"); the target is 70-90 % for both quantities.
* A calibrated hardware file (``partita calibrate``) does *not* narrow them yet: the
  calibrated loop's residuals (``bench/predict_vs_measure.py``) are 12 plans of one machine per
  run and move 2x between runs (issue 33), too few and too unstable to stand as a class.

The one "fits" (issue 32 item 5, issue 33 item 4): the limit is the device's usable memory
(HBM less what the runtime keeps) less ``headroom`` (default :data:`DEFAULT_HEADROOM`,
0: the residuals, not a fixed margin, carry the model's error) and at most a cap;
:func:`verdict` says "fits" when the predicted peak is within it, "at risk" when it is
over but ``P(fit) >= min_p_fit`` (default :data:`DEFAULT_MIN_P_FIT`), and "DOES NOT FIT"
only when ``P(fit) < min_p_fit``. ``estimate``, ``plan``, ``import`` and the HTML report
all call it.
"""
from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

#: Fraction of usable memory kept free by default: none - the memory model already counts the
#: runtime's reservation and the allocator's slack, and P(fit) carries the model's error.
DEFAULT_HEADROOM = 0.0
#: A plan is ruled out ("does not fit") only when P(fit) is below this (issue 33: 5 %).
DEFAULT_MIN_P_FIT = 0.05
#: The interval level, fixed: the table stores residuals, the level picks order statistics.
LEVEL = 0.8
#: The fewest residuals a class needs to stand alone (else the plan falls back to all rows):
#: with 15, the 80 % interval's ends are the 1st/2nd and 15th order statistics.
MIN_ROWS = 15
#: ... from at least this many sources: one source's rows share its accounting and its errors.
MIN_SOURCES = 3
#: ... and at least this effective sample (:func:`effective_rows`): the least n_eff for which
#: the 80 % ends are inside the sample (``ceil(0.9 (n + 1)) <= n`` needs n >= 9); below it a
#: class's interval would be its extreme rows, and the plan uses all rows pooled instead.
MIN_EFFECTIVE = 9.0
INTERVALS_FILE = Path(__file__).resolve().parent / "catalog" / "intervals.json"
#: Step-time feature classes (issue 33's list), in the order they are reported.
STEP_CLASSES = ("dense", "moe", "long_context", "vpp4", "fp8", "fsdp", "ascend")
#: Memory classes: only what a whole search shares (model kind, sequence length, dtype,
#: device), so the search prices a layout's ZeRO / recompute / cp / vpp ladder against one
#: limit; vpp >= 4 and FSDP2/ZeRO-3 are step-time classes only.
MEMORY_CLASSES = ("dense", "moe", "long_context", "fp8", "ascend")
LONG_CONTEXT_TOKENS = 32768


@dataclass(frozen=True)
class MemoryLimit:
    """The memory a plan may use per device, and how it is made up (named in every verdict)."""

    hbm_gib: float
    usable_gib: float
    headroom: float = DEFAULT_HEADROOM
    cap_gib: float | None = None

    @classmethod
    def of(cls, device: Any, headroom: float | None = None, cap_gib: float | None = None) -> "MemoryLimit":
        return cls(float(device.hbm_gib), float(device.usable_gib),
                   DEFAULT_HEADROOM if headroom is None else float(headroom), cap_gib or None)

    @property
    def gib(self) -> float:
        limit = self.usable_gib * (1 - self.headroom)
        return min(limit, self.cap_gib) if self.cap_gib else limit

    def describe(self) -> str:
        """E.g. "61.0 GiB usable (64.0 GiB HBM - 3.0 GiB reserved)", with the headroom and cap when set."""
        text = (f"{self.gib:.1f} GiB usable ({self.hbm_gib:.1f} GiB HBM - {self.hbm_gib - self.usable_gib:.1f} GiB "
                "reserved")
        if self.headroom:
            text += f" - {self.headroom:.0%} headroom"
        if self.cap_gib and self.cap_gib < self.usable_gib * (1 - self.headroom):
            text += f", capped at {self.cap_gib:.1f} GiB"
        return text + ")"


@dataclass(frozen=True)
class Residuals:
    """One class's sorted out-of-sample log residuals ``ln(measured / predicted)``.

    ``effective``: the effective number of exchangeable units among them (Kish's design
    effect, :func:`effective_rows`) - rows of one source move together, so 70 rows of one
    source are worth far fewer than 70 runs; 0: every row counts (``len(values)``).
    ``sources``: how many sources the rows come from."""

    name: str
    values: tuple[float, ...]
    sources: int = 0
    effective: float = 0.0

    @property
    def units(self) -> float:
        """n_eff: the count conformal's finite-sample correction uses (module docstring)."""
        return self.effective if self.effective > 0 else float(len(self.values))

    def bounds(self, level: float = LEVEL) -> tuple[float, float]:
        """Split-conformal equal-tailed log bounds (module docstring): the upper end is the
        ``ceil(n q)``-th smallest residual, ``q = (1 - tail) (n_eff + 1) / n_eff``, the lower end
        its mirror image, the ``floor(n (1 - q)) + 1``-th; past the sample, the extreme residual.
        With ``n_eff = n`` these are the order statistics ``floor((n + 1) tail)`` and
        ``ceil((n + 1) (1 - tail))`` of Lei et al. 2018."""
        n, units = len(self.values), self.units
        q = (1 - (1 - level) / 2) * (units + 1) / units
        hi = math.ceil(n * q - 1e-9)
        lo = math.floor(n * (1 - q) + 1e-9) + 1
        return self.values[min(max(lo, 1), n) - 1], self.values[min(max(hi, 1), n) - 1]

    def _positions(self) -> list[float]:
        """Plotting positions of the sorted residuals: ``(j / n) n_eff / (n_eff + 1)`` (``j / (n + 1)``
        when every row counts)."""
        n, units = len(self.values), self.units
        return [j / n * units / (units + 1) for j in range(1, n + 1)]

    def cdf(self, x: float) -> float:
        """Empirical CDF at x: the plotting positions, linear between residuals; 0 below the
        smallest, 1 at and above the largest."""
        v = self.values
        if x < v[0]:
            return 0.0
        if x >= v[-1]:
            return 1.0
        pos = self._positions()
        i = bisect.bisect_right(v, x)  # v[i-1] <= x < v[i]
        lo, hi = v[i - 1], v[i]
        frac = (x - lo) / (hi - lo) if hi > lo else 1.0
        return pos[i - 1] + frac * (pos[i] - pos[i - 1])

    def inverse_cdf(self, p: float) -> float:
        """The least x with cdf(x) >= p (0 < p <= 1): the inverse of :meth:`cdf`."""
        v, pos = self.values, self._positions()
        if p <= pos[0]:
            return v[0]
        if p >= pos[-1]:
            return v[-1]
        i = bisect.bisect_left(pos, p)  # pos[i-1] < p <= pos[i]
        span = pos[i] - pos[i - 1]
        return v[i - 1] + ((p - pos[i - 1]) / span if span > 0 else 1.0) * (v[i] - v[i - 1])


@lru_cache(maxsize=4)
def _table(path: str) -> dict[str, dict[str, Residuals]]:
    raw = json.loads(Path(path).read_text())
    return {metric: {name: Residuals(name, tuple(sorted(c["residuals"])), int(c.get("sources", 0)),
                               float(c.get("effective_rows", 0.0)))
                     for name, c in raw[metric].items()} for metric in ("step_time", "peak_memory")}


def table(path: Path | None = None) -> dict[str, dict[str, Residuals]]:
    """The stored residual tables (``catalog/intervals.json``), read once."""
    return _table(str(path or INTERVALS_FILE))


def _is_ascend(device: Any) -> bool:
    return "ascend" in str(getattr(device, "name", "")).lower() or "ascend" in str(getattr(device, "vendor", "")).lower()


def step_classes(model: Any, plan: Any, device: Any) -> list[str]:
    """The step-time feature classes a plan belongs to (every plan is dense or MoE)."""
    out = ["moe" if getattr(model, "moe_layers", 0) else "dense"]
    if plan.seq_len >= LONG_CONTEXT_TOKENS or plan.cp > 1:
        out.append("long_context")
    if plan.pp > 1 and plan.vpp >= 4:
        out.append("vpp4")
    if plan.dtype == "fp8":
        out.append("fp8")
    if plan.zero >= 3:
        out.append("fsdp")
    if _is_ascend(device):
        out.append("ascend")
    return out


def memory_class_names(model: Any, seq_len: int, dtype: str, device: Any) -> list[str]:
    """The memory classes of a plan: only fields a whole search shares (:data:`MEMORY_CLASSES`)."""
    out = ["moe" if getattr(model, "moe_layers", 0) else "dense"]
    if seq_len >= LONG_CONTEXT_TOKENS:
        out.append("long_context")
    if dtype == "fp8":
        out.append("fp8")
    if _is_ascend(device):
        out.append("ascend")
    return out


def stands_alone(res: Residuals) -> bool:
    """Whether a class has the rows, sources and effective sample to set its own interval
    (:data:`MIN_ROWS`, :data:`MIN_SOURCES`, :data:`MIN_EFFECTIVE`)."""
    return len(res.values) >= MIN_ROWS and res.sources >= MIN_SOURCES and res.units >= MIN_EFFECTIVE - 1e-9


def effective_rows(by_source: dict[str, list[float]]) -> float:
    """Kish's effective sample size of clustered residuals: ``n / deff``, the design effect
    ``deff = 1 + (m - 1) rho`` with ``m = sum(n_s^2) / n`` the rows' mean cluster size and
    ``rho`` the intra-source correlation of the residuals, the one-way ANOVA estimator
    ``(MSB - MSW) / (MSB + (m0 - 1) MSW)``, ``m0 = (n - sum(n_s^2) / n) / (k - 1)`` (Kish 1965,
    "Survey Sampling", sec. 5.4; Donner 1986 for unequal sizes), clamped to [0, 1]. Bounded by
    the k sources below (rho = 1: each source one unit) and the n rows above (rho = 0). One
    source: 1. Why: the sources are the exchangeable units a new run is drawn like, and their
    rows repeat one error - the memory rows' rho is near 1 (35 rows are worth 8), the step
    times' well below (417 rows worth about 34)."""
    groups = [v for v in by_source.values() if v]
    n, k = sum(len(v) for v in groups), len(groups)
    if k < 2:
        return 1.0
    mean = sum(sum(v) for v in groups) / n
    means = [sum(v) / len(v) for v in groups]
    msb = sum(len(v) * (mu - mean) ** 2 for v, mu in zip(groups, means)) / (k - 1)
    msw = sum((x - mu) ** 2 for v, mu in zip(groups, means) for x in v) / (n - k) if n > k else 0.0
    sq = sum(len(v) ** 2 for v in groups) / n
    m0 = (n - sq) / (k - 1)
    denom = msb + (m0 - 1) * msw
    rho = min(1.0, max(0.0, (msb - msw) / denom)) if denom > 0 else 1.0
    return min(float(n), max(float(k), n / (1 + (sq - 1) * rho)))


def pick(classes: list[str], metric: str, path: Path | None = None,
         tab: dict[str, Residuals] | None = None) -> Residuals:
    """The residuals a plan is judged by: of its classes that stand alone (:func:`stands_alone`),
    the best informed (largest n_eff), else all rows (``tab``: a metric's table built in
    memory, as bench/fit_intervals.py's check does)."""
    tab = table(path)[metric] if tab is None else tab
    usable = [tab[c] for c in classes if c in tab and stands_alone(tab[c])]
    if not usable:
        return tab["all"]
    return max(usable, key=lambda r: (r.units, r.name))


def memory_residuals(model: Any, seq_len: int, dtype: str, device: Any) -> Residuals:
    return pick(memory_class_names(model, seq_len, dtype, device), "peak_memory")


def p_fit(peak_gib: float, limit_gib: float, residuals: Residuals) -> float:
    """P(true peak <= limit) = F(ln(limit / predicted peak)) (module docstring)."""
    if peak_gib <= 0:
        return 1.0
    if limit_gib <= 0:
        return 0.0
    return residuals.cdf(math.log(limit_gib / peak_gib))


def admission_limit(limit_gib: float, residuals: Residuals, min_p_fit: float = DEFAULT_MIN_P_FIT) -> float:
    """The largest predicted peak with P(fit) >= min_p_fit: limit * exp(-F^-1(min_p_fit)).
    The search compares a peak with it instead of computing P(fit) per candidate."""
    if min_p_fit <= 0:
        return float("inf")
    return limit_gib * math.exp(-residuals.inverse_cdf(min_p_fit))


def interval(value: float, residuals: Residuals, level: float = LEVEL) -> tuple[float, float]:
    """The ``level`` prediction interval of a predicted ``value`` (module docstring)."""
    lo, hi = residuals.bounds(level)
    return value * math.exp(lo), value * math.exp(hi)


def confident_limit(limit_gib: float, residuals: Residuals) -> float:
    """The largest predicted peak with P(fit) = 1: limit * exp(-largest residual)."""
    return limit_gib * math.exp(-residuals.values[-1])


def risk_adjusted(step_time_s: float, p: float) -> float:
    """The search's ranking key: step time / P(fit). Read as the expected time per step that
    survives when a plan that runs out of memory must be tried again elsewhere: a plan that
    fits with probability p costs 1/p tries. P(fit) = 1 leaves the step time as it is; 0.9 adds
    11 %, 0.5 doubles it. Never below the step time, so a step-time lower bound bounds it too."""
    return step_time_s / max(p, 1e-9)


def verdict_kind(peak_gib: float, limit_gib: float, p: float, min_p_fit: float = DEFAULT_MIN_P_FIT) -> str:
    """ "fits" (predicted peak within the limit and P(fit) >= min), "at risk" (over the limit,
    P(fit) >= min), "does not fit" (P(fit) < min) - the only three answers."""
    if p < min_p_fit:
        return "does not fit"
    return "fits" if peak_gib <= limit_gib else "at risk"


def verdict(peak_gib: float, limit: MemoryLimit, p: float, where: str,
            min_p_fit: float = DEFAULT_MIN_P_FIT, mem_range: tuple[float, float] | None = None) -> str:
    """The one wording of the memory verdict, the limit and its make-up named, e.g.
    "fits: peak 57.9 GiB [54-63] on each device <= 61.0 GiB usable (64.0 GiB HBM - 3.0 GiB
    reserved), P(fit) 0.71"."""
    kind = verdict_kind(peak_gib, limit.gib, p, min_p_fit)
    rng = f" [{mem_range[0]:.0f}-{mem_range[1]:.0f}]" if mem_range else ""
    rel = "<=" if peak_gib <= limit.gib else ">"
    head = {"fits": "fits", "at risk": f"at risk (OOM risk {1 - p:.0%})",
            "does not fit": f"DOES NOT FIT (P(fit) < {min_p_fit:g})"}[kind]
    return f"{head}: peak {peak_gib:.1f} GiB{rng} on {where} {rel} {limit.describe()}, P(fit) {p:.2f}"
