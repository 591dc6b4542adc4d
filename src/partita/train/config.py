"""What a training run is asked to do, as frozen dataclasses: one place per option.

:class:`TrainConfig` holds every option a training process reads; the launcher writes it
to ``<run dir>/train.json`` beside ``<run dir>/plan.json`` and each worker reads both
(``python -m partita.train.worker RUN_DIR``). :class:`LaunchConfig` holds how the
processes are started (torchrun's process counts and rendezvous, the plan as the user
wrote it); the workers never see it.

The command-line flags of ``partita train`` and ``partita profile`` are generated from
these fields (``partita.cli.common.add_config_arguments``), so adding an option is one
field here::

    weight_decay: float = option(0.0, "AdamW weight decay")

``option`` records the help string and, where needed, the choices, the commands that
offer the flag (``commands=()`` for a value the launcher derives itself, e.g. the
prediction figures) and a flag spelling other than ``--field-name``. The worker then
reads ``config.weight_decay``; nothing else has to change.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PartitaError

TRAIN_FILE = "train.json"
PLAN_FILE = "plan.json"

BOTH = ("train", "profile")


def option(default: Any = dataclasses.MISSING, help: str = "", *, choices: tuple | None = None,
           commands: tuple[str, ...] = BOTH, flag: str | None = None) -> Any:
    """A config field with the metadata its command-line flag is generated from: ``help``,
    ``choices``, the ``commands`` that offer it (empty: not a flag) and the ``flag`` name
    (default ``--`` + the field name with dashes). No default: the flag is required."""
    meta = {"help": help, "choices": choices, "commands": commands, "flag": flag}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class TrainConfig:
    """Every option a training process reads (written to ``train.json``)."""

    model: str = option(help="tiny-llama, tiny-moe, a preset or a config.json")
    steps: int = option(10, "optimizer steps to run")
    seed: int = option(0, "seed of the model's initialisation and the data order")
    lr: float = option(3e-4, "peak learning rate")
    lr_schedule: str = option("constant", "cosine: linear warm-up then cosine decay to --min-lr",
                              choices=("constant", "cosine"))
    warmup_steps: int = option(0, "linear warm-up steps of the cosine schedule")
    min_lr: float = option(0.0, "learning rate the cosine schedule decays to")
    max_grad_norm: float = option(1.0, "gradient clipping over all shards (0: off)")
    skip_nonfinite: int = option(0, "steps with a non-finite loss or gradient norm to skip (no update) and report "
                                    "before the run stops (0: stop at the first)")
    optimizer: str = option("adamw", "adamw or sgd", choices=("adamw", "sgd"))
    momentum: float = option(0.0, "SGD momentum")
    data: str | None = option(None, "text file, directory of .txt/.jsonl, or tokens .npy (default: synthetic)")
    tokenizer: str | None = option(None, "HF tokenizer.json (default: a byte-level BPE trained on --data)")
    checkpoint_dir: str | None = option(None, "where checkpoints go")
    checkpoint_every: int = option(0, "save every N steps")
    keep: int = option(2, "complete checkpoints to keep")
    resume: bool = option(False, "continue from the newest complete checkpoint")
    device: str | None = option(None, "cpu, cuda or npu (default: what the machine has)")
    timeout_s: int = option(300, "collective timeout per process group; a run with no step for twice this long "
                                 "is stopped")
    json: bool = option(False, "one JSON object per step")
    profile_dir: str | None = option(None, "where the per-rank traces go (default: <run dir>/profile)",
                                     commands=("profile",))
    # derived by the launcher, not flags
    progress: bool = option(False, "rank 0 draws a progress bar (not --json, not --no-progress)", commands=())
    predicted_step_s: float | None = option(None, "the planner's step time on --hardware", commands=())
    model_flops_per_token: float | None = option(None, "model FLOPs per token, for MFU", commands=())
    peak_flops: float | None = option(None, "peak FLOP/s of one device on --hardware, for MFU", commands=())

    def __post_init__(self) -> None:
        """Values no run can mean: refused here, so the flags, ``train.json`` and library
        callers all get the same one line."""
        if not self.max_grad_norm >= 0:  # also NaN
            raise PartitaError(f"--max-grad-norm must be >= 0 (0 turns clipping off), got {self.max_grad_norm}")
        for name in ("steps", "skip_nonfinite", "checkpoint_every", "warmup_steps"):
            if getattr(self, name) < 0:
                raise PartitaError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.timeout_s <= 0:
            raise PartitaError(f"--timeout-s must be > 0, got {self.timeout_s}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        """Strict: a key that is not a field is a mistake (a stale or hand-edited file)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise PartitaError(f"{TRAIN_FILE}: unknown option(s) {', '.join(unknown)}")
        return cls(**data)

    def save(self, run_dir: str | Path) -> Path:
        path = Path(run_dir) / TRAIN_FILE
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, run_dir: str | Path) -> "TrainConfig":
        path = Path(run_dir) / TRAIN_FILE
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise PartitaError(f"cannot read the training config {path}: {e}") from None
        return cls.from_dict(data)


@dataclass(frozen=True)
class LaunchConfig:
    """How ``partita train`` starts the training processes (the launcher's own options)."""

    plan: str = option("", '"dp=2,tp=2,..." (dp fills the world) or plan.json')
    nproc: int = option(1, "processes per node")
    nnodes: int = option(1, "nodes")
    node_rank: int = option(0, "this node's rank (multi-node)")
    rdzv_endpoint: str = option("", "host:port of the rendezvous (multi-node)")
    rdzv_id: str = option("partita", "rendezvous id (multi-node)")
    max_restarts: int = option(0, "torchrun restarts of a failed job (elastic; resumes from the newest checkpoint)")
    hardware: str | None = option(None, "print the planner's prediction and MFU against this device's peak")
    no_progress: bool = option(False, "plain lines instead of a progress bar")
    run_dir: str | None = option(None, "where the plan and logs go (default: a temp dir)")

    @property
    def world(self) -> int:
        return self.nproc * self.nnodes
