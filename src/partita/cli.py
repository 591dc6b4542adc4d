"""``partita`` command line: parses, calls the library, prints. Nothing else lives here.

Every user mistake surfaces as :class:`partita.errors.PartitaError`: one line on stderr,
exit code 2.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, Callable, Sequence

from .errors import PartitaError


def parse_tokens(text: str) -> float:
    """``1.4T`` -> 1.4e12; accepts K/M/B/G/T suffixes or a plain number."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmbgt]?)\s*", text.lower())
    if not m:
        raise PartitaError(f"--tokens {text!r} must be a number like 1.4T, 300B or 2e12")
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}[m.group(2)]
    return float(m.group(1)) * scale


def _add_cluster_args(p: argparse.ArgumentParser, defaults: bool = False) -> None:
    p.add_argument("--model", default="llama-65b" if defaults else None, required=not defaults,
                   help="preset name (partita models) or a config.json path")
    p.add_argument("--hardware", default="ascend-910b2" if defaults else None, required=not defaults,
                   help="device name (partita hardware) or a device/cluster JSON file")
    p.add_argument("--devices", type=int, default=512 if defaults else None, required=not defaults,
                   help="number of devices")
    p.add_argument("--devices-per-node", type=int, help="devices per node (default: the device file's)")
    p.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE", dest="overrides",
                   help="override a hardware field, e.g. --set inter_node.gbps_per_direction=25")
    p.add_argument("--seq-len", type=int, default=2048, help="sequence length in tokens")
    p.add_argument("--global-batch", type=int, help="global batch in sequences")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp8", "fp32"], help="training precision")
    p.add_argument("--tokens", help="total training tokens, e.g. 1.4T: print run days and device-hours")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _cluster_and_model(args: argparse.Namespace):
    from .spec.hardware import make_cluster, parse_overrides
    from .spec.model import load_model
    model = load_model(args.model)
    cluster = make_cluster(args.hardware, args.devices, args.devices_per_node, parse_overrides(args.overrides))
    return model, cluster


def cmd_estimate(args: argparse.Namespace) -> int:
    from .estimate import estimate
    from .plan import Plan
    model, cluster = _cluster_and_model(args)
    if args.plan:
        plan = Plan.load(args.plan)
    else:
        if args.global_batch is None:
            raise PartitaError("--global-batch is required (or pass --plan plan.json)")
        other = args.tp * args.pp * args.cp
        if cluster.world_size % other:
            raise PartitaError(f"tp*pp*cp = {other} does not divide --devices {cluster.world_size}")
        dp = args.dp or cluster.world_size // other
        fields: dict[str, Any] = dict(dp=dp, tp=args.tp, pp=args.pp, vpp=args.vpp, cp=args.cp, ep=args.ep,
                                      zero=args.zero, mbs=args.mbs, gbs=args.global_batch, seq_len=args.seq_len,
                                      recompute=args.recompute, dtype=args.dtype or "bf16")
        if args.sp is not None:
            fields["sp"] = args.sp
        if args.schedule:
            fields["schedule"] = args.schedule
        if args.layer_split:
            fields["layer_split"] = args.layer_split
        if args.tp_comm_overlap:
            fields["tp_comm_overlap"] = True
        plan = Plan.from_dict(fields, "plan")
    est = estimate(model, cluster, plan)
    tokens = parse_tokens(args.tokens) if args.tokens else None
    if args.json:
        out = est.to_dict()
        if tokens:
            out["run_days"] = est.run_days(tokens)
            out["device_hours"] = est.run_days(tokens) * 24 * cluster.world_size
        print(json.dumps(out, indent=2))
    else:
        from .report import print_estimate
        print_estimate(est, tokens=tokens)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from .spec.model import load_model, preset_names
    rows = []
    for name in preset_names():
        m = load_model(name)
        rows.append({"name": name, "params_b": m.total_params() / 1e9, "active_b": m.active_params() / 1e9,
                     "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
                     "experts": m.moe.num_experts if m.moe else 0, "source": m.source})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.table import Table

    from .report import make_console
    t = Table(title="Built-in models (or pass any HF config.json)")
    for col in ("name", "params", "active", "layers", "hidden", "heads/kv", "experts"):
        t.add_column(col, justify="left" if col == "name" else "right")
    for r in rows:
        t.add_row(r["name"], f"{r['params_b']:.2f}B", f"{r['active_b']:.2f}B", str(r["layers"]), str(r["hidden"]),
                  f"{r['heads']}/{r['kv_heads']}", str(r["experts"] or "-"))
    make_console().print(t)
    return 0


def cmd_hardware(args: argparse.Namespace) -> int:
    from .spec.hardware import builtin_devices, load_device
    devices = [load_device(n) for n in builtin_devices()]
    if args.json:
        print(json.dumps([d.to_dict() for d in devices], indent=2))
        return 0
    from rich.table import Table

    from .report import make_console
    t = Table(title="Built-in devices (or pass your own JSON file; see docs/hardware.md)")
    for col in ("name", "bf16 TF", "fp8 TF", "HBM GiB", "HBM TB/s", "intra GB/s", "node", "inter GB/s"):
        t.add_column(col, justify="left" if col == "name" else "right")
    for d in devices:
        t.add_row(d.name, str(d.peak_tflops.get("bf16") or d.peak_tflops.get("fp16")), str(d.peak_tflops.get("fp8") or "-"),
                  f"{d.hbm_gib:g}", f"{d.hbm_tbps:g}", f"{d.intra_gbps:g} ({d.intra_topology})", str(d.devices_per_node),
                  f"{d.inter_gbps:g}")
    make_console().print(t)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .export import export
    from .plan import Plan
    from .spec.model import load_model
    plan = Plan.load(args.plan_file)
    model = load_model(args.model) if args.model else None
    if model is not None:
        from .plan import check
        check(plan, model)
    result = export(args.to, plan, model)
    for w in result.warnings:
        print(f"partita: warning: {w}", file=sys.stderr)
    if args.output:
        with open(args.output, "w") as f:
            f.write(result.text)
    else:
        sys.stdout.write(result.text)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    import os
    import subprocess
    try:
        import torch  # noqa: F401
    except ImportError:
        raise PartitaError("partita calibrate needs PyTorch: pip install 'partita[runtime]'") from None
    from .spec.hardware import load_device
    load_device(args.base)  # fail early on an unknown base
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           "-m", "partita.profile.calibrate", args.output, args.base, args.name or f"{args.base}-calibrated",
           args.device or "auto", args.dtype]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s,
                          env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    if proc.returncode:
        from .train.launch import root_cause
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="partita", description="Plan, run and check parallel LLM training.")
    sub = parser.add_subparsers(dest="command")

    est = sub.add_parser("estimate", help="memory and step time of one plan")
    _add_cluster_args(est)
    est.add_argument("--plan", help="a plan JSON file (instead of the degree flags)")
    est.add_argument("--tp", type=int, default=1)
    est.add_argument("--pp", type=int, default=1)
    est.add_argument("--vpp", type=int, default=1)
    est.add_argument("--cp", type=int, default=1)
    est.add_argument("--ep", type=int, default=1)
    est.add_argument("--dp", type=int, help="default: devices / (tp*pp*cp)")
    est.add_argument("--zero", type=int, default=1, choices=[0, 1, 2, 3])
    est.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None, help="sequence parallel (default: on when tp > 1)")
    est.add_argument("--mbs", type=int, default=1, help="micro-batch size")
    est.add_argument("--recompute", choices=["none", "selective", "full"], default="none")
    est.add_argument("--schedule", choices=["1f1b", "gpipe", "interleaved-1f1b", "zero-bubble"])
    est.add_argument("--layer-split", help="layers per virtual stage, e.g. 9,10,10,9")
    est.add_argument("--tp-comm-overlap", action="store_true",
                     help="overlap tensor-parallel communication (Megatron --tp-comm-overlap, Ascend MC2)")
    est.set_defaults(func=cmd_estimate)

    exp = sub.add_parser("export", help="write a plan as Megatron-LM / MindSpeed-LLM / DeepSpeed / torchtitan config")
    exp.add_argument("--to", required=True, choices=["megatron", "mindspeed", "deepspeed", "torchtitan"])
    exp.add_argument("plan_file", metavar="PLAN.json", help="a plan (or the output of plan/estimate --json)")
    exp.add_argument("--model", help="add the model shape (Megatron/MindSpeed) and check the plan against it")
    exp.add_argument("-o", "--output", help="write here instead of stdout")
    exp.set_defaults(func=cmd_export)

    cal = sub.add_parser("calibrate", help="measure this machine (GEMM, bandwidth, collectives) into a hardware file")
    cal.add_argument("--nproc", type=int, default=2, help="processes (the group size collectives are measured on)")
    cal.add_argument("--base", default="cpu", help="device file to extend (default: cpu)")
    cal.add_argument("--name", help="name of the calibrated device")
    cal.add_argument("--device", help="cpu, cuda or npu (default: what the machine has)")
    cal.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    cal.add_argument("-o", "--output", default="calibrated.json")
    cal.add_argument("--timeout-s", type=int, default=300)
    cal.set_defaults(func=cmd_calibrate)

    models = sub.add_parser("models", help="list built-in model presets")
    models.add_argument("--json", action="store_true")
    models.set_defaults(func=cmd_models)
    hw = sub.add_parser("hardware", help="list built-in devices")
    hw.add_argument("--json", action="store_true")
    hw.set_defaults(func=cmd_hardware)

    from .search.cli import add_plan_command
    from .train.launch import add_train_command
    add_plan_command(sub, _add_cluster_args)
    add_train_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv:
        argv = ["plan"] if "plan" in parser._subparsers._group_actions[0].choices else ["--help"]  # type: ignore[union-attr]
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return func(args)
    except PartitaError as e:
        print(f"partita: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
