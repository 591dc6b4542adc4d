"""``partita calibrate``: measure this machine into a hardware file (torchrun + microbenchmarks)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from ..errors import PartitaError
from ..inputs import check_output_path
from .types import check_device_type, positive_int

#: More processes than any single machine runs (collectives are measured inside one node).
MAX_NPROC = 1024


def add_parser(sub) -> None:
    cal = sub.add_parser("calibrate", help="measure this machine (GEMM, bandwidth, collectives) into a hardware file")
    cal.add_argument("--nproc", type=positive_int(MAX_NPROC), default=2, help="processes (the group size collectives are measured on)")
    cal.add_argument("--base", default="cpu", help="device file to extend (default: cpu)")
    cal.add_argument("--name", help="name of the calibrated device")
    cal.add_argument("--device", help="cpu, cuda or npu (default: what the machine has)")
    cal.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    cal.add_argument("-o", "--output", default="calibrated.json")
    cal.add_argument("--repeats", type=positive_int(100), default=5,
                     help="repeats of every timed term (the printed spread is over them)")
    cal.add_argument("--model", default="tiny-llama",
                     help="dense model of the framework micro-runs (a preset; default tiny-llama): the model you "
                          "will run measures its own per-layer framework times")
    cal.add_argument("--from-profile", action="append", metavar="RUN_DIR",
                     help="refine --base (a calibrated file) from a `partita train`/`profile` run dir's measured "
                          "step times instead of measuring (repeatable)")
    cal.add_argument("--bind-cores", choices=("auto", "on", "off"), default="off",
                     help="pin each rank of the micro-runs to its own share of the cores, as partita train "
                          "--bind-cores (CPU only; default off)")
    cal.add_argument("--pool", nargs="+", metavar="FILE",
                     help="write the median of several calibrated files (each field and term) instead of measuring: "
                          "calibrations taken at different moments of a shared machine, pooled")
    cal.add_argument("--timeout-s", type=positive_int(7 * 24 * 3600), default=300,
                     help="give up (and stop every process) after this many seconds")
    cal.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from ..spec.hardware import load_device
    load_device(args.base)  # fail early (before the slow torch import) on an unknown base
    check_output_path(args.output, "-o")
    if args.name is not None and (not args.name.strip() or not args.name.isprintable()):
        raise PartitaError(f"--name {args.name!r} must be a printable, non-empty device name")
    if args.pool:
        if args.from_profile:
            raise PartitaError("--pool and --from-profile do not combine: pool calibrated files, then refine the result")
        from ..calibrate.pool import pool_files
        from ..outputs import write_output
        data = pool_files(args.pool, args.name)
        write_output(args.output, json.dumps(data, indent=2), "-o")
        print(f"wrote {args.output}: the median of {len(args.pool)} calibrations (spread = half the IQR between them)")
        print_terms(data)
        return 0
    if args.from_profile:
        from ..calibrate.refine import refine_from_runs
        data = refine_from_runs(args.base, args.from_profile, args.name)
        from ..outputs import write_output
        write_output(args.output, json.dumps(data, indent=2), "-o")
        print(f"wrote {args.output}: {args.base} refined from {len(args.from_profile)} run(s)")
        print_terms(data)
        return 0
    try:
        import torch  # noqa: F401
    except ImportError:
        raise PartitaError("partita calibrate needs PyTorch: pip install 'partita[runtime]'") from None
    check_device_type(args.device, "--device")
    from ..spec.load import load_model
    load_model(args.model)  # an unknown model is one line before torchrun
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           "-m", "partita.calibrate.hardware_file", args.output, args.base, args.name or f"{args.base}-calibrated",
           args.device or "auto", args.dtype, str(args.repeats), args.model]
    from ..calibrate.binding import BIND_CORES_ENV
    os.environ[BIND_CORES_ENV] = args.bind_cores  # the ranks bind themselves (calibrate/binding.py)
    returncode, stderr = _run_group(cmd, args.timeout_s)
    if returncode:
        from ..train.supervise import root_cause
        log = f"{args.output}.failed.log"  # every rank's output, for the cause one line cannot hold
        with open(log, "w") as f:
            f.write(stderr)
        raise PartitaError(f"calibration failed: {root_cause(stderr)} (the workers' output: {log})")
    data = json.load(open(args.output))
    eff = data["efficiency"]
    print(f"wrote {args.output}: {data['peak_tflops']} TFLOPS peak, gemm efficiency {eff['gemm']:.3f} "
          f"(half at {eff['gemm_half_gflop']:.3f} GFLOP), collectives {data['intra_node']['gbps_per_direction']:.2f} GB/s "
          f"+ {data['intra_node']['latency_us']:.0f} us/step; use it with --hardware {args.output}")
    print_terms(data)
    return 0


def print_terms(data: dict) -> None:
    """Every measured term: value +- spread (half the inter-quartile range of the repeats),
    repeats, and a note where the measured value was outside its range (a negative time is
    written as 0, an overlap share is written clamped to [0, 1])."""
    terms = data.get("calibration", {}).get("terms", {})
    print(f"{'term':44s} {'value':>12s} {'spread':>10s}  unit        repeats")
    for name, t in terms.items():
        if "value" in t:
            note = ("  (negative: written as 0)" if t["value"] < 0 and name.startswith("efficiency.") and
                    t.get("clamped_to", 0.0) == 0.0 else f"  ({t['note']})" if "clamped_to" in t else "")
            print(f"{name:44s} {t['value']:12.4g} {t['spread']:10.3g}  {t['unit'][:11]:11s} {t['repeats']:4d}{note}")
        elif "latency_us" in t:  # a collective's own fit (or the joint one) beside the pair the file holds
            gbps = "inf" if t.get("gbps") is None else f"{t['gbps']:.3g}"
            extra = (f"  spread {t['spread_rel']:.0%}, joint fit worst {t['joint_fit_worst_rel_error']:.0%}, "
                     f"{t['repeats']} repeats" if "spread_rel" in t else "")
            print(f"{name:44s} {gbps:>9s} GB/s + {t['latency_us']:.0f} us{extra}")
    for kind, fits in data.get("collectives", {}).items():  # what the cost model reads per collective
        for f in fits:
            print(f"{'collectives.' + kind + ' on ' + str(f['group']):44s} {f['gbps']:9.3g} GB/s + "
                  f"{f['latency_us']:.0f} us/step  worst size off {f.get('worst_rel_error', 0):.0%}, "
                  f"repeats spread {f.get('spread_rel', 0):.0%}  (used by the cost model)")


def _run_group(cmd: list[str], timeout_s: int) -> tuple[int, str]:
    """Run ``cmd`` (``python -m torch.distributed.run ...``) in its own process group and wait;
    on a timeout or an interrupt the whole group (torchrun and its workers) is killed, so no
    process outlives the command. torchrun's logs (by default a ``torchelastic_*`` folder left
    in the temp dir) and the workers' temp files go to a scratch folder removed on every exit."""
    import shutil
    import signal
    import tempfile
    scratch = tempfile.mkdtemp(prefix="partita-calibrate-")
    cmd = cmd[:3] + [f"--log-dir={os.path.join(scratch, 'torchelastic')}"] + cmd[3:]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TMPDIR": scratch}
    try:
        return _wait_group(cmd, env, timeout_s, signal.SIGKILL)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _wait_group(cmd: list[str], env: dict, timeout_s: int, kill: int) -> tuple[int, str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=env)
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc, kill)
        raise PartitaError(f"calibration did not finish in --timeout-s {timeout_s} s; "
                           "give it more time (a CPU run takes a few minutes)") from None
    except BaseException:
        _kill_group(proc, kill)
        raise
    return proc.returncode, stderr


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    proc.communicate()
