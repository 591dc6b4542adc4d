"""Published serving benchmarks (data/published_serving.csv), the figures docs/serve.md quotes
from them, and the 80 % intervals ``partita serve`` derives from them.

Oracles: each row's quoted source line (the number must be in it), the catalog's own model
registry and device files, an order-statistic computation written out here (not
:mod:`partita.uncertainty`'s), and the script's recomputation for the stored tables."""
from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest

from conftest import load_script
from partita.uncertainty import effective_rows

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "data" / "published_serving.csv"
DOC = ROOT / "docs" / "serve.md"
STORED = ROOT / "src" / "partita" / "catalog" / "serve_intervals.json"


def _bench():
    return load_script(ROOT / "bench" / "serve_published.py", "serve_published")


@pytest.fixture(scope="module")
def bench():
    return _bench()


@pytest.fixture(scope="module")
def rows(bench):
    return bench.predict_all()


def _records():
    with CSV.open(newline="") as f:
        return list(csv.DictReader(f))


def test_every_row_has_a_source_a_url_and_a_quote_holding_its_number():
    recs = _records()
    assert len(recs) >= 30 and len({r["source"] for r in recs}) >= 4
    for r in recs:
        assert r["source"] and r["url"].startswith("https://github.com/") and r["quote"], r
        value = float(r["value"])
        shown = value * 1e3 if r["metric"] in ("ttft_s", "tpot_s") else value  # sources print ms
        numbers = [float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*\.?\d*", r["quote"])]
        assert any(math.isclose(n, shown, rel_tol=1e-6) for n in numbers), (shown, r["quote"])


def test_rows_name_a_registry_model_a_catalog_device_and_a_known_scenario():
    from partita.models.registry import resolve_model
    from partita.spec.hardware import load_device
    for r in _records():
        resolve_model(r["model"]).spec()
        load_device(r["hardware"])
        assert r["scenario"] in ("single_prefill", "batch_prefill", "batch_decode", "static_batch", "poisson",
                                 "saturated", "concurrency")
        assert r["metric"] in ("ttft_s", "tpot_s", "out_tok_s") and float(r["value"]) > 0
        assert int(r["tp"]) * int(r["pp"]) >= 1 and int(r["prompt_len"]) >= 1 and int(r["output_len"]) >= 1


def test_an_ascend_source_is_among_them():
    assert any(r["hardware"].startswith("ascend") for r in _records())


def test_the_docs_table_is_what_the_script_computes(bench, rows):
    """docs/serve.md quotes the per-source errors; a change to the serving model must rerun
    `python bench/serve_published.py --markdown` and paste the table (and `--write`)."""
    table = bench.markdown_table(rows)
    assert table in DOC.read_text(), "docs/serve.md's published-serving table is stale: rerun the script"


def test_stored_residuals_are_the_scripts_out_of_sample_residuals(bench, rows):
    stored = json.loads(STORED.read_text())
    fresh = json.loads(json.dumps(bench.table_json(rows)))
    assert stored == fresh, "rerun: python bench/serve_published.py --write"


def _conformal(values, level=0.8, n_eff=None):
    """Split-conformal bounds on the absolute residual, written out (Lei et al. 2018 sec. 2.2:
    the ``ceil((n + 1)(1 - alpha))``-th smallest ``|r|``), the finite-sample correction counted
    in ``n_eff`` units (issue 33: Kish's n_eff)."""
    v, n = sorted(abs(x) for x in values), len(values)
    u = n_eff or n
    k = min(n, max(1, math.ceil(n * level * (u + 1) / u - 1e-9)))
    return -v[k - 1], v[k - 1]


def test_conformal_ends_are_lei_et_al_order_statistics_when_every_row_counts():
    values = [(-1) ** i * i for i in range(1, 21)]  # |r| = 1..20, n = 20: ceil(21 x 0.8) = 17th
    assert _conformal(values) == (-17, 17)
    from partita.serve.intervals import absolute_bounds
    from partita.uncertainty import Residuals
    assert absolute_bounds(Residuals("x", tuple(sorted(values)))) == (-17, 17)
    # few independent sources: the finite-sample correction reaches the largest |r|
    assert absolute_bounds(Residuals("x", tuple(sorted(values)), 2, 2.0)) == (-20, 20)


def test_loso_coverage_recomputed_by_hand(bench, rows):
    stored = json.loads(STORED.read_text())["loso_coverage"]
    total = inside = 0
    for cls in ("ttft_s", "tpot_s", "tpot_s_saturated", "out_tok_s_saturated"):
        mine = [r for r in rows if r.cls == cls]
        hit = n = 0
        for src in {r.source for r in mine}:
            groups = {}
            for r in mine:
                if r.source != src:
                    groups.setdefault(r.source, []).append(math.log(r.measured / r.predicted))
            others = [x for v in groups.values() for x in v]
            if len(others) < 2:
                continue
            lo, hi = _conformal(others, n_eff=effective_rows(groups))
            for r in mine:
                if r.source == src:
                    n += 1
                    hit += lo <= math.log(r.measured / r.predicted) <= hi
        assert (stored[cls]["inside"], stored[cls]["rows"]) == (hit, n), cls
        total, inside = total + n, inside + hit
    assert (stored["all"]["inside"], stored["all"]["rows"]) == (inside, total)


def test_serve_interval_scales_the_point_by_the_conformal_bounds():
    from partita.serve.intervals import serve_interval
    stored = json.loads(STORED.read_text())["metrics"]
    for cls, c in stored.items():  # the stored n_eff is Kish's of the stored rows' sources (>= sources)
        assert c["sources"] <= c["effective"] + 1e-9 <= c["rows"] + 1e-9, cls
    iv = serve_interval(0.2, 0.03, 4.0, 500.0, stable=True)
    assert iv["level"] == 0.8
    for key, point, cls in (("ttft_s", 0.2, "ttft_s"), ("tpot_s", 0.03, "tpot_s"),
                            ("capacity_rps", 4.0, "out_tok_s_saturated"),
                            ("goodput_tokens_per_s_per_device", 500.0, "out_tok_s_saturated")):
        lo, hi = _conformal(stored[cls]["residuals"], n_eff=stored[cls]["effective"])
        assert iv[key] == pytest.approx([point * math.exp(lo), point * math.exp(hi)])
        # a factor either way: the point is the interval's geometric centre
        assert iv[key][0] * iv[key][1] == pytest.approx(point ** 2)
    over = serve_interval(0.2, 0.03, 4.0, 500.0, stable=False)
    lo, hi = _conformal(stored["tpot_s_saturated"]["residuals"], n_eff=stored["tpot_s_saturated"]["effective"])
    assert over["tpot_s"] == pytest.approx([0.03 * math.exp(lo), 0.03 * math.exp(hi)])
    assert serve_interval(math.inf, 0.03, 0.0, 0.0)["ttft_s"] is None


def test_serve_json_and_text_carry_the_intervals(capsys):
    from partita.cli.main import main
    args = ["serve", "--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "2", "--prompt-len", "512",
            "--output-len", "128", "--rate", "2"]
    assert main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    best = data["layouts"][0]
    assert data["interval"] == best["interval"]
    iv = best["interval"]
    assert set(iv) >= {"level", "ttft_s", "tpot_s", "capacity_rps", "goodput_tokens_per_s_per_device"}
    from partita.serve.intervals import serve_interval
    again = serve_interval(best["ttft_ms"] / 1e3, best["tpot_ms"] / 1e3, best["capacity_rps"],
                           best["goodput_tokens_per_s_per_device"], best["stable"])
    for key in ("ttft_s", "tpot_s", "capacity_rps", "goodput_tokens_per_s_per_device"):
        assert iv[key] == pytest.approx(again[key]) and iv[key][0] <= iv[key][1]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "best layout, 80 % intervals: TTFT" in out and "leave-one-source-out" in out
