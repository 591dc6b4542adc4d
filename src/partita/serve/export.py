"""Launch arguments of the serving engines for a layout ``partita serve`` chose.

* **vLLM** (and vLLM-Ascend, a platform plugin that keeps ``vllm serve``'s flags):
  ``vllm serve MODEL --tensor-parallel-size --pipeline-parallel-size [--data-parallel-size
  --enable-expert-parallel] --max-num-seqs --max-model-len --max-num-batched-tokens
  --kv-cache-dtype --gpu-memory-utilization``, and ``--quantization fp8`` for fp8 weights
  (online dynamic fp8 of a bf16 checkpoint: vLLM ``QuantizationMethods``, SGLang
  ``QUANTIZATION_CHOICES`` "fp8"; ``--dtype bfloat16`` stays the activations' dtype);
  disaggregated pools get ``--kv-transfer-config`` with ``kv_role`` kv_producer / kv_consumer (vLLM ``KVTransferConfig``): NixlConnector on GPUs,
  vLLM-Ascend's MooncakeConnectorV1 on NPUs. vLLM's data parallel with MoE models runs attention
  data parallel and spreads the experts over ``tp x dp`` (its expert-parallel docs).
* **SGLang** ``python -m sglang.launch_server``: ``--tp-size`` is the whole engine (``tp x
  dp_attn``) and ``--dp-size`` with ``--enable-dp-attention`` splits attention; ``--ep-size``,
  ``--pp-size``, ``--max-running-requests``, ``--context-length``, ``--chunked-prefill-size``,
  ``--mem-fraction-static``, ``--kv-cache-dtype``, ``--disaggregation-mode prefill|decode``;
  on Ascend ``--device npu --attention-backend ascend``.
* **MindIE** ``mindie-service/conf/config.json``: the ``BackendConfig`` keys to merge into the
  shipped file (instances, NPU ids, ``worldSize`` = tp, the schedule limits; the predicted
  prefill and decode step times fill ``prefillTimeMsPerReq`` / ``decodeTimeMsPerReq``, which
  its scheduler uses to choose between them). Its schema has no pipeline, attention data
  parallel, expert parallel or prefill/decode role field: such layouts are not expressible.

Each exporter is checked against the engine's own argument definitions, transcribed with their
source in tests/export_oracles/serve_engines.json.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from ..spec.hardware import Device
from .memory import MEM_FRACTION, PREFILL_CHUNK
from .workload import Layout, Workload

ENGINES = ("vllm", "sglang", "mindie")


@dataclass(frozen=True)
class ExportInput:
    """What an exporter needs: the layout, the KV-bounded concurrency of one replica, the
    workload, where the weights are, the device and the predicted step times (seconds)."""

    layout: Layout
    max_seqs: int
    work: Workload
    model_path: str
    device: Device
    prefill_s: float = 0.0
    tpot_s: float = 0.0
    per_node: int = 8


def is_npu(device: Device) -> bool:
    """An Ascend NPU (the engines take NPU-specific switches): the catalog's Ascend files."""
    return device.name.lower().startswith("ascend") or "ascend" in device.description.lower()[:40]


def not_expressible(engine: str, layout: Layout) -> str | None:
    """Why ``engine`` cannot run ``layout`` (None: it can)."""
    if engine != "mindie":
        return None
    for bad, what in ((layout.dtype == "fp8", "fp8 weights"),
                      (layout.pp > 1, "pipeline stages"), (layout.dp_attn > 1, "attention data parallel"),
                      (layout.ep > 1, "expert parallel"), (layout.disaggregated, "prefill/decode pools")):
        if bad:
            return f"MindIE's config.json has no field for {what}"
    return None


def _kv_transfer(inp: ExportInput, role: str) -> str:
    lay = inp.layout
    if is_npu(inp.device):
        config = {"kv_connector": "MooncakeConnectorV1", "kv_role": role,
                  "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector",
                  "kv_connector_extra_config": {k: {"dp_size": lay.dp_attn, "tp_size": lay.tp}
                                                for k in ("prefill", "decode")}}
    else:
        config = {"kv_connector": "NixlConnector", "kv_role": role}
    return json.dumps(config, separators=(",", ":"))


def vllm_argv(inp: ExportInput, role: str = "both") -> list[str]:
    """``vllm serve``'s arguments (after ``vllm serve``) for one replica of ``role``
    (both | prefill | decode)."""
    lay, work = inp.layout, inp.work
    argv = [inp.model_path, "--tensor-parallel-size", str(lay.tp), "--pipeline-parallel-size", str(lay.pp)]
    if lay.dp_attn > 1:
        argv += ["--data-parallel-size", str(lay.dp_attn)]
    if lay.ep > 1:
        argv.append("--enable-expert-parallel")
    argv += ["--max-num-seqs", str(max(1, inp.max_seqs // lay.dp_attn)), "--max-model-len", str(work.max_len),
             "--max-num-batched-tokens", str(PREFILL_CHUNK), "--dtype", "bfloat16",
             "--kv-cache-dtype", "fp8" if lay.kv_dtype == "fp8" else "auto",
             "--gpu-memory-utilization", str(MEM_FRACTION)]
    if lay.dtype == "fp8":
        argv += ["--quantization", "fp8"]
    if role != "both":
        argv += ["--kv-transfer-config", _kv_transfer(inp, "kv_producer" if role == "prefill" else "kv_consumer")]
    return argv


def sglang_argv(inp: ExportInput, role: str = "both") -> list[str]:
    """``python -m sglang.launch_server``'s arguments for one replica of ``role``."""
    lay, work = inp.layout, inp.work
    argv = ["--model-path", inp.model_path, "--tp-size", str(lay.tp * lay.dp_attn), "--pp-size", str(lay.pp)]
    if lay.dp_attn > 1:
        argv += ["--dp-size", str(lay.dp_attn), "--enable-dp-attention"]
    if lay.ep > 1:
        argv += ["--ep-size", str(lay.ep)]
    argv += ["--max-running-requests", str(inp.max_seqs), "--context-length", str(work.max_len),
             "--chunked-prefill-size", str(PREFILL_CHUNK), "--dtype", "bfloat16",
             "--kv-cache-dtype", "fp8_e4m3" if lay.kv_dtype == "fp8" else "auto",
             "--mem-fraction-static", str(MEM_FRACTION)]
    if lay.dtype == "fp8":
        argv += ["--quantization", "fp8"]
    if role != "both":
        argv += ["--disaggregation-mode", role]
    if is_npu(inp.device):
        argv += ["--device", "npu", "--attention-backend", "ascend"]
    return argv


def mindie_config(inp: ExportInput, model_name: str) -> dict:
    """The ``config.json`` keys of one MindIE service on a node (module docstring)."""
    lay, work = inp.layout, inp.work
    instances = max(1, min(inp.per_node // lay.tp, lay.replicas, 10))
    batch = max(1, min(inp.max_seqs, 5000))
    schedule = {"templateType": "Standard", "templateName": "Standard_LLM", "cacheBlockSize": 128,
                "maxPrefillBatchSize": max(1, min(batch, PREFILL_CHUNK // work.prompt_len)),
                "maxPrefillTokens": max(PREFILL_CHUNK, work.prompt_len),
                "prefillTimeMsPerReq": int(min(max(round(inp.prefill_s * 1e3), 0), 1000)), "prefillPolicyType": 0,
                "decodeTimeMsPerReq": int(min(max(round(inp.tpot_s * 1e3), 0), 1000)), "decodePolicyType": 0,
                "maxBatchSize": batch, "maxIterTimes": work.output_len, "maxPreemptCount": 0,
                "supportSelectBatch": True, "maxQueueDelayMicroseconds": 5000}
    model = {"modelInstanceType": "Standard", "modelName": model_name, "modelWeightPath": inp.model_path,
             "worldSize": lay.tp, "cpuMemSize": 5, "npuMemSize": -1, "backendType": "atb", "trustRemoteCode": False}
    deploy = {"maxSeqLen": work.max_len, "maxInputTokenLen": work.prompt_len, "truncation": False,
              "ModelConfig": [model]}
    backend = {"backendName": "mindieservice_llm_engine", "modelInstanceNumber": instances,
               "npuDeviceIds": [list(range(i * lay.tp, (i + 1) * lay.tp)) for i in range(instances)],
               "tokenizerProcessNumber": 8, "multiNodesInferEnabled": lay.tp > inp.per_node,
               "ModelDeployConfig": deploy, "ScheduleConfig": schedule}
    return {"Version": "1.0.0", "ServerConfig": {"ipAddress": "127.0.0.1", "port": 1025}, "BackendConfig": backend}


def render(engine: str, inp: ExportInput, model_name: str) -> str:
    """The export as text: shell commands (vLLM, SGLang) or the JSON (MindIE)."""
    lay = inp.layout
    if engine == "mindie":
        head = (f"// MindIE: merge into mindie-service/conf/config.json on each node; "
                f"{lay.replicas} instance(s) of worldSize {lay.tp} in all\n")
        return head + json.dumps(mindie_config(inp, model_name), indent=2) + "\n"
    program = "vllm serve" if engine == "vllm" else "python -m sglang.launch_server"
    build = vllm_argv if engine == "vllm" else sglang_argv
    pools = [("prefill", lay.prefill_replicas), ("decode", lay.decode_replicas)] if lay.disaggregated \
        else [("both", lay.replicas)]
    lines = []
    nodes = -(-lay.replica_devices // inp.per_node)
    if nodes > 1:
        lines.append(f"# each replica spans {nodes} nodes: " + (
            "start a Ray cluster over them first (vLLM's multi-node serving)" if engine == "vllm" else
            f"run the command on each with --nnodes {nodes} --node-rank <i> --dist-init-addr <first node>:<port>"))
    for role, count in pools:
        what = "replica(s)" if role == "both" else f"{role} replica(s)"
        lines.append(f"# {count} {what} of {lay.replica_devices} device(s) each, behind a load balancer")
        lines.append(f"{program} {shlex.join(build(inp, role))}")
    return "\n".join(lines) + "\n"
