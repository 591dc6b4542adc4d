"""``bench/validate_published.py --worst N`` (issue 33 item 1's list of the worst out-of-sample
rows): each listed prediction is paired with its own published row, the time split lists only
rows published from the cutoff on, and the list is the tail of the error distribution.

Oracles from outside the listing: the measured value and publication date of each row as
data/published_runs.csv gives them (``published_runs.load_cases`` / ``row_date``), and the
summary figures ``out_of_sample.summary`` prints for the same predictions. Uses the stored fits
(bench/loso_fits.json), ~2 s."""
from __future__ import annotations

import subprocess
import sys

import out_of_sample as oos
import validate_published as vp
from published_runs import load_cases

FITS = oos.Fits(oos.FULL_CSV, use_stale=True)
N = 12


def test_worst_rows_pair_predictions_with_their_rows():
    """Every listed row carries its own case: the measured figure and the source, model and
    metric of a published step-time row (a misaligned pairing would print another run's
    device and layout beside an error)."""
    cases, _ = load_cases(oos.FULL_CSV)
    measured = {(c.source, c.name, c.measured) for c in cases if c.metric == "step_time_s"}
    worst = vp.worst_rows(FITS, N)
    assert set(worst) == {"time split", "leave one source out"}
    for pairs in worst.values():
        assert len(pairs) == N
        for row, case in pairs:
            assert row.metric == case.metric == "step_time_s"
            assert (case.source, case.name, case.measured) in measured
            assert (row.source, row.name, row.measured) == (case.source, case.name, case.measured)
            assert row.classes == oos.feature_classes(case)


def test_time_split_lists_only_later_rows_and_the_tail():
    """The time split's list holds only rows dated from the cutoff (2025-01) on, worst first,
    and its best listed row is still at or beyond the split's p90 (12 of 143 rows is the
    worst 8 %, inside the worst 10 %); the same for leave one source out (12 of 417)."""
    worst = vp.worst_rows(FITS, N)
    for label, rows in (("time split", oos.time_split_predictions(FITS)),
                        ("leave one source out", oos.loso_predictions(FITS))):
        listed = [abs(r.signed) for r, _ in worst[label]]
        assert listed == sorted(listed, reverse=True)
        p90 = oos.summary([r for r in rows if r.metric == "step_time_s"])["p90"]
        assert listed[-1] >= p90
    assert all(tuple(c.date) >= oos.CUTOFF for _, c in worst["time split"])


def test_worst_rejects_a_negative_count_in_one_line():
    """A negative --worst is a one-line error and exit status 2, before any fit is read."""
    res = subprocess.run([sys.executable, vp.__file__, "--worst", "-3"], capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.strip() == "--worst takes a row count >= 0, got -3"
