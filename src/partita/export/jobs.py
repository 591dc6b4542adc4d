"""What every cluster launch artefact (the Slurm script, the Kubernetes manifests) shares: the
kind of accelerator a device is, the ``partita train`` command one node runs, and the
environment the device's collective library reads.

The artefacts run Partita itself (``partita train``, which starts torchrun on each node with a
c10d rendezvous): the plan travels inside the artefact as its JSON text (``--plan '{...}'``,
which :meth:`partita.plan.Plan.parse` reads), so the artefact alone is the job.

Environment sources:

- NCCL: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html (``NCCL_DEBUG``,
  ``NCCL_SOCKET_IFNAME``, ``NCCL_IB_HCA``); PyTorch's ``TORCH_NCCL_ASYNC_ERROR_HANDLING``:
  https://pytorch.org/docs/stable/torch_nccl_environment_variables.html
- Ascend, CANN's environment variable reference
  (https://www.hiascend.com/document/detail/en/canncommercial/850/maintenref/envvar/envref_07_0078.html
  and its neighbours): ``ASCEND_RT_VISIBLE_DEVICES`` (the NPUs a process may see, as
  ``CUDA_VISIBLE_DEVICES``); ``HCCL_CONNECT_TIMEOUT`` (seconds HCCL waits for its peers while
  it builds the links of a communicator, default 120 - "wait socket establish timeout ...
  timeout[120 s]", EI0006 in the HCCL guide,
  https://www.hiascend.com/document/detail/zh/CANNCommunityEdition/850alpha002/hccl/hcclug/hcclug_000050.html;
  raised here because the nodes of a job start minutes apart); ``HCCL_EXEC_TIMEOUT``
  (seconds a collective waits for the other devices, default 1836 on Atlas A2/A3);
  ``HCCL_SOCKET_IFNAME`` / ``HCCL_IF_IP`` (the host NIC of HCCL's set-up traffic: a
  site's value, given with ``env``). MindSpeed-LLM's launch scripts
  (``examples/mcore/*/pretrain_*.sh``, https://gitee.com/ascend/MindSpeed-LLM) set
  ``CUDA_DEVICE_MAX_CONNECTIONS=1`` and source ``/usr/local/Ascend/ascend-toolkit/set_env.sh``
  (the CANN install's environment).
"""
from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import PartitaError

if TYPE_CHECKING:
    from ..plan import Plan
    from ..spec.hardware import Device

#: ``partita train`` flags the artefact writes itself (the launch of one node); train
#: arguments passed in must not repeat them
LAUNCH_FLAGS = ("--plan", "--nnodes", "--nproc", "--node-rank", "--rdzv-endpoint", "--rdzv-id", "--device")

#: the CANN install's environment script, sourced where it exists (MindSpeed-LLM's scripts do)
ASCEND_SET_ENV = "/usr/local/Ascend/ascend-toolkit/set_env.sh"

#: default rendezvous port (torchrun's own default, ``--master-port`` 29500)
RDZV_PORT = 29500


@dataclass(frozen=True)
class JobOptions:
    """What a user sets for a launch artefact (``partita export --to slurm|k8s-*`` flags),
    shared by the Slurm script and the Kubernetes manifests; None: the artefact's default.

    ``name``: the job's name (Slurm ``--job-name``, the Kubernetes object and rendezvous id);
    ``time`` / ``partition`` / ``account``: Slurm's; ``image``: the container image (Pyxis on
    Slurm, the pods' image on Kubernetes); ``pvc``: the Kubernetes claim of the shared storage;
    ``train_args``: the ``partita train`` arguments other than the launch (default
    ``--model`` of the export); ``env``: extra environment variables."""

    name: str | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    image: str | None = None
    pvc: str | None = None
    train_args: tuple[str, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict)


def accelerator_of(device: Device) -> str:
    """``"npu"`` (Ascend: torch_npu, hccl), ``"cpu"`` (gloo) or ``"cuda"`` (NVIDIA and AMD
    GPUs: ROCm's torch is also ``cuda``), from the device file: an Ascend device's links are
    HCCS (910/910B) or UB (910C) inside the node."""
    name, link = device.name.lower(), device.intra_link.lower()
    if name == "cpu" or link.startswith("gloo"):
        return "cpu"
    if "ascend" in name or "hccs" in link or link.startswith("ub"):
        return "npu"
    return "cuda"


def device_env(accelerator: str, devices_per_node: int) -> dict[str, str]:
    """The environment a node's processes need for ``accelerator`` (sources: module docstring).
    Site-specific values (the NIC names) are left to ``--env`` / the options' ``env``."""
    if accelerator == "npu":
        return {
            "ASCEND_RT_VISIBLE_DEVICES": ",".join(str(i) for i in range(devices_per_node)),
            "HCCL_CONNECT_TIMEOUT": "1200",  # multi-node communicator set-up can exceed the 120 s default
            "HCCL_EXEC_TIMEOUT": "1836",
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        }
    if accelerator == "cuda":
        return {"NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    return {}


def check_train_args(train_args: Sequence[str]) -> list[str]:
    """``train_args`` as a list, refusing the launch flags the artefact writes itself (a
    second ``--plan`` would silently win or lose depending on the order)."""
    args = [str(a) for a in train_args]
    for a in args:
        flag = a.split("=", 1)[0]
        if flag in LAUNCH_FLAGS:
            raise PartitaError(f"{flag} is written by the launch artefact itself (from the plan and the cluster); "
                               f"leave it out of the partita train arguments")
    return args


def job_train_args(ctx, train_args: Sequence[str] | None = None) -> tuple[list[str], list[str]]:
    """The ``partita train`` arguments of an exported job, and the warnings: ``train_args``, else
    the context's ``job.train_args``, with ``--model`` first when they lack one (the export's
    model, else ``tiny-llama`` and a warning)."""
    if train_args is None and ctx.job is not None:
        train_args = ctx.job.train_args
    args = check_train_args(train_args or ())
    if any(a == "--model" or a.startswith("--model=") for a in args):
        return args, []
    if ctx.model is not None:
        return ["--model", ctx.model.name, *args], []
    return ["--model", "tiny-llama", *args], ["no --model given: the job trains tiny-llama; give --model for yours"]


def plan_text(plan: Plan) -> str:
    """The plan as one line of JSON (``--plan`` reads it back with :meth:`Plan.parse`)."""
    return json.dumps(plan.to_dict(), separators=(",", ":"), sort_keys=False)


def train_argv(plan: Plan, *, nodes: int, devices_per_node: int, accelerator: str, rdzv_endpoint: str,
               rdzv_id: str, train_args: Sequence[str] = (), launcher: Sequence[str] = ("partita",),
               plan_arg: str | None = None) -> list[str]:
    """The ``partita train`` command one node runs: ``launcher train <train_args> --plan ...
    --nnodes N --nproc P --device D --rdzv-endpoint E --rdzv-id I`` (one torchrun per node;
    the c10d rendezvous numbers the nodes, so no ``--node-rank``). ``plan_arg`` replaces the
    plan's JSON text (a shell reference such as ``"$PLAN"``)."""
    args = check_train_args(train_args)
    return [*launcher, "train", *args, "--plan", plan_arg if plan_arg is not None else plan_text(plan),
            "--nnodes", str(nodes), "--nproc", str(devices_per_node), "--device", accelerator,
            "--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id]


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    """Extra environment: names a shell and Kubernetes accept (``[A-Za-z_][A-Za-z0-9_]*``), values
    on one line."""
    import re
    out = {}
    for name, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)):
            raise PartitaError(f"environment variable name {name!r} is not NAME (letters, digits, _)")
        if any(ord(c) < 32 for c in str(value)):
            raise PartitaError(f"environment variable {name}: its value holds a newline or control character")
        out[str(name)] = str(value)
    return out


class Raw(str):
    """A word written into a shell script as it is (``"$PLAN"``, ``--container-workdir="$PWD"``:
    the script's own variables), not quoted."""


def shell_join(argv: Sequence[str]) -> str:
    """``argv`` quoted for bash, :class:`Raw` words kept as written."""
    return " ".join(a if isinstance(a, Raw) else shlex.quote(a) for a in argv)
