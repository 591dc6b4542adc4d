"""Turn rows of ``published_runs.csv`` into (model, cluster, plan, measured step time / memory).

Benchmark data, not library code: ``bench/validate_published.py`` and ``bench/fit.py`` read
it (``import published_runs``, from this folder) and so do the accuracy tests
(``tests/conftest.py`` puts ``bench/`` on ``sys.path``). The planner never does.

Every measured figure is converted to what it implies about the step, using the
FLOP accounting of its own source (data/README.md):

* ``iter_time_s``: the step time itself;
* ``tokens_per_s_per_gpu``: ``gbs * seq / (value * n)``;
* ``tflops_per_gpu`` from the Megatron-LM 2021 paper, the DeepSpeed blog and InternLM:
  those count ``96 B s l h^2 (1 + s/6h + V/16lh)`` FLOPs per step (Narayanan et al.
  SC'21 appendix, with the recomputed forward); the Megatron-LM README (H100) counts
  model FLOPs, Megatron's ``num_floating_point_operations``:
  ``72 B s l h^2 (1 + s/6h + V/12lh)`` for a GPT with ffn = 4h;
* ``mfu_pct``: model FLOPs (Megatron formula) / (989 TF x n).

Facts a source's runs share but its rows do not repeat (framework, main-gradient dtype,
TP-communication overlap, FLOP accounting, default sequence length...) live in one
table, :data:`SOURCE_FACTS`, one cited record per source; the loader only looks them
up, never branches on a source, and never tunes per row. A source missing from the
table is skipped with that reason. Row facts come from the row's own columns (layout,
batch, recompute, sharding; precision from ``notes``). Unknown micro-batch: 1; unknown
recompute: none; unknown SP: on when tp > 1.
"""
from __future__ import annotations

import csv
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from partita.errors import PartitaError
from partita.plan import Plan, balanced_split, validate
from partita.spec.hardware import Cluster, make_cluster
from partita.spec.load import load_model
from partita.spec.model import MLASpec, ModelSpec, MoESpec

HARDWARE = {
    "A100-80GB-SXM": "a100-80gb", "A100-80GB": "a100-80gb", "A100-40GB": "a100-40gb",
    "H100-80GB-SXM": "h100-sxm", "H100-80GB": "h100-sxm", "H100-96GB-HBM2e": "h100-96gb-hbm2e",
    "H200-141GB": "h200", "B200": "b200", "MI300X-192GB": "mi300x", "Ascend-910A": "ascend-910",
    # Ascend-910B: the rows (Atlas 800T A2 / Atlas 900 A2 PoD) do not say which variant,
    # b1-b4; the catalog's own alias for a plain 910B is ascend-910b2 (the Atlas 800T A2's
    # usual part). The Ascend family's efficiencies are fitted on these rows
    # (bench/fit.py), so the fitted gemm absorbs the variant's peak if it is another.
    "Ascend-910B": "ascend-910b2",
    # GB200: the rows are GB200 NVL72 racks (dgxc "GB200 NVL72 reference architecture", Megatron CI
    # dgx_gb200, torchao "64 nodes x 4 GPUs"); gb200.json's node is the 72-GPU NVLink domain.
    "GB200": "gb200",
    # plain "H100" (torchao-float8, torchao-float8nocompile): the SKU is not stated. The rows are
    # torchtitan runs benchmarked by the PyTorch team (pytorch/ao docs, torchtitan PR #778), whose
    # torchtitan H100 benchmarks name their parts: 96 GB HBM2e at 500 W (Grand Teton; the
    # torchtitan-h100 rows' hardware cell). The rows' own figures cannot tell the two apart (their
    # peaks, <= 53 GB, fit both), so the team's documented part is taken: h100-96gb-hbm2e.
    "H100": "h100-96gb-hbm2e",
    # a power-capped part is its own device (its efficiencies are fitted on its own rows, not
    # the datasheet part's): "B200 (power-limited, ...)" -> b200-power-limited (hardware_token)
    "B200-power-limited": "b200-power-limited",
}
#: Sources whose team benchmarks on power-capped parts without every table saying so: the
#: PyTorch team's torchao B200 machines are "power-limited" in its mx_formats table; its
#: moe_training table (same team and repository) names only "B200". Such a row is mapped on that
#: documented practice and flagged as not naming its part (like plain "H100" above).
POWER_CAPPED_BY_PRACTICE = {"torchao-moe": frozenset({"B200"})}


def hardware_token(cell: str, source: str = "") -> str:
    """The :data:`HARDWARE` key of a row's hardware cell: its first word, with
    ``-power-limited`` appended when the cell says the part ran under a power cap, or when
    its ``source`` benchmarks that part power-capped (:data:`POWER_CAPPED_BY_PRACTICE`)."""
    token = cell.split()[0]
    capped = "power-limited" in cell or token in POWER_CAPPED_BY_PRACTICE.get(source, ())
    return f"{token}-power-limited" if capped and f"{token}-power-limited" in HARDWARE else token


def sku_stated(cell: str, source: str = "") -> bool:
    """Whether the row's hardware cell names the part it ran on (False: mapped on the source's
    documented practice, :data:`SKU_NOT_STATED`, :data:`POWER_CAPPED_BY_PRACTICE`)."""
    token = cell.split()[0]
    return token not in SKU_NOT_STATED and token not in POWER_CAPPED_BY_PRACTICE.get(source, ())


#: Hardware cells whose part (SKU) the row does not state: mapped above on the source's
#: documented practice, flagged on the case (:attr:`Case.sku_stated`) so a check can leave them out.
SKU_NOT_STATED = frozenset({"H100"})


def nodes_of(devices_per_node: int, n: int) -> int:
    """Devices per node for a published job of ``n`` devices: the largest divisor of ``n`` not
    above the device file's node size. Equal to the node size whenever ``n`` fills whole nodes
    (every 8-GPU-node row); for a rack-scale NVLink domain (GB200 NVL72: 72) a 128-512 GPU job
    fills 64 GPUs of each rack - the jobs' own layouts (tp x ep = 64, 4-GPU trays) are
    power-of-two and cannot use 72 GPUs per rack."""
    for per_node in range(min(devices_per_node, n), 0, -1):
        if n % per_node == 0:
            return per_node
    return 1


#: A row's stated scale-out network: "<count>x<rate>Gb/s ... per node|VM", "<rate>Gb/s ... per
#: GPU" or "<rate> Gbps node-node" (the hardware column as its source printed it).
_NIC = re.compile(r"(?:(\d+)\s*x\s*)?(\d+)\s*Gb(?:/s|ps)\b[^;,)]*?\b(per node|per VM|per GPU|node-node)", re.I)


def stated_network_gbps(hardware: str, devices_per_node: int) -> float | None:
    """GB/s per direction per device of the scale-out network the row's hardware column
    states, or None when it states none. Per node (or VM, or node-to-node) the NICs' line
    rates add up and are shared by the node's devices; per GPU it is the device's own.
    Example: InternLM's A100 cluster, "4x100Gb/s RoCE per node" = 400 Gb/s = 50 GB/s per
    node = 6.25 GB/s per GPU, a quarter of the DGX A100's 8 x 200 Gb/s HDR that the
    a100-80gb device file assumes - the bandwidth its gradient and parameter syncs cross
    between nodes."""
    m = _NIC.search(hardware or "")
    if not m:
        return None
    gbps = int(m.group(1) or 1) * int(m.group(2)) / 8
    return gbps if m.group(3).lower() == "per gpu" else gbps / devices_per_node


#: Mixture-of-experts architectures of the CSV's MoE rows: what the row's columns cannot
#: say (expert FFN width, shared experts, which layers are MoE, the dense layers' FFN),
#: from each model's released config, as the rows' notes cite them. A name prefix maps to
#: the ``MoESpec`` fields and the dense layers' FFN width (None: the row's ``ffn_hidden``,
#: every layer MoE) - or to a model preset (DeepSeek-V3: MLA, 3 dense layers).
MOE_ARCH: dict[str, tuple[dict, int | None] | str] = {
    # xai-org/grok-1 release config: 8 experts top-2, expert ffn 32768, every layer MoE
    "Grok-1": (dict(num_experts=8, top_k=2, expert_ffn_hidden=32768), None),
    # meta-llama/Llama-4-Maverick-17B-128E config: 128 routed top-1 + 1 shared (8192),
    # MoE every 2nd layer (interleave_moe_layer_step 2), dense layers' ffn 16384
    "Llama4-Maverick": (dict(num_experts=128, top_k=1, expert_ffn_hidden=8192, shared_experts=1,
                             shared_ffn_hidden=8192, layer_freq=2), 16384),
    # meta-llama/Llama-4-Scout-17B-16E config: 16 routed top-1 + 1 shared, every layer MoE
    "Llama4-Scout": (dict(num_experts=16, top_k=1, expert_ffn_hidden=8192, shared_experts=1,
                          shared_ffn_hidden=8192), None),
    # mistralai/Mixtral-8x7B config: 8 experts top-2, expert ffn 14336
    "Mixtral-8x7B": (dict(num_experts=8, top_k=2, expert_ffn_hidden=14336), None),
    # deepseek-ai/DeepSeek-V3 config (the catalog preset): MLA, 256 routed top-8 + 1 shared
    "DeepSeek-V3": "deepseek-v3",
    # deepseek-ai/DeepSeek-V2 config.json: n_routed_experts 160, num_experts_per_tok 6,
    # n_shared_experts 2, moe_intermediate_size 1536, intermediate_size 12288 (the dense layer),
    # first_k_dense_replace 1, MLA q_lora_rank 1536, kv_lora_rank 512, qk_rope_head_dim 64,
    # qk_nope_head_dim 128, v_head_dim 128 (as NeMo's deepseek_v2.yaml restates them:
    # moe_layer_freq [0]*1+[1]*59, moe_shared_expert_intermediate_size 3072 = 2 x 1536)
    "DeepSeek-V2": (dict(num_experts=160, top_k=6, expert_ffn_hidden=1536, shared_experts=2,
                         shared_ffn_hidden=1536, first_dense_layers=1,
                         mla=dict(q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64,
                                  qk_nope_head_dim=128, v_head_dim=128)), 12288),
    # Qwen/Qwen2-57B-A14B config.json: num_experts 64, num_experts_per_tok 8,
    # moe_intermediate_size 2560, shared_expert_intermediate_size 20480 (one shared expert with
    # its sigmoid shared_expert_gate, Qwen2-MoE), decoder_sparse_step 1, mlp_only_layers []
    "Qwen2-57B-A14B": (dict(num_experts=64, top_k=8, expert_ffn_hidden=2560, shared_experts=1,
                            shared_ffn_hidden=20480, shared_expert_gate=True), None),
    # mindspore-lab/mindformers research/telechat2 telechat2-39b-a12b yaml moe_config: expert_num 16,
    # num_experts_chosen 4, moe_intermediate_size 6144, shared_expert_num 0; every layer MoE
    "TeleChat2-39B-A12B": (dict(num_experts=16, top_k=4, expert_ffn_hidden=6144), None),
    # NVIDIA/Megatron-LM tests/functional_tests/test_cases/moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed
    # model_config.yaml, as the row's notes transcribe it (not re-read here): 16 layers, the first
    # dense (ffn 4096), 32 routed experts top-4 + a shared expert of 1024, expert ffn 1024, MLA
    # (q_lora 1536, kv_lora 512, qk head 128 + rope 64, v head 128); GPT-2 BPE (50257 tokens)
    # padded to a multiple of 3232: 51712. Its one MTP layer is not modelled.
    "DeepSeek-style MoE proxy": (dict(num_experts=32, top_k=4, expert_ffn_hidden=1024, shared_experts=1,
                                      shared_ffn_hidden=1024, first_dense_layers=1, vocab=51712,
                                      mla=dict(q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64,
                                               qk_nope_head_dim=128, v_head_dim=128)), 4096),
}


@dataclass
class Case:
    """One published measurement, ready to predict."""

    source: str
    name: str
    model: ModelSpec
    cluster: Cluster
    plan: Plan
    metric: str
    measured: float  # step time in s, or peak memory in GiB
    raw_metric: str
    raw_value: float
    sku_stated: bool = True  # False: the row's hardware cell does not name the part (SKU_NOT_STATED)
    date: tuple[int, int] = (0, 0)  # (year, month) the figure was published: row_date


@dataclass(frozen=True)
class SourceFacts:
    """What every run of one source shares that its rows do not state, with where it is
    written down. ``match`` identifies the source in the CSV's ``source`` cell."""

    match: str
    citation: str
    framework: str
    #: FLOPs behind ``tflops_per_gpu``: "hardware" = 96 B s l h^2 (1 + s/6h + V/16lh), the
    #: recomputed forward counted (Narayanan et al. SC'21 appendix); "model" = Megatron's
    #: ``num_floating_point_operations`` (:func:`megatron_model_flops`)
    flops: str = "hardware"
    #: the peak ``mfu_pct`` is relative to (TFLOP/s per device)
    mfu_peak_tflops: float = 989.0
    grad_dtype: str = "fp32"  # main-gradient buffer / reduction dtype of the framework's runs
    tp_comm_overlap: bool = False
    #: whether the runs overlap the data-parallel gradient reduction with the backward and
    #: the zero 1/2 weight all-gather with the next forward (Plan.overlap_grad_reduce /
    #: Plan.overlap_param_gather)
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    default_seq_len: int | None = None  # when the row leaves seq_len blank
    always_fsdp: bool = False  # every run shards parameters (ZeRO-3-like) whatever the cell says
    memory_stat: str = "not stated"  # what peak_mem_gib rows measure: allocated / reserved / device reading
    #: the framework shards each expert's weights over the tensor-parallel group too (expert tensor
    #: parallel = tp) where a row's notes state no ETP; False: the plan default etp = 1
    experts_split_by_tp: bool = False
    defaults_note: str = ""  # facts above taken as the framework's defaults because the source is silent


_NEMO_RECIPES = ("NeMo keeps bf16 main gradients (megatron_gpt_config grad_reduce_in_fp32=False) and its "
                 "performance recipes set tp_comm_overlap=True")
_TORCHTITAN = ("torchtitan FSDP2 training (mixed_precision_reduce float32 by default, no TP overlap without "
               "async TP); llama3 configs default to seq_len 8192 (torchtitan/models/llama3/train_configs); its "
               "'memory' log is the device's max reserved memory in GiB (torchtitan/components/metrics.py, "
               "DeviceMemoryMonitor.get_peak_stats: max_reserved_gib)")

#: One record per source of published_runs.csv (data/README.md lists them);
#: insertion order is matching order, the more specific patterns first.
SOURCE_FACTS: dict[str, SourceFacts] = {
    "megatron-2021": SourceFacts(
        "Narayanan", "Narayanan et al. SC'21 (arXiv:2104.04473) Sec. 5 and appendix: Megatron-LM, fp32 "
        "gradients, TFLOP/s counted with the recomputed forward", "megatron"),
    "megatron-readme-h100": SourceFacts(
        "Megatron-LM README", "NVIDIA/Megatron-LM README 'Performance Benchmarking' (commit f2e5db402c): model "
        "FLOPs, MFU against 989 TF (H100 bf16 dense), runs with --tp-comm-overlap", "megatron",
        flops="model", tp_comm_overlap=True),
    "megatron-ci": SourceFacts(
        "Megatron-LM tests/functional_tests", "NVIDIA/Megatron-LM tests/functional_tests/test_cases/*/"
        "*_memory_speed/golden_values_*.json and model_config.yaml", "megatron", memory_stat="allocated",
        defaults_note="grad dtype and TP overlap: Megatron-LM defaults (the rows do not say)"),
    "deepspeed-zero3": SourceFacts(
        "DeepSpeed blog", "DeepSpeed blog 2022 'Azure empowers easy-to-use, high-performance, hyperscale model "
        "training using DeepSpeed': TFLOP/s in the Megatron-paper accounting", "deepspeed"),
    "torchtitan-h100": SourceFacts(
        "asyncTP", "pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md; " + _TORCHTITAN,
        "torchtitan", default_seq_len=8192, memory_stat="reserved"),
    "torchtitan-h200": SourceFacts(
        "trainy", "pytorch/torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md; " + _TORCHTITAN,
        "torchtitan", default_seq_len=8192, memory_stat="reserved"),
    "nemo-24.07": SourceFacts(
        "NeMo docs/source/performance/performance_summary.md", "NVIDIA/NeMo docs/source/performance/"
        "performance_summary.md (24.07); " + _NEMO_RECIPES, "nemo", grad_dtype="bf16", tp_comm_overlap=True),
    "nemo-long-seq": SourceFacts(
        "performance_long_sequence.md", "NVIDIA/NeMo docs/source/performance/performance_long_sequence.md "
        "(commit 19fadb67b0): 'TFLOPS / GPU' are model FLOPs (data/README.md); " + _NEMO_RECIPES,
        "nemo", flops="model", grad_dtype="bf16", tp_comm_overlap=True),
    "dgxc-24.11": SourceFacts(
        "dgxc-benchmarking v24.11.1", "NVIDIA/dgxc-benchmarking v24.11.1 READMEs (NeMo recipes); " + _NEMO_RECIPES,
        "nemo", grad_dtype="bf16", tp_comm_overlap=True,
        # Megatron-Core shards experts over the tp group when ETP is not set: initialize_model_parallel
        # "if expert_tensor_parallel_size is None: expert_tensor_parallel_size = tensor_model_parallel_size"
        # (megatron/core/parallel_state.py); v25.05's Grok row of the same recipe states ETP=4 = tp.
        experts_split_by_tp=True),
    "dgxc-25.05": SourceFacts(
        "dgxc-benchmarking v25.05", "NVIDIA/dgxc-benchmarking v25.05 READMEs (NeMo recipes); " + _NEMO_RECIPES,
        "nemo", grad_dtype="bf16", tp_comm_overlap=True,
        # as dgxc-24.11: Megatron-Core's ETP default is tp
        experts_split_by_tp=True),
    "dgxc-25.04": SourceFacts(
        "dgxc", "NVIDIA/dgxc-benchmarking v25.04.02 READMEs (NeMo recipes); " + _NEMO_RECIPES,
        "nemo", grad_dtype="bf16", tp_comm_overlap=True,
        # as dgxc-24.11: Megatron-Core's ETP default is tp
        experts_split_by_tp=True),
    "internlm": SourceFacts(
        "InternLM", "InternLM/InternLM doc/train_performance.md: InternLM trainer, TFLOPS in the Megatron-paper "
        "accounting (data/README.md)", "internlm"),
    "mpt-llm-foundry": SourceFacts(
        "llm-foundry", "mosaicml/llm-foundry scripts/train/benchmarking/README.md: Composer with FSDP "
        "FULL_SHARD for every run", "composer", always_fsdp=True),
    "torchao-float8": SourceFacts(
        "pytorch/ao docs/source/workflows/training.md", "pytorch/ao docs/source/workflows/training.md "
        "'Training benchmarks' (torchtitan); " + _TORCHTITAN, "torchtitan", default_seq_len=8192,
        memory_stat="reserved"),
    "torchao-mxfp8": SourceFacts(
        "torchao/prototype/mx_formats", "pytorch/ao torchao/prototype/mx_formats/README.md 'Training e2e "
        "benchmarks on NVIDIA B200' (torchtitan); " + _TORCHTITAN, "torchtitan", default_seq_len=8192,
        memory_stat="reserved"),
    "torchao-float8nocompile": SourceFacts(
        "float8nocompile", "pytorch/ao torchao/prototype/float8nocompile/README.md (torchtitan, 8 H100); "
        + _TORCHTITAN, "torchtitan", default_seq_len=8192, memory_stat="reserved"),
    "torchao-moe": SourceFacts(
        "torchao/prototype/moe_training", "pytorch/ao torchao/prototype/moe_training/README.md (torchtitan); "
        + _TORCHTITAN, "torchtitan", default_seq_len=8192, memory_stat="reserved"),
    "mindformers": SourceFacts(
        "mindspore-lab/mindformers", "mindspore-lab/mindformers model cards (tokens/s per NPU; layout from the "
        "config at the same commit, data/README.md); MindSpore graph mode overlaps neither the data-parallel "
        "gradient reduction with the backward (parallel_speed_up_json enable_grad_comm_opt) nor the optimizer-"
        "parallel weight all-gather with the forward (enable_opt_shard_comm_opt): both default to false "
        "(mindspore/core/utils/ms_context.cc; mindspore.set_context docs), and MindFormers' parallel_speed_up.json "
        "examples (llama2 model card) keep them false", "mindformers",
        overlap_grad_reduce=False, overlap_param_gather=False,
        # MindFormers' training MoE FFN (LlamaFeedForward with expert_num > 1, the MoEV2 path) shards
        # each expert's weights over expert_parallel *and* model_parallel: LlamaFeedForward.shard,
        # "w1.shard(strategy_matmul=((dp, ep, 1, 1), (ep, mp, 1)))", w2 "(ep, 1, mp)", w3 "(ep, mp, 1)"
        # (mindformers/models/llama/llama_layer.py, commit 01982a66): expert tensor parallel = tp.
        experts_split_by_tp=True,
        defaults_note="grad dtype: not stated; Plan default"),
}


#: When each source's figures were published (year, month), and where that date is written:
#: what the time split of ``bench/out_of_sample.py`` orders the rows by. A row whose ``source``
#: cell names a month ("Mar-2025") or a commit of :data:`COMMIT_DATES` takes that date instead
#: (:func:`row_date`): a source whose tables were added over time (torchao's H100 then MI300X
#: tables, MindFormers' model cards) is dated per table.
SOURCE_DATES: dict[str, tuple[tuple[int, int], str]] = {
    "megatron-2021": ((2021, 4), "arXiv:2104.04473 (submitted April 2021)"),
    "megatron-readme-h100": ((2024, 7), "the cell: commit f2e5db402c, Jul-2024, Megatron-Core r0.8.0"),
    "megatron-ci": ((2026, 1), "the cells: golden values last changed Jan-2026 .. Jul-2026"),
    "deepspeed-zero3": ((2022, 1), "the cell: 'DeepSpeed blog 2022' (month not stated: January taken)"),
    "torchtitan-h100": ((2025, 6), "file name asyncTP_llama3_h100_2025-06_torchtitan.md"),
    "torchtitan-h200": ((2025, 6), "file name llama3-8b_h200_202506_trainy-whitefiber.md"),
    "nemo-24.07": ((2024, 7), "NeMo 24.07 container (NVIDIA's YY.MM release naming)"),
    "nemo-long-seq": ((2025, 5), "the cell: commit 19fadb67b0, May-2025"),
    "dgxc-24.11": ((2024, 11), "tag v24.11.1 (YY.MM release naming)"),
    "dgxc-25.04": ((2025, 4), "tag v25.04.02 (YY.MM release naming)"),
    "dgxc-25.05": ((2025, 5), "tag v25.05 (YY.MM release naming)"),
    "internlm": ((2023, 7), "InternLM/InternLM doc/train_performance.md added in commit fa7337b, 2023-07-06"),
    "mpt-llm-foundry": ((2023, 5), "mosaicml/llm-foundry scripts/train/benchmarking/README.md at that path from "
                                   "commit 300cc5c58, 2023-05-03 (its H100 sections: b2a43a147, 2023-10-19)"),
    "torchao-float8": ((2025, 3), "the cells: H100 table Mar-2025 (e850b90d2), MI300X table Aug-2025 (99562f045)"),
    "torchao-mxfp8": ((2025, 8), "pytorch/ao: the 'Training e2e benchmarks on NVIDIA B200' table first in "
                                 "commit d8bb51f63, 2025-08-15"),
    "torchao-float8nocompile": ((2024, 12), "the cell: commit 02d413c00, Dec-2024"),
    "torchao-moe": ((2025, 10), "pytorch/ao: the Llama4 Scout end-to-end table first in commit e9c7bead9, "
                                "2025-10-24 (the 'Case study' table: ccd503511, 2026-01-02)"),
    "mindformers": ((2024, 10), "commit 9719c5cd2 (2024-10-26) of most rows; each row's own commit "
                                "where :data:`COMMIT_DATES` has it"),
}

#: Commit dates (``git log -1 --format=%ad``) of the commits MindFormers rows cite, and of
#: torchao's 'Case study' table (the one moe_training table whose cell names no month).
COMMIT_DATES: dict[str, tuple[int, int]] = {
    "9719c5cd2": (2024, 10), "bc419f8a5": (2024, 9), "bd5f3c5c5": (2023, 9), "e445aade3": (2024, 5),
    "712dae58e": (2023, 9), "8813a417f": (2023, 9), "bb3bd418d": (2023, 9), "b23d1b02b": (2024, 5),
    "97e990157": (2024, 7), "003758e24": (2024, 12), "bff73eaf6": (2025, 12), "0ad8f2a0c": (2023, 8),
}
_CASE_STUDY = "Case study training at scale"


def row_date(source_cell: str, key: str) -> tuple[int, int]:
    """(year, month) a row was published: the earliest month its ``source`` cell names, else
    the date of a commit it names (:data:`COMMIT_DATES`), else its source's (:data:`SOURCE_DATES`)."""
    months = [(int(y), _MONTHS.index(m) + 1) for m, y in _SOURCE_DATE.findall(source_cell or "")]
    if months:
        return min(months)
    commits = [COMMIT_DATES[c] for c in re.findall(r"commit ([0-9a-f]{9})", source_cell or "") if c in COMMIT_DATES]
    if commits:
        return min(commits)
    if _CASE_STUDY in (source_cell or ""):
        return (2026, 1)
    return SOURCE_DATES[key][0]


#: The framework (:mod:`partita.cost.frameworks`) each source's runs are estimated as run
#: by, from :attr:`SourceFacts.framework`, with why. Trainers outside the five named
#: frameworks map to the one that behaves the same in every modelled term.
RUNS_AS: dict[str, tuple[str, str]] = {
    "megatron": ("megatron", "Megatron-LM itself"),
    "nemo": ("megatron", "NeMo trains through Megatron-Core with Transformer Engine (fused kernels, reentrant "
             "checkpoint, distributed optimizer with overlapped param gather)"),
    "deepspeed": ("deepspeed", "DeepSpeed"),
    "torchtitan": ("torchtitan", "torchtitan (torchao's benchmarks run torchtitan's train.py)"),
    "internlm": ("internevo", "InternLM trainer (InternEvo): flash-attn fused kernels, its activation checkpoint is "
                 "a reentrant autograd Function (internlm/solver/activation_checkpoint.py), hybrid ZeRO-1 whose "
                 "parameter sync is a broadcast per shard owner after the step (overlap_sync_param=False in its "
                 "configs): cost/frameworks.py ``internevo``"),
    "composer": ("megatron", "Composer/llm-foundry: flash/triton attention and fused LayerNorm; the benchmark table "
                 "does not state its checkpoint flavour, kept at the reference (whole-forward recompute)"),
    "mindformers": ("mindformers", "MindSpore on Ascend: graph-mode fused kernels, recompute reruns the forward: "
                    "MindSpeed's behaviour in every time term; its AdamW keeps no fp32 master "
                    "(cost/frameworks.py ``mindformers``)"),
}


#: Corrections of a CSV cell, each from the source's own run configuration; applied by
#: the loader (the shared CSV stays as its sources printed it). (source key, model_name,
#: column, value, citation).
ERRATA: tuple[tuple[str, str, str, str, str], ...] = (
    ("dgxc-25.04", "Nemotron4-340B", "vpp", "12",
     "NVIDIA/dgxc-benchmarking nemotron/README_340b.md, 'maintain these values ... "
     "training.model.virtual_pipeline_model_parallel_size=12' (tp 8, pp 8, mbs 1, gbs = nodes x 2, "
     "the layout of these rows); the v25.04.02 results table prints VP=NA, the run config sets 12"),
    ("mindformers", "TeleChat2-115B", "vpp", "3",
     "mindspore-lab/mindformers research/telechat2/telechat2-115b/finetune_telechat_115b.yaml at bff73eaf6 (the "
     "row's linked yaml): parallel.pipeline_config.pipeline_interleave True and model_config.pp_interleave_num 3; "
     "research/telechat2/telechat.py passes it to LayerSetting, which splits each of the 8 stages into 3 "
     "interleaved chunks (mindformers/parallel_core/training_graph/transformer/utils.py); the README table "
     "prints no layout. The only MindFormers row with pp > 1 whose yaml sets pipeline_interleave"),
)


def with_errata(row: dict, key: str) -> dict:
    """The row with every :data:`ERRATA` correction for its source and model applied, where
    the cell is blank (a stated value is never overwritten)."""
    fixes = {col: value for src, model, col, value, _ in ERRATA if src == key and model == row["model_name"]}
    if not fixes:
        return row
    return {**row, **{col: value for col, value in fixes.items() if not row.get(col, "").strip()}}


#: Evidence in a row's own ``notes`` that its run was not compiled, and the variant of its
#: source's framework such a run is estimated as run by. The torchtitan / torchao rows state
#: it ("precision=bf16 (eager)", "float8nocompile ... linears (eager, Triton kernels)"; the
#: compiled ones "torch.compile" / "compile on"); a row that says both is read as compiled,
#: its framework's default. (``float8nocompile`` alone names the prototype, not the mode:
#: its table also has a "float8 + torch.compile" row.)
EAGER_NOTES = re.compile(r"\beager\b|\bno[ -]compile\b|without (?:torch\.)?compile|compile (?:off|disabled)", re.I)
COMPILED_NOTES = re.compile(r"torch\.compile|\bcompile on\b|\bcompiled\b", re.I)
EAGER_VARIANT: dict[str, str] = {"torchtitan": "torchtitan-eager"}


def runs_eager(notes: str) -> bool:
    """Whether a row's notes say its run was eager (not compiled): :data:`EAGER_NOTES`
    without :data:`COMPILED_NOTES`."""
    return bool(EAGER_NOTES.search(notes or "")) and not COMPILED_NOTES.search(notes or "")


#: torchtitan compiled its loss from commit bbb1b616e (2025-04-02); a row whose source dates
#: its table ("Mar-2025", "Dec-2024") before that ran compiled blocks with an eager loss.
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_SOURCE_DATE = re.compile(rf"\b({'|'.join(_MONTHS)})-(20\d\d)\b")
LOSS_COMPILED_SINCE = (2025, 4)


def dated_before_loss_compile(source: str) -> bool:
    """Whether the earliest month a row's source names (its table's first publication) is
    before torchtitan compiled its loss (:data:`LOSS_COMPILED_SINCE`)."""
    dates = [(int(y), _MONTHS.index(m) + 1) for m, y in _SOURCE_DATE.findall(source or "")]
    return bool(dates) and min(dates) < LOSS_COMPILED_SINCE


def runs_as(facts: SourceFacts, notes: str = "", source: str = "", zero_cell: str = "") -> str:
    """The :mod:`partita.cost.frameworks` name a source's runs are estimated as run by;
    a row whose ``notes`` say it ran eager takes its framework's eager variant
    (:data:`EAGER_VARIANT`: torchtitan without torch.compile saves the unfused ops'
    tensors and has no async TP, :mod:`partita.cost.frameworks`).

    torchtitan rows whose notes say "async TP" still run without tp overlap here: the
    devices' ``tp_overlap`` is fitted on Transformer Engine userbuffers runs (NeMo, the
    Megatron README), and torchtitan's async TP hides less - the rows' own pairs gain 4-9 %
    throughput (Llama-3.1-70B bf16 597 -> 652, 8B 4378 -> 4809 tokens/s) where TE's share
    would give ~19 %; applying it made those rows 8-14 % fast-predicted.

    A compiled torchtitan row whose ``source`` dates it before 2025-04
    (:func:`dated_before_loss_compile`) runs as ``torchtitan-eager-loss``: compiled blocks,
    eager cross-entropy (its loss phase holds 12 bytes per logit, not 4: cost/memory.py).

    A row whose ``zero_stage/fsdp`` cell names DeepSpeed (``zero_cell``) ran on DeepSpeed
    whatever its source's framework: Narayanan et al. SC'21 compare Megatron's PTD-P with
    "ZeRO-3 without model parallelism" run in DeepSpeed (Sec. 5.3)."""
    name = RUNS_AS[facts.framework][0]
    if zero_cell and "deepspeed" in zero_cell.lower():  # e.g. Narayanan et al.'s ZeRO-3 baseline
        return "deepspeed"
    if runs_eager(notes):
        return EAGER_VARIANT.get(name, name)
    if name == "torchtitan" and dated_before_loss_compile(source):
        return "torchtitan-eager-loss"
    return name


def source_key(source: str) -> str | None:
    """The :data:`SOURCE_FACTS` key of a CSV ``source`` cell (None: not in the table)."""
    for key, facts in SOURCE_FACTS.items():
        if facts.match in source:
            return key
    return None


def short_source(source: str) -> str:
    """A short name for reports: the table key, or the cell's start for unknown sources."""
    return source_key(source) or source[:30]


def _int(value: str, default: int | None = None) -> int | None:
    value = (value or "").strip()
    if not value:
        return default
    return int(float(value))


def _etp(notes: str, tp: int = 1, experts_split_by_tp: bool = False) -> int:
    """The expert tensor parallel size the row's notes state ("ETP=4 (expert tensor parallel)",
    "ETP 1"); when they state none: ``tp`` for a framework that always shards experts over the
    tensor-parallel group (:attr:`SourceFacts.experts_split_by_tp`: MindFormers, and the NeMo /
    Megatron-Core dgxc recipes, whose ETP defaults to tp), else 1 (the plan default)."""
    m = re.search(r"\bETP[ =](\d+)", notes)
    return int(m.group(1)) if m else (tp if experts_split_by_tp else 1)


#: A row's notes stating that attention ran unfused (Megatron-Core ``--attention-backend
#: unfused``, e.g. "UNFUSED attention backend (deterministic-mode workaround) so attention
#: activations are materialised"): its layers keep the softmax probabilities
#: (cost/memory.py ``unfused_attention_bytes``).
UNFUSED_ATTENTION_NOTES = re.compile(r"\bunfused attention\b|attention[- ]backend[ =]unfused", re.I)


def _attention(notes: str) -> str:
    """The plan's ``attention``: ``unfused`` where the notes say so (:data:`UNFUSED_ATTENTION_NOTES`)."""
    return "unfused" if UNFUSED_ATTENTION_NOTES.search(notes or "") else "fused"


def _precision(notes: str) -> str:
    m = re.match(r"precision=([^;,(]+)", notes)
    text = (m.group(1) if m else "").lower()
    if "fp8" in text or "float8" in text:
        return "fp8"
    if "fp16" in text and "bf16" not in text:
        return "fp16"
    return "bf16"


def _fp8_recipe(notes: str) -> str:
    """The fp8 scaling recipe a row's precision names (``Plan.fp8_recipe``): torchao's rowwise
    recipes ("float8 rowwise", "rowwise_with_gw_hp") and MX ("mxfp8") by name, else tensorwise
    (Transformer Engine's delayed / current scaling and torchao's default are per tensor)."""
    m = re.match(r"precision=([^;]+)", notes)
    text = (m.group(1) if m else "").lower()
    return "rowwise" if "rowwise" in text else "mxfp8" if "mxfp8" in text else "tensorwise"


def _zero(text: str, fsdp_hint: bool) -> int:
    """The ZeRO stage a row's ``zero_stage/fsdp`` cell describes.

    MindSpore's optimizer parallel (``enable_parallel_optimizer``) is read as zero 2 by its
    memory: MindSpore docs, "Optimizer Parallel" (features/parallel/optimizer_parallel.md,
    r2.2-r2.10): "the framework saves the parameters as minimal slices and updates them in
    the optimizer"; the forward all-gathers each weight and the backward reduce-scatters its
    gradient, so the gradients and optimizer states are 1/dp slices. The all-gathered weight
    feeds both the forward MatMul and its input-gradient MatMul in the compiled graph, so it
    stays live through the step unless ``parallel_optimizer_comm_recompute`` (MindFormers
    recompute_config, off by default) re-gathers it: full weights, sharded gradients and
    states - ZeRO-2's peak. Known gap: the 1/dp weight slice the optimizer updates is held
    besides the gathered copy (1/dp of the weights, not counted). With gradient
    accumulation MindFormers' configs set ``parallel_optimizer_config:
    gradient_accumulation_shard: False`` (configs/*/*.yaml ``parallel:`` block): the
    accumulated gradient is kept whole and reduce-scattered once per step
    (:func:`_grad_accum_mode`: ``unsharded``)."""
    t = text.lower()
    if "zero-3" in t or "full_shard" in t or "fsdp" in t or fsdp_hint:
        return 3
    if "optimizer parallel" in t and "mindspore" in t:
        return 2
    if "distributed optimizer" in t or "zero-1" in t:
        return 1
    if "none" in t:
        return 0
    return 1


def _grad_accum_mode(text: str) -> str:
    """``unsharded`` for MindSpore optimizer parallel (:func:`_zero`: MindFormers'
    ``gradient_accumulation_shard: False``), else the plan default ``sharded``."""
    t = text.lower()
    return "unsharded" if "optimizer parallel" in t and "mindspore" in t else "sharded"


def _dp_shard(text: str, dp: int) -> int:
    """HSDP shard group from "ZeRO-1 within groups of N" (InternLM's hybrid zero: the optimizer
    sharded within N ranks, replicated across): N when it divides dp and is smaller, else 0."""
    m = re.search(r"within groups of (\d+)", text.lower())
    n = int(m.group(1)) if m else 0
    return n if 0 < n < dp and dp % n == 0 else 0


def _recompute(text: str) -> str:
    t = text.lower()
    if t.startswith("full") or _layer_ac_every(t):
        return "full"
    if t.startswith("selective"):
        return "selective"
    return "none"


_ORDINAL = {"2nd": 2, "second": 2, "other": 2, "3rd": 3, "third": 3}


def _layer_ac_every(text: str) -> int:
    """k of torchtitan's layer-wise AC stated as "per-layer AC, every 2nd layer" (0: not
    stated). torchtitan's ``selective_ac_option = "k"`` wraps a block in the full-AC
    checkpoint wrapper when its running count (from 1, in apply order) is a multiple of
    k (torchtitan/models/llama3/parallelize.py ``_apply_ac_to_transformer_block``,
    ``ptd_checkpoint_wrapper._count % ac_freq == 0``; torchtitan docs, "activation
    checkpointing": "selective_ac_option = '2' # 'int' = ac every positive int layer"):
    whole blocks, so partita reads it as full recompute of some layers."""
    m = re.search(r"per-layer ac,? every (\d+)(?:st|nd|rd|th)?\b|per-layer ac,? every (second|other|third)\b", text.lower())
    if not m:
        return 0
    return int(m.group(1)) if m.group(1) else _ORDINAL[m.group(2)]


def _recompute_layers(text: str, metric: str, stage_layers: int) -> int:
    """Layers per stage a row recomputes when it states only some (0: all or none).

    * torchtitan layer-wise AC every k-th block (:func:`_layer_ac_every`): the blocks
      counted ``k, 2k, ...`` of a stage's ``L``: ``floor(L / k)``.
    * MindFormers "full on [a, b, ...] layers per pipeline stage": a count per stage,
      which one ``recompute_layers`` cannot hold; the single N chosen errs on the safe
      side of the row's figure - for a step time the largest (no stage is given less
      recompute than it ran), for a memory figure the smallest (no stage keeps fewer
      activations than it did; 0 there means none)."""
    t = text.lower()
    every = _layer_ac_every(t)
    if every:
        return stage_layers // every
    m = re.match(r"full on \[([\d,\s]+)\] layers per pipeline stage", t)
    if not m:
        return 0
    counts = [int(c) for c in m.group(1).replace(",", " ").split()]
    n = min(counts) if "mem" in metric.lower() else max(counts)
    return min(n, stage_layers) if n else -1  # -1: the row recomputes no layer of some stage


def _moe_model(row: dict) -> ModelSpec:
    """A MoE row's model from :data:`MOE_ARCH` and the row's own dimensions."""
    name = row["model_name"]
    arch = next((v for k, v in MOE_ARCH.items() if name.startswith(k)), None)
    if arch is None:
        raise PartitaError("mixture of experts: architecture not in MOE_ARCH (add it with its config's citation)")
    if isinstance(arch, str):
        preset = load_model(arch)
        return dataclasses.replace(preset, name=name, layers=_int(row["n_layers"]) or preset.layers,
                                   vocab=_int(row["vocab"], preset.vocab) or preset.vocab,
                                   max_positions=max(preset.max_positions, _int(row["seq_len"], 0) or 0)).validated(name)
    fields, dense_ffn = arch
    fields = dict(fields)
    mla = fields.pop("mla", None)  # DeepSeek multi-head latent attention (config's lora ranks / head dims)
    vocab = fields.pop("vocab", None)  # the config's vocabulary where the row leaves it blank
    h, L, f = _int(row["hidden"]), _int(row["n_layers"]), _int(row["ffn_hidden"])
    a, kv, V = _int(row["n_heads"]), _int(row["n_kv_heads"]), _int(row["vocab"], vocab or 128256)
    return ModelSpec(name=name, hidden=h, layers=L, heads=a, kv_heads=kv or a, ffn_hidden=dense_ffn or f, vocab=V,
                     moe=MoESpec(**fields), mla=MLASpec(**mla) if mla else None,
                     max_positions=_int(row["seq_len"], 4096) or 4096,
                     source="published_runs.csv").validated(name)


def _model(row: dict) -> ModelSpec:
    if (_int(row.get("n_experts", ""), 1) or 1) > 1:
        return _moe_model(row)
    h, L, f = _int(row["hidden"]), _int(row["n_layers"]), _int(row["ffn_hidden"])
    a, kv, V = _int(row["n_heads"]), _int(row["n_kv_heads"]), _int(row["vocab"], 51200)
    if not all((h, L, f, a)):
        raise PartitaError("architecture not given (hidden/layers/ffn/heads blank)")
    name = row["model_name"]
    gpt = name.lower().startswith(("gpt", "mpt"))
    nemotron = "nemotron" in name.lower()
    act = "gelu" if gpt else ("relu2" if nemotron else "swiglu")
    return ModelSpec(name=name, hidden=h, layers=L, heads=a, kv_heads=kv or a, ffn_hidden=f, vocab=V,
                     activation=act, norm="layernorm" if gpt or nemotron else "rmsnorm",
                     tied_embeddings=gpt, position="learned" if name.lower().startswith("gpt") else "rope",
                     max_positions=_int(row["seq_len"], 2048) or 2048, dropout=name.lower().startswith("gpt-"),
                     source="published_runs.csv").validated(name)


def megatron_hw_flops(model: ModelSpec, gbs: int, seq: int) -> float:
    """``96 B s l h^2 (1 + s/6h + V/16lh)``: FLOPs per step incl. the recomputed forward."""
    h, L, V = model.hidden, model.layers, model.vocab
    return 96 * gbs * seq * L * h * h * (1 + seq / (6 * h) + V / (16 * L * h))


def megatron_model_flops(model: ModelSpec, gbs: int, seq: int) -> float:
    """Megatron-LM ``num_floating_point_operations`` (2024): model FLOPs per step."""
    h, L, V = model.hidden, model.layers, model.vocab
    gated = 1.5 if model.gated else 1.0
    attn = 1 + model.kv_heads / model.heads + seq / h
    return 12 * gbs * seq * L * h * h * (attn + model.ffn_hidden / h * gated) + 6 * gbs * seq * h * V


def load_cases(csv_path: str | Path) -> tuple[list[Case], list[tuple[str, str]]]:
    """All rows that can be predicted, and (row description, reason) for the ones skipped."""
    cases: list[Case] = []
    skipped: list[tuple[str, str]] = []
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        label = f"{short_source(row['source'])}: {row['model_name']} on {row['n_devices']} {row['hardware'].split()[0]}"
        try:
            cases.append(_case(row))
        except PartitaError as e:
            skipped.append((label, str(e)))
    return cases, skipped


def _case(row: dict) -> Case:
    key = source_key(row["source"])
    if key is None:
        raise PartitaError("source not in SOURCE_FACTS (add its facts with a citation)")
    facts = SOURCE_FACTS[key]
    row = with_errata(row, key)
    hw_token = hardware_token(row["hardware"], key)
    if hw_token not in HARDWARE:
        raise PartitaError(f"hardware {hw_token} not in the catalog")
    if "LAYOUT INCONSISTENT" in row["notes"]:
        raise PartitaError("the source's layout columns contradict its device count (notes)")
    n = _int(row["n_devices"])
    tp, pp = _int(row["tp"]), _int(row["pp"])
    if tp is None or pp is None:
        raise PartitaError("parallel layout (tp/pp) not stated")
    model = _model(row)
    cp = _int(row["cp"], 1) or 1
    vpp = _int(row["vpp"], 1) or 1
    seq = _int(row["seq_len"]) or facts.default_seq_len
    if not seq:
        raise PartitaError("sequence length not stated")
    dp = n // (tp * pp * cp)
    mbs = _int(row["micro_batch"], 1) or 1
    gbs = _int(row["global_batch"])
    if not gbs:
        raise PartitaError("global batch not stated")
    sp_text = row["sequence_parallel"].strip().lower()
    sp = (sp_text == "y") if sp_text else tp > 1
    split = balanced_split(model.layers, pp * vpp) if model.layers % (pp * vpp) else None
    ep = _int(row.get("ep", ""), 1) or 1  # Megatron: EP carved out of dp x cp (data README)
    recompute = _recompute(row["recompute"])
    rc_layers = _recompute_layers(row["recompute"], row["measured_metric"], max(split or (model.layers // (pp * vpp),)))
    if rc_layers < 0:
        recompute, rc_layers = "none", 0
    etp = _etp(row["notes"], tp, facts.experts_split_by_tp and bool(model.moe_layers))
    plan = Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, layer_split=split,
                sp=sp and tp > 1, zero=_zero(row["zero_stage/fsdp"], facts.always_fsdp),
                dp_shard=_dp_shard(row["zero_stage/fsdp"], dp), grad_accum_mode=_grad_accum_mode(row["zero_stage/fsdp"]),
                mbs=mbs, gbs=gbs, seq_len=seq,
                recompute=recompute, recompute_layers=rc_layers, dtype=_precision(row["notes"]),
                fp8_recipe=_fp8_recipe(row["notes"]),
                schedule="interleaved-1f1b" if vpp > 1 else "1f1b",
                grad_dtype=facts.grad_dtype, tp_comm_overlap=facts.tp_comm_overlap,
                overlap_grad_reduce=facts.overlap_grad_reduce, overlap_param_gather=facts.overlap_param_gather,
                framework=runs_as(facts, row["notes"], row["source"], row["zero_stage/fsdp"]), attention=_attention(row["notes"]))
    node_size = make_cluster(HARDWARE[hw_token]).devices_per_node
    per_node = nodes_of(node_size, n)
    nic = stated_network_gbps(row["hardware"], node_size)
    cluster = make_cluster(HARDWARE[hw_token], n, devices_per_node=per_node,
                           overrides={"inter_node": {"gbps_per_direction": nic}} if nic else None)
    if not cluster.device.supports(plan.dtype):
        raise PartitaError(f"precision {plan.dtype} not supported by {cluster.device.name}")
    errs = validate(plan, model, n)
    if errs:
        raise PartitaError("layout not expressible: " + "; ".join(errs))
    metric, value = row["measured_metric"], float(row["measured_value"])
    measured, kind = _measured(metric, value, facts, model, gbs, seq, n)
    return Case(source=key, name=row["model_name"], model=model, cluster=cluster, plan=plan, metric=kind,
                measured=measured, raw_metric=metric, raw_value=value, sku_stated=sku_stated(row["hardware"], key),
                date=row_date(row["source"], key))


def _measured(metric: str, value: float, facts: SourceFacts, model: ModelSpec, gbs: int, seq: int,
              n: int) -> tuple[float, str]:
    """(what the figure implies, "step_time_s" or "peak_memory_gib") under the source's
    own FLOP accounting (:class:`SourceFacts`)."""
    if metric == "iter_time_s":
        return value, "step_time_s"
    if metric == "tokens_per_s_per_gpu":
        return gbs * seq / (value * n), "step_time_s"
    if metric == "tflops_per_gpu":
        flops = megatron_model_flops(model, gbs, seq) if facts.flops == "model" else megatron_hw_flops(model, gbs, seq)
        return flops / (value * 1e12 * n), "step_time_s"
    if metric == "mfu_pct":
        return megatron_model_flops(model, gbs, seq) / (value / 100 * facts.mfu_peak_tflops * 1e12 * n), "step_time_s"
    if metric == "peak_mem_gib":
        return value, "peak_memory_gib"
    raise PartitaError(f"metric {metric} not compared")
