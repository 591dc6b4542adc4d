"""Bad input never gets a traceback, a hang or a silent wrong answer (issue 16).

A table of ~350 bad inputs over ``plan``, ``estimate``, ``export``, ``import``, ``models``,
``hardware``, ``calibrate`` and ``profile`` (the last ones: what ``bench/fuzz_cli.py`` found), each run through :func:`partita.cli.main` in a forked
child of this process (fast: no interpreter start, the imports are shared; and a hang
is killed after :data:`TIMEOUT_S`). Every case must exit 2 with exactly one stderr line
starting ``partita: error:`` and no traceback.

``python tests/test_bad_input.py`` prints the classification of every case
(clean / traceback / hang / accepted / messy) and the counts.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Callable

import pytest

# Imported once here, so every forked case starts with the command modules loaded.
import partita.estimate  # noqa: F401,E402
import partita.export  # noqa: F401,E402
import partita.search.engine  # noqa: F401,E402
import partita.search.explain  # noqa: F401,E402
import partita.spec.hf_config  # noqa: F401,E402
import rich.table  # noqa: F401,E402
from child_io import read_child  # noqa: E402
from partita.cli import main as partita_main  # noqa: E402

TIMEOUT_S = 20.0

E = ["estimate", "--model", "llama-7b", "--hardware", "h100-sxm", "--devices", "8", "--global-batch", "64"]
P = ["plan", "--model", "llama-7b", "--hardware", "h100-sxm", "--devices", "16", "--global-batch", "64", "--top", "1"]
HUGE = "99999999999999999999"
GOOD_PLAN = {"dp": 8, "tp": 1, "pp": 1, "mbs": 1, "gbs": 64}


def make_files(root: Path) -> dict[str, str]:
    """The bad files the cases name, written under ``root``; returns {key: path}."""
    f: dict[str, str] = {}

    def put(key: str, content: str | bytes, name: str | None = None) -> None:
        path = root / (name or f"{key}.json")
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        f[key] = str(path)

    put("notutf8", b'{"dp": 1, "name": "\xff\xfe\xfa"}')
    put("deep", "[" * 100000 + "]" * 100000)
    put("deepobj", '{"a":' * 100000 + "1" + "}" * 100000)
    put("garbage", "this is not json")
    put("empty", "")
    put("list", "[1, 2, 3]")
    put("number", "42")
    (root / "adir.json").mkdir()
    f["dir"] = str(root / "adir.json")
    f["missing"] = str(root / "nope.json")
    for key, patch in {"dp_neg": {"dp": -1}, "tp0": {"tp": 0}, "zero7": {"zero": 7}, "gbs_odd": {"gbs": 63},
                       "recompute_bad": {"recompute": "sometimes"}, "dtype_bad": {"dtype": "fp3"},
                       "tp_str": {"tp": "abc"}, "tp_float": {"tp": 1.5}, "tp_bool": {"tp": True},
                       "tp_list": {"tp": [1]}, "split_bad": {"layer_split": "x"}, "unknown_field": {"tpp": 2},
                       "schedule_bad": {"schedule": "2f2b"}, "huge_dp": {"dp": 10 ** 30},
                       "sp_bad": {"sp": "maybe"}, "mbs0": {"mbs": 0}, "seq_neg": {"seq_len": -5},
                       "dp_shard_bad": {"dp_shard": 3}, "grad_dtype_bad": {"grad_dtype": "int8"},
                       "plans_garbage": None}.items():
        if key == "plans_garbage":
            put(key, json.dumps({"plans": [5]}))
            continue
        put(key, json.dumps({**GOOD_PLAN, **patch}))
    put("dp_inf", '{"dp": Infinity, "gbs": 64}')
    put("dp_nan", '{"dp": NaN, "gbs": 64}')
    put("gbs_1e400", '{"dp": 8, "gbs": 1e400}')
    # models (Partita model JSON and HF config.json)
    base = {"hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 32, "ffn_hidden": 11008, "vocab": 32000}
    for key, patch in {"m_layers_huge": {"layers": 10 ** 12}, "m_hidden_neg": {"hidden": -1},
                       "m_ffn_neg": {"ffn_hidden": -5}, "m_head_dim_neg": {"head_dim": -64},
                       "m_layers_str": {"layers": "32"}, "m_moe_int": {"moe": 5}, "m_moe_bad": {"moe": {"x": 1}},
                       "m_vocab0": {"vocab": 0}, "m_hidden_huge": {"hidden": 10 ** 15},
                       "m_heads_indiv": {"heads": 33, "kv_heads": 33}, "m_act_bad": {"activation": "tanh"},
                       "m_name_list": {"name": ["a"]}, "m_layers_float": {"layers": 32.5},
                       "m_ffn_str": {"ffn_hidden": "big"}, "m_mla_bad": {"mla": "yes"},
                       "m_tied_str": {"tied_embeddings": "no"}, "m_moe_list": {"moe": []}}.items():
        put(key, json.dumps({**base, **patch}))
    put("m_nan", json.dumps(base).replace("4096", "NaN"))
    qwen2 = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True}
    put("hf_layers_huge", json.dumps({**qwen2, "model_type": "llama", "num_hidden_layers": 10 ** 12}))
    put("hf_type_bad", json.dumps({**qwen2, "model_type": "not-a-model"}))
    put("hf_hidden_str", json.dumps({**qwen2, "model_type": "llama", "hidden_size": "896"}))
    put("hf_heads0", json.dumps({**qwen2, "model_type": "llama", "num_attention_heads": 0}))
    put("hf_act_int", json.dumps({**qwen2, "model_type": "llama", "hidden_act": 5}))
    put("hf_moe_topk", json.dumps({**qwen2, "model_type": "mixtral", "num_local_experts": 2,
                                   "num_experts_per_tok": 4}))
    _hardware_files(put)
    _fuzz_found_files(put, base, qwen2)
    return f


def _fuzz_found_files(put: Callable[..., None], model: dict, qwen2: dict) -> None:
    """The files of the failures bench/fuzz_cli.py found after the first 320 cases were clean."""
    put("big_int", '{"dp": ' + "9" * 5000 + "}")  # past CPython's 4,300-digit int parsing limit
    put("schedule_2f2b", json.dumps({**GOOD_PLAN, "schedule": "2f2b"}))  # estimate normalised it away
    put("split_len", json.dumps({**GOOD_PLAN, "layer_split": [10, 10, 12]}))  # 3 entries for pp 1
    put("split_float", json.dumps({**GOOD_PLAN, "pp": 1, "layer_split": [32.5]}))  # int() truncated it
    put("m_position_bad", json.dumps({**model, "position": "sinusoid"}))
    put("m_first_dense_gt", json.dumps({**model, "moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden": 1024,
                                                          "first_dense_layers": 40}}))
    put("hf_type_list", json.dumps({**qwen2, "model_type": ["llama"]}))
    put("hf_tie_str", json.dumps({**qwen2, "tie_word_embeddings": "yes"}))
    put("hf_rope_list", json.dumps({**qwen2, "rope_scaling": [1]}))
    put("meg_tp0", "torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 0 "
                   "--micro-batch-size 1 --global-batch-size 64\n", "meg_tp0.sh")
    put("titan_tp0", "--parallelism.tensor_parallel_degree 0 --training.local_batch_size 1\n", "titan_tp0.sh")
    put("ds_batch_str", json.dumps({"train_batch_size": "64", "zero_optimization": {"stage": 1}}), "ds_str.json")
    put("toml_deep", "a = " + "[" * 5000 + "]" * 5000 + "\n", "deep.toml")


def _hardware_files(put: Callable[..., None]) -> None:
    """The bad device files (one field of h100-sxm.json changed each)."""
    hw = json.loads((Path(__file__).resolve().parents[1] / "src/partita/catalog/devices/h100-sxm.json").read_text())
    hw.pop("aliases", None)

    def hw_put(key: str, section: str | None, field: str, value) -> None:
        data = json.loads(json.dumps(hw))
        if section is None:
            data[field] = value
        else:
            data.setdefault(section, {})
            if not isinstance(data[section], dict):
                data[section] = {}
            data[section][field] = value
        put(key, json.dumps(data))

    hw_put("h_gemm0", "efficiency", "gemm", 0)
    hw_put("h_gemm_neg", "efficiency", "gemm", -0.5)
    hw_put("h_gemm_big", "efficiency", "gemm", 7)
    hw_put("h_gemm_str", "efficiency", "gemm", "high")
    hw_put("h_inter0", "inter_node", "gbps_per_direction", 0)
    hw_put("h_intra0", "intra_node", "gbps_per_direction", 0)
    hw_put("h_hbm0", "memory", "hbm_gib", 0)
    hw_put("h_tbps0", "memory", "hbm_tbps", 0)
    hw_put("h_peak_str", None, "peak_tflops", "lots")
    hw_put("h_peak_neg", "peak_tflops", "bf16", -989)
    hw_put("h_memory_list", None, "memory", [1, 2])
    hw_put("h_extends_int", None, "extends", 5)
    hw_put("h_extends_missing", None, "extends", "no-such-family")
    hw_put("h_dpn0", "intra_node", "devices_per_node", 0)
    hw_put("h_dpn_float", "intra_node", "devices_per_node", 7.5)
    hw_put("h_topology_bad", "intra_node", "topology", "ring")
    hw_put("h_frag_big", "memory", "allocator_fragmentation", 3)
    hw_put("h_usable_big", "memory", "usable_gib", 10000)
    hw_put("h_cluster_nodes_bad", "cluster", "nodes", "many")
    hw_put("h_cluster_list", None, "cluster", [1])
    hw_put("h_eff_list", None, "efficiency", [1])
    hw_put("h_half0", "efficiency", "gemm_half_gflop", -1)
    hw_put("h_name_int", None, "name", 5)
    hw_put("h_link_list", "inter_node", "link", [])
    hw_put("h_hbm_huge", "memory", "hbm_gib", 10 ** 30)
    hw_put("h_reserved_big", "memory", "runtime_reserved_gib", 1000)  # more than the device holds
    hw_put("h_cluster_bogus", "cluster", "nodez", 2)  # a misspelt field was ignored
    hw_put("h_section_bogus", None, "memroy", {"hbm_gib": 80})
    hw_put("h_aliases_int", None, "aliases", 5)
    put("h_nan", json.dumps(hw).replace('"hbm_tbps": 3.35', '"hbm_tbps": NaN'))
    put("h_inf", json.dumps(hw).replace('"hbm_tbps": 3.35', '"hbm_tbps": Infinity'))


def cases(f: dict[str, str]) -> list[tuple[str, list[str]]]:
    """(case id, argv) of every bad input; ``f`` maps file keys to paths."""
    out: list[tuple[str, list[str]]] = []

    def add(name: str, argv: list[str]) -> None:
        out.append((name, argv))

    # degrees and sizes: zero, negative, huge, not a number
    for knob in ("tp", "pp", "vpp", "cp", "ep", "dp", "mbs"):
        for value in ("0", "-1", HUGE, "x"):
            add(f"plan-{knob}={value}", P + [f"--{knob}", value])
            add(f"estimate-{knob}={value}", E + [f"--{knob}", value])
    for flag in ("--devices", "--devices-per-node", "--seq-len", "--global-batch"):
        for value in ("0", "-3", HUGE, "1.5"):
            add(f"plan{flag}={value}", _with(P, flag, value))
            add(f"estimate{flag}={value}", _with(E, flag, value))
    for value in ("nan", "inf", "-inf", "1e400", "-1", "0", "abc", "1.4X", ""):
        add(f"plan--tokens={value}", P + [f"--tokens={value}"])
        add(f"estimate--tokens={value}", E + [f"--tokens={value}"])
    for value in ("nan", "1", "1.5", "-0.1", "inf", "x"):
        add(f"plan--headroom={value}", P + ["--headroom", value])
    for value in ("nan", "0", "-1", "inf", "1e400"):
        add(f"plan--max-memory-gib={value}", P + ["--max-memory-gib", value])
    for value in ("0", "-1", HUGE):
        add(f"plan--top={value}", P + ["--top", value])
    add("plan--zero=4", P + ["--zero", "4"])
    add("estimate--zero=-1", E + ["--zero", "-1"])
    add("estimate--layer-split=a,b", E + ["--pp", "2", "--layer-split", "a,b"])
    add("estimate--layer-split=0,0", E + ["--pp", "2", "--layer-split", "0,0"])
    add("estimate--layer-split=-1,33", E + ["--pp", "2", "--layer-split=-1,33"])
    add("estimate--layer-split=huge", E + ["--pp", "2", "--layer-split", f"{HUGE},1"])
    # impossible plans
    add("estimate-tp3-8dev", E + ["--tp", "3"])
    add("estimate-tp16-8dev", E + ["--tp", "16"])
    add("estimate-vpp2-pp1", E + ["--vpp", "2"])
    add("estimate-ep2-dense", E + ["--ep", "2"])
    add("estimate-cp3", E + ["--cp", "3", "--dp", "1", "--devices", "3", "--devices-per-node", "3"])
    add("estimate-gbs-odd", _with(E, "--global-batch", "63"))
    add("estimate-dp-mismatch", E + ["--dp", "3"])
    add("estimate-no-gbs", [a for a in E if a not in ("--global-batch", "64")])
    add("estimate-tp-heads", _with(E, "--devices", "24") + ["--tp", "3"] + ["--devices-per-node", "8"])
    add("estimate-fp8-a100", ["estimate", "--model", "llama-7b", "--hardware", "a100-80gb", "--devices", "8",
                              "--global-batch", "64", "--dtype", "fp8"])
    add("estimate-plan-and-tp", E + ["--plan", str(Path(f["missing"]).with_name("good-plan.json")), "--tp", "2"])
    add("plan-vpp2-pp1", P + ["--vpp", "2", "--pp", "1"])
    add("plan-tp3", P + ["--tp", "3"])
    add("plan-ep2-dense", P + ["--ep", "2"])
    add("plan-infeasible-mem", P + ["--max-memory-gib", "0.001"])
    add("plan-tp-pp-too-big", P + ["--tp", "8", "--pp", "8"])
    # names
    for cmd in (P, E):
        add(f"{cmd[0]}-model-typo", _with(cmd, "--model", "llama-7c"))
        add(f"{cmd[0]}-model-empty", _with(cmd, "--model", ""))
        add(f"{cmd[0]}-hardware-typo", _with(cmd, "--hardware", "h100-sxn"))
        add(f"{cmd[0]}-hardware-empty", _with(cmd, "--hardware", ""))
        add(f"{cmd[0]}-dtype-bad", cmd + ["--dtype", "fp3"])
    # flags generated from a config dataclass (train/profile): finite floats, 32-bit ints, at parse time
    for flag, value in (("--lr", "nan"), ("--lr", "inf"), ("--seed", HUGE), ("--steps", "x")):
        add(f"train{flag}={value}", ["train", "--model", "tiny-llama", flag, value])
    add("unknown-command", ["plna"])
    add("unknown-flag", P + ["--tpp", "2"])
    add("models-extra", ["models", "--bogus"])
    add("hardware-extra", ["hardware", "extra"])
    return out + _file_cases(f) + _fuzz_found_cases(f)


def _fuzz_found_cases(f: dict[str, str]) -> list[tuple[str, list[str]]]:
    """What bench/fuzz_cli.py found (tracebacks, silently accepted input, launches) once the
    cases above were clean; each was fixed at the edge."""
    root = Path(f["missing"]).parent
    good = str(root / "good-plan.json")
    out = [("estimate-model-name-5000", _with(E, "--model", "x" * 5000)),  # OSError: File name too long
           ("plan-model-name-5000", _with(P, "--model", "x" * 5000)),  # traced-spec check: File name too long
           ("estimate-hardware-name-5000", _with(E, "--hardware", "x" * 5000 + ".json")),
           ("estimate-plan-big-int", E[:7] + ["--plan", f["big_int"]]),
           ("estimate-plan-schedule-2f2b", E[:7] + ["--plan", f["schedule_2f2b"]]),
           ("estimate--layer-split=''", E + ["--pp", "2", "--layer-split", ""]),
           ("estimate--layer-split=','", E + ["--pp", "2", "--layer-split", ","]),
           ("estimate--set=cluster.nodes=0", E + ["--set", "cluster.nodes=0"]),
           ("plan--set=cluster.nodes=x", P + ["--set", "cluster.nodes=x"]),
           ("export-split-len", ["export", "--to", "megatron", f["split_len"]]),
           ("export-split-float", ["export", "--to", "megatron", f["split_float"]]),
           ("export-o-empty", ["export", "--to", "megatron", good, "-o", ""]),
           ("import-o-empty", ["import", f["meg_tp0"], "-o", ""]),
           ("import-megatron-tp0", ["import", f["meg_tp0"]]),
           ("estimate-from-script-tp0", E[:7] + ["--from-script", f["meg_tp0"]]),
           ("import-titan-tp0", ["import", f["titan_tp0"], "--devices", "8"]),
           ("import-ds-batch-str", ["import", f["ds_batch_str"], "--devices", "8"]),
           ("import-toml-deep", ["import", f["toml_deep"], "--devices", "8"]),
           ("calibrate--name=''", ["calibrate", "--name", "", "-o", str(root / "cal.json")]),
           ("profile--report-missing-dir", ["profile", "--model", "tiny-llama", "--report", str(root / "no/r.html")]),
           ("profile--hardware-typo", ["profile", "--model", "tiny-llama", "--hardware", "h100-sxn"]),
           ("profile--run-dir-file", ["profile", "--model", "tiny-llama", "--run-dir", good])]
    for key in ("m_position_bad", "m_first_dense_gt", "hf_type_list", "hf_tie_str", "hf_rope_list"):
        out.append((f"estimate-model-{key}", _with(E, "--model", f[key])))
    for key in ("h_reserved_big", "h_cluster_bogus", "h_section_bogus", "h_aliases_int"):
        out.append((f"estimate-hardware-{key}", _with(E, "--hardware", f[key])))
    return out


def _file_cases(f: dict[str, str]) -> list[tuple[str, list[str]]]:
    """Cases that name bad files: models, devices, --set, plan files, outputs, calibrate."""
    out: list[tuple[str, list[str]]] = []

    def add(name: str, argv: list[str]) -> None:
        out.append((name, argv))

    # model files
    for key in ("notutf8", "deep", "deepobj", "garbage", "empty", "list", "number", "dir", "missing"):
        add(f"estimate-model-file-{key}", _with(E, "--model", f[key]))
    for key in [k for k in f if k.startswith(("m_", "hf_"))]:
        add(f"estimate-model-{key}", _with(E, "--model", f[key]))
    add("plan-model-layers-huge", _with(P, "--model", f["m_layers_huge"]))
    add("plan-model-hf-layers-huge", _with(P, "--model", f["hf_layers_huge"]))
    # hardware files
    for key in ("notutf8", "deep", "deepobj", "garbage", "empty", "list", "number", "dir", "missing"):
        add(f"estimate-hardware-file-{key}", _with(E, "--hardware", f[key]))
    for key in [k for k in f if k.startswith("h_")]:
        add(f"estimate-hardware-{key}", _with(E, "--hardware", f[key]))
    add("plan-hardware-nan", _with(P, "--hardware", f["h_nan"]))
    # --set
    for value in ("efficiency.gemmm=0.5", "name.x=1", "efficiency.gemm=NaN", "efficiency.gemm=Infinity",
                  "efficiency.gemm=-1", "efficiency.gemm=0", "efficiency.gemm=1e400", "=5", "efficiency.=1",
                  ".gemm=1", "efficiency.gemm", "memory.hbm_gib=abc", "inter_node.gbps_per_direction=0",
                  "memry.hbm_gib=80", "efficiency=0.5", "efficiency.gemm.x=1", "memory.hbm_gib=[1]",
                  "intra_node.devices_per_node=0", "peak_tflops.bf16=-5", "memory.hbm_gib=1e309"):
        add(f"estimate--set={value}", E + ["--set", value])
    add("plan--set-nan", P + ["--set", "efficiency.gemm=NaN"])
    # plan files: estimate --plan and export (with and without --model)
    plan_keys = ["notutf8", "deep", "deepobj", "garbage", "empty", "list", "number", "dir", "missing",
                 "dp_neg", "tp0", "zero7", "gbs_odd", "recompute_bad", "dtype_bad", "tp_str", "tp_float",
                 "tp_bool", "tp_list", "split_bad", "unknown_field", "schedule_bad", "huge_dp", "sp_bad", "mbs0",
                 "seq_neg", "dp_shard_bad", "grad_dtype_bad", "plans_garbage", "dp_inf", "dp_nan", "gbs_1e400"]
    for key in plan_keys:
        add(f"export-{key}", ["export", "--to", "megatron", f[key]])
    for key in ("dp_neg", "tp0", "zero7", "dp_inf", "deep", "notutf8", "dir", "tp_float", "gbs_1e400"):
        add(f"export-model-{key}", ["export", "--to", "deepspeed", "--model", "llama-7b", f[key]])
        add(f"estimate-plan-{key}", E + ["--plan", f[key]])
    good = str(Path(f["missing"]).with_name("good-plan.json"))
    add("export-o-missing-dir", ["export", "--to", "megatron", good, "-o", str(Path(f["missing"]).parent / "no/x.sh")])
    add("export-o-dir", ["export", "--to", "megatron", good, "-o", f["dir"]])
    add("export-to-bad", ["export", "--to", "nemo", good])
    add("export-model-typo", ["export", "--to", "megatron", "--model", "lama-7b", good])
    add("export-plan-model-mismatch", ["export", "--to", "megatron", "--model", "llama-7b", good.replace(
        "good-plan", "tp-heads-plan")])
    # calibrate: every case must fail before any process starts
    for flag, value in (("--nproc", "0"), ("--nproc", "-1"), ("--nproc", HUGE), ("--timeout-s", "0"),
                        ("--timeout-s", "-5"), ("--timeout-s", "nan"), ("--base", "cpuu"), ("--base", "garbage"),
                        ("--base", "dir"), ("--dtype", "fp8")):
        add(f"calibrate{flag}={value}", ["calibrate", flag, f.get(value, value), "-o",
                                         str(Path(f["dir"]).parent / "cal.json")])
    add("calibrate-o-dir", ["calibrate", "-o", f["dir"]])
    add("calibrate-o-missing-dir", ["calibrate", "-o", str(Path(f["missing"]).parent / "no/cal.json")])
    return out


def _with(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag``'s value replaced (or the flag added)."""
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def run_case(argv: list[str], timeout_s: float = TIMEOUT_S) -> dict:
    """Run ``partita.cli.main(argv)`` in a forked child; returns rc, stdout, stderr,
    ``raised`` (an exception that escaped main, as text) and ``hung``."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        out, err = io.StringIO(), io.StringIO()
        sys.stdout, sys.stderr = out, err
        result: dict = {"raised": None}
        try:
            result["rc"] = partita_main(argv)
        except SystemExit as e:
            result["rc"] = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 - what escaped is the finding
            result["rc"] = 1
            result["raised"] = traceback.format_exc()
        result["stdout"], result["stderr"] = out.getvalue()[-20000:], err.getvalue()[-20000:]
        with os.fdopen(write_fd, "wb") as w:
            w.write(pickle.dumps(result))
        os._exit(0)
    os.close(write_fd)
    raw = read_child(pid, read_fd, timeout_s)
    if raw is None:
        return {"rc": None, "hung": True, "stdout": "", "stderr": "", "raised": None}
    result = pickle.loads(raw) if raw else {"rc": None, "raised": "child died", "stdout": "",
                                                            "stderr": ""}
    result["hung"] = False
    return result


def classify(r: dict) -> str:
    """clean (exit 2, one `partita: error:` line) / hang / traceback / accepted (exit 0) / messy."""
    if r["hung"]:
        return "hang"
    if r["raised"] or "Traceback" in r["stderr"] or "internal error" in r["stderr"]:
        return "traceback"
    lines = [ln for ln in r["stderr"].splitlines() if ln.strip()]
    if r["rc"] == 2 and len(lines) == 1 and lines[0].startswith("partita: error:"):
        return "clean"
    if r["rc"] == 0:
        return "accepted"
    return "messy"


def write_good_plans(root: Path) -> None:
    from partita.plan import Plan
    Plan(**GOOD_PLAN).to_json(root / "good-plan.json")
    Plan(dp=4, tp=3, gbs=64).to_json(root / "tp-heads-plan.json")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("bad")
    write_good_plans(root)
    return make_files(root)


def _all_cases() -> list[tuple[str, list[str]]]:
    root = Path(tempfile.mkdtemp(prefix="partita-bad-input-ids-"))
    try:
        return cases(make_files(root))
    finally:
        import shutil
        shutil.rmtree(root)


_IDS = [name for name, _ in _all_cases()]


@pytest.mark.parametrize("name", _IDS)
def test_bad_input_is_one_clean_line(files, name):
    argv = dict(cases(files))[name]
    r = run_case(argv)
    assert not r["hung"], f"{name}: hung for {TIMEOUT_S} s"
    assert not r["raised"], f"{name}: exception escaped main:\n{r['raised']}"
    assert "Traceback" not in r["stderr"], r["stderr"]
    lines = [ln for ln in r["stderr"].splitlines() if ln.strip()]
    assert r["rc"] == 2, f"{name}: exit {r['rc']}, stderr {r['stderr']!r}, stdout {r['stdout'][:300]!r}"
    assert len(lines) == 1 and lines[0].startswith("partita: error:"), f"{name}: stderr {r['stderr']!r}"


def main_report() -> int:
    root = Path(tempfile.mkdtemp(prefix="partita-bad-input-"))
    write_good_plans(root)
    table = cases(make_files(root))
    counts: dict[str, int] = {}
    for name, argv in table:
        r = run_case(argv)
        kind = classify(r)
        counts[kind] = counts.get(kind, 0) + 1
        detail = (r["raised"] or "").strip().splitlines()[-1:] or r["stderr"].strip().splitlines()[-1:] or [""]
        print(f"{kind:9} {name:45} {detail[0][:150]}")
    print(f"{len(table)} cases:", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    import shutil
    shutil.rmtree(root)
    return 0


if __name__ == "__main__":
    sys.exit(main_report())


# ------------------------------------------------------------------ exact messages
EXACT = {
    "plan-tp=0": "partita: error: plan: argument --tp: must be from 1 to 16,777,216, got 0 (see partita plan --help)",
    "plan--headroom=1": "partita: error: plan: argument --headroom: must be a finite number in [0, 1), got 1 "
                        "(see partita plan --help)",
    "estimate-model-typo": "partita: error: unknown model 'llama-7c': did you mean llama-7b, llama2-7b, llama3-70b, "
                           "llama2-70b?",
    "estimate--set=efficiency.gemmm=0.5": "partita: error: --set efficiency.gemmm: no field 'gemmm' in efficiency; "
                                          "did you mean efficiency.gemm, efficiency.gemm_fp8?",
    "estimate-gbs-odd": "partita: error: invalid plan: global batch 63 must be a multiple of dp*mbs = 8*1 = 8",
    "export-zero7": "partita: error: invalid plan: zero must be 0, 1, 2 or 3, got 7",
    "estimate--set=efficiency.gemm=NaN": "partita: error: --set efficiency.gemm=...: efficiency.gemm must be a finite "
                                         "number, got nan",
    "plan-vpp2-pp1": "partita: error: --vpp 2 needs --pp > 1 (virtual stages interleave a pipeline)",
    "export-o-empty": "partita: error: -o is empty; give a file name",
    "estimate--set=cluster.nodes=0": "partita: error: --set cluster.nodes=...: cluster.nodes must be a whole number "
                                     "from 1 to 1,048,576, got 0",
    "import-megatron-tp0": "partita: error: FILES/meg_tp0.sh: --tensor-model-parallel-size 0 must be a whole number "
                           "from 1 to 16,777,216",
}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_message(files, name):
    r = run_case(dict(cases(files))[name])
    assert r["stderr"].strip() == EXACT[name].replace("FILES", str(Path(files["missing"]).parent))


def test_unknown_model_names_close_ones_and_plan_names_the_constraint(files):
    r = run_case(dict(cases(files))["estimate-model-m_layers_huge"])
    assert "layers must be a whole number from 1 to 10,000, got 1000000000000" in r["stderr"]
    r = run_case(dict(cases(files))["estimate-hardware-typo"])
    assert "unknown hardware 'h100-sxn': did you mean" in r["stderr"] and "h100-sxm" in r["stderr"]


# ------------------------------------------------------------------ valid input still works
@pytest.mark.parametrize("argv", [
    E + ["--tokens", "1.4T", "--json"],
    E + ["--pp", "2", "--layer-split", "17,15", "--json"],
    P + ["--headroom", "0", "--max-memory-gib", "60", "--json"],
    ["export", "--to", "megatron", "GOOD"],
    ["estimate", "--model", "QWEN2", "--hardware", "h100-sxm", "--devices", "8", "--global-batch", "64", "--json",
     "--set", "efficiency.gemm=0.5"],
])
def test_valid_input_is_accepted(files, argv):
    root = Path(files["missing"]).parent
    qwen2 = root / "qwen2-0.5b" / "config.json"
    qwen2.parent.mkdir(exist_ok=True)
    qwen2.write_text(json.dumps({"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24,
                                 "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
                                 "vocab_size": 151936, "tie_word_embeddings": True}))
    argv = [str(root / "good-plan.json") if a == "GOOD" else str(qwen2) if a == "QWEN2" else a for a in argv]
    r = run_case(argv)
    assert r["rc"] == 0 and not r["raised"], r
    assert "nan" not in r["stdout"].lower() and "inf" not in r["stdout"].lower().replace("info", "")


def test_qwen2_config_has_qkv_bias(tmp_path):
    """Issue 15: a qwen2 config.json crashed with `got multiple values for keyword argument 'qkv_bias'`;
    Qwen2 has biases on q/k/v (transformers Qwen2Attention: q_proj/k_proj/v_proj bias=True)."""
    from partita.spec.hf_config import parse_hf_config
    spec = parse_hf_config({"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24,
                            "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
                            "vocab_size": 151936})
    assert spec.qkv_bias is True and spec.kv_heads == 2


def test_full_disk_is_one_line(files):
    """stdout to a full disk (`> /dev/full`): one line, exit 2, no traceback."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        err = io.StringIO()
        sys.stderr = err
        sys.stdout = open("/dev/full", "w")
        try:
            rc = partita_main(E + ["--json"])
        except BaseException:  # noqa: BLE001
            rc = 99
        os.write(write_fd, pickle.dumps((rc, err.getvalue())))
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as r:
        rc, err = pickle.loads(r.read())
    os.waitpid(pid, 0)
    assert rc == 2 and err.strip() == "partita: error: cannot write the output: No space left on device"


# ------------------------------------------------------------------ plan strings (train --plan, Plan.parse)
@pytest.mark.parametrize("text, message", [
    ("tp=0", "plan: tp must be from 1 to 16,777,216, got 0"),
    ("pp=-1", "plan: pp must be from 1 to 16,777,216, got -1"),
    ("tp=2,tp=3", "plan item 'tp=3': tp is given twice"),
    ("=2", "plan item '=2': a field name is missing before '='"),
    ("tp=1e400", "plan: tp must be an integer, got '1e400'"),
    ("tp=3", "plan: tp*pp*cp = 3 does not divide the world size 8"),
])
def test_plan_string_errors(text, message):
    from partita.errors import PartitaError
    from partita.plan import Plan
    with pytest.raises(PartitaError) as e:
        Plan.parse(text, world_size=8)
    assert str(e.value) == message


_KEYS = ["dp", "tp", "pp", "vpp", "cp", "ep", "zero", "mbs", "gbs", "seq_len", "sp", "recompute", "dtype",
         "schedule", "layer_split", "dp_shard", "", "tpp"]
_VALUES = ["0", "1", "2", "-1", "3", "8", "1e400", "inf", "nan", "99999999999999999999", "x", "", "true",
           "full", "1,2", "1.5"]


def test_plan_strings_parse_or_refuse_in_one_line():
    """Property over 2,000 seeded random key=value plan strings (a fixed-seed generator keeps the
    cases reproducible; tests/test_fuzz_properties.py has the hypothesis version): each either parses
    into a plan that check() accepts or is rejected with a one-line PartitaError, never
    another exception."""
    import random

    from partita.errors import PartitaError
    from partita.plan import Plan, check

    rng = random.Random(16)
    for _ in range(2000):
        items = [f"{rng.choice(_KEYS)}={rng.choice(_VALUES)}" for _ in range(rng.randint(0, 5))]
        world = rng.choice([None, 1, 8, 12])
        try:
            plan = check(Plan.parse(",".join(items), world_size=world))
        except PartitaError as e:
            assert "\n" not in str(e) and str(e), items
            continue
        assert plan.world_size >= 1 and plan.gbs % (plan.dp * plan.mbs) == 0, items


def test_cluster_file_sets_the_device_count(tmp_path):
    """A hardware file's ``cluster.nodes`` was ignored by ``plan`` (its default 512 devices won)."""
    hw = json.loads((Path(__file__).resolve().parents[1] / "src/partita/catalog/devices/h100-sxm.json").read_text())
    hw.pop("aliases", None)
    hw["cluster"] = {"nodes": 4, "devices_per_node": 8}
    (tmp_path / "cluster.json").write_text(json.dumps(hw))
    r = run_case(["plan", "--model", "llama-7b", "--hardware", str(tmp_path / "cluster.json"), "--global-batch", "64",
                  "--top", "1", "--json"])
    assert r["rc"] == 0 and json.loads(r["stdout"])["devices"] == 32


_BAD_VALUES = [0, -1, 1, 0.5, 1e308, -1e308, 10 ** 30, "x", "", None, True, False, [], {}, [1], {"a": 1}, 2 ** 63,
               1e-300, 7]


def test_mutated_device_and_model_files_are_clean_or_finite(tmp_path):
    """Property over 80 seeded random mutations of a device file and a model file (one field
    set to a wrong type, zero, a negative, a huge or a tiny value): every run either exits 2
    with one line or exits 0 with no NaN/Infinity in its JSON output."""
    import random
    rng = random.Random(1600)
    hw = json.loads((Path(__file__).resolve().parents[1] / "src/partita/catalog/devices/h100-sxm.json").read_text())
    hw.pop("aliases", None)
    model = {"hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 8, "ffn_hidden": 11008, "vocab": 32000,
             "moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden": 1024}}
    for i in range(80):
        kind = rng.choice(["hardware", "model"])
        data = json.loads(json.dumps(hw if kind == "hardware" else model))
        node, key = data, rng.choice(list(data))
        if isinstance(node[key], dict) and node[key] and rng.random() < 0.8:
            node, key = node[key], rng.choice(list(node[key]))
        node[key] = rng.choice(_BAD_VALUES)
        path = tmp_path / f"{i}.json"
        path.write_text(json.dumps(data))
        argv = ["estimate", "--model", str(path) if kind == "model" else "llama-7b", "--hardware",
                str(path) if kind == "hardware" else "h100-sxm", "--devices", "8", "--global-batch", "64", "--json"]
        r = run_case(argv)
        kind_of = classify(r)
        assert kind_of in ("clean", "accepted"), (key, node[key], kind_of, r["raised"] or r["stderr"])
        if kind_of == "accepted":
            assert "NaN" not in r["stdout"] and "Infinity" not in r["stdout"], (key, node[key])


def test_internal_error_is_one_line_and_debug_shows_the_traceback(monkeypatch, capsys):
    """A bug (not a user mistake) is exit 1 and one `partita: internal error:` line; with
    --debug the traceback follows."""
    import types
    main_module = sys.modules["partita.cli.main"]

    def broken(args):
        raise KeyError("boom")
    fake = types.SimpleNamespace(add_parser=lambda sub: sub.add_parser("models").set_defaults(func=broken))
    monkeypatch.setattr(main_module, "COMMANDS", (fake,))
    assert partita_main(["models"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("partita: internal error: KeyError: 'boom' at test_bad_input.py:")
    assert partita_main(["models", "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err


# ------------------------------------------------------------------ found by bench/fuzz_cli.py
def _full_stdout_run(argv: list[str]) -> tuple[int, str]:
    """``partita_main(argv)`` in a forked child whose stdout is /dev/full: (rc, stderr)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        err = io.StringIO()
        sys.stderr = err
        sys.stdout = open("/dev/full", "w")
        try:
            rc = partita_main(argv)
        except BaseException:  # noqa: BLE001
            rc = 99
        os.write(write_fd, pickle.dumps((rc, err.getvalue())))
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as r:
        rc, err = pickle.loads(r.read())
    os.waitpid(pid, 0)
    return rc, err


@pytest.mark.parametrize("argv", [["--help"], ["models"], ["hardware", "--json"], ["export", "--to", "megatron", "GOOD"]])
def test_every_output_onto_a_full_disk_is_one_line(files, argv):
    """`--help` on a full disk exited 0 with the help lost; every printing command says so in one line."""
    argv = [str(Path(files["missing"]).with_name("good-plan.json")) if a == "GOOD" else a for a in argv]
    rc, err = _full_stdout_run(argv)
    assert rc == 2 and err.strip() == "partita: error: cannot write the output: No space left on device", (rc, err)


def test_set_cluster_nodes_sets_the_device_count():
    """`--set cluster.nodes=2` was silently ignored (plan searched its default 512 devices)."""
    r = run_case(["plan", "--model", "llama-7b", "--hardware", "h100-sxm", "--set", "cluster.nodes=2",
                  "--global-batch", "64", "--top", "1", "--json"])
    assert r["rc"] == 0 and json.loads(r["stdout"])["devices"] == 16, r["stderr"]


def test_largest_global_batch_is_answered_quickly():
    """`plan --global-batch 16777216` (the largest allowed) spent 100 s listing divisors up to n;
    now well under a second (run_case kills it after TIMEOUT_S = 20 s, and then it fails as hung)."""
    r = run_case(["plan", "--model", "llama-7b", "--hardware", "h100-sxm", "--devices", "16",
                  "--global-batch", str(1 << 24), "--top", "1", "--json"])
    assert not r["hung"] and r["rc"] == 0 and json.loads(r["stdout"])["plans"], r["stderr"]


def test_profile_that_fails_leaves_no_temp_dir(tmp_path, monkeypatch):
    """`partita profile` made a partita-profile-* temp run dir before validating the plan and left
    it behind on every exit (20 of them after one fuzz run)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None  # re-read TMPDIR (in the forked child too)
    try:
        r = run_case(["profile", "--model", "tiny-llama", "--plan", "tp=0"], timeout_s=60)
    finally:
        tempfile.tempdir = None
    assert r["rc"] == 2 and "tp must be from 1" in r["stderr"], r
    assert list(tmp_path.iterdir()) == []


def test_calibrate_unknown_device_is_refused_before_torchrun(files):
    """`calibrate --device tpu` started torchrun and failed in the workers; now one line before any
    process starts (its check imports torch, slow on a loaded machine: a longer timeout)."""
    out = str(Path(files["missing"]).parent / "cal.json")
    r = run_case(["calibrate", "--device", "tpu", "-o", out], timeout_s=90)
    assert r["rc"] == 2 and r["stderr"].startswith("partita: error: --device 'tpu' is not a device type"), r
    assert not Path(out).exists()
