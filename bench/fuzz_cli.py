"""Fuzz every command and flag of the planning CLI with careless input (issue 16).

``python bench/fuzz_cli.py`` runs ~750 cases over ``estimate``, ``plan``, ``export``,
``import``, ``models``, ``hardware``, ``calibrate``, ``profile`` and ``train``
(``calibrate``, ``profile`` and ``train`` are fuzzed for argument validation: a bad case
that gets as far as starting torchrun is stopped and counted as *launched*; the
``calibrate --timeout-s 2`` case must start it and stop it cleanly, and four good
``train`` runs - ``--steps 2`` on tiny models, 1-2 processes - really train).

Every case runs :func:`partita.cli.main.main` in a forked child of this process (the
imports are shared, so a case costs milliseconds; a child still running after
``--timeout`` seconds is killed and counted as a hang), with stdout and stderr captured
(or stdout on ``/dev/full``). Each case carries what a correct CLI does with it:

* ``bad``: a user mistake: exit 2 and exactly one ``partita: error:`` line;
* ``good``: valid input: exit 0, no NaN/inf anywhere in the output;
* ``either``: valid-looking but possibly impossible (e.g. the largest allowed sizes):
  exit 0 with finite output or exit 2 with one line, in bounded time.

Failure classes: ``traceback`` (an exception escaped, or an internal error), ``hang``,
``nonfinite`` (NaN/inf in the output), ``accepted`` (a ``bad`` case exited 0),
``launched`` (a ``bad`` calibrate/profile/train case would have started processes), ``rejected``
(a ``good`` case did not exit 0), ``messy`` (a wrong exit code or not one line).

Figures are printed per category; ``--show`` prints every failing case. Exit status 1
when anything failed. The temp folder it works in is removed at the end.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import pickle
import re
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

# Imported once, so every forked case starts with the command modules loaded.
import partita.estimate  # noqa: E402,F401
import partita.export  # noqa: E402,F401
import partita.search.engine  # noqa: E402,F401
import partita.search.explain  # noqa: E402,F401
import partita.spec.hf_config  # noqa: E402,F401
import rich.table  # noqa: E402,F401
from partita.cli.main import main as partita_main  # noqa: E402

HUGE = "99999999999999999999"
E = ["estimate", "--model", "llama-7b", "--hardware", "h100-sxm", "--devices", "8", "--global-batch", "64"]
P = ["plan", "--model", "llama-7b", "--hardware", "h100-sxm", "--devices", "16", "--global-batch", "64", "--top", "1"]
GOOD_PLAN = {"dp": 8, "tp": 1, "pp": 1, "mbs": 1, "gbs": 64}
DEVICE_FILE = ROOT / "src/partita/catalog/devices/h100-sxm.json"
MODEL = {"hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 8, "ffn_hidden": 11008, "vocab": 32000}
HF = {"model_type": "llama", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
      "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936}
MEGATRON = ("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size {tp} "
            "--pipeline-model-parallel-size {pp} --micro-batch-size {mbs} --global-batch-size {gbs} "
            "--seq-length {seq} --num-layers 32 --bf16\n")


@dataclass
class Case:
    category: str
    name: str
    argv: list[str]
    expect: str  # "bad" | "good" | "either"
    launch_ok: bool = False  # may start torchrun (the calibrate --timeout-s 2 case)
    full_stdout: bool = False  # stdout is /dev/full


# ------------------------------------------------------------------ files
class Files(dict):
    """key -> path of the input files the cases name, written under ``root``."""

    def __init__(self, root: Path):
        super().__init__()
        self.root = root

    def put(self, key: str, content: str | bytes | dict | list, name: str | None = None) -> str:
        path = self.root / (name or f"{key}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, (dict, list)):
            content = json.dumps(content)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        self[key] = str(path)
        return str(path)


def malformed(files: Files, prefix: str) -> list[str]:
    """Files that are not a JSON object of the right kind; returns their keys."""
    bad = {"notutf8": b'{"a": "\xff\xfe"}', "deep": "[" * 50000 + "]" * 50000,
           "deepobj": '{"a":' * 50000 + "1" + "}" * 50000, "garbage": "not json at all", "empty": "",
           "list": "[1, 2]", "number": "3", "null": "null", "string": '"x"', "nan": "NaN", "bom": "\ufeff{",
           "binary": bytes(range(256)), "truncated": '{"a": 1', "dup": '{"a": 1, "a": 2}',
           "big_int": '{"a": ' + "9" * 5000 + "}"}
    keys = []
    for key, content in bad.items():
        files.put(f"{prefix}_{key}", content)
        keys.append(f"{prefix}_{key}")
    (files.root / f"{prefix}_dir.json").mkdir()
    files[f"{prefix}_dir"] = str(files.root / f"{prefix}_dir.json")
    files[f"{prefix}_missing"] = str(files.root / f"{prefix}_missing.json")
    return keys + [f"{prefix}_dir", f"{prefix}_missing"]


def make_files(root: Path) -> Files:
    f = Files(root)
    f.put("good_plan", GOOD_PLAN)
    f.put("good_model", MODEL)
    f.put("good_hf", HF, "hf/config.json")
    hw = json.loads(DEVICE_FILE.read_text())
    hw.pop("aliases", None)
    f.put("good_hw", hw)
    f.put("good_cluster", {**hw, "cluster": {"nodes": 2, "devices_per_node": 8}})
    f.put("megatron_good", MEGATRON.format(tp=2, pp=2, mbs=1, gbs=64, seq=2048), "megatron.sh")
    f.put("ds_good", {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1},
                      "bf16": {"enabled": True}}, "ds_config.json")
    f.put("titan_good", "--parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 4 "
                        "--training.local_batch_size 2 --training.seq_len 2048\n", "titan.sh")
    f.put("empty_text", "", "empty.sh")
    f.put("notutf8_text", b"\xff\xfe torchrun pretrain_gpt.py", "notutf8.sh")
    return f


# ------------------------------------------------------------------ cases
def _with(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


BAD_INTS = ["0", "-1", "-99999999999999999999", HUGE, "1e3", "2.0", "1.5", "nan", "inf", "x", "", "0x10", "1_000"]
BAD_FLOATS = ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1e400", "x", ""]


def degree_cases(add) -> None:
    for knob in ("tp", "pp", "vpp", "cp", "ep", "dp", "mbs"):
        for value in BAD_INTS:
            add("degrees", f"plan--{knob}={value}", P + [f"--{knob}={value}"], "bad")
            add("degrees", f"estimate--{knob}={value}", E + [f"--{knob}={value}"], "bad")
    for flag in ("--zero",):
        for value in ("4", "-1", "7", HUGE, "x", "1.0"):
            add("degrees", f"plan{flag}={value}", P + [f"{flag}={value}"], "bad")
            add("degrees", f"estimate{flag}={value}", E + [f"{flag}={value}"], "bad")


def size_cases(add) -> None:
    for flag in ("--devices", "--devices-per-node", "--seq-len", "--global-batch"):
        for value in ("0", "-3", HUGE, "1.5", "nan", "1e400", ""):
            add("sizes", f"plan{flag}={value}", _with(P, flag, value), "bad")
            add("sizes", f"estimate{flag}={value}", _with(E, flag, value), "bad")
    for value in ("0", "-1", HUGE, "nan", "1.5", ""):
        add("sizes", f"plan--top={value}", _with(P, "--top", value), "bad")
    for value in ("128", "129", "1024"):
        add("sizes", f"plan--vpp={value}", P + ["--pp", "2", "--vpp", value], "bad" if value != "128" else "either")
    # the largest allowed values: answered or refused, in bounded time
    add("bounded", "plan-devices-max", _with(P, "--devices", str(1 << 20)), "either")
    add("bounded", "plan-gbs-max", _with(P, "--global-batch", str(1 << 24)), "either")
    add("bounded", "plan-seq-max", _with(P, "--seq-len", str(1 << 24)), "either")
    add("bounded", "plan-dpn-max", P + ["--devices-per-node", "1024"], "either")
    add("bounded", "plan-default-scenario", ["plan", "--top", "1"], "good")
    add("bounded", "plan-big-moe", ["plan", "--model", "deepseek-v3", "--devices", "4096", "--hardware", "h100-sxm",
                                    "--top", "1", "--json"], "either")
    add("bounded", "estimate-devices-max", _with(E, "--devices", str(1 << 20)), "either")
    add("bounded", "estimate-seq-max", _with(E, "--seq-len", str(1 << 24)), "either")
    add("bounded", "estimate-gbs-max", _with(E, "--global-batch", str(1 << 24)), "either")
    add("bounded", "estimate-vpp-max", E + ["--pp", "2", "--vpp", "16"], "either")  # 32 layers, one per stage
    add("bounded", "estimate-vpp-too-many", E + ["--pp", "2", "--vpp", "32"], "bad")  # 64 stages > 32 layers
    add("bounded", "estimate-ep-huge", E + ["--ep", str(1 << 20)], "bad")
    add("bounded", "estimate-cp-max", _with(E, "--devices", str(1 << 20)) + ["--cp", str(1 << 20)], "either")


def float_cases(add) -> None:
    for value in BAD_FLOATS + ["1", "1.5", "-0.1", "1.0000001", "-1e-300"]:
        add("floats", f"plan--headroom={value}", P + [f"--headroom={value}"], "bad")
    for value in ("0", "0.5", "0.999"):
        add("floats", f"plan--headroom={value}", P + [f"--headroom={value}", "--json"], "either")
    for value in BAD_FLOATS + ["0", "-5", "1e7"]:
        add("floats", f"plan--max-memory-gib={value}", P + [f"--max-memory-gib={value}"], "bad")
    add("floats", "plan--max-memory-gib=tiny", P + ["--max-memory-gib", "1e-300"], "bad")
    for value in BAD_FLOATS + ["0", "-1", "1.4X", "1e19", "2e18", "1e-400", "T", "1.4TT", " ", "0.0"]:
        add("floats", f"plan--tokens={value}", P + [f"--tokens={value}"], "bad")
        add("floats", f"estimate--tokens={value}", E + [f"--tokens={value}"], "bad")
    for value in ("1", "1e18", "1K", "0.5T"):
        add("floats", f"estimate--tokens={value}", E + [f"--tokens={value}", "--json"], "good")
    add("floats", "estimate--tokens=1e-300", E + ["--tokens=1e-300"], "either")


def choice_cases(add) -> None:
    for flag, value in (("--dtype", "fp3"), ("--dtype", ""), ("--recompute", "sometimes"), ("--schedule", "2f2b"),
                        ("--zero", "")):
        add("choices", f"estimate{flag}={value}", E + [f"{flag}={value}"], "bad")
    for flag, value in (("--dtype", "int8"), ("--recompute", "all"), ("--export", "nemo")):
        add("choices", f"plan{flag}={value}", P + [f"{flag}={value}"], "bad")
    for value in ("9,10,10,9", "a,b", "0,0", "-1,33", f"{HUGE},1", "16,16,0", "", ",", "32", "16,16,", "1e3,1",
                  " 16 , 16 ", "nan,1"):
        add("layer-split", f"estimate--layer-split={value!r}", E + ["--pp", "2", f"--layer-split={value}"],
            "good" if value.replace(" ", "") == "16,16" or value == "16,16," else "bad")
    add("layer-split", "estimate--layer-split-no-pp", E + ["--layer-split", "32"], "either")
    add("layer-split", "estimate--layer-split-vpp", E + ["--pp", "2", "--vpp", "2", "--layer-split", "8,8,8,8"],
        "good")
    # impossible plans
    impossible = {"tp3": ["--tp", "3"], "tp16": ["--tp", "16"], "vpp2-pp1": ["--vpp", "2"], "ep2-dense": ["--ep", "2"],
                  "dp3": ["--dp", "3"], "dp-times": ["--dp", "16"], "mbs-gt-gbs": ["--mbs", "128"],
                  "pp64": ["--pp", "64", "--devices", "64"], "cp3": ["--cp", "3"], "tp8-pp2": ["--tp", "8", "--pp", "2"],
                  "fp8-a100": ["--hardware", "a100-80gb", "--dtype", "fp8"], "seq-not-cp": ["--cp", "2", "--seq-len", "2047"]}
    for name, extra in impossible.items():
        argv = list(E)
        for i in range(0, len(extra), 2):
            argv = _with(argv, extra[i], extra[i + 1])
        add("impossible", f"estimate-{name}", argv, "bad")
    add("impossible", "estimate-no-gbs", [a for a in E if a not in ("--global-batch", "64")], "bad")
    add("impossible", "plan-tp3", P + ["--tp", "3"], "bad")
    add("impossible", "plan-ep2-dense", P + ["--ep", "2"], "bad")
    add("impossible", "plan-vpp2-pp1", P + ["--vpp", "2", "--pp", "1"], "bad")
    add("impossible", "plan-tiny-memory", P + ["--max-memory-gib", "0.001"], "bad")
    add("impossible", "plan-too-big-degrees", P + ["--tp", "8", "--pp", "8"], "bad")
    add("impossible", "plan-no-zero3-no-recompute-tiny", P + ["--no-zero3", "--no-recompute",
                                                              "--max-memory-gib", "1"], "bad")
    add("impossible", "plan-gbs-odd", _with(P, "--global-batch", "7"), "either")


def name_cases(add) -> None:
    for cmd in (P, E):
        for flag, value in (("--model", "llama-7c"), ("--model", ""), ("--model", " "), ("--model", "x" * 5000),
                            ("--hardware", "h100-sxn"), ("--hardware", ""), ("--hardware", "family-nvidia-hopper"),
                            ("--hardware", "\x00"), ("--model", "../../etc/passwd"), ("--model", "/dev/null"),
                            ("--hardware", "/dev/null"), ("--model", "/"), ("--hardware", "/")):
            add("names", f"{cmd[0]}{flag}={value[:20]!r}", _with(cmd, flag, value), "bad")
    for argv in (["plna"], ["plan", "--tpp", "2"], ["models", "--bogus"], ["hardware", "extra"], ["models", "x"],
                 ["export"], ["import"], ["estimate"], ["calibrate", "extra"], ["profile"]):
        add("names", "argv-" + "-".join(argv), argv, "bad")
    for argv in (["models"], ["models", "--json"], ["hardware"], ["hardware", "--json"], ["--help"], ["plan", "-h"],
                 ["--version"]):  # partita --version exists since 7cedb71
        add("listing", "-".join(argv), argv, "good")


def set_cases(add) -> None:
    bad = ["efficiency.gemmm=0.5", "name.x=1", "efficiency.gemm=NaN", "efficiency.gemm=Infinity",
           "efficiency.gemm=-Infinity", "efficiency.gemm=-1", "efficiency.gemm=0", "efficiency.gemm=1e400",
           "efficiency.gemm=2", "=5", "efficiency.=1", ".gemm=1", "efficiency.gemm", "memory.hbm_gib=abc",
           "inter_node.gbps_per_direction=0", "memry.hbm_gib=80", "efficiency=0.5", "efficiency.gemm.x=1",
           "memory.hbm_gib=[1]", "intra_node.devices_per_node=0", "peak_tflops.bf16=-5", "memory.hbm_gib=1e309",
           "", "  ", ".=", "efficiency.gemm=", "efficiency.gemm=true", 'efficiency.gemm="0.5"',
           "efficiency.gemm=null", "memory.usable_gib=1000", "intra_node.topology=ring",
           "intra_node.devices_per_node=7.5", "peak_tflops.bf16=0", "peak_tflops.bf17=5",
           "cluster.nodes=0", "cluster.nodes=x", "memory.allocator_fragmentation=1",
           "efficiency.kernel_overhead_us_per_layer=-1", "efficiency.gemm_half_gflop=1e10",
           "inter_node.latency_us=NaN", "efficiency.gemm={}", "name=x", "memory.hbm_gib=1e-400"]
    for value in bad:
        add("set", f"estimate--set={value!r}", E + ["--set", value], "bad")
    for value in ("efficiency.gemm=NaN", "efficiency.gemmm=0.5", "memory.hbm_gib=0"):
        add("set", f"plan--set={value!r}", P + ["--set", value], "bad")
    for value in ("efficiency.gemm=0.5", "inter_node.gbps_per_direction=25", "memory.hbm_gib=40",
                  "efficiency.gemm_half_gflop=0", "efficiency.kernel_overhead_us_per_layer=0",
                  " efficiency . gemm =0.5", "peak_tflops.bf16=1e-6", "intra_node.latency_us=0"):
        add("set", f"estimate--set={value!r}-ok", E + ["--set", value, "--json"], "either")


def model_file_cases(add, f: Files) -> None:
    for key in malformed(f, "model"):
        add("model-json", f"estimate-model-{key}", _with(E, "--model", f[key]), "bad")
    bad = {"layers_huge": {"layers": 10 ** 12}, "hidden_neg": {"hidden": -1}, "ffn_neg": {"ffn_hidden": -5},
           "head_dim_neg": {"head_dim": -64}, "layers_str": {"layers": "32"}, "moe_int": {"moe": 5},
           "moe_bad": {"moe": {"x": 1}}, "vocab0": {"vocab": 0}, "hidden_huge": {"hidden": 10 ** 15},
           "heads_indiv": {"heads": 33, "kv_heads": 33}, "act_bad": {"activation": "tanh"}, "name_list": {"name": ["a"]},
           "layers_float": {"layers": 32.5}, "ffn_str": {"ffn_hidden": "big"}, "mla_bad": {"mla": "yes"},
           "tied_str": {"tied_embeddings": "no"}, "moe_list": {"moe": [1]}, "layers0": {"layers": 0},
           "heads0": {"heads": 0}, "kv0": {"kv_heads": 0}, "kv_gt_heads": {"kv_heads": 64},
           "moe_topk0": {"moe": {"num_experts": 8, "top_k": 0, "expert_ffn_hidden": 1024}},
           "moe_topk_gt": {"moe": {"num_experts": 8, "top_k": 9, "expert_ffn_hidden": 1024}},
           "moe_experts_huge": {"moe": {"num_experts": 10 ** 9, "top_k": 2, "expert_ffn_hidden": 1024}},
           "moe_freq0": {"moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden": 1024, "layer_freq": 0}},
           "moe_dense_neg": {"moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden": 1024,
                                     "first_dense_layers": -1}},
           "moe_extra": {"moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden": 1024, "bogus": 1}},
           "mla_neg": {"mla": {"q_lora_rank": 0, "kv_lora_rank": -1, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                               "v_head_dim": 128}},
           "norm_bad": {"norm": "batchnorm"}, "position_bad": {"position": "sinusoid"}, "unknown": {"hiddn": 1},
           "dropout_int": {"dropout": 1}, "max_pos_neg": {"max_positions": -1}, "hidden_null": {"hidden": None},
           "source_int": {"source": 5}, "heads_bool": {"heads": True}, "vocab_big": {"vocab": 1 << 30}}
    for key, patch in bad.items():
        path = f.put(f"m_{key}", {**MODEL, **patch})
        add("model-json", f"estimate-model-{key}", _with(E, "--model", path), "bad")
    path = f.put("m_nan", json.dumps(MODEL).replace("4096", "NaN"))
    add("model-json", "estimate-model-nan", _with(E, "--model", path), "bad")
    path = f.put("m_first_dense_gt", {**MODEL, "moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden": 1024,
                                                        "first_dense_layers": 40}})
    add("model-json", "estimate-model-first-dense-gt-layers", _with(E, "--model", path), "bad")
    for key in ("m_layers_huge", "m_hidden_huge", "m_nan"):
        add("model-json", f"plan-model-{key}", _with(P, "--model", f[key]), "bad")
    big = f.put("m_biggest", {"hidden": 1 << 16, "layers": 10_000, "heads": 512, "kv_heads": 512,
                              "ffn_hidden": 1 << 18, "vocab": 1 << 20})
    add("bounded", "plan-model-biggest", _with(P, "--model", big), "either")
    add("bounded", "estimate-model-biggest", _with(E, "--model", big), "either")
    add("model-json", "estimate-model-good", _with(E, "--model", f["good_model"]) + ["--json"], "good")
    add("model-json", "estimate-model-hf-dir", _with(E, "--model", str(Path(f["good_hf"]).parent)) + ["--json"],
        "good")
    hf_bad = {"layers_huge": {"num_hidden_layers": 10 ** 12}, "type_bad": {"model_type": "not-a-model"},
              "hidden_str": {"hidden_size": "896"}, "heads0": {"num_attention_heads": 0}, "act_int": {"hidden_act": 5},
              "type_missing": {"model_type": None}, "type_list": {"model_type": ["llama"]},
              "vocab_neg": {"vocab_size": -1}, "kv_str": {"num_key_value_heads": "2"},
              "layers_nan": {"num_hidden_layers": float("nan")}, "hidden_float": {"hidden_size": 896.5},
              "moe_topk": {"model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 4},
              "moe_experts_str": {"model_type": "mixtral", "num_local_experts": "8", "num_experts_per_tok": 2},
              "rope_list": {"rope_scaling": [1]}, "tie_str": {"tie_word_embeddings": "yes"},
              "head_dim_neg": {"head_dim": -1}, "inter_zero": {"intermediate_size": 0},
              "text_config_int": {"model_type": "llava", "text_config": 5}}
    for key, patch in hf_bad.items():
        data = {**HF, **patch}
        data = {k: v for k, v in data.items() if v is not None}
        path = f.put(f"hf_{key}", json.dumps(data).replace("NaN", "NaN"))
        add("hf-config", f"estimate-hf-{key}", _with(E, "--model", path), "bad")


def _hw(f: Files, key: str, section: str | None, field: str, value) -> str:
    data = json.loads(DEVICE_FILE.read_text())
    data.pop("aliases", None)
    if section is None:
        data[field] = value
    else:
        if not isinstance(data.get(section), dict):
            data[section] = {}
        data[section][field] = value
    return f.put(key, data)


def hardware_file_cases(add, f: Files) -> None:
    for key in malformed(f, "hw"):
        add("hardware-json", f"estimate-hardware-{key}", _with(E, "--hardware", f[key]), "bad")
    bad = [("efficiency", "gemm", 0), ("efficiency", "gemm", -0.5), ("efficiency", "gemm", 7),
           ("efficiency", "gemm", "high"), ("efficiency", "gemm", None), ("efficiency", "gemm", True),
           ("efficiency", "attention", 0), ("efficiency", "memory_bandwidth", 0), ("efficiency", "gemm_fp8", 2),
           ("efficiency", "intra_node_comm", 0), ("efficiency", "inter_node_comm", 0), ("efficiency", "tp_overlap", 2),
           ("efficiency", "gemm_half_gflop", -1), ("efficiency", "kernel_overhead_us_per_layer", -1),
           ("efficiency", "kernel_overhead_us_per_layer", 1e300), ("efficiency", "tp_framework_us_per_layer", -1),
           ("inter_node", "gbps_per_direction", 0), ("intra_node", "gbps_per_direction", 0),
           ("intra_node", "peer_gbps_per_direction", -1), ("memory", "hbm_gib", 0), ("memory", "hbm_tbps", 0),
           ("memory", "hbm_gib", 10 ** 30), ("memory", "usable_gib", 10000), ("memory", "usable_gib", 0),
           ("memory", "allocator_fragmentation", 3), ("memory", "allocator_fragmentation", 1),
           ("memory", "runtime_reserved_gib", -1), ("memory", "runtime_reserved_gib", 1000),
           ("memory", "comm_buffer_mib_per_group", -1), ("peak_tflops", "bf16", -989), ("peak_tflops", "bf16", "x"),
           ("peak_tflops", "bf16", 0), ("intra_node", "devices_per_node", 0), ("intra_node", "devices_per_node", 7.5),
           ("intra_node", "devices_per_node", 10 ** 9), ("intra_node", "topology", "ring"),
           ("intra_node", "topology", 5), ("intra_node", "latency_us", -1), ("inter_node", "latency_us", "x"),
           ("intra_node", "link", []), ("inter_node", "link", 5), ("cluster", "nodes", "many"),
           ("cluster", "nodes", 0), ("cluster", "nodes", -1), ("cluster", "nodes", 1.5), ("cluster", "nodes", 10 ** 12),
           ("cluster", "devices_per_node", 0), ("cluster", "devices_per_node", 3), ("cluster", "bogus", 1),
           (None, "cluster", [1]), (None, "cluster", "x"), (None, "efficiency", [1]), (None, "memory", [1, 2]),
           (None, "peak_tflops", "lots"), (None, "peak_tflops", {}), (None, "peak_tflops", {"bf16": None}),
           (None, "name", 5), (None, "description", []), (None, "extends", 5), (None, "extends", ["a"]),
           (None, "extends", "no-such-family"), (None, "extends", ""), (None, "extends", "/"),
           (None, "efficiency_provenance", [1]), (None, "aliases", 5), (None, "bogus_section", {"a": 1})]
    for i, (section, field, value) in enumerate(bad):
        key = f"h_{section}_{field}_{i}"
        path = _hw(f, key, section, field, value)
        add("hardware-json", f"estimate-hw-{section}.{field}={str(value)[:12]}", _with(E, "--hardware", path), "bad")
    text = json.dumps(json.loads(DEVICE_FILE.read_text()))
    for name, patch in (("nan", "NaN"), ("inf", "Infinity"), ("neginf", "-Infinity"), ("1e400", "1e400")):
        path = f.put(f"h_{name}", text.replace('"hbm_tbps": 3.35', f'"hbm_tbps": {patch}'))
        add("hardware-json", f"estimate-hw-hbm_tbps={name}", _with(E, "--hardware", path), "bad")
        add("hardware-json", f"plan-hw-hbm_tbps={name}", _with(P, "--hardware", path), "bad")
    loop = f.root / "loop.json"
    loop.write_text(json.dumps({"extends": str(loop)}))
    add("hardware-json", "estimate-hw-extends-loop", _with(E, "--hardware", str(loop)), "bad")
    ext = f.put("h_extends_dir", {"extends": f["hw_dir"]})
    add("hardware-json", "estimate-hw-extends-dir", _with(E, "--hardware", ext), "bad")
    ext = f.put("h_extends_notutf8", {"extends": f["hw_notutf8"]})
    add("hardware-json", "estimate-hw-extends-notutf8", _with(E, "--hardware", ext), "bad")
    add("hardware-json", "estimate-hw-good", _with(E, "--hardware", f["good_hw"]) + ["--json"], "good")
    add("hardware-json", "plan-cluster-file", ["plan", "--model", "llama-7b", "--hardware", f["good_cluster"],
                                               "--global-batch", "64", "--top", "1", "--json"], "good")
    add("hardware-json", "plan-cluster-file-dpn", ["plan", "--model", "llama-7b", "--hardware", f["good_cluster"],
                                                   "--global-batch", "64", "--devices-per-node", "3"], "either")
    big = _hw(f, "h_cluster_huge", "cluster", "nodes", 1 << 20)
    add("bounded", "plan-cluster-huge", ["plan", "--model", "llama-7b", "--hardware", big, "--global-batch", "64",
                                         "--top", "1"], "bad")


def plan_file_cases(add, f: Files) -> None:
    keys = malformed(f, "plan")
    patches = {"dp_neg": {"dp": -1}, "tp0": {"tp": 0}, "zero7": {"zero": 7}, "gbs_odd": {"gbs": 63},
               "recompute_bad": {"recompute": "sometimes"}, "dtype_bad": {"dtype": "fp3"}, "tp_str": {"tp": "abc"},
               "tp_float": {"tp": 1.5}, "tp_bool": {"tp": True}, "tp_list": {"tp": [1]}, "split_bad": {"layer_split": "x"},
               "unknown_field": {"tpp": 2}, "schedule_bad": {"schedule": "2f2b"}, "huge_dp": {"dp": 10 ** 30},
               "sp_bad": {"sp": "maybe"}, "mbs0": {"mbs": 0}, "seq_neg": {"seq_len": -5}, "dp_shard_bad": {"dp_shard": 3},
               "grad_dtype_bad": {"grad_dtype": "int8"}, "vpp0": {"vpp": 0}, "vpp_huge": {"vpp": 10 ** 20},
               "ep0": {"ep": 0}, "cp_neg": {"cp": -2}, "gbs0": {"gbs": 0}, "gbs_huge": {"gbs": 10 ** 20},
               "seq_huge": {"seq_len": 10 ** 20}, "split_neg": {"layer_split": [-1, 33]},
               "split_len": {"layer_split": [10, 10, 12]}, "split_huge": {"layer_split": [10 ** 30]},
               "split_dict": {"layer_split": {"a": 1}}, "split_floats": {"layer_split": [1.5, 2]},
               "split_bools": {"layer_split": [True, True]}, "zero_str": {"zero": "1"}, "zero_neg": {"zero": -1},
               "mode_bad": {"grad_accum_mode": "x"}, "dp_shard_neg": {"dp_shard": -1},
               "overlap_str": {"overlap_grad_reduce": "maybe"}, "format_bad": {"format": "partita.plan/9"},
               "tp_null": {"tp": None}, "dtype_int": {"dtype": 5}, "recompute_list": {"recompute": ["full"]},
               "gbs_float": {"gbs": 64.0}, "tp_str_num": {"tp": "2"}, "dp_str_space": {"dp": " 8"},
               "vpp_no_pp": {"vpp": 2}, "schedule_vpp1": {"schedule": "interleaved-1f1b"},
               "plans_garbage": None, "plans_empty": None, "plan_key_list": None, "dp_1e400": None, "dp_nan": None}
    for key, patch in patches.items():
        if patch is None:
            continue
        f.put(f"p_{key}", {**GOOD_PLAN, **patch})
        keys.append(f"p_{key}")
    f.put("p_plans_garbage", {"plans": [5]})
    f.put("p_plans_empty", {"plans": []})
    f.put("p_plan_key_list", {"plan": [1]})
    f.put("p_dp_1e400", '{"dp": 1e400, "gbs": 64}')
    f.put("p_dp_nan", '{"dp": NaN, "gbs": 64}')
    keys += ["p_plans_garbage", "p_plans_empty", "p_plan_key_list", "p_dp_1e400", "p_dp_nan"]
    ambiguous = {"p_tp_str_num", "p_dp_str_space", "p_gbs_float", "p_zero_str", "p_format_bad", "p_plan_key_list",
                 "p_split_bools", "p_schedule_vpp1", "plan_dup"}
    for key in keys:
        expect = "either" if key in ambiguous else "bad"
        add("export", f"export-{key}", ["export", "--to", "megatron", f[key]], expect)
        add("export", f"export-deepspeed-{key}", ["export", "--to", "deepspeed", f[key]], expect)
        add("plan-json", f"estimate-plan-{key}", E[:7] + ["--plan", f[key]], expect)
    for key in ("p_dp_neg", "p_tp0", "p_zero7", "p_gbs_odd", "plan_deep", "p_split_len"):
        add("export", f"export-model-{key}", ["export", "--to", "torchtitan", "--model", "llama-7b", f[key]], "bad")
    good = f["good_plan"]
    for target in ("megatron", "mindspeed", "deepspeed", "torchtitan"):
        add("export", f"export-good-{target}", ["export", "--to", target, good], "good")
    add("export", "export-o-missing-dir", ["export", "--to", "megatron", good, "-o", str(f.root / "no/x.sh")], "bad")
    add("export", "export-o-dir", ["export", "--to", "megatron", good, "-o", f["plan_dir"]], "bad")
    add("export", "export-o-empty", ["export", "--to", "megatron", good, "-o", ""], "bad")
    add("export", "export-o-devfull", ["export", "--to", "megatron", good, "-o", "/dev/full"], "bad")
    add("export", "export-o-ok", ["export", "--to", "megatron", good, "-o", str(f.root / "out.sh")], "good")
    add("export", "export-to-bad", ["export", "--to", "nemo", good], "bad")
    add("export", "export-no-to", ["export", good], "bad")
    add("export", "export-model-typo", ["export", "--to", "megatron", "--model", "lama-7b", good], "bad")
    add("export", "export-model-bad-file", ["export", "--to", "megatron", "--model", f["model_deep"], good], "bad")
    f.put("p_tp_heads", {"dp": 4, "tp": 3, "gbs": 64})
    add("export", "export-plan-model-mismatch", ["export", "--to", "megatron", "--model", "llama-7b", f["p_tp_heads"]],
        "bad")
    add("plan-json", "estimate-plan-and-tp", E + ["--plan", good, "--tp", "2"], "bad")
    add("plan-json", "estimate-plan-world-mismatch", _with(E[:7], "--devices", "16") + ["--plan", good], "bad")
    add("plan-json", "estimate-plan-good", E[:7] + ["--plan", good, "--json"], "good")


def import_cases(add, f: Files) -> None:
    keys = malformed(f, "script")
    for key in keys:
        add("import", f"import-{key}", ["import", f[key], "--devices", "8"], "bad")
    add("import", "import-empty-text", ["import", f["empty_text"]], "bad")
    add("import", "import-notutf8-text", ["import", f["notutf8_text"]], "bad")
    scripts = {"tp0": dict(tp=0, pp=1, mbs=1, gbs=64, seq=2048), "pp_neg": dict(tp=1, pp=-1, mbs=1, gbs=64, seq=2048),
               "tp_huge": dict(tp=HUGE, pp=1, mbs=1, gbs=64, seq=2048),
               "gbs_odd": dict(tp=1, pp=1, mbs=1, gbs=63, seq=2048), "seq0": dict(tp=1, pp=1, mbs=1, gbs=64, seq=0),
               "tp_nan": dict(tp="nan", pp=1, mbs=1, gbs=64, seq=2048),
               "seq_huge": dict(tp=1, pp=1, mbs=1, gbs=64, seq=HUGE), "mbs_x": dict(tp=1, pp=1, mbs="x", gbs=64, seq=2048),
               "tp3": dict(tp=3, pp=1, mbs=1, gbs=64, seq=2048), "gbs_1e400": dict(tp=1, pp=1, mbs=1, gbs="1e400", seq=2048)}
    for key, values in scripts.items():
        path = f.put(f"meg_{key}", MEGATRON.format(**values), f"meg_{key}.sh")
        add("import", f"import-megatron-{key}", ["import", path], "bad")
        add("import", f"estimate-from-script-{key}", E[:7] + ["--from-script", path], "bad")
    ds = {"batch_neg": {"train_batch_size": -1}, "stage7": {"zero_optimization": {"stage": 7}},
          "batch_str": {"train_batch_size": "64"}, "batch_nan": {"train_batch_size": float("nan")},
          "zero_list": {"zero_optimization": [1]}, "mbs0": {"train_micro_batch_size_per_gpu": 0},
          "batch_odd": {"train_batch_size": 63}, "batch_huge": {"train_batch_size": 10 ** 30},
          "batch_float": {"train_batch_size": 64.5}, "bf16_str": {"bf16": "yes"}}
    for key, patch in ds.items():
        base = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1}}
        path = f.put(f"ds_{key}", json.dumps({**base, **patch}), f"ds_{key}.json")
        add("import", f"import-ds-{key}", ["import", path, "--devices", "8"], "bad")
    titan = {"tp0": "--parallelism.tensor_parallel_degree 0 --training.local_batch_size 1",
             "tp_x": "--parallelism.tensor_parallel_degree x --training.local_batch_size 1",
             "seq_neg": "--parallelism.tensor_parallel_degree 2 --training.seq_len -5",
             "tp_huge": f"--parallelism.tensor_parallel_degree {HUGE} --training.local_batch_size 1"}
    for key, text in titan.items():
        path = f.put(f"titan_{key}", text + "\n", f"titan_{key}.sh")
        add("import", f"import-titan-{key}", ["import", path, "--devices", "8"], "bad")
    toml_bad = f.put("titan_toml_bad", "[parallelism\ntensor_parallel_degree = 2\n", "bad.toml")
    add("import", "import-toml-bad", ["import", toml_bad, "--devices", "8"], "bad")
    toml_deep = f.put("titan_toml_deep", "a = " + "[" * 5000 + "]" * 5000 + "\n", "deep.toml")
    add("import", "import-toml-deep", ["import", toml_deep, "--devices", "8"], "bad")
    for flag, value in (("--devices", "0"), ("--devices", HUGE), ("--devices", "nan"), ("--seq-len", "0"),
                        ("--seq-len", HUGE), ("--pp", "0"), ("--pp", "-1"), ("--from", "nemo"), ("--from", "deepspeed"),
                        ("--model", "lama-7b"), ("-o", str(f.root / "no/plan.json")), ("-o", f["script_dir"]),
                        ("--devices", "3")):
        add("import", f"import-megatron{flag}={value[-20:]}", ["import", f["megatron_good"], flag, value], "bad")
    add("import", "import-megatron-good", ["import", f["megatron_good"], "--json"], "good")
    add("import", "import-ds-good", ["import", f["ds_good"], "--devices", "8", "--json"], "good")
    add("import", "import-titan-good", ["import", f["titan_good"], "--devices", "8", "--json"], "good")
    add("import", "import-ds-no-devices", ["import", f["ds_good"]], "bad")
    add("import", "plan-from-script-bad", P + ["--from-script", f["meg_tp0"]], "bad")
    add("import", "plan-from-script-dir", P + ["--from-script", f["script_dir"]], "bad")
    add("import", "estimate-from-script-and-plan", E[:7] + ["--from-script", f["megatron_good"], "--plan",
                                                            f["good_plan"]], "bad")


def output_cases(add, f: Files) -> None:
    """stdout on a full disk: one line, exit 2, for every command that prints."""
    for name, argv in (("estimate", E), ("estimate-json", E + ["--json"]), ("plan", P), ("plan-json", P + ["--json"]),
                       ("models", ["models"]), ("models-json", ["models", "--json"]), ("hardware", ["hardware"]),
                       ("hardware-json", ["hardware", "--json"]), ("export", ["export", "--to", "megatron",
                                                                                f["good_plan"]]),
                       ("import", ["import", f["megatron_good"]]), ("plan-export", P + ["--export", "megatron"]),
                       ("help", ["--help"])):
        add("dev-full", f"devfull-{name}", argv, "bad", full_stdout=True)


def calibrate_cases(add, f: Files) -> None:
    out = str(f.root / "cal.json")
    for flag, value in (("--nproc", "0"), ("--nproc", "-1"), ("--nproc", HUGE), ("--nproc", "1.5"), ("--nproc", "nan"),
                        ("--timeout-s", "0"), ("--timeout-s", "-5"), ("--timeout-s", "nan"), ("--timeout-s", HUGE),
                        ("--timeout-s", "1.5"), ("--base", "cpuu"), ("--base", ""), ("--base", f["hw_garbage"]),
                        ("--base", f["hw_dir"]), ("--base", f["hw_notutf8"]), ("--base", f["hw_missing"]),
                        ("--base", "family-nvidia-hopper"), ("--dtype", "fp8"), ("--device", "tpu"), ("--device", ""),
                        ("--name", ""), ("--name", "a\nb"), ("-o", ""), ("--nproc", "2000")):
        add("calibrate", f"calibrate{flag}={Path(value).name if '/' in value else value}",
            ["calibrate", flag, value, "-o", out] if flag != "-o" else ["calibrate", "-o", value], "bad")
    add("calibrate", "calibrate-o-dir", ["calibrate", "-o", f["hw_dir"]], "bad")
    add("calibrate", "calibrate-o-missing-dir", ["calibrate", "-o", str(f.root / "no/cal.json")], "bad")
    add("calibrate", "calibrate-o-exists-as-dir-slash", ["calibrate", "-o", str(f.root) + "/"], "bad")
    add("calibrate", "calibrate--timeout-s=2", ["calibrate", "--timeout-s", "2", "--nproc", "1", "-o", out], "bad",
        launch_ok=True)


def profile_cases(add, f: Files) -> None:
    base = ["profile", "--model", "tiny-llama"]
    for flag, value in (("--steps", "0"), ("--steps", "2"), ("--steps", "-1"), ("--steps", HUGE), ("--steps", "x"),
                        ("--lr", "nan"), ("--lr", "inf"), ("--lr", "-1"), ("--seed", HUGE), ("--nproc", "0"),
                        ("--nproc", "-2"), ("--nproc", HUGE), ("--timeout-s", "0"), ("--timeout-s", "nan"),
                        ("--plan", "tp=0"), ("--plan", "dp=-1"), ("--plan", "x"), ("--plan", f["p_zero7"]),
                        ("--plan", f["plan_deep"]), ("--plan", f["plan_dir"]), ("--plan", "tp=1e400"),
                        ("--model", "tiny-lama"), ("--model", f["model_deep"]), ("--hardware", "h100-sxn"),
                        ("--hardware", f["hw_garbage"]), ("--report", str(f.root / "no/r.html")),
                        ("--report", f["hw_dir"]), ("--run-dir", f["good_plan"]), ("--data", str(f.root / "nope.txt")),
                        ("--max-grad-norm", "-1"), ("--momentum", "nan"), ("--keep", "-1"), ("--device", "tpu"),
                        ("--warmup-steps", "-1"), ("--min-lr", "nan"), ("--optimizer", "lamb"),
                        ("--lr-schedule", "linear"), ("--profile-dir", f["good_plan"])):
        name = Path(value).name if "/" in value else value
        argv = base + [flag, value] if flag != "--model" else ["profile", "--model", value]
        add("profile", f"profile{flag}={name}", argv, "bad")
    add("profile", "profile-no-model", ["profile"], "bad")


def _train_files(f: Files) -> None:
    """Data, tokenizer, checkpoint and model-directory inputs of the train cases."""
    import numpy as np
    text = " ".join(f"the {w} goes to market {i} times." for i, w in enumerate(["cat", "dog", "bird"] * 200))
    f.put("t_text", text, "train/corpus.txt")
    for key, arr in (("t_npy_float", np.ones(4096, dtype=np.float32)), ("t_npy_neg", -np.ones(4096, dtype=np.int64)),
                     ("t_npy_2d", np.ones((64, 64), dtype=np.int64)), ("t_npy_big", np.full(4096, 10 ** 6)),
                     ("t_npy_short", np.ones(3, dtype=np.int64)), ("t_npy_str", np.array(["a", "b"] * 100))):
        buf = io.BytesIO()
        np.save(buf, arr)
        f.put(key, buf.getvalue(), f"train/{key}.npy")
    f.put("t_npy_garbage", b"\x93NUMPY garbage" * 10, "train/garbage.npy")
    f.put("t_empty_text", "", "train/empty.txt")
    f.put("t_binary_text", bytes(range(256)) * 8, "train/binary.txt")
    (f.root / "train/emptydir").mkdir(parents=True)
    f["t_emptydir"] = str(f.root / "train/emptydir")
    f.put("t_tok_garbage", "not a tokenizer", "train/tokenizer.json")
    f.put("t_ckpt_list_meta", [1, 2], "train/ckpt_list/step_1/meta.json")
    f.put("t_ckpt_empty_meta", "", "train/ckpt_empty/step_1/meta.json")
    f.put("t_cfg_only", {"model_type": "bert", "hidden_size": 8}, "train/bert/config.json")
    f.put("t_hf_damaged_cfg", {"model_type": "llama", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1,
                               "num_attention_heads": 2, "intermediate_size": 32}, "train/damaged/config.json")
    f.put("t_hf_damaged", b"\xff" * 64, "train/damaged/model.safetensors")


def train_cases(add, f: Files) -> None:
    """``partita train``: bad flags, plans, data files and directories are refused on the
    launcher before any worker starts (a case that would start torchrun counts as
    *launched*); a few good runs (``--steps`` 1-2, tiny models) really train."""
    _train_files(f)
    run = ["--run-dir", str(f.root / "train/run")]
    base = ["train", "--model", "tiny-llama", "--steps", "1", "--nproc", "1", "--no-progress"] + run
    for flag, value in (("--steps", "1.5"), ("--steps", "-1"), ("--steps", HUGE), ("--steps", "x"), ("--lr", "nan"),
                        ("--lr", "inf"), ("--lr", "-1"), ("--seed", HUGE), ("--seed", "-1"), ("--nproc", "0"),
                        ("--nproc", HUGE), ("--timeout-s", "0"), ("--timeout-s", "nan"), ("--warmup-steps", "-1"),
                        ("--min-lr", "nan"), ("--max-grad-norm", "-1"), ("--momentum", "nan"), ("--momentum", "-0.5"),
                        ("--weight-decay", "-1"), ("--weight-decay", "nan"), ("--beta1", "1.5"), ("--beta2", "nan"),
                        ("--eps", "0"), ("--eps", "-1e-8"), ("--eval-every", "-1"), ("--eval-batches", "0"),
                        ("--keep", "-1"), ("--checkpoint-every", "-1"), ("--save-hf-shard-mb", "0"),
                        ("--optimizer", "lamb"), ("--lr-schedule", "linear"), ("--device", "tpu"),
                        ("--global-batch", "0"), ("--global-batch", HUGE), ("--seq-len", "-5"), ("--seq-len", HUGE),
                        ("--mbs", "0"), ("--max-restarts", "-1"), ("--nnodes", "0"), ("--node-rank", "-1"),
                        ("--skip-nonfinite", "-1"), ("--skip-nonfinite", "nan"), ("--bogus-flag", "1")):
        add("train", f"train{flag}={value}", base + [flag, value], "bad")
    for name, plan in (("tp0", "tp=0"), ("dp-1", "dp=-1"), ("garbage", "x"), ("tp1e400", "tp=1e400"),
                       ("dp3-of-1", "dp=3"), ("fp8", "dtype=fp8"), ("zero7", "zero=7"), ("tp3-heads", "tp=3"),
                       ("auto-unknown", "auto,foo=1"), ("gbs-conflict", "gbs=3,mbs=2"), ("file-zero7", f["p_zero7"]),
                       ("file-deep", f["plan_deep"]), ("file-dir", f["plan_dir"]), ("file-missing", f["plan_missing"]),
                       ("dup-degree", "tp=2,tp=1")):
        add("train", f"train-plan-{name}", base + ["--plan", plan], "bad")
    add("train", "train-plan-gbs-vs-flag", base + ["--plan", "gbs=8", "--global-batch", "4"], "bad")
    data = {"missing": str(f.root / "train/nope.txt"), "emptydir": f["t_emptydir"], "empty": f["t_empty_text"],
            "npy-float": f["t_npy_float"], "npy-neg": f["t_npy_neg"], "npy-2d": f["t_npy_2d"], "npy-big": f["t_npy_big"],
            "npy-short": f["t_npy_short"], "npy-str": f["t_npy_str"], "npy-garbage": f["t_npy_garbage"]}
    for name, path in data.items():
        # a token file shorter than one sequence is found by the workers (the launcher does
        # not know seq_len yet): they must run and end in one line, exit 2
        add("train", f"train-data-{name}", base + ["--data", path], "bad", launch_ok=name == "npy-short")
        add("train", f"train-eval-data-{name}", base + ["--eval-data", path], "bad", launch_ok=name == "npy-short")
    # text that is not UTF-8 is read with replacement characters (train/data.py): valid input
    add("train", "train-data-notutf8", base + ["--data", f["notutf8_text"]], "either")
    add("train", "train-tokenizer-garbage", base + ["--data", f["t_text"], "--tokenizer", f["t_tok_garbage"]], "bad")
    add("train", "train-tokenizer-dir", base + ["--data", f["t_text"], "--tokenizer", f["t_emptydir"]], "bad")
    add("train", "train-tokenizer-missing", base + ["--data", f["t_text"], "--tokenizer", str(f.root / "no.json")], "bad")
    for flag in ("--run-dir", "--checkpoint-dir", "--save-hf", "--tensorboard"):
        add("train", f"train{flag}-is-a-file", base + [flag, f["good_plan"]], "bad")
    add("train", "train-resume-no-ckpt-dir", base + ["--resume"], "bad")
    for kind in ("list", "empty"):  # a damaged checkpoint: refused, or set aside and the run starts fresh
        add("train", f"train-resume-{kind}-meta", base + ["--resume", "--checkpoint-dir", str(f.root / f"train/ckpt_{kind}")],
            "either")
    for name, model in (("missing", "tiny-lama"), ("bert-dir", str(f.root / "train/bert")), ("damaged-safetensors",
                        str(f.root / "train/damaged")), ("no-config-dir", f["t_emptydir"]), ("deep", f["model_deep"]),
                        ("hf-save-on-ref", None)):
        argv = base[:2] + [model] + base[3:] if model else base + ["--save-hf", str(f.root / "train/hfout")]
        add("train", f"train-model-{name}", argv, "bad")
    add("train", "train-no-model", ["train", "--steps", "1"], "bad")
    good = ["--steps", "2", "--no-progress", "--json", "--timeout-s", "60"]
    for name, argv in (("tiny-llama-1", ["--model", "tiny-llama", "--nproc", "1"] + good),
                       ("tiny-llama-tp2", ["--model", "tiny-llama", "--nproc", "2", "--plan", "tp=2"] + good),
                       ("hf-llama-dp2-zero3", ["--model", "hf-llama", "--nproc", "2", "--plan", "dp=2,zero=3"] + good),
                       ("tiny-moe-data", ["--model", "tiny-moe", "--nproc", "2", "--plan", "ep=2,dp=2",
                                          "--data", f["t_text"]] + good)):
        add("train", f"train-good-{name}", ["train"] + argv + ["--run-dir", str(f.root / f"train/run-{name}")], "good",
            launch_ok=True)


def all_cases(f: Files) -> list[Case]:
    out: list[Case] = []

    def add(category: str, name: str, argv: list[str], expect: str, **kw) -> None:
        out.append(Case(category, name, argv, expect, **kw))

    degree_cases(add)
    size_cases(add)
    float_cases(add)
    choice_cases(add)
    name_cases(add)
    set_cases(add)
    model_file_cases(add, f)
    hardware_file_cases(add, f)
    plan_file_cases(add, f)
    import_cases(add, f)
    output_cases(add, f)
    calibrate_cases(add, f)
    profile_cases(add, f)
    train_cases(add, f)
    return out


# ------------------------------------------------------------------ running
class _Launched(BaseException):
    """Raised in a case's child instead of starting torchrun (argument validation only)."""


def _no_launch(*args, **kwargs):
    raise _Launched("started processes")


def _child(case: Case) -> dict:
    """Run one case in this (forked) process; returns what came out."""
    if not case.launch_ok:
        import partita.cli.calibrate as cal
        import partita.train.supervise as launch
        cal._run_group = _no_launch
        launch.run_watched = _no_launch
    # a run that starts torchrun hands it our stdout: a real file then, not a StringIO
    out, err = (tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) if case.launch_ok else \
        (io.StringIO(), io.StringIO())
    sys.stdout = open("/dev/full", "w") if case.full_stdout else out
    sys.stderr = err
    result: dict = {"raised": None, "launched": False}
    try:
        result["rc"] = partita_main(case.argv)
        sys.stdout.flush()
    except SystemExit as e:
        result["rc"] = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except _Launched:
        result["rc"], result["launched"] = None, True
    except BaseException:  # noqa: BLE001 - what escaped is the finding
        result["rc"] = 1
        result["raised"] = traceback.format_exc()
    for stream in (out, err):
        stream.flush()
        if not isinstance(stream, io.StringIO):
            stream.seek(0)
    text = [s.getvalue() if isinstance(s, io.StringIO) else s.read() for s in (out, err)]
    result["stdout"], result["stderr"] = text[0][-200000:], text[1][-20000:]
    return result


def run_case(case: Case, timeout_s: float) -> dict:
    """``_child(case)`` in a forked child, killed (with its process group) after ``timeout_s``."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        os.setpgid(0, 0)  # its own group: a hang is killed with anything it started
        try:
            data = pickle.dumps(_child(case))
        except BaseException:  # noqa: BLE001
            data = pickle.dumps({"rc": 1, "raised": traceback.format_exc(), "stdout": "", "stderr": "",
                                 "launched": False})
        with os.fdopen(write_fd, "wb") as w:
            w.write(data)
        os._exit(0)
    os.close(write_fd)
    chunks, deadline, started = [], time.monotonic() + timeout_s, time.monotonic()
    with os.fdopen(read_fd, "rb") as r:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                _kill(pid)
                return {"rc": None, "hung": True, "stdout": "", "stderr": "", "raised": None, "launched": False,
                        "seconds": timeout_s}
            chunk = os.read(r.fileno(), 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    os.waitpid(pid, 0)
    result = pickle.loads(b"".join(chunks)) if chunks else {"rc": None, "raised": "child died", "stdout": "",
                                                            "stderr": "", "launched": False}
    result["hung"], result["seconds"] = False, time.monotonic() - started
    return result


def _kill(pid: int) -> None:
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except ProcessLookupError:
            pass
    os.waitpid(pid, 0)


_NONFINITE = re.compile(r"(?<![A-Za-z])(nan|-?inf|-?infinity)(?![A-Za-z])", re.IGNORECASE)


def nonfinite(text: str) -> bool:
    """NaN or inf anywhere in ``text`` (a JSON document: any non-finite number in it)."""
    try:
        data = json.loads(text)
    except ValueError:
        return bool(_NONFINITE.search(text))

    def walk(x) -> bool:
        if isinstance(x, float):
            return not math.isfinite(x)
        if isinstance(x, dict):
            return any(walk(v) for v in x.values())
        if isinstance(x, list):
            return any(walk(v) for v in x)
        if isinstance(x, str):
            return bool(_NONFINITE.fullmatch(x.strip()))
        return False
    return walk(data)


def classify(case: Case, r: dict) -> str:
    """ok, or the failure class (see the module docstring)."""
    if r["hung"]:
        return "hang"
    if r["raised"] or "Traceback" in r["stderr"] or "internal error" in r["stderr"]:
        return "traceback"
    if r["launched"]:  # stopped where torchrun would start: the input was accepted
        return "launched" if case.expect == "bad" else "ok"
    lines = [ln for ln in r["stderr"].splitlines() if ln.strip() and not ln.startswith("partita: warning:")]
    one_line = r["rc"] == 2 and len(lines) == 1 and lines[0].startswith("partita: error:")
    if r["rc"] == 0 and nonfinite(r["stdout"]):
        return "nonfinite"
    if case.expect == "bad":
        return "ok" if one_line else "accepted" if r["rc"] == 0 else "messy"
    if case.expect == "good":
        return "ok" if r["rc"] == 0 else "rejected"
    return "ok" if r["rc"] == 0 or one_line else "messy"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds before a case counts as a hang")
    ap.add_argument("--only", help="run only the categories (comma-separated) or names containing this")
    ap.add_argument("--show", action="store_true", help="print every failing case with its output")
    ap.add_argument("--slowest", type=int, default=0, help="print the N slowest cases")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="partita-fuzz-"))
    try:
        cases = all_cases(make_files(root))
        if args.only:
            keep = args.only.split(",")
            cases = [c for c in cases if c.category in keep or any(k in c.name for k in keep)]
        return report(cases, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(cases: list[Case], args: argparse.Namespace) -> int:
    table: dict[str, dict[str, int]] = {}
    timings = []
    if any(c.category in ("calibrate", "profile", "train") for c in cases):
        import partita.runtime.device  # noqa: F401  (torch, imported once: every forked case shares it)
    started = time.monotonic()
    for case in cases:
        # calibrate and profile import torch before refusing (their device check): seconds, or
        # tens of seconds on a loaded machine, which is not a hang
        r = run_case(case, args.timeout * (10 if case.launch_ok and case.category == "train" else
                                           3 if case.category in ("calibrate", "profile", "train") else 1))
        kind = classify(case, r)
        timings.append((r["seconds"], case.name))
        row = table.setdefault(case.category, {})
        row[kind] = row.get(kind, 0) + 1
        if kind != "ok" and args.show:
            detail = (r["raised"] or "").strip().splitlines()[-1:] or r["stderr"].strip().splitlines()[-2:] or [""]
            print(f"{kind:9} {case.category:13} {case.name:50} rc={r['rc']} {' | '.join(detail)[:300]}"
                  + (f" stdout={r['stdout'][:120]!r}" if kind in ("accepted", "nonfinite") else ""))
    kinds = ["ok", "traceback", "hang", "nonfinite", "accepted", "launched", "rejected", "messy"]
    print(f"{'category':14}" + "".join(f"{k:>10}" for k in kinds))
    totals = {k: sum(row.get(k, 0) for row in table.values()) for k in kinds}
    for category, row in table.items():
        print(f"{category:14}" + "".join(f"{row.get(k, 0):>10}" for k in kinds))
    print(f"{'total':14}" + "".join(f"{totals[k]:>10}" for k in kinds))
    failed = len(cases) - totals["ok"]
    print(f"{len(cases)} cases in {time.monotonic() - started:.0f} s: {totals['ok']} ok, {failed} failed")
    for seconds, name in sorted(timings, reverse=True)[:args.slowest]:
        print(f"  {seconds:6.2f} s  {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
