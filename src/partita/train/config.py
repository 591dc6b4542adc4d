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
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PartitaError

TRAIN_FILE = "train.json"
PLAN_FILE = "plan.json"

BOTH = ("train", "profile")


def option(default: Any = dataclasses.MISSING, help: str = "", *, choices: tuple | None = None,
           commands: tuple[str, ...] = BOTH, flag: str | None = None,
           bounds: tuple[float, float] | None = None, plan_field: str | None = None) -> Any:
    """A config field with the metadata its command-line flag is generated from: ``help``,
    ``choices``, the ``commands`` that offer it (empty: not a flag), the ``flag`` name
    (default ``--`` + the field name with dashes) and the ``bounds`` (low, high) a number
    must lie in (checked at parse time, the range named in the error). No default: the
    flag is required. A ``plan_field`` option sets that :class:`~partita.plan.Plan` field:
    its allowed values, bounds and check are the plan's (``partita.plan.field_problem``),
    not typed again here."""
    if plan_field is not None:
        from ..plan import field_meta
        choices, bounds = field_meta(plan_field)["choices"], field_meta(plan_field)["bounds"]
    meta = {"help": help, "choices": choices, "commands": commands, "flag": flag, "bounds": bounds,
            "plan_field": plan_field}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class TrainConfig:
    """Every option a training process reads (written to ``train.json``)."""

    model: str = option(help="tiny-llama, tiny-moe, a preset, a config.json, or a Hugging Face directory "
                             "(config.json + *.safetensors: its weights are loaded, each rank reading only its shards)")
    steps: int = option(10, "optimizer steps to run", bounds=(0, 10 ** 9))
    seed: int = option(0, "seed of the model's initialisation and the data order", bounds=(0, 2 ** 31 - 1))
    lr: float = option(3e-4, "peak learning rate", bounds=(0.0, 10.0))
    lr_schedule: str = option("constant", "cosine: linear warm-up then cosine decay to --min-lr",
                              choices=("constant", "cosine"))
    warmup_steps: int = option(0, "linear warm-up steps of the cosine schedule", bounds=(0, 10 ** 9))
    min_lr: float = option(0.0, "learning rate the cosine schedule decays to", bounds=(0.0, 10.0))
    max_grad_norm: float = option(1.0, "gradient clipping over all shards (0: off)", bounds=(0.0, 1e6))
    skip_nonfinite: int = option(0, "steps with a non-finite loss or gradient norm to skip (no update) and report "
                                    "before the run stops (0: stop at the first)", bounds=(0, 10 ** 9))
    optimizer: str = option("adamw", "adamw or sgd", choices=("adamw", "sgd"))
    momentum: float = option(0.0, "SGD momentum", bounds=(0.0, 1.0))
    weight_decay: float | None = option(None, "weight decay: AdamW's decoupled (default 0.01), SGD's L2 (default 0)",
                                        bounds=(0.0, 10.0))
    beta1: float = option(0.9, "AdamW beta1", bounds=(0.0, 0.999999))
    beta2: float = option(0.999, "AdamW beta2", bounds=(0.0, 0.999999))
    eps: float = option(1e-8, "AdamW epsilon", bounds=(1e-30, 1.0))
    compile: bool = option(False, "torch.compile each block (a one-line note and eager mode where it cannot)")
    data: str | None = option(None, "text file, directory of .txt/.jsonl, or tokens .npy (default: synthetic)")
    tokenizer: str | None = option(None, "HF tokenizer.json (default: the --model directory's tokenizer.json, "
                                         "else a byte-level BPE trained on --data)")
    eval_data: str | None = option(None, "held-out data (same formats as --data): eval loss and perplexity")
    eval_every: int = option(0, "evaluate every N steps (0: only after the last step)", bounds=(0, 10 ** 9))
    eval_batches: int = option(4, "global batches per evaluation", bounds=(1, 10 ** 6))
    checkpoint_dir: str | None = option(None, "where checkpoints go (a final one is written at the end)")
    checkpoint_every: int | None = option(None, "save every N steps (a resumed run keeps the cadence it was saved with "
                                      "unless given again)", bounds=(0, 10 ** 9))
    keep: int = option(2, "complete checkpoints to keep", bounds=(0, 10 ** 6))
    resume: bool = option(False, "continue from the newest complete checkpoint (needs --checkpoint-dir)")
    save_hf: str | None = option(None, "write the trained weights here as a Hugging Face directory "
                                       "(config.json + safetensors; HF models only)")
    save_hf_shard_mb: float = option(5000.0, "largest safetensors file --save-hf writes, in MB; more weights are "
                                             "sharded with an index", bounds=(0.001, 1e9))
    adapter: str | None = option(None, "with --finetune lora: start from this PEFT adapter directory "
                                       "(adapter_config.json + adapter_model.safetensors)")
    merge: bool = option(False, "with --finetune lora --save-hf: write the merged weights (W + alpha/r B A) as a "
                                "Hugging Face model instead of the PEFT adapter")
    tensorboard: str | None = option(None, "write TensorBoard event files (loss, lr, grad norm, eval) here")
    device: str | None = option(None, "cpu, cuda or npu (default: what the machine has)")
    timeout_s: int = option(300, "collective timeout per process group; a run with no step for twice this long "
                                 "is stopped", bounds=(1, 86400 * 7))
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
            if (getattr(self, name) or 0) < 0:
                raise PartitaError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.timeout_s <= 0:
            raise PartitaError(f"--timeout-s must be > 0, got {self.timeout_s}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise PartitaError(f"--lr must be a finite number > 0, got {self.lr}")
        if self.resume and not self.checkpoint_dir:
            raise PartitaError("--resume needs --checkpoint-dir DIR (the directory the checkpoints were written to)")
        if self.lr_schedule == "cosine" and self.min_lr > self.lr:
            raise PartitaError(f"--min-lr {self.min_lr} is above --lr {self.lr}; the cosine schedule decays from "
                               "--lr down to --min-lr")

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
    nproc: int = option(1, "processes per node", bounds=(1, 4096))
    nnodes: int = option(1, "nodes", bounds=(1, 100000))
    node_rank: int = option(0, "this node's rank (multi-node)", bounds=(0, 100000))
    rdzv_endpoint: str = option("", "host:port of the rendezvous (multi-node)")
    rdzv_id: str = option("partita", "rendezvous id (multi-node)")
    max_restarts: int = option(0, "torchrun restarts of a failed job (elastic; resumes from the newest checkpoint)",
                               bounds=(0, 1000))
    hardware: str | None = option(None, "print the planner's prediction and MFU against this device's peak")
    no_progress: bool = option(False, "plain lines instead of a progress bar")
    run_dir: str | None = option(None, "where the plan, metrics and logs go (default: runs/<timestamp> here)")
    global_batch: int | None = option(None, "global batch in sequences (the plan string's gbs=)", plan_field="gbs")
    seq_len: int | None = option(None, "sequence length in tokens (the plan string's seq_len=)", plan_field="seq_len")
    mbs: int | None = option(None, "micro-batch size in sequences (the plan string's mbs=)", plan_field="mbs")
    # gradient communication knobs (issue 17): override the plan's fields of the same name
    grad_dtype: str | None = option(None, "data-parallel gradient reduction dtype (overrides the plan's grad_dtype)",
                                    plan_field="grad_dtype")
    grad_compression: str | None = option(None, "gradient compression (overrides the plan's; powersgd needs zero 0 "
                                                "and plain DDP)", plan_field="grad_compression")
    powersgd_rank: int | None = option(None, "PowerSGD rank (overrides the plan's powersgd_rank)",
                                       plan_field="powersgd_rank")
    # fine-tuning (issue 36): override the plan's fields of the same name
    finetune: str | None = option(None, "none, full (SFT of every weight) or lora (PEFT LoRA adapters, base frozen)",
                                  plan_field="finetune")
    lora_rank: int | None = option(None, "LoRA rank r (with --finetune lora; default 16)", plan_field="lora_rank")
    lora_alpha: float | None = option(None, "LoRA alpha (scale alpha/r; default 32)", plan_field="lora_alpha")
    lora_targets: str | None = option(None, "linears given an adapter: attention, qkv, mlp or all-linear (default)",
                                      plan_field="lora_targets")
    lora_dropout: float | None = option(None, "LoRA dropout on each adapter's input (default 0: exact against one "
                                               "process; tp=1 only)", plan_field="lora_dropout")
    # a scheduler in front of torchrun (issue 34): train/slurm.py
    scheduler: str = option("local", "local (torchrun here) or slurm (sbatch: one torchrun per node, c10d rendezvous "
                                     "on the allocation's first node)", choices=("local", "slurm"), commands=("train",))
    detach: bool = option(False, "with --scheduler slurm: print the job id and return", commands=("train",))
    dry_run: bool = option(False, "with --scheduler slurm: print the sbatch script, submit nothing", commands=("train",))
    partition: str | None = option(None, "Slurm partition (#SBATCH --partition)", commands=("train",))
    account: str | None = option(None, "Slurm account (#SBATCH --account)", commands=("train",))
    time_limit: str | None = option(None, "Slurm time limit, e.g. 04:00:00 (#SBATCH --time)", commands=("train",),
                                    flag="--time")
    container_image: str | None = option(None, "container image for Pyxis (srun --container-image)",
                                         commands=("train",))

    def __post_init__(self) -> None:
        if self.node_rank >= self.nnodes:
            raise PartitaError(f"--node-rank {self.node_rank} is outside --nnodes {self.nnodes} "
                               f"(node ranks are 0..{self.nnodes - 1})")
        if self.nnodes > 1 and not self.rdzv_endpoint and self.scheduler == "local":
            raise PartitaError(f"--nnodes {self.nnodes} needs --rdzv-endpoint HOST:PORT (the rendezvous every node "
                               "joins), or --scheduler slurm")

    @property
    def world(self) -> int:
        return self.nproc * self.nnodes

    @property
    def job_key(self) -> str | None:
        """What makes the launchers of one multi-node job one job (the checkpoint-dir lock is
        shared between them): the rendezvous id and endpoint; None on one node."""
        return f"{self.rdzv_id}@{self.rdzv_endpoint}" if self.nnodes > 1 else None
