"""Issue 33 item 1: the estimator's accuracy out of sample - every published step time predicted
with efficiencies fitted without its source (leave one source out), and the later rows
from a fit on the earlier ones (time split) - as bench/validate_published.py prints it first
and the README quotes it.

The fits come from bench/loso_fits.json (written by ``python bench/validate_published.py``,
refitted whenever its inputs change); each test here predicts with them (~2 s), and one
refits a held-out source from scratch to check the stored fits are what the procedure
gives. The oracle is the measured figure of each row (data/published_runs.csv)."""
from __future__ import annotations

import json

import fit
import out_of_sample as oos
from published_runs import SOURCE_DATES, SOURCE_FACTS, row_date

FITS = oos.Fits(oos.FULL_CSV, use_stale=True)  # the stored fits, even after a cost change elsewhere


def _step(rows):
    return [r for r in rows if r.metric == "step_time_s"]


def test_leave_one_source_out_error():
    """Measured (python bench/validate_published.py): 417 step times, median 6.9 %, p90 22.5 %,
    MoE 4.9 % (7.0 % / 22.5 % before Blackwell's unfitted values were Hopper's fit scaled by the
    MAMF ratio - tests/test_blackwell_prior.py; 7.6 % / 22.9 %, MoE 8.2 % before TE's grouped-GEMM fp8 quantize was priced -
    cost/frameworks.py fp8_grouped_quantize_bytes; 8.0 % / 24.9 %, MoE 7.8 % before interleaved pipelines synchronised each model
    chunk's gradients on their own - cost/step.py _exposed_by_chunk: the MoE vpp rows of Grok-1
    and Llama4-Maverick, already too fast, moved further; 8.4 % / 27.0 % before MindFormers' op-by-op cross-entropy and torchtitan's fp8
    all-gather for tensorwise TP were priced; 8.7 % / 27.1 %, MoE 7.1 %, before Hopper's gemm_fp8
    was unfitted and unfused attention priced; 10.8 % / 27.8 %, MoE 9.6 % before the dgxc MoE rows ran with Megatron-Core's default
    etp = tp and FSDP2's compute-stream copies were charged; 11.0 % / 28.4 % while the
    power-limited B200's bf16 gemm was fitted: fit.NOT_FITTED);
    the bounds sit just above. (fit.py's old --loso said 9.9 % / 30.8 %: it refitted
    from the shipped constants, which had seen the held-out source, and predicted single-source
    devices - MI300X, Ascend - with their own fit.)"""
    rows = oos.loso_predictions(FITS)
    step = oos.summary(_step(rows))
    assert step["rows"] == 417
    assert step["median"] < 0.0695 and step["p90"] <= 0.25  # issue 33's target: p90 <= 25 %
    moe = oos.summary([r for r in _step(rows) if "moe" in r.classes])
    assert moe["rows"] == 63 and moe["median"] < 0.0515
    mem = oos.summary([r for r in rows if r.metric == "peak_memory_gib"])
    assert mem["rows"] == 35 and mem["median"] < 0.0495 and mem["under"] <= 2 * mem["rows"] / 3


def test_time_split_error():
    """Fitted on the rows published before 2025-01 (2021-2024), the 143 later step times:
    median 11.9 %, p90 42.3 %, median signed +3.5 % (predicted too slow - the bias the issue's
    held-out runs showed, 12 %). 152 rows, 12.8 % / 43.4 %, +5.2 % while NeMo's long-sequence
    H100 table was dated by the commit it was read at (May-2025), not by its first publication
    (Oct-2024); on the same 143 rows the old pre-2025 fit gives 12.1 % / 42.3 %, +4.1 %."""
    step = oos.summary(_step(oos.time_split_predictions(FITS)))
    assert step["rows"] == 143
    # 6.8 % / 28.9 % now (6.8 % / 39.6 % before Blackwell / CDNA3 took Hopper's fit scaled by the MAMF
    # ratio: torchao's MI300X rows set the p90 - tests/test_blackwell_prior.py; 29.2 % with MI300X's
    # MAMF share over 1300 TF, 34.5 % with the 788.2 TF MI300X figure - docs/accuracy.md)
    assert step["median"] < 0.0995 and step["p90"] < 0.2950


def test_long_sequence_h100_rows_are_dated_by_first_publication():
    """NeMo's performance_long_sequence.md H100 table (NeMo 24.03.01 container) has the same
    figures and layouts since the file's first commit 5b47a94c11, 2024-10-18 (NVIDIA/NeMo git
    history - the oracle); its B200 table came in 2025. The H100 rows are fitted in the time
    split, not predicted."""
    rows = [c for c in FITS.cases if c.source == "nemo-long-seq" and c.metric == "step_time_s"]
    assert len(rows) == 9 and {c.cluster.device.name for c in rows} == {"h100-sxm"}
    assert {tuple(c.date) for c in rows} == {(2024, 10)}


def test_a_held_out_source_never_informs_its_own_prediction():
    """A device whose rows all come from one source is predicted, when that source is held out,
    with its family's unfitted values - read here from the family file itself."""
    family = json.loads((oos.DEVICES_DIR / "family-amd-cdna3.json").read_text())["efficiency"]
    prior = oos.unfitted("mi300x")
    assert (prior["gemm"], prior["gemm_fp8"]) == (family["gemm"], family["gemm_fp8"])
    assert oos.loso_fits(FITS)["torchao-float8"].get("mi300x", {}) == {}
    # a family's fitted value falls back to its value before the first fit (PRIOR), never its own
    assert oos.unfitted("h100-sxm")["gemm"] == oos.PRIOR[("family-nvidia-hopper", "gemm")][0] != \
        json.loads((oos.DEVICES_DIR / "family-nvidia-hopper.json").read_text())["efficiency"]["gemm"]


def test_stored_fits_are_what_the_procedure_gives():
    """Refit one held-out source from scratch (torchao-moe out of the power-limited B200's rows:
    5 rows, a few seconds) and compare with the stored fit."""
    held = [c for c in FITS.groups["b200-power-limited"] if c.source != "torchao-moe"]
    fresh = oos.shipped_rule_fit(held)
    stored = oos.loso_fits(FITS)["torchao-moe"]["b200-power-limited"]
    assert set(fresh) == set(stored) and all(abs(fresh[k] - stored[k]) < 0.02 for k in fresh)


def test_every_source_is_dated_with_a_citation():
    """Every SOURCE_FACTS source has a publication date and where it is written; a row's own
    cell overrides it (its month, or a commit of COMMIT_DATES)."""
    assert set(SOURCE_DATES) == set(SOURCE_FACTS)
    for (year, month), citation in SOURCE_DATES.values():
        assert 2020 <= year <= 2026 and 1 <= month <= 12 and len(citation) > 15
    assert row_date("pytorch/ao ... (table first added in commit e850b90d2, Mar-2025)", "torchao-float8") == (2025, 3)
    assert row_date("mindspore-lab/mindformers research/telechat2/README.md (commit bff73eaf6)", "mindformers") == \
        (2025, 12)
    assert row_date("NVIDIA/dgxc-benchmarking v24.11.1 grok1/README_314b.md", "dgxc-24.11") == (2024, 11)
    assert {c.date for c in FITS.cases} and all(c.date != (0, 0) for c in FITS.cases)


def test_feature_classes_follow_the_plan():
    """The classes the errors are reported in come from the plan and the device (cp, vpp,
    dtype, zero, MoE, Ascend) - checked against the CSV's own columns."""
    for case in FITS.cases:
        classes = oos.feature_classes(case)
        assert ("moe" in classes) == bool(case.model.moe) != ("dense" in classes)
        assert ("vpp>=4" in classes) == (case.plan.vpp >= 4)
        assert ("ascend" in classes) == (fit.family_of(case.cluster.device.name).startswith(("ascend", "family-ascend")))
