"""Megatron's ``--optimizer-cpu-offload`` read into the plan (``optimizer_offload``) and its device
memory (issue 33: published layouts that ran must not be ruled out; Megatron-MoE-ModelZoo's
DeepSeek-V3 long-context runs on 256 H100s offload the optimizer and were predicted at 105-107 GiB).

Expected values come from Megatron-LM's own sources and docs (cited per test), not from the
code under test."""
from __future__ import annotations

import shlex

import pytest

from conftest import rank0_states
from partita.errors import PartitaError
from partita.imports.megatron import read_megatron
from partita.spec.load import load_model

LLAMA70 = ("--num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 "
           "--group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm "
           "--position-embedding-type rope --untie-embeddings-and-output-weights --disable-bias-linear "
           "--vocab-size 128256 --seq-length 4096 --bf16 ")


def read(text: str, world: int):
    return read_megatron(shlex.split(text), world)


@pytest.mark.parametrize("flags,fraction", [("", 0.0), ("--optimizer-cpu-offload", 1.0),
                                             ("--optimizer-cpu-offload --optimizer-offload-fraction 0.5", 0.5),
                                             ("--optimizer-offload-fraction 0.5", 0.0)])
def test_optimizer_cpu_offload_is_a_plan_field(flags, fraction):
    # Megatron-LM@d98e8a6 megatron/training/arguments.py: --optimizer-cpu-offload "Offload optimizer state
    # to CPU"; --optimizer-offload-fraction "Ratio of optimizer state to offload to CPU", default 1.0, read
    # only with the offload on. Its time is still named (the host step), its memory no longer is.
    r = read(LLAMA70 + "--use-distributed-optimizer --use-precision-aware-optimizer " + flags, 8)
    assert r.plan.optimizer_offload == fraction
    assert [n for n in r.not_modelled if "offload" in n] == (
        ["--optimizer-cpu-offload: the optimizer step on the host and its device-host copies take time the "
         "estimate does not count (the states' memory is modelled)"] if "cpu-offload" in flags else [])


@pytest.mark.parametrize("dp,fraction", [(8, 1.0), (8, 0.5), (4, 1.0)])
def test_optimizer_cpu_offload_leaves_what_megatron_documents(dp, fraction):
    # Megatron-LM@d98e8a6 docs/user-guide/features/dist_optimizer.md: bf16 parameters with fp32 gradients
    # take 6 + 12/d bytes per parameter with the distributed optimizer (the 12: fp32 master, Adam m, v);
    # HybridDeviceOptimizer (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py) holds the offloaded
    # fraction's fp32 copies and moments in host memory, the device keeps the 6
    params = load_model("llama3-8b").total_params()
    on_device = rank0_states("llama3-8b", dp, zero=1, optimizer_offload=fraction)
    assert sum(rank0_states("llama3-8b", dp, zero=1).values()) == pytest.approx(params * (6 + 12 / dp))
    assert sum(on_device.values()) == pytest.approx(params * (6 + (1 - fraction) * 12 / dp))


def test_optimizer_offload_fraction_is_a_ratio():
    from partita.plan import Plan, check
    with pytest.raises(PartitaError) as e:
        check(Plan(dp=8, gbs=8, optimizer_offload=1.5), None, 8)
    assert "optimizer_offload is the fraction" in str(e.value) and "\n" not in str(e.value)


SWIFT = """NPROC_PER_NODE=8 \\
megatron sft \\
    --model Qwen/Qwen2.5-72B-Instruct \\
    --tensor_model_parallel_size 8 \\
    --micro_batch_size 1 \\
    --max_length 8192 \\
    --recompute_granularity full \\
    --recompute_method uniform \\
    --recompute_num_layers 1 \\
    --sequence_parallel true \\
    --optimizer_cpu_offload true \\
    --use_precision_aware_optimizer true \\
    --optimizer_offload_fraction 1 \\
"""


@pytest.mark.parametrize("batching,padding_free", [("--packing true", False), ("", True),
                                                   ("--padding_free false", False)])
def test_megatron_swift_offload_and_padding_free(tmp_path, batching, padding_free):
    # ms-swift@3602360 examples/megatron/dense/72b_offload.sh (measured "8 * 65GiB"): ms-swift passes
    # --optimizer_cpu_offload / --optimizer_offload_fraction to Megatron as its own flags. Megatron-SWIFT's
    # padding_free is True by default (swift/megatron/arguments/megatron_args.py) and moot with packing.
    from partita.imports import load_config
    path = tmp_path / "sft.sh"
    path.write_text(SWIFT + f"    {batching}\n")
    read = load_config(str(path))
    assert read.plan.optimizer_offload == 1.0
    names = [n.split(" ")[0].rstrip(":") for n in read.not_modelled]
    assert ("--padding_free" in names) is padding_free
    assert names.count("--optimizer_cpu_offload") == 1  # the host step's time, named once
    assert "--use_precision_aware_optimizer" not in names  # Megatron's flag: moment_dtype, fp32 by default
    assert read.plan.moment_dtype == "fp32"


def test_a_fraction_megatron_cannot_parse_is_refused_in_one_line(tmp_path):
    # Pai-Megatron-Patch@a098ca5 examples/moonlight/run_mcore_moonlight.sh with its README's arguments
    # passes "--optimizer-offload-fraction none"; Megatron's argparse (type=float) refuses it too
    from partita.imports import load_config
    path = tmp_path / "run.sh"
    path.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 8 " + LLAMA70 +
                    "--use-distributed-optimizer --optimizer-cpu-offload --optimizer-offload-fraction none\n")
    with pytest.raises(PartitaError) as e:
        load_config(str(path))
    assert "--optimizer-offload-fraction" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("dtype,moment_bytes", [("bf16", 2), ("fp8", 1)])
def test_precision_aware_moments_hold_what_megatron_stores(dtype, moment_bytes):
    # Megatron-LM@d98e8a6 arguments.py: --exp-avg-dtype / --exp-avg-sq-dtype (fp32, fp16, bf16, fp8) store
    # Adam's moments "in memory during training" with --use-precision-aware-optimizer; the fp32 master
    # (--main-params-dtype fp32) is kept as its 16 low bits only: OptimizerConfig.store_param_remainders
    # defaults True (megatron/core/optimizer/optimizer_config.py) and the distributed optimizer allocates
    # the master shard as torch.int16 for bf16 params (distrib_optimizer.py, TE FusedAdam): weights 2 +
    # fp32 grads 4 + (2 + 2 x bytes) / d per parameter, against 6 + 12/d
    params = load_model("llama3-8b").total_params()
    r = read(LLAMA70 + f"--use-distributed-optimizer --use-precision-aware-optimizer --exp-avg-dtype {dtype} "
             f"--exp-avg-sq-dtype {dtype}", 8)
    assert r.plan.moment_dtype == dtype and r.not_modelled == ()
    states = rank0_states("llama3-8b", 8, zero=1, moment_dtype=dtype)
    assert sum(states.values()) == pytest.approx(params * (6 + (2 + 2 * moment_bytes) / 8))
    # MindSpeed-LLM's core (core_v0.12.1) has no store_param_remainders: the 4-byte master stays
    mindspeed = rank0_states("llama3-8b", 8, zero=1, moment_dtype=dtype, framework="mindspeed")
    assert sum(mindspeed.values()) == pytest.approx(params * (6 + (4 + 2 * moment_bytes) / 8))
    mixed = read(LLAMA70 + "--use-distributed-optimizer --use-precision-aware-optimizer --exp-avg-dtype bf16", 8)
    assert mixed.plan.moment_dtype == "fp32" and mixed.not_modelled[0].startswith("--exp-avg-dtype bf16")
    assert read(LLAMA70 + "--use-distributed-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16",
                8).plan.moment_dtype == "fp32"  # without the precision-aware optimizer the dtypes are unused


def test_offloaded_optimizer_keeps_fp32_moments_on_the_device():
    # Megatron-Core passes exp_avg_dtype / exp_avg_sq_dtype only to the non-offloaded Adam
    # (megatron/core/optimizer/__init__.py: `if config.optimizer_cpu_offload:` builds
    # HybridDeviceOptimizer first), so with an offload the device share holds fp32 master + m + v:
    # (1 - f) x 12 / d bytes per parameter (dist_optimizer.md), whatever --exp-avg-dtype says
    params = sum(rank0_states("llama3-8b", 8, zero=1).values()) / (6 + 12 / 8)
    offloaded = rank0_states("llama3-8b", 8, zero=1, moment_dtype="bf16", optimizer_offload=0.5)
    assert offloaded["optimizer"] == pytest.approx(params * 0.5 * 12 / 8)
