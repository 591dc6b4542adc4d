"""What ``partita serve`` plans for: the workload, and one serving layout.

A *replica* is one engine instance (one ``vllm serve`` / SGLang server / MindIE model
instance) on ``tp x pp x dp_attn`` devices:

* ``tp`` - tensor parallel degree of attention (heads split ``tp`` ways) and, without expert
  parallelism, of every MLP / expert;
* ``pp`` - pipeline stages (contiguous blocks of layers);
* ``dp_attn`` - attention data parallel (SGLang ``--enable-dp-attention``, vLLM data parallel
  with expert parallelism; MoE models only): ``dp_attn`` copies of attention each hold their
  own sequences and KV cache, while the MoE layers span all ``tp x dp_attn`` devices of a stage;
* ``ep`` - expert parallel degree: 1 (routed experts tensor-split over the stage, all-reduce)
  or ``tp x dp_attn`` (whole experts per device, all-to-all dispatch and combine).

Disaggregated serving (DistServe, Zhong et al. OSDI'24; Splitwise, Patel et al. ISCA'24) puts
``prefill_replicas`` replicas on prompts and the rest on decoding, the KV cache of each prompt
sent from one to the other.

Lengths are the workload's means (the engines' benchmarks report them so); a distribution's
spread is not modelled beyond that.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import PartitaError

KV_DTYPES = {"bf16": 2, "fp8": 1, "fp32": 4}  # bytes per cached element
#: weight and activation dtypes: bf16 (every engine's default); fp32 for CPU measurements; fp8
#: (fp8 weights and GEMMs at the device's fp8 rate - TensorRT-LLM ``--enable_fp8``, vLLM
#: ``--quantization fp8``): the published-benchmark check's FP8 rows, and the search where the
#: device has fp8 GEMMs
DTYPES = {"bf16": 2, "fp32": 4, "fp8": 1}


@dataclass(frozen=True)
class Workload:
    """Mean prompt and output lengths (tokens), the arrival rate (requests/s, Poisson) and the
    latency targets (None: no target)."""

    prompt_len: int
    output_len: int
    rate: float
    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("prompt_len", "output_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 22:
                raise PartitaError(f"--{name.replace('_', '-')} must be a whole number from 1 to 4,194,304, "
                                   f"got {value!r}")
        if not 0 < self.rate < 1e9:
            raise PartitaError(f"--rate must be a positive number of requests per second, got {self.rate!r}")
        for name in ("ttft_ms", "tpot_ms"):
            value = getattr(self, name)
            if value is not None and not 0 < value < 1e9:
                raise PartitaError(f"--{name.replace('_', '-')} must be a positive number of milliseconds, "
                                   f"got {value!r}")

    @property
    def max_len(self) -> int:
        """Tokens one sequence holds in the KV cache at its end (prompt + output)."""
        return self.prompt_len + self.output_len

    @property
    def mean_context(self) -> float:
        """Mean number of cached tokens a decode step attends over: the prompt plus half the
        output (the context grows linearly from ``P`` to ``P + O`` over the decode)."""
        return self.prompt_len + self.output_len / 2


@dataclass(frozen=True)
class Layout:
    """One serving layout: the replica's parallel degrees, how many replicas, the KV-cache dtype
    and how many of the replicas only prefill (0: prefill and decode together)."""

    tp: int
    pp: int
    replicas: int
    kv_dtype: str = "bf16"
    ep: int = 1
    dp_attn: int = 1
    prefill_replicas: int = 0
    dtype: str = "bf16"  # weights and activations

    @property
    def weight_bytes(self) -> int:
        return DTYPES[self.dtype]

    @property
    def replica_devices(self) -> int:
        return self.tp * self.pp * self.dp_attn

    @property
    def devices(self) -> int:
        return self.replica_devices * self.replicas

    @property
    def decode_replicas(self) -> int:
        return self.replicas - self.prefill_replicas

    @property
    def disaggregated(self) -> bool:
        return self.prefill_replicas > 0

    @property
    def kv_bytes(self) -> int:
        return KV_DTYPES[self.kv_dtype]

    def describe(self) -> str:
        parts = [f"tp={self.tp}", f"pp={self.pp}"]
        if self.dp_attn > 1:
            parts.append(f"dp_attn={self.dp_attn}")
        if self.ep > 1:
            parts.append(f"ep={self.ep}")
        parts.append(f"x{self.replicas}")
        parts.append(f"kv {self.kv_dtype}")
        if self.dtype != "bf16":
            parts.append(f"weights {self.dtype}")
        if self.disaggregated:
            parts.append(f"P/D {self.prefill_replicas}:{self.decode_replicas}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
