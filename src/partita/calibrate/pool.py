"""``partita calibrate --pool a.json b.json ... -o c.json``: one hardware file from several calibrations.

Why: on a shared machine one calibration's framework terms move as much as their own values
between two runs minutes apart (2-vCPU VM, three quiet calibrations back to back:
``tp_framework_us_per_layer`` 15.0 -> 33.5 ms, ``ep_framework_us_per_layer`` 0.17 -> 2.7 ms;
docs/calibrate.md, "Pooling calibrations"): the machine's speed moves at the scale of a
launch, and each term of one calibration is read from a few launches. Each launch is one
sample of that state; the median over several calibrations, taken at different moments, is a
figure no single burst decides - the same reasoning as the repeats inside one calibration
(a median of repeats), one level up.

How: where every file carries its raw measurements (``calibration.raw`` as ``partita
calibrate`` writes it), the measurements are pooled - each measured quantity's samples from
every calibration together, its median re-taken (:func:`pool_measurements`) - and the file is
fitted once from them (:func:`partita.calibrate.hardware_file.hardware_file`). A term is a
small residual on a large step (the base per-layer overhead is 36 us of a ~150 ms increment
per us): one calibration whose launches met a burst reads it 5x too high, and the median of
four files' *fitted values* then averages a good and a bad one (loop run 34: 1125 / 254 /
660 / 1875 us -> 892 us; predictions median 10 %, worst 30 %). The median of the twenty
pooled increments is decided by the calibrations' quiet launches (run 34 refitted: median
6.5 %, worst 15 %; docs/calibrate.md "Pooling calibrations"). Each pooled term keeps every
file's own value (``pooled_values``) and their spread (``between_spread``, half the IQR), so
a disagreement between calibrations stays visible.

Files without raw measurements (a pooled file, a hand-written one) are pooled field by field
instead (pure functions, no torch: tests feed them synthetic files):

* every numeric field the cost model reads (``peak_tflops``, ``memory``, ``intra_node``,
  ``efficiency``, ``eager_decode``) -> the median of the files' written values (a clamped term
  enters as its written value, so the pooled field is what the cost model would read from the
  median calibration);
* each collective fit (``collectives.<kind>``, per group size) -> the median latency and
  bandwidth of the files that fitted that kind and group;
* each term record (``calibration.terms``) with a ``value`` -> a record whose value is the
  median of the files' values (signed: a negative term stays visible), whose spread is half
  the inter-quartile range of those values (the spread *between* calibrations, the figure
  pooling is meant to shrink), with every file's value listed under ``pooled_values``.

Every file must extend the same base device with the same dtype and process count: pooling a
2-process fit with a 4-process one would mix group sizes the cost model reads apart.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..errors import PartitaError

#: top-level sections whose numeric leaves are pooled by their median
POOLED_SECTIONS = ("peak_tflops", "memory", "intra_node", "efficiency", "eager_decode")


def half_iqr(values: list[float]) -> float:
    """Half the inter-quartile range (the spread calibrate prints for its repeats); 0 for one value."""
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return (q[2] - q[0]) / 2


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _median_tree(trees: list) -> object:
    """The median of every numeric leaf present in all ``trees`` (dicts recursed; a leaf that
    is not a number in every tree keeps the first tree's value)."""
    first = trees[0]
    if isinstance(first, dict):
        keys = [k for k in first if all(isinstance(t, dict) and k in t for t in trees)]
        return {k: _median_tree([t[k] for t in trees]) for k in keys}
    if all(_is_number(t) for t in trees):
        return statistics.median(trees)
    return first


def collectives_problem(collectives: object) -> str:
    """What is wrong with a file's ``collectives`` section for pooling ("" when it is as
    ``partita calibrate`` writes it: ``{kind: [{"group": int, ...}, ...]}``); a hand-edited
    file otherwise reaches :func:`_pool_collectives` as a TypeError or KeyError."""
    if not isinstance(collectives, dict):
        return f"is a {type(collectives).__name__}, not a mapping"
    for kind, fits in collectives.items():
        if not isinstance(fits, list) or not all(isinstance(f, dict) for f in fits):
            return f"{kind!r} is not a list of fits"
        if not all(isinstance(f.get("group"), int) and not isinstance(f.get("group"), bool) for f in fits):
            return f"{kind!r} has a fit without an integer 'group'"
    return ""


def _pool_collectives(files: list[dict]) -> dict:
    """Per kind and group size: the median latency and bandwidth of the files that fitted them."""
    out: dict = {}
    kinds = {k for f in files for k in f.get("collectives", {})}
    for kind in sorted(kinds):
        groups: dict[int, list[dict]] = {}
        for f in files:
            for fit in f.get("collectives", {}).get(kind, []):
                groups.setdefault(fit["group"], []).append(fit)
        fits = []
        for group, rows in sorted(groups.items()):
            fit = dict(rows[0])
            for key in ("latency_us", "gbps", "worst_rel_error", "spread_rel"):
                values = [r[key] for r in rows if _is_number(r.get(key))]
                if values:
                    fit[key] = statistics.median(values)
            fit["pooled_from"] = len(rows)
            fits.append(fit)
        out[kind] = fits
    return out


def _pool_terms(files: list[dict], names: list[str]) -> dict:
    terms_per_file = [f.get("calibration", {}).get("terms", {}) for f in files]
    out: dict = {}
    for name, first in terms_per_file[0].items():
        records = [t[name] for t in terms_per_file if name in t]
        if "value" in first and all(_is_number(r.get("value")) for r in records):
            values = [r["value"] for r in records]
            record = {k: v for k, v in first.items() if k not in ("samples", "clamped_to", "note")}
            record.update(value=statistics.median(values), spread=half_iqr(values),
                          repeats=sum(r.get("repeats", 0) for r in records), pooled_values=values,
                          within_spreads=[r.get("spread") for r in records],
                          method=f"median of {len(records)} calibrations (partita calibrate --pool); each: "
                                 f"{first.get('method', '')}")
            clamped = [r["clamped_to"] for r in records if "clamped_to" in r]
            if record["value"] < 0 and name.startswith("efficiency."):
                record["clamped_to"] = 0.0
                record["note"] = "negative pooled value: written as 0"
            elif clamped and len(clamped) == len(records) and len(set(clamped)) == 1:
                record["clamped_to"] = clamped[0]
                record["note"] = first.get("note", "outside its range: written clamped")
            out[name] = record
        else:
            out[name] = first
    return out


#: the raw sections a calibration must carry to be pooled by its measurements
RAW_SECTIONS = ("gemm", "copy", "runtime")


def _concat(trees: list, path: str = "") -> object:
    """The union of ``trees``' samples, recursively (see :func:`pool_measurements`)."""
    first = trees[0]
    if isinstance(first, dict):
        out = {k: _concat([t[k] for t in trees], f"{path}.{k}") for k in first
               if all(isinstance(t, dict) and k in t for t in trees)}
        if "samples" in out and _is_number(first.get("seconds")):
            out["seconds"] = statistics.median(out["samples"])
            if "spread" in first:  # as measure_collectives writes it: half the range of its repeats
                out["spread"] = (max(out["samples"]) - min(out["samples"])) / 2
        return out
    if isinstance(first, list):
        if all(_is_number(x) for t in trees for x in t):
            return [x for t in trees for x in t]
        if all(isinstance(x, dict) for t in trees for x in t):  # rows of one measured quantity each
            keys = [[_row_key(x) for x in t] for t in trees]
            if any(k != keys[0] for k in keys):
                raise PartitaError(f"--pool: the calibrations measured different {path.lstrip('.')} rows "
                                   "(written by different partita versions?); pool files of one version")
            return [_concat(list(rows), path) for rows in zip(*trees)]
        return [x for t in trees for x in t] if all(isinstance(t, list) for t in trees) else first
    if path.endswith(".repeats"):
        return sum(trees) if all(_is_number(t) for t in trees) else first
    return first


def _row_key(row: dict) -> tuple:
    """What a measured row is (its shape, collective, group and size), not what it measured."""
    return tuple((k, json.dumps(v)) for k, v in sorted(row.items())
                 if k not in ("seconds", "samples", "spread", "gap_s"))


def pool_measurements(raws: list[dict]) -> dict:
    """One raw record from several calibrations' ``calibration.raw``: every measured quantity's
    samples from all of them (in file order), its ``seconds`` the median of the union. A
    micro-run's samples and its longer run's stay paired (each calibration contributes as many
    of one as of the other). ``repeats`` is the sum."""
    return _concat(raws)


def _has_measurements(f: dict) -> bool:
    raw = f.get("calibration", {}).get("raw", {})
    return isinstance(raw, dict) and all(k in raw for k in RAW_SECTIONS)


def _refit(files: list[dict], names: list[str], name: str | None) -> dict:
    """The file fitted once from the pooled measurements, each term keeping every file's value."""
    from .hardware_file import hardware_file
    first = files[0]
    out = hardware_file(pool_measurements([f["calibration"]["raw"] for f in files]), first.get("extends", "cpu"),
                        name or first.get("name", "calibrated"))
    own = [f["calibration"]["terms"] for f in files]
    for term_name, record in out["calibration"]["terms"].items():
        values = [t[term_name]["value"] for t in own if _is_number(t.get(term_name, {}).get("value"))]
        if "value" in record and len(values) == len(files):
            record.update(pooled_values=values, between_spread=half_iqr(values),
                          method=f"one fit to the samples of {len(files)} calibrations (partita calibrate --pool); "
                                 f"{record.get('method', '')}")
    out["calibration"]["pooled_from"] = list(names)
    out["description"] = (f"{first.get('extends', 'cpu')} calibrated by `partita calibrate`, the measurements of "
                          f"{len(files)} calibrations pooled ({', '.join(names)})")
    return out


def pool_calibrations(files: list[dict], names: list[str], name: str | None = None) -> dict:
    """One hardware file from several calibrated ``files`` (parsed JSON; ``names`` label them in
    the provenance): one fit to their pooled measurements where every file carries them, else
    the median of each field and term (module docstring)."""
    if len(files) < 2:
        raise PartitaError("--pool needs two or more calibrated files (the median of one is itself)")
    for f, path in zip(files, names):
        if "calibration" not in f or "terms" not in f.get("calibration", {}):
            raise PartitaError(f"--pool {path}: not a file written by partita calibrate (no calibration.terms)")
        if collectives_problem(f.get("collectives", {})):
            raise PartitaError(f"--pool {path}: collectives {collectives_problem(f['collectives'])} (partita calibrate "
                               "writes a mapping of kind -> list of fits, each with an integer 'group')")
    keys = [(f.get("extends"), f["calibration"].get("raw", {}).get("dtype"), f["calibration"].get("raw", {}).get("world"))
            for f in files]
    if len(set(keys)) > 1:
        detail = ", ".join(f"{p}: base {k[0]}, {k[1]}, {k[2]} processes" for p, k in zip(names, keys))
        raise PartitaError(f"--pool mixes calibrations of different bases, dtypes or process counts ({detail})")
    if all(_has_measurements(f) for f in files):
        try:
            return _refit(files, names, name)
        except (TypeError, KeyError, ValueError, IndexError, ZeroDivisionError, AttributeError) as e:
            raise PartitaError(f"--pool: the files' raw measurements (calibration.raw) cannot be fitted - a damaged or "
                               f"hand-edited file? ({type(e).__name__}: {str(e)[:80]}); pool files as partita calibrate "
                               "wrote them") from None
    first = files[0]
    out = {k: v for k, v in first.items() if k not in POOLED_SECTIONS + ("collectives", "calibration",
                                                                         "efficiency_provenance")}
    for section in POOLED_SECTIONS:
        present = [f[section] for f in files if section in f]
        if len(present) == len(files):
            out[section] = _median_tree(present)
        elif section in first:
            out[section] = first[section]
    if any("collectives" in f for f in files):
        out["collectives"] = _pool_collectives(files)
    terms = _pool_terms(files, names)
    provenance = dict(first.get("efficiency_provenance", {}))
    for field in out.get("efficiency", {}):
        term = terms.get(f"efficiency.{field}")
        what = (f"{term['value']:.4g} +- {term['spread']:.2g} {term.get('unit', '')} between calibrations"
                if term and "value" in term else "")
        provenance[field] = f"pooled: median of {len(files)} calibrations ({', '.join(names)}) {what}".rstrip()
    out["efficiency_provenance"] = provenance
    raw = first["calibration"].get("raw", {})
    out["calibration"] = {"terms": terms,
                          "raw": {k: raw[k] for k in ("device", "dtype", "world", "clock") if k in raw},
                          "pooled_from": list(names)}
    if name:
        out["name"] = name
    out["description"] = f"median of {len(files)} calibrations by `partita calibrate` ({', '.join(names)})"
    return out


def pool_files(paths: list[str], name: str | None = None) -> dict:
    """:func:`pool_calibrations` of the files at ``paths`` (a missing or unreadable one: one line)."""
    files = []
    for p in paths:
        try:
            files.append(json.loads(Path(p).read_text()))
        except OSError as e:
            raise PartitaError(f"--pool {p}: cannot read it ({e.strerror})") from None
        except ValueError as e:
            raise PartitaError(f"--pool {p}: not JSON ({e})") from None
        if not isinstance(files[-1], dict):
            raise PartitaError(f"--pool {p}: not a hardware file (a JSON object)")
    return pool_calibrations(files, list(paths), name)
