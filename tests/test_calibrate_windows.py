"""A micro-run's steps are read with the ranks' run share of their own repeat (issue 33 item 7:
the load moves within a calibration; one share over all repeats corrects each by the average).

Oracle: the busy clock's formula written out here by hand (rank r's interval is ``run + sleep *
rho``, ``rho`` the other rank's ``run / (run + wait)`` over the window, ``sleep = wall - run -
wait``; mean over ranks), on hand-made numbers: a quiet repeat and a loaded one."""
import pytest

from partita.calibrate.measure import busy_in_windows


def _by_hand(a: list[float], b: list[float], rho_a: float, rho_b: float) -> float:
    """Two ranks' ``[wall, run, wait]``; ``rho_x``: the share rank x ran over the window."""
    est_a = a[1] + (a[0] - a[1] - a[2]) * rho_b
    est_b = b[1] + (b[0] - b[1] - b[2]) * rho_a
    return (est_a + est_b) / 2


def test_each_repeat_reads_its_own_run_share():
    # repeat 1 (2 steps): quiet, each rank ran its whole runnable time; repeat 2 (2 steps): each
    # rank waited on a run queue as long as it ran (run share 1/2)
    quiet = [[0.10, 0.06, 0.0], [0.10, 0.06, 0.0]]
    loaded = [[0.30, 0.06, 0.06], [0.30, 0.06, 0.06]]
    per_rank = [quiet + loaded, quiet + loaded]
    got = busy_in_windows(per_rank, per=2)
    assert got[0] == pytest.approx(_by_hand(quiet[0], quiet[0], 1.0, 1.0))  # 0.10: nothing to take out
    assert got[2] == pytest.approx(_by_hand(loaded[0], loaded[0], 0.5, 0.5))  # 0.06 + 0.18 / 2 = 0.15
    # one window over both repeats reads a run share of 0.24 / 0.36 = 2/3 for every step
    whole = busy_in_windows(per_rank)
    assert whole[0] == pytest.approx(_by_hand(quiet[0], quiet[0], 2 / 3, 2 / 3))
    assert whole[2] == pytest.approx(_by_hand(loaded[0], loaded[0], 2 / 3, 2 / 3))
    assert got[0] != pytest.approx(whole[0]) and got[2] != pytest.approx(whole[2])


def test_a_short_last_window_and_unequal_ranks():
    a = [[0.2, 0.1, 0.05], [0.2, 0.05, 0.1], [0.4, 0.2, 0.0]]
    b = [[0.2, 0.15, 0.0], [0.2, 0.1, 0.05], [0.4, 0.1, 0.1]]
    got = busy_in_windows([a, b], per=2)
    rho = lambda xs: sum(x[1] for x in xs) / sum(x[1] + x[2] for x in xs)  # noqa: E731
    assert got[1] == pytest.approx(_by_hand(a[1], b[1], rho(a[:2]), rho(b[:2])))
    assert got[2] == pytest.approx(_by_hand(a[2], b[2], rho(a[2:]), rho(b[2:])))
