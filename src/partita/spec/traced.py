"""A model measured by tracing it (:func:`partita.trace`), as the planner sees it.

A :class:`TracedSpec` is what the cost model needs of a model that no config describes
(vision transformers, diffusion UNets and DiTs, multimodal models): parameters, FLOPs
and saved activations, per *block* - the repeated unit that FSDP wraps, activation
checkpointing recomputes and pipeline stages cut along - and for the rest of the model
(stem, embeddings, heads). The figures are measured by running forward + backward on the
meta device under ``torch.utils.flop_counter.FlopCounterMode`` and
``torch.autograd.graph.saved_tensors_hooks`` (see :mod:`partita.tracing.tracer`), for the
traced example batch of ``batch`` samples; the cost model scales them linearly with the
micro-batch (the per-sample cost of a fixed-shape model does not depend on the batch).

This module is pure data (planning never imports torch): it loads and writes the JSON
that ``partita trace`` / :meth:`TracedSpec.to_json` produce.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import PartitaError
from ..inputs import read_json

TRACED_FORMAT = "partita.traced/1"


@dataclass(frozen=True)
class TracedBlock:
    """One repeated block, measured for the traced batch.

    ``saved_bytes``: storages autograd saves inside the block for backward (unique, the
    first block that saves a storage owns it); ``recompute_bytes``: what the block keeps
    when it is checkpointed - its tensor inputs (non-reentrant activation checkpointing
    keeps the inputs and recomputes the rest in backward); ``output_bytes``: its tensor
    outputs (what a pipeline stage boundary after it sends).
    ``tp_*``: the part a tensor-parallel plan splits (linear layers it names, the
    attention between them, the tensors they save) and the all-reduce volume per forward
    (outputs of its row-wise layers)."""

    name: str
    params: int
    forward_flops: float
    backward_flops: float
    saved_bytes: float
    recompute_bytes: float
    output_bytes: float
    attention_forward_flops: float = 0.0  # the fused attention's share of forward_flops
    matmuls: int = 0  # weight matrices (>= 2-D parameters): GEMMs per forward, for the GEMM-size efficiency
    tp_params: int = 0
    tp_forward_flops: float = 0.0
    tp_saved_bytes: float = 0.0
    tp_allreduce_bytes: float = 0.0


@dataclass(frozen=True)
class TracedSpec:
    """A traced model: totals, blocks and what lies outside them (``other_*``)."""

    name: str
    batch: int
    dtype: str  # activation dtype of the trace: fp32 | bf16 | fp16
    inputs: tuple[tuple[int, ...], ...]
    total_params: int
    forward_flops: float
    backward_flops: float
    saved_bytes: float
    block_class: str = ""
    block_container: str = ""
    blocks: tuple[TracedBlock, ...] = ()
    pipeline: bool = False  # the blocks are one sequence in one container that forward runs in order
    tp_plan: tuple[tuple[str, str], ...] = ()  # (module pattern, "colwise" | "rowwise")
    tp_other_params: int = 0  # parameters outside the blocks that the TP plan splits (a stem's or head's layers)
    modules: tuple[tuple[str, int, float], ...] = ()  # (path, params, forward FLOPs) of the top modules
    #: FLOPs of the modules outside the blocks that forward runs before the first block (the stem:
    #: patch/time embedding); the rest of ``other_*`` is the head's (what runs after the blocks,
    #: and calls of a block's submodule from outside it). None: a spec written before they were traced
    stem_forward_flops: float | None = None
    stem_backward_flops: float | None = None
    #: parameters outside the blocks a pipeline stage holds (:mod:`partita.runtime.traced_pipeline`):
    #: the stem's (with the root's and the blocks' ancestors' own) on every stage, the head's on the
    #: last; ``stem_tp_params`` of the stem's are split by the TP plan (the rest of ``tp_other_params``
    #: is the head's); ``shared_block_params``: (block index, parameters, 0 stem | 1 head) of a
    #: block's submodules called from outside it (diffusers' DiT head calls block 0's ``norm1.emb``),
    #: which those stages hold too. None: a spec written before they were traced
    stem_params: int | None = None
    head_params: int | None = None
    stem_tp_params: int = 0
    shared_block_params: tuple[tuple[int, int, int], ...] = ()
    #: modules forward calls between two blocks (a norm between block groups): (path, parameters,
    #: forward and backward FLOPs per call, blocks entered before each call). The traced pipeline
    #: runs each call on the stage of the block before it (that stage sends the next block's input)
    #: and, forward only, on every later stage; their FLOPs and parameters are in ``other_*``
    between: tuple[tuple[str, int, float, float, tuple[int, ...]], ...] = ()
    #: why the blocks cannot be cut into pipeline stages ("" when ``pipeline``): not one run of
    #: identical blocks in one container, blocks called out of order, a skip connection
    pipeline_blocker: str = ""
    #: activation bytes saved outside the blocks, where a pipeline stage keeps them (pipeline-able
    #: traces only): the stem's (first stage), the head's (last stage), and (blocks entered
    #: before, bytes) of what forward saves between two blocks (the stage of the block before).
    #: None: not placed - all of ``other_saved_bytes`` on the first stage
    stem_saved_bytes: float | None = None
    head_saved_bytes: float | None = None
    between_saved: tuple[tuple[int, float], ...] = ()
    source: str = ""
    kind: str = field(default="traced", init=False)

    # ------------------------------------------------------------------ derived
    @property
    def layers(self) -> int:
        """Blocks, under the name the plan's pipeline split uses."""
        return len(self.blocks)

    @property
    def block_params(self) -> int:
        return sum(b.params for b in self.blocks)

    @property
    def other_params(self) -> int:
        return self.total_params - self.block_params

    @property
    def other_forward_flops(self) -> float:
        return max(0.0, self.forward_flops - sum(b.forward_flops for b in self.blocks))

    @property
    def other_backward_flops(self) -> float:
        return max(0.0, self.backward_flops - sum(b.backward_flops for b in self.blocks))

    @property
    def other_saved_bytes(self) -> float:
        return max(0.0, self.saved_bytes - sum(b.saved_bytes for b in self.blocks))

    @property
    def tp_capable(self) -> bool:
        return bool(self.tp_plan) and any(b.tp_params for b in self.blocks)

    def train_flops_per_sample(self) -> float:
        """Forward + backward FLOPs of one sample (no recompute)."""
        return (self.forward_flops + self.backward_flops) / self.batch

    def model_flops_per_token(self, seq_len: int = 1, causal: bool = True) -> float:
        """Training FLOPs per *sample* (the Estimate type's MFU numerator asks per token;
        a traced plan's "token" is one sample, seq_len 1)."""
        return self.train_flops_per_sample()

    @property
    def cache_key(self) -> int:
        return hash((self.name, self.batch, self.total_params, self.forward_flops, self.layers))

    # ------------------------------------------------------------------ io
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("kind")
        return {"format": TRACED_FORMAT, **d}

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "traced spec") -> "TracedSpec":
        if data.get("format") != TRACED_FORMAT:
            raise PartitaError(f"{where}: not a traced spec (format {data.get('format')!r}, expected {TRACED_FORMAT!r}); "
                               "write one with partita.trace(model, inputs).to_json(path)")
        data = {k: v for k, v in data.items() if k != "format"}
        known = {f.name for f in fields(cls) if f.init}
        unknown = set(data) - known
        if unknown:
            raise PartitaError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
        try:
            data["blocks"] = tuple(TracedBlock(**b) for b in data.get("blocks", ()))
            data["inputs"] = tuple(tuple(s) for s in data.get("inputs", ()))
            data["tp_plan"] = tuple(tuple(p) for p in data.get("tp_plan", ()))
            data["modules"] = tuple(tuple(m) for m in data.get("modules", ()))
            data["shared_block_params"] = tuple(tuple(m) for m in data.get("shared_block_params", ()))
            data["between_saved"] = tuple((int(m[0]), float(m[1])) for m in data.get("between_saved", ()))
            data["between"] = tuple((str(m[0]), int(m[1]), float(m[2]), float(m[3]), tuple(int(k) for k in m[4]))
                                    for m in data.get("between", ()))
            spec = cls(**data)
        except (TypeError, ValueError, IndexError) as e:
            raise PartitaError(f"{where}: {e}") from None
        if spec.batch < 1 or spec.total_params < 1:
            raise PartitaError(f"{where}: batch and total_params must be at least 1, got {spec.batch}, {spec.total_params}")
        return spec

    @classmethod
    def load(cls, path: str | Path) -> "TracedSpec":
        data = read_json(path, "traced spec")
        if not isinstance(data, dict):
            raise PartitaError(f"traced spec {path}: expected a JSON object")
        return cls.from_dict(data, where=f"traced spec {path}")


def is_traced_file(path: str) -> bool:
    """Whether ``path`` is a JSON file holding a traced spec (cheap check on the format key)."""
    try:
        if not path.endswith(".json") or not Path(path).is_file():
            return False
        data = read_json(path, "traced spec")
    except (OSError, ValueError, PartitaError):  # a name too long to look up; a file read_json refuses
        return False
    return isinstance(data, dict) and data.get("format") == TRACED_FORMAT
