"""Resolve a training run before any process starts: the plan, the model, the checks.

Everything that can be refused is refused here, before a process group exists, so a bad
plan costs one line, not a hung job: the plan (the user's, the search's for ``--plan auto``,
or the checkpoint's, re-planned for this world size), the model it runs
(:func:`partita.models.registry.resolve_model`: the one place a ``--model`` name is
resolved, so the model planned and checked here is the model the workers train), the
runtime's limits checked against that very model (built on the meta device), the data and
directories. :func:`prepare_run` then writes the run directory - ``plan.json`` (the
resolved plan) and ``train.json`` (the :class:`~partita.train.config.TrainConfig`) - and
builds torchrun's command; every worker is started with just that directory, by
:mod:`partita.train.supervise`. The command line around this is :mod:`partita.cli.train`.
"""
from __future__ import annotations

import dataclasses
import errno
import os
import socket
from pathlib import Path
from typing import Callable, NamedTuple

from ..errors import PartitaError
from ..models.registry import ModelEntry, resolve_model
from ..plan import Plan, check, flag_name, plan_fields_of
from .config import PLAN_FILE, LaunchConfig, TrainConfig


def train_defaults(device: str | None) -> dict:
    """Plan fields `partita train` fills when the plan string does not: a fixed global batch
    (so different plans see the same data) and fp32 on CPU (bf16 on accelerators)."""
    on_cpu = (device or "cpu") == "cpu" and not _has_accelerator()
    return {"gbs": 8, "seq_len": 64, "mbs": 1, "dtype": "fp32" if on_cpu else "bf16"}


def _has_accelerator() -> bool:
    try:
        from ..runtime.device import detect_device_type
        return detect_device_type() != "cpu"
    except Exception:  # torch missing: the worker will say so
        return False


class PreparedRun(NamedTuple):
    """A validated run, its directory written, ready to start."""
    plan: Plan
    run_dir: Path
    config: TrainConfig
    command: list[str]
    env: dict[str, str]


def resolve_plan(config: TrainConfig, launch: LaunchConfig, say: Callable[[str], None]) -> Plan:
    """The plan to run: the user's, the search's (``--plan auto``) or (with --resume and no
    --plan) the newest checkpoint's, re-planned for this world size; checked against the
    model the workers will train before any process starts."""
    world = launch.world
    plan_text = launch.plan
    from_checkpoint = False
    meta = _newest_meta(config.checkpoint_dir) if config.resume and config.checkpoint_dir else None
    if meta is not None and not plan_text:
        plan_text = _checkpoint_plan(config.checkpoint_dir, meta)
        from_checkpoint = True
    flags = batch_flags(launch)
    if plan_text and plan_text.strip().split(",", 1)[0].strip() == "auto":
        return check(knob_flags(_auto_plan(config, launch, plan_text, flags, say), launch, say))
    plan = Plan.parse(plan_text, world_size=world, defaults={**train_defaults(config.device), **flags})
    check_batch_flags(plan, flags, plan_text)
    plan = knob_flags(plan, launch, say)
    if meta is not None:
        from .worker import resume_problem
        problem = resume_problem(meta, config.model, plan.gbs)
        if problem:
            raise PartitaError(f"cannot resume from {config.checkpoint_dir}: {problem}")
    entry = resolve_model(config.model)
    spec = entry.spec()
    if from_checkpoint and plan.world_size != world:
        from .replan import describe_change, replan
        new = replan(plan, world, spec)
        say(f"partita: the checkpoint's plan ran on {plan.world_size} processes; re-planned for {world} keeping "
            f"global batch {plan.gbs}: {describe_change(plan, new)}")
        plan = new
    check(plan, spec, world)
    runtime_check(plan, model_to_check(entry))
    return plan


def model_to_check(entry: ModelEntry):
    """The model the workers will train, on the meta device (:meth:`ModelEntry.check_model`),
    for the runtime's checks and the search: never a stand-in, so a limit of its family
    (HF MoE models run no sequence parallel) is refused here, not inside a worker after torchrun started."""
    _need_torch()
    with _skip_meta_fills():
        return entry.check_model()


#: in-place calls that only write values (``torch.nn.init``'s initialisers and the tensor
#: methods they and HF's ``_init_weights`` use): on a meta tensor they store nothing
_VALUE_FILLS = frozenset({
    "normal_", "uniform_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_", "xavier_uniform_",
    "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_", "fill_", "zero_", "copy_",
    "clamp_", "mul_", "add_", "sub_", "div_", "erfinv_", "exponential_", "random_", "bernoulli_", "log_normal_",
    "masked_fill_", "index_fill_"})


def _skip_meta_fills():
    """A torch-function mode under which a value-filling call on a meta tensor returns it
    unchanged instead of running its meta kernel. Why: those kernels are Python
    decompositions (``torch._refs``) whose first call imports ``torch._dynamo``, about 1 CPU-s
    of every launch (measured: the launcher's CPU time for tiny-llama on 4 processes, 5.1-5.3 s
    without, 4.1-4.2 s with) for writes that store nothing; the workers import it anyway (their
    optimizer does). Real tensors (the buffers) and every other call, metadata changes
    (``requires_grad_``) included, run as usual, so the model checked is the same."""
    import torch

    class SkipMetaFills(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            target = args[0] if args else kwargs.get("tensor", kwargs.get("self"))
            if getattr(func, "__name__", "") in _VALUE_FILLS and isinstance(target, torch.Tensor) and target.is_meta:
                return target
            return func(*args, **kwargs)
    return SkipMetaFills()


def _need_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise PartitaError("partita train needs PyTorch: pip install 'partita[runtime]'") from None


def runtime_check(plan: Plan, model) -> None:
    """:func:`partita.runtime.parallelize.runtime_check`: this runtime's limits, one line."""
    from ..runtime.parallelize import runtime_check as check_runtime
    check_runtime(plan, model)


def _auto_plan(config: TrainConfig, launch: LaunchConfig, text: str, flags: dict,
               say: Callable[[str], None]) -> Plan:
    """``--plan "auto[,gbs=8,mbs=1,...]"``: the search's best plan for this world size on this
    machine's hardware file (``calibrated.json`` here, else ``--hardware``, else the built-in
    device of the type), printed with the runner-up and why it lost
    (:func:`partita.runtime.auto.choose_plan`, the same call ``parallelize(model, "auto")`` makes),
    for the model the workers will train. Fields the search does not choose (gbs, seq_len) come
    from the text, the batch flags, then `partita train`'s defaults."""
    _need_torch()
    from ..runtime import auto
    from ..runtime.device import detect_device_type
    fixed = auto.parse_auto(text)
    for key, value in flags.items():
        if key in fixed and str(value) != fixed[key]:
            raise PartitaError(f"{flag_name(key)} {value} conflicts with {key}={fixed[key]} in "
                               f"--plan {text!r}; give it in one place")
    entry = resolve_model(config.model)
    model = model_to_check(entry)
    defaults = train_defaults(config.device)
    merged = {"gbs": defaults["gbs"], "seq_len": defaults["seq_len"], **flags, **fixed}
    merged.setdefault("dtype", defaults["dtype"])
    device_type = config.device or detect_device_type()
    auto_text = ",".join(["auto"] + [f"{k}={v}" for k, v in merged.items()])
    plan, report = auto.choose_plan(model, launch.world, auto_text, device_type=device_type, hardware=launch.hardware)
    plan = dataclasses.replace(plan, seq_len=int(merged["seq_len"]))
    for line in report.splitlines():
        say(f"partita: {line}")
    check(plan, entry.spec(), launch.world)
    runtime_check(plan, model)
    return plan


#: the plan fields `partita train` also takes as flags beside the plan string (--global-batch, --seq-len, --mbs)
BATCH_FIELDS = ("gbs", "seq_len", "mbs")


def batch_flags(launch: LaunchConfig) -> dict:
    """--global-batch / --seq-len / --mbs as plan fields (those given), named by the plan's own
    flag metadata (:func:`partita.plan.plan_fields_of`)."""
    return plan_fields_of(launch, BATCH_FIELDS)


#: the gradient-communication flags of partita train, which override the plan (issue 17)
KNOB_FLAGS = ("grad_dtype", "grad_compression", "powersgd_rank")
#: the fine-tuning flags (issue 36): set those plan fields (silently over the plan's defaults)
FINETUNE_FLAGS = ("finetune", "lora_rank", "lora_alpha", "lora_targets", "lora_dropout")


def knob_flags(plan: Plan, launch: LaunchConfig, say: Callable[[str], None]) -> Plan:
    """--grad-dtype / --grad-compression / --powersgd-rank set those plan fields, over the
    plan's own values (a note says what changed; the result is validated by the caller, so
    e.g. PowerSGD on a zero-1 plan is one line)."""
    plan = plan.with_(**plan_fields_of(launch, FINETUNE_FLAGS))
    given = plan_fields_of(launch, KNOB_FLAGS)
    changed = {k: v for k, v in given.items() if getattr(plan, k) != v}
    if not changed:
        return plan
    say("partita: " + ", ".join(f"{flag_name(k)} {v} overrides the plan's {k}={getattr(plan, k)}"
                                for k, v in changed.items()))
    return plan.with_(**changed)


def check_batch_flags(plan: Plan, flags: dict, plan_text: str) -> None:
    """A flag that the plan string (or file) sets to another value is a conflict, not a guess."""
    for key, value in flags.items():
        if getattr(plan, key) != value:
            raise PartitaError(f"{flag_name(key)} {value} conflicts with {key}={getattr(plan, key)} in --plan "
                               f"{plan_text!r}; give it in one place")


def prepare_run(config: TrainConfig, launch: LaunchConfig, say: Callable[[str], None]) -> PreparedRun:
    """Validate, fill the values the launcher derives (progress bar, prediction), write
    ``plan.json`` and ``train.json`` into the run directory and build torchrun's command."""
    from .preflight import check_inputs, default_run_dir, writable_dir
    from .supervise import torchrun_command
    plan = resolve_plan(config, launch, say)
    entry = resolve_model(config.model)
    check_inputs(config, entry.vocab())
    check_finetune(config, plan)
    if config.save_hf and not entry.saves_hf:
        raise PartitaError("--save-hf writes Hugging Face models: --model must be a directory with an HF config.json "
                           "(with or without *.safetensors) or hf-llama / hf-qwen2 / hf-mixtral")
    run_dir = writable_dir(launch.run_dir or config.checkpoint_dir or default_run_dir(), "--run-dir")
    derived: dict = {"progress": not config.json and not launch.no_progress}
    if launch.hardware:
        derived.update(prediction(entry.spec(), plan, launch.hardware, launch.world))
    config = dataclasses.replace(config, **derived)
    check_rendezvous(launch)
    plan.to_json(run_dir / PLAN_FILE)
    config.save(run_dir)
    from .ownership import launcher_env
    env = {**os.environ, **launcher_env()}
    env.setdefault("OMP_NUM_THREADS", "1")
    return PreparedRun(plan, run_dir, config, torchrun_command(launch, run_dir, config.timeout_s), env)


def check_rendezvous(launch: LaunchConfig) -> None:
    """On the rendezvous host (node 0), a port another process holds is one line now, not a
    rendezvous that waits for peers who will never come: bind the endpoint once, as
    torchrun's c10d store will (a bind that fails because the address is not this host's
    is left to the rendezvous and its join timeout)."""
    if not launch.rdzv_endpoint or launch.node_rank != 0:
        return
    host, _, port = launch.rdzv_endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise PartitaError(f"--rdzv-endpoint {launch.rdzv_endpoint!r} must be host:port")
    try:
        infos = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except OSError as e:
        raise PartitaError(f"rendezvous endpoint {launch.rdzv_endpoint}: cannot resolve {host}: {e}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store's own bind
        try:
            probe.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE and not _a_rendezvous_store(launch):
                raise PartitaError(f"rendezvous endpoint {launch.rdzv_endpoint} is in use by another process; "
                                   "pick a free port for --rdzv-endpoint") from None


def _a_rendezvous_store(launch: LaunchConfig) -> bool:
    """Multi-node: the port is held by a c10d store that answers - another node of this job
    started first on this host (one host running several nodes: a test, or two slurmd)."""
    if launch.nnodes <= 1:
        return False
    from .nodes import joined_nodes
    return joined_nodes(launch.rdzv_endpoint, launch.rdzv_id) is not None


def _newest_meta(checkpoint_dir: str) -> dict | None:
    """``meta.json`` of the newest checkpoint whose manifest and ``meta.json`` check out
    (a legacy one, without manifest, only when no checkpoint has one); None if there is none.
    Cheap: the data files are verified by the workers, who fall back from damage."""
    import json

    from ..runtime.checkpoint import scan_checkpoints
    found = scan_checkpoints(checkpoint_dir)
    usable = [f for f in found if f.kind == "verified"] or [f for f in found if f.kind == "legacy"]
    for f in reversed(usable):
        try:
            meta = json.loads((f.path / "meta.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and isinstance(meta.get("plan"), dict):
            return meta  # an empty or list meta.json is damage: the workers fall back past it
    return None


def _checkpoint_plan(checkpoint_dir: str, meta: dict) -> str:
    """Path of a plan JSON holding a checkpoint's plan (from its ``meta``)."""
    import json
    path = Path(checkpoint_dir) / "resume-plan.json"
    path.write_text(json.dumps(meta["plan"]))
    return str(path)


def prediction(spec, plan: Plan, hardware: str, world: int) -> dict[str, float]:
    """The planner's predicted step time and the MFU inputs, for the progress line
    (:class:`TrainConfig` fields)."""
    from ..estimate import estimate
    from ..spec.hardware import make_cluster
    cluster = make_cluster(hardware, world)
    est = estimate(spec, cluster, plan)
    dtype = "bf16" if plan.dtype in ("bf16", "fp8") else plan.dtype
    return {"predicted_step_s": est.step_time_s,
            "model_flops_per_token": spec.model_flops_per_token(plan.seq_len),
            "peak_flops": cluster.device.peak_flops(dtype if cluster.device.supports(dtype) else "fp16")}


def check_finetune(config: TrainConfig, plan: Plan) -> None:
    """Chat / instruction data read and checked (one line with file:line) and the LoRA-only
    flags refused without LoRA, before any process starts."""
    if config.data:
        from .sft_data import is_sft_file, read_samples
        if is_sft_file(config.data):
            read_samples(config.data)
    if plan.finetune != "lora" and (config.adapter or config.merge):
        raise PartitaError(f"{'--adapter' if config.adapter else '--merge'} needs --finetune lora "
                           f"(this plan fine-tunes: {plan.finetune})")
    if config.merge and not config.save_hf:
        raise PartitaError("--merge writes the merged weights with --save-hf OUT; give --save-hf")
