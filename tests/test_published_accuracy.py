"""Guards the estimator's in-sample accuracy on measured published runs (the shipped constants
were fitted on these rows; bench/validate_published.py prints it after the out-of-sample
figures, which tests/test_out_of_sample.py guards), and the loader's per-source facts table."""
import csv
import statistics

from partita.estimate import estimate
from published_runs import SOURCE_FACTS, load_cases, runs_as, source_key


def test_median_error_on_published_runs(published_csv):
    cases, skipped = load_cases(published_csv)
    step = [c for c in cases if c.metric == "step_time_s"]
    mem = [c for c in cases if c.metric == "peak_memory_gib"]
    # 266 rows: 8 cannot be predicted - 2 state no tp/pp, 4 no global batch, 2 no
    # architecture (the bench lists them); the remaining 258 are 254 step times and 4
    # peak memories
    assert (len(step), len(mem), len(skipped)) == (254, 4, 8)
    step_err = [abs(estimate(c.model, c.cluster, c.plan).step_time_s - c.measured) / c.measured for c in step]
    mem_err = [abs(estimate(c.model, c.cluster, c.plan).peak_memory_gib - c.measured) / c.measured for c in mem]
    # the measured figures, to the precision the README prints them (one decimal of a
    # percent): step time median 6.9 %, p90 20.1 % (9.0 % / 23.6 % before the InternLM rows
    # ran as internevo - parameter sync by per-owner broadcasts, cost/frameworks.py - on
    # their stated 4x100 Gb/s per node, and Ampere was refitted on them; 27.9 %
    # p90 before the Nemotron-340B rows got their run config's vpp 12:
    # validation.published.ERRATA); peak memory median 7.5 % (8.6 % before the FSDP
    # last-rank phases and the replicated tp norms). Step median 6.98 % since FSDP2's
    # compute-stream copies are charged (cost/step.py _zero3_exposed) and the shipped Hopper
    # constants were not refitted on that: the out-of-sample figures (tests/test_out_of_sample.py)
    # are the ones it improved
    assert statistics.median(step_err) < 0.0705  # 7.03 % since Hopper gemm_fp8 is no longer fitted (7.00 % with it)
    assert sorted(step_err)[int(round(0.9 * (len(step_err) - 1)))] < 0.2015
    assert statistics.median(mem_err) < 0.0755


def test_every_source_has_cited_facts(published_csv):
    """Each source of the CSV resolves to exactly the SOURCE_FACTS record meant for it,
    and each record says where its facts are written down."""
    with open(published_csv) as f:
        sources = {row["source"] for row in csv.DictReader(f)}
    assert all(source_key(s) is not None for s in sources)
    for key, facts in SOURCE_FACTS.items():
        assert source_key(facts.match) == key  # no earlier pattern shadows it
        assert len(facts.citation) > 20 and facts.flops in ("hardware", "model")
        assert facts.grad_dtype in ("fp32", "bf16") and facts.mfu_peak_tflops > 0
    # the 266 rows come from these 9 sources (data/README.md lists them)
    assert {source_key(s) for s in sources} == {
        "megatron-2021", "megatron-readme-h100", "deepspeed-zero3", "torchtitan-h100", "torchtitan-h200",
        "nemo-24.07", "dgxc-25.04", "internlm", "mpt-llm-foundry"}


def test_facts_come_from_the_table(published_csv):
    """The looked-up facts reach the plan: NeMo/dgxc rows bf16 gradients and TP overlap,
    the Megatron README rows TP overlap with fp32 gradients, the others neither; every row
    is estimated as run by its source's framework (``RUNS_AS``), except a row whose
    ``zero_stage/fsdp`` cell names DeepSpeed (Narayanan et al.'s ZeRO-3 baseline), run as DeepSpeed."""
    import csv
    zero_cells = {}
    with open(published_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        zero_cells.setdefault(row["model_name"], set()).add(row["zero_stage/fsdp"])
    # straight from the CSV, not through load_cases: the rows whose zero cell names DeepSpeed
    # while their source's framework is another one (Narayanan et al.'s ZeRO-3 rows: 6)
    expected_deepspeed = sum(1 for row in rows if "deepspeed" in row["zero_stage/fsdp"].lower()
                             and SOURCE_FACTS[source_key(row["source"])].framework != "deepspeed")
    cases, _ = load_cases(published_csv)
    ran_deepspeed = 0
    for case in cases:
        facts = SOURCE_FACTS[case.source]
        assert (case.plan.grad_dtype, case.plan.tp_comm_overlap) == (facts.grad_dtype, facts.tp_comm_overlap)
        if case.plan.framework == "deepspeed" and facts.framework != "deepspeed":
            assert any("deepspeed" in cell.lower() for cell in zero_cells[case.name.split(" on ")[0]]), case.name
            ran_deepspeed += 1
            continue
        assert case.plan.framework == runs_as(facts)  # no row of the 266 ran eager
    assert ran_deepspeed == expected_deepspeed == 6  # Narayanan et al. SC'21 Table 2: the ZeRO-3 rows, all of them
    seen = {(c.source, c.plan.grad_dtype, c.plan.tp_comm_overlap) for c in cases}
    assert ("dgxc-25.04", "bf16", True) in seen and ("megatron-readme-h100", "fp32", True) in seen
    assert ("megatron-2021", "fp32", False) in seen


def test_eager_rows_run_as_torchtitan_eager_from_their_own_notes():
    """On the 470-row table, the rows whose notes say eager (torchao's float8nocompile table:
    'bfloat16, eager' and the float8nocompile prototype, 3 AC settings x step and memory)
    and only those are estimated as torchtitan-eager; that table's 'float8 + torch.compile'
    rows stay compiled torchtitan."""
    from pathlib import Path

    from published_runs import dated_before_loss_compile, runs_eager

    table = Path(__file__).resolve().parents[1] / "data" / "published_runs.csv"
    with open(table) as f:
        rows = list(csv.DictReader(f))
    eager_rows = [r for r in rows if "eager" in r["notes"].lower() and "torch.compile" not in r["notes"]]
    assert len(eager_rows) == 12 and all("float8nocompile" in r["source"] for r in eager_rows)
    assert all(runs_eager(r["notes"]) for r in eager_rows)
    cases, _ = load_cases(table)
    eager = [c for c in cases if c.plan.framework == "torchtitan-eager"]
    assert len(eager) == 12 and {c.source for c in eager} == {"torchao-float8nocompile"}
    # its compiled rows predate torchtitan's compiled loss (table dated Dec-2024; the loss joined
    # compile in torchtitan commit bbb1b616e, 2025-04-02), as do torchao's Mar-2025 H100 rows
    compiled = [c for c in cases if c.source == "torchao-float8nocompile" and c.plan.framework == "torchtitan-eager-loss"]
    assert len(compiled) == 6
    assert {c.source for c in cases if c.plan.framework == "torchtitan-eager-loss"} == {
        "torchao-float8nocompile", "torchao-float8"}
    assert dated_before_loss_compile("torchao README (commit 02d413c00, Dec-2024; torchtitan PR #778)")
    assert not dated_before_loss_compile("pytorch/ao ... (first in torchao/float8/README.md commit 99562f045, Aug-2025)")
    assert not dated_before_loss_compile("no date stated")
    assert dated_before_loss_compile("first added Mar-2025, updated Aug-2025")  # the table's first publication
    assert not runs_eager("precision=bf16; torch.compile; eager baseline in the README")  # compiled wins
    assert runs_as(SOURCE_FACTS["megatron-2021"], "eager") == "megatron"  # no eager variant: the source's own


def test_unknown_source_is_skipped_with_the_reason(tmp_path, published_csv):
    with open(published_csv) as f:
        rows = list(csv.DictReader(f))
    row = dict(rows[0], source="Some new benchmark nobody catalogued")
    path = tmp_path / "one.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerow(row)
    cases, skipped = load_cases(path)
    assert cases == [] and len(skipped) == 1
    assert skipped[0][1] == "source not in SOURCE_FACTS (add its facts with a citation)"


def test_peak_memory_on_the_full_table():
    """Peak memory on the 470-row table (data/published_runs.csv: the torchtitan / torchao
    FSDP2, Megatron CI, NeMo and MindFormers memory rows), as each source's statistic reads
    it. Under-promising memory is the worse error (issue 12).

    All 35 rows: median 4.9 %, p90 25.1 %, 17 under / 18 over - fewer under than over, as
    issue 12 asks (was 9.1 %, 24.9 %, 23 / 12 before the loss phase was modelled per
    framework - cost/memory.py loss_bytes_per_logit, measured in
    tests/data/memory_physics_oracles.json - and torchtitan rows dated before its compiled loss
    ran as ``torchtitan-eager-loss``; p90 25.5 % before unfused attention and MindSpore's
    optimizer parallel were read). The 19 rows that name their part: median 4.3 %, 8 under /
    11 over. (The 4 torchao-moe Llama4-Scout rows, on "B200" mapped to b200-power-limited by
    their team's practice - validation/published.py POWER_CAPPED_BY_PRACTICE - and so not
    counted as naming their part, read 25 % under: torchtitan's expert-parallel MoE layer
    keeps more than the fused count; not yet modelled.) The Megatron-CI MoE proxy went from 73 % under to 1.6 % under once its notes'
    unfused attention keeps its probabilities (cost/memory.py unfused_attention_bytes; its one
    multi-token-prediction layer is still not modelled), and MindFormers ChatGLM2-6B from 102 %
    to 15 % over once MindSpore optimizer parallel reads as sharded gradients
    (validation/published.py _zero). These bounds guard the measured figures; they are not the issue's target."""
    from pathlib import Path

    table = Path(__file__).resolve().parents[1] / "data" / "published_runs.csv"
    cases, _ = load_cases(table)
    mem = [c for c in cases if c.metric == "peak_memory_gib"]
    signed = [(estimate(c.model, c.cluster, c.plan).peak_memory_gib_as(SOURCE_FACTS[c.source].memory_stat)
               - c.measured) / c.measured for c in mem]
    assert len(mem) == 35
    assert statistics.median(abs(e) for e in signed) < 0.0495
    assert sorted(abs(e) for e in signed)[int(round(0.9 * (len(signed) - 1)))] < 0.2510
    assert sum(e < 0 for e in signed) < sum(e > 0 for e in signed)
    stated = [e for c, e in zip(mem, signed) if c.sku_stated]
    assert len(stated) == 19
    assert statistics.median(abs(e) for e in stated) < 0.0430
    assert sum(e < 0 for e in stated) < sum(e > 0 for e in stated)


def test_step_time_on_the_full_table():
    """Step time on the 470-row table (data/published_runs.csv), as bench/validate_published.py
    prints it in sample (out of sample: tests/test_out_of_sample.py): 417 step-time rows,
    median 7.0 %, p90 22.5 % (22.3 % before the power-limited B200's bf16 gemm stopped being
    fitted - bench/fit.py NOT_FITTED: it did not transfer between its two torchao tables;
    7.2 %, 23.7 % before the
    MindFormers rows ran without dp-communication overlap - MindSpore's enable_grad_comm_opt /
    enable_opt_shard_comm_opt default off - and bench/fit.py refitted the 910 and 910B2 on
    them), the 63 MoE rows 7.0 % (before
    bench/fit.py fitted B200, GB200, MI300X and the 910B2 on their own rows and the InternLM
    rows ran as internevo on their stated network: 10.0 %, 30.9 %, 13.1 %; p90 31.4 % before
    eager torchtitan rows
    were charged their unfused element-wise traffic; 32.0 % before the per-layer-AC
    and MindFormers "full on [..] layers per stage" rows got their recompute_layers; 34.4 %
    before ERRATA gave the Nemotron-340B rows their vpp 12). These bounds guard the measured
    figures. (384 rows and 9.3 % / 33.3 % before GB200, the plain-"H100" torchao rows and
    four more MoE architectures became expressible.)"""
    from pathlib import Path

    table = Path(__file__).resolve().parents[1] / "data" / "published_runs.csv"
    cases, _ = load_cases(table)
    step = [c for c in cases if c.metric == "step_time_s"]
    err = [abs(estimate(c.model, c.cluster, c.plan).step_time_s - c.measured) / c.measured for c in step]
    assert len(step) == 417
    assert statistics.median(err) < 0.0715
    assert sorted(err)[int(round(0.9 * (len(err) - 1)))] < 0.2255
    moe = [e for c, e in zip(step, err) if c.model.moe]
    assert len(moe) == 63 and statistics.median(moe) < 0.0715


def test_an_erratum_fills_only_a_blank_cell():
    """ERRATA corrects a cell its source left blank from the run's own config, and never
    overwrites a stated value."""
    from published_runs import with_errata

    row = {"model_name": "Nemotron4-340B", "vpp": ""}
    assert with_errata(row, "dgxc-25.04")["vpp"] == "12"
    assert with_errata({**row, "vpp": "4"}, "dgxc-25.04")["vpp"] == "4"
    assert with_errata(row, "dgxc-24.11")["vpp"] == ""


def test_a_row_s_stated_network_sets_the_inter_node_bandwidth():
    """The hardware column's scale-out network, by hand: 4 x 100 Gb/s per node over 8 GPUs =
    400 / 8 / 8 = 6.25 GB/s per GPU (InternLM's A100 RoCE cluster); 8 x 200 Gb/s per node =
    25; 400 Gb/s per GPU = 50; 1600 Gbps node-node = 25; nothing stated: None. The loader
    builds the InternLM rows' cluster with it."""
    from published_runs import stated_network_gbps

    assert stated_network_gbps("A100-80GB-SXM (nvidia_a100-sxm4-80gb; 4x100Gb/s RoCE per node)", 8) == 6.25
    assert stated_network_gbps("A100-80GB-SXM (DGX A100, Selene, 8x200Gb/s HDR IB per node)", 8) == 25.0
    assert stated_network_gbps("H200-141GB (WhiteFiber, 400Gb/s CX-7 per GPU)", 8) == 50.0
    assert stated_network_gbps("A100-40GB (1600 Gbps node-node RoCE)", 8) == 25.0
    assert stated_network_gbps("H100-80GB-SXM (DGX H100 reference architecture)", 8) is None
    from pathlib import Path

    cases, _ = load_cases(Path(__file__).resolve().parents[1] / "data" / "published_runs.csv")
    assert {c.cluster.device.inter_gbps for c in cases if c.source == "internlm"} == {6.25}


def test_a_power_capped_part_is_its_own_device():
    """torchao's B200 rows ran power-capped (its mx_formats table: "B200 (power-limited, single
    node, 8 GPUs)"; its moe_training table, same team, by that practice): their fitted
    efficiencies live in b200-power-limited.json, and a plain B200 row from any other source (a
    NeMo DGX B200 run) keeps the datasheet part with the Blackwell family's efficiencies."""
    from partita.spec.hardware import load_device
    from published_runs import HARDWARE, hardware_token, sku_stated

    assert HARDWARE[hardware_token("B200 (power-limited, single node, 8 GPUs)", "torchao-mxfp8")] == \
        "b200-power-limited"
    assert HARDWARE[hardware_token("B200 (single node, 4 GPUs)", "torchao-moe")] == "b200-power-limited"
    assert not sku_stated("B200 (single node, 4 GPUs)", "torchao-moe")
    assert HARDWARE[hardware_token("B200 (DGX B200, 8 per node)", "nemo-long-seq")] == "b200"
    assert sku_stated("B200 (DGX B200, 8 per node)", "nemo-long-seq")
    capped, plain = load_device("b200-power-limited"), load_device("b200")
    fp8 = capped.efficiency.source("gemm_fp8")
    assert fp8.startswith("fitted:") and "torchao" in fp8
    assert "torchao" not in plain.efficiency.source("gemm_fp8") and plain.efficiency.gemm_fp8 > 2 * capped.efficiency.gemm_fp8
    # its bf16 gemm is not fitted (bench/fit.py NOT_FITTED: fitted on one torchao table it
    # predicts the other 40 % off): the Blackwell family's value, as the plain part's
    assert capped.efficiency.gemm == plain.efficiency.gemm
