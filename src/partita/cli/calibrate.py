"""``partita calibrate``: measure this machine into a hardware file (torchrun + microbenchmarks)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from ..errors import PartitaError


def add_parser(sub) -> None:
    cal = sub.add_parser("calibrate", help="measure this machine (GEMM, bandwidth, collectives) into a hardware file")
    cal.add_argument("--nproc", type=int, default=2, help="processes (the group size collectives are measured on)")
    cal.add_argument("--base", default="cpu", help="device file to extend (default: cpu)")
    cal.add_argument("--name", help="name of the calibrated device")
    cal.add_argument("--device", help="cpu, cuda or npu (default: what the machine has)")
    cal.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    cal.add_argument("-o", "--output", default="calibrated.json")
    cal.add_argument("--timeout-s", type=int, default=300)
    cal.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise PartitaError("partita calibrate needs PyTorch: pip install 'partita[runtime]'") from None
    from ..spec.hardware import load_device
    load_device(args.base)  # fail early on an unknown base
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           "-m", "partita.profile.calibrate", args.output, args.base, args.name or f"{args.base}-calibrated",
           args.device or "auto", args.dtype]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s,
                          env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    if proc.returncode:
        from ..train.launch import root_cause
        raise PartitaError(f"calibration failed: {root_cause(proc.stderr)}")
    data = json.load(open(args.output))
    eff = data["efficiency"]
    print(f"wrote {args.output}: {data['peak_tflops']} TFLOPS peak, gemm efficiency {eff['gemm']:.2f} "
          f"(half at {eff['gemm_half_gflop']:.3f} GFLOP), all-reduce {data['intra_node']['gbps_per_direction']:.2f} GB/s "
          f"+ {data['intra_node']['latency_us']:.0f} us/step, layer overhead {eff['kernel_overhead_us_per_layer']:.0f} us"
          + (f", framework per layer: tp {eff['tp_framework_us_per_layer']:.0f} us, zero-3 "
             f"{eff['zero3_framework_us_per_layer']:.0f} us" if "tp_framework_us_per_layer" in eff else "")
          + f"; use it with --hardware {args.output}")
    return 0
