"""Start a training run: validate the plan, write the run directory, watch torchrun.

Validation happens here, before any process group exists, so a bad plan costs one line,
not a hung job. The run directory gets ``plan.json`` (the resolved plan) and
``train.json`` (the :class:`~partita.train.config.TrainConfig`); every worker is started
with just that directory. torchrun stops every rank when one fails; the workers' process
groups carry a timeout so a lost peer ends in an error rather than a hang, and the
launcher stops a job that logs no step for twice that timeout (:func:`run_watched`).
The command line around this is :mod:`partita.cli.train`.
"""
from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, NamedTuple

from ..errors import PartitaError
from ..plan import Plan, check
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


def model_spec_for(name: str):
    """The planner's view of ``--model``: a preset, a config file or directory, or one of the
    tiny HF models (``hf-llama`` / ``hf-qwen2`` / ``hf-mixtral``) read from its HF config."""
    from ..models.hf import TINY
    if name in TINY:
        from ..runtime.auto import model_spec_of
        return model_spec_of(_tiny_hf(name))
    from ..spec.load import load_model
    return load_model(name)


def _tiny_hf(name: str):
    from ..models.hf import build_hf_model
    return build_hf_model(name)


class PreparedRun(NamedTuple):
    """A validated run, its directory written, ready to start."""
    plan: Plan
    run_dir: Path
    config: TrainConfig
    command: list[str]
    env: dict[str, str]


def resolve_plan(config: TrainConfig, launch: LaunchConfig, say: Callable[[str], None]) -> Plan:
    """The plan to run: the user's, or (with --resume and no --plan) the newest checkpoint's,
    re-planned for this world size; checked against the model before any process starts."""
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
    spec = model_spec_for(config.model)
    if from_checkpoint and plan.world_size != world:
        from .replan import describe_change, replan
        new = replan(plan, world, spec)
        say(f"partita: the checkpoint's plan ran on {plan.world_size} processes; re-planned for {world} keeping "
            f"global batch {plan.gbs}: {describe_change(plan, new)}")
        plan = new
    check(plan, spec, world)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise PartitaError("partita train needs PyTorch: pip install 'partita[runtime]'") from None
    from ..runtime.parallelize import runtime_check
    runtime_check(plan, _model_for_check(config.model, spec))
    return plan


def _auto_plan(config: TrainConfig, launch: LaunchConfig, text: str, flags: dict,
               say: Callable[[str], None]) -> Plan:
    """``--plan "auto[,gbs=8,mbs=1,...]"``: the search's best plan for this world size on this
    machine's hardware file (``calibrated.json`` here, else ``--hardware``, else the built-in
    device of the type), printed with the runner-up and why it lost
    (:func:`partita.runtime.auto.choose_plan`, the same call ``parallelize(model, "auto")`` makes).
    Fields the search does not choose (gbs, seq_len) come from the text, the batch flags, then
    `partita train`'s defaults."""
    from ..runtime.auto import choose_plan, parse_auto
    from ..runtime.device import detect_device_type
    fixed = parse_auto(text)
    for name, key in FLAG_KEYS.items():
        if key in flags and key in fixed and str(flags[key]) != fixed[key]:
            raise PartitaError(f"--{name.replace('_', '-')} {flags[key]} conflicts with {key}={fixed[key]} in "
                               f"--plan {text!r}; give it in one place")
    defaults = train_defaults(config.device)
    merged = {"gbs": defaults["gbs"], "seq_len": defaults["seq_len"], **flags, **fixed}
    merged.setdefault("dtype", defaults["dtype"])
    spec_model = _model_for_auto(config.model)
    device_type = config.device or detect_device_type()
    auto_text = ",".join(["auto"] + [f"{k}={v}" for k, v in merged.items()])
    plan, report = choose_plan(spec_model, launch.world, auto_text, device_type=device_type, hardware=launch.hardware)
    plan = dataclasses.replace(plan, seq_len=int(merged["seq_len"]))
    for line in report.splitlines():
        say(f"partita: {line}")
    check(plan, model_spec_for(config.model), launch.world)
    from ..runtime.parallelize import runtime_check
    runtime_check(plan, _model_for_check(config.model, model_spec_for(config.model)))
    return plan


def _model_for_auto(name: str):
    """A module :func:`~partita.runtime.auto.model_spec_of` can read: the built model for the
    reference and tiny HF models, the HF model on meta for a weights directory."""
    from ..models.hf import TINY
    from ..models.hf_weights import build_hf_meta, has_hf_weights
    if has_hf_weights(name):
        return build_hf_meta(name)
    if name in TINY:
        return _tiny_hf(name)
    from ..models.llama import build_model
    return build_model(name)


FLAG_KEYS = {"global_batch": "gbs", "seq_len": "seq_len", "mbs": "mbs"}


def batch_flags(launch: LaunchConfig) -> dict:
    """--global-batch / --seq-len / --mbs as plan fields (those given)."""
    return {key: getattr(launch, name) for name, key in FLAG_KEYS.items() if getattr(launch, name) is not None}


#: the gradient-communication flags of partita train, which override the plan (issue 17)
KNOB_FLAGS = ("grad_dtype", "grad_compression", "powersgd_rank")


def knob_flags(plan: Plan, launch: LaunchConfig, say: Callable[[str], None]) -> Plan:
    """--grad-dtype / --grad-compression / --powersgd-rank set those plan fields, over the
    plan's own values (a note says what changed; the result is validated by the caller, so
    e.g. PowerSGD on a zero-1 plan is one line)."""
    given = {k: getattr(launch, k) for k in KNOB_FLAGS if getattr(launch, k) is not None}
    changed = {k: v for k, v in given.items() if getattr(plan, k) != v}
    if not changed:
        return plan
    say("partita: " + ", ".join(f"--{k.replace('_', '-')} {v} overrides the plan's {k}={getattr(plan, k)}"
                                for k, v in changed.items()))
    return plan.with_(**changed)


def check_batch_flags(plan: Plan, flags: dict, plan_text: str) -> None:
    """A flag that the plan string (or file) sets to another value is a conflict, not a guess."""
    for name, key in FLAG_KEYS.items():
        if key in flags and getattr(plan, key) != flags[key]:
            flag = "--" + name.replace("_", "-")
            raise PartitaError(f"{flag} {flags[key]} conflicts with {key}={getattr(plan, key)} in --plan "
                               f"{plan_text!r}; give it in one place")


def _model_for_check(name: str, spec):
    """What runtime_check needs: the reference model, the HF model on meta, or the shape."""
    from ..models.hf_weights import build_hf_meta, has_hf_weights, weight_map
    if has_hf_weights(name):
        weight_map(Path(name))  # every safetensors header (or the index) readable: checked before any worker
        return build_hf_meta(name)
    if name.startswith("tiny-"):
        from ..models.llama import build_model
        return build_model(name)
    return _Shape(spec)


def prepare_run(config: TrainConfig, launch: LaunchConfig, say: Callable[[str], None]) -> PreparedRun:
    """Validate, fill the values the launcher derives (progress bar, prediction), write
    ``plan.json`` and ``train.json`` into the run directory and build torchrun's command."""
    from .preflight import check_inputs, default_run_dir, writable_dir
    plan = resolve_plan(config, launch, say)
    check_inputs(config, _vocab(config.model))
    if config.save_hf and not _is_hf_name(config.model):
        raise PartitaError("--save-hf writes Hugging Face models: --model must be a directory with config.json and "
                           "*.safetensors (or hf-llama / hf-qwen2 / hf-mixtral)")
    run_dir = writable_dir(launch.run_dir or config.checkpoint_dir or default_run_dir(), "--run-dir")
    derived: dict = {"progress": not config.json and not launch.no_progress}
    if launch.hardware:
        derived.update(prediction(model_spec_for(config.model), plan, launch.hardware, launch.world))
    config = dataclasses.replace(config, **derived)
    check_rendezvous(launch)
    plan.to_json(run_dir / PLAN_FILE)
    config.save(run_dir)
    from .ownership import launcher_env
    env = {**os.environ, **launcher_env()}
    env.setdefault("OMP_NUM_THREADS", "1")
    return PreparedRun(plan, run_dir, config, torchrun_command(launch, run_dir, config.timeout_s), env)


def _is_hf_name(name: str) -> bool:
    from ..models.hf import TINY
    from ..models.hf_weights import has_hf_weights
    return name in TINY or has_hf_weights(name)


def _vocab(name: str) -> int | None:
    """The model's vocabulary, for the token-file check (None when it cannot be read cheaply)."""
    try:
        return model_spec_for(name).vocab
    except Exception:  # the worker reports what is wrong with the model
        return None


TORCHRUN_LOGS = "torchelastic"


def torchrun_command(launch: LaunchConfig, run_dir: Path, timeout_s: int = 300) -> list[str]:
    """torchrun (standalone, or c10d rendezvous across nodes) starting one worker per process.
    Its log directory is ``<run dir>/torchelastic`` (removed after the job,
    :func:`remove_torchrun_logs`) - by default torchrun makes a ``torchelastic_*`` one in
    the temp dir and leaves it there. ``timeout_s`` bounds the rendezvous (join) and the
    workers' graceful shutdown after a signal (long enough for the checkpoint of the step
    reached)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={launch.nproc}",
           f"--log-dir={run_dir / TORCHRUN_LOGS}", f"--shutdown-timeout={timeout_s}"]
    if launch.nnodes > 1 or launch.rdzv_endpoint:
        cmd += [f"--nnodes={launch.nnodes}", f"--node-rank={launch.node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={launch.rdzv_endpoint}", f"--rdzv-id={launch.rdzv_id}",
                f"--rdzv-conf=join_timeout={timeout_s},read_timeout={timeout_s}"]
    else:
        cmd += ["--standalone"]
    if launch.max_restarts:
        cmd += [f"--max-restarts={launch.max_restarts}"]
    return cmd + ["-m", "partita.train.worker", str(run_dir)]


class Outcome(NamedTuple):
    """How a watched job ended: torchrun's exit code, its stderr, the seconds it stalled
    (0: did not) and the signal (SIGINT / SIGTERM) that stopped the launcher (0: none)."""
    returncode: int
    stderr: str
    stalled: float
    signal: int


class _Stderr:
    """torchrun's stderr, read line by line as it comes: the workers' ``partita:`` notes and
    warnings (not errors: the launcher reports the one root cause at the end) are printed
    while the job runs; everything is kept for :func:`root_cause`."""

    def __init__(self, stream, say: Callable[[str], None]):
        self.lines: list[str] = []
        self.say = say
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            line = line.rstrip("\n")
            self.lines.append(line)
            if line.startswith("partita: ") and not line.startswith("partita: error:"):
                self.say(line)

    def text(self, wait_s: float) -> str:
        self.thread.join(timeout=wait_s)
        return "\n".join(self.lines)


def run_watched(cmd: list[str], env: dict, stdout, metrics: Path, stall_s: float, pass_fds: tuple = (),
                grace_s: float = 60.0, say: Callable[[str], None] | None = None,
                stop_file: Path | None = None) -> Outcome:
    """Run torchrun and watch it. torchrun gets a session of its own (a Ctrl-C in the
    terminal reaches only the launcher, which passes exactly one signal on) and SIGKILL as
    its parent-death signal (it dies with the launcher, whatever kills the launcher).
    SIGINT / SIGTERM to the launcher go to torchrun, which passes them to every worker:
    they stop after the step they agree on, save it, and exit; after ``grace_s`` whatever
    is left is killed. Training that stalls - once a first step is logged (rank 0 appends
    to ``metrics``), a gap of ``stall_s`` seconds without another - ends the job: the
    per-group collective timeout cannot catch every hang (DTensor's functional collectives
    wait outside it; a rank can spin). ``stop_file`` (``<run dir>/stop-requested``) is
    written before a signal is passed on: it tells the workers the stop is a clean one."""
    from .ownership import set_parent_death_signal
    if stop_file is not None:
        stop_file.unlink(missing_ok=True)
    say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
    received: list[int] = []
    on_main = threading.current_thread() is threading.main_thread()
    proc = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=set_parent_death_signal, pass_fds=pass_fds)

    def on_signal(signum, frame):
        if not received:
            received.append(signum)
            if stop_file is not None:
                stop_file.write_text(f"{signum}\n")
            proc.send_signal(signum)
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)} if on_main else {}
    err = _Stderr(proc.stderr, say)
    try:
        stalled = _watch(proc, metrics, stall_s, received, grace_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if proc.poll() is None:
        _stop(proc)
    if stop_file is not None:
        stop_file.unlink(missing_ok=True)
    return Outcome(proc.returncode, err.text(wait_s=30), stalled, received[0] if received else 0)


def _watch(proc: subprocess.Popen, metrics: Path, stall_s: float, received: list[int], grace_s: float) -> float:
    """Poll until torchrun ends; returns the seconds training stalled when it had to be
    stopped for that (0 otherwise). After a forwarded signal, ``grace_s`` to end."""
    last_change, last_stat, signalled_at = None, None, None
    while proc.poll() is None:
        time.sleep(0.2)
        now = time.monotonic()
        if received:
            signalled_at = signalled_at or now
            if now - signalled_at > grace_s:
                _stop(proc)
            continue
        try:
            stat = metrics.stat()
            seen = (stat.st_size, stat.st_mtime_ns)
        except FileNotFoundError:
            continue
        if seen != last_stat:
            last_stat, last_change = seen, now
        elif last_change is not None and now - last_change > stall_s:
            _stop(proc)
            return now - last_change
    return 0.0


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM torchrun (it terminates its workers), then SIGKILL it and every process
    below it that is still there - torchrun starts each worker in a session of its own."""
    family = _descendants(proc.pid)
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pid in family:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def remove_torchrun_logs(run_dir: Path) -> None:
    shutil.rmtree(run_dir / TORCHRUN_LOGS, ignore_errors=True)


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
            if e.errno == errno.EADDRINUSE:
                raise PartitaError(f"rendezvous endpoint {launch.rdzv_endpoint} is in use by another process; "
                                   "pick a free port for --rdzv-endpoint") from None


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


PEER_LOSS = ("closed by peer", "reset by peer", "Read error", "Broken pipe", "Timed out", "timed out",
             "Connection refused", "SIGTERM", "Signal 15")


def _torchrun_failures(stderr: str) -> list[tuple[int, int]]:
    """(rank, exit code) of each failed worker in torchrun's summary, the "Root Cause"
    entry first (torchrun prints "rank : R (local_rank: L)" and "exitcode : C (pid: P)")."""
    import re
    entry = re.compile(r"rank\s*:\s*(\d+) \(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)", re.S)
    head, _, root = stderr.partition("Root Cause (first observed failure):")
    return [(int(r), int(c)) for r, c in entry.findall(root) + entry.findall(head)]


def root_cause(stderr: str) -> str:
    """The one line that says why the job failed: a worker's ``partita: error:`` line; else
    the rank that was killed by a signal (the others then fail with a lost-peer error -
    gloo's "Connection closed by peer" / "Read error" - which is not the cause); else the
    first error of a rank that is not such a lost-peer error; else torchrun's own."""
    import re
    lines = stderr.splitlines()
    for line in reversed(lines):
        if "partita: error:" in line:  # two ranks' lines may run together: the first one
            return "partita: error:" + line.split("partita: error:")[1].rstrip()
    failures = _torchrun_failures(stderr)
    for rank, code in failures:
        if code < 0 and -code not in (signal.SIGTERM, signal.SIGINT):
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
            return (f"rank {rank} died (killed by {name}: out of memory, or killed from outside?); "
                    "the other ranks stopped because they lost it")
    pattern = re.compile(r"^(\[rank(\d+)\]:\s*)?[A-Za-z_.]*(Error|Exception|Interrupt): ")
    causes = [m for m in map(pattern.match, lines) if m and "ChildFailedError" not in m.string]
    primary = [m for m in causes if not any(p in m.string for p in PEER_LOSS)]
    if primary:
        m = primary[0]
        text = m.string[m.end(1):] if m.group(1) else m.string
        return f"rank {m.group(2)} failed: {text}" if m.group(2) else text
    if failures:
        rank, code = failures[0]
        return f"rank {rank} exited with code {code}" + (f": {causes[0].string}" if causes else "")
    if causes:
        return causes[0].string
    return lines[-1] if lines else "unknown error"


class _Shape:
    """Enough of a model for runtime_check when the model is only a spec."""

    def __init__(self, spec):
        from ..models.llama import TransformerConfig
        self.cfg = TransformerConfig(num_experts=spec.moe.num_experts if spec.moe else 0)
