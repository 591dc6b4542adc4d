"""``partita infer``: inference memory and time of a long-sequence model over sequence lengths.

Traces the forward only (:mod:`partita.tracing.inference`), searches the model's own memory
knobs (:mod:`partita.tracing.knobs`: ESMFold's trunk chunk size) and prints, per length, the
fastest setting that fits one device, else the fewest devices under DAP.
"""
from __future__ import annotations

import argparse
import json

from ..errors import PartitaError

GIB = 2 ** 30


def add_parser(sub) -> None:
    p = sub.add_parser("infer", help="inference memory/time of a long-sequence model (ESMFold) over lengths")
    p.add_argument("--model", default="esmfold-tiny",
                   help="esmfold-tiny, esmfold-v1, or module.path:function returning an nn.Module whose "
                        "input is one (1, L) int64 sequence (built on the meta device)")
    p.add_argument("--hardware", default="cpu", help="a built-in device or a device JSON file (see partita hardware)")
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256], metavar="L",
                   help="sequence lengths to trace")
    p.add_argument("--limit-gib", type=float, default=None,
                   help="memory per device in GiB (default: the device's usable memory less its runtime reserve)")
    p.add_argument("--max-devices", type=int, default=64, help="most devices to split one sequence over (DAP)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_infer)


def _model(name: str):
    from ..tracing import esmfold
    if name in esmfold.CONFIGS:
        return esmfold.build(name, "meta")
    if ":" not in name:
        from ..errors import unknown_name
        raise unknown_name("inference model", name, esmfold.CONFIGS)
    import torch

    from .traced import _factory
    with torch.device("meta"):
        return _factory(name)()


def _row(r) -> dict:
    b = r.best
    return {"seq_len": r.seq_len, "default_peak_gib": r.default.trace.peak_bytes / GIB,
            "default_seconds": r.default.seconds, "fits": b is not None,
            "devices": b.devices if b else None, "setting": b.setting.values if b else None,
            "peak_gib_per_device": b.bytes_per_device / GIB if b else None,
            "seconds": b.seconds if b else None, "comm_gb_per_device": b.comm_bytes_per_device / 1e9 if b else None,
            "peak_at": b.setting.trace.peak_at if b else r.default.trace.peak_at}


def cmd_infer(args: argparse.Namespace) -> int:
    if any(length < 1 for length in args.lengths):
        raise PartitaError(f"infer: --lengths {' '.join(map(str, args.lengths))}: every length must be >= 1")
    if args.max_devices < 1 or (args.limit_gib is not None and args.limit_gib <= 0):
        raise PartitaError("infer: --max-devices must be >= 1 and --limit-gib > 0")
    import torch

    from ..spec.hardware import load_device
    from ..tracing.knobs import limit_bytes, sweep
    device = load_device(args.hardware)
    model = _model(args.model)
    limit = args.limit_gib * GIB if args.limit_gib is not None else limit_bytes(device)
    rows = sweep(model, lambda n: torch.zeros(1, n, dtype=torch.long, device="meta"), args.lengths, device,
                 limit=limit, max_devices=args.max_devices)
    out = [_row(r) for r in rows]
    if args.json:
        print(json.dumps({"model": args.model, "hardware": device.name, "limit_gib": limit / GIB, "rows": out},
                         indent=2, default=str))
        return 0
    print(f"{args.model} on {device.name}, {limit / GIB:.3g} GiB per device "
          f"(beyond one device: the pair track split by rows, DAP; docs/tracing.md)")
    print(f"{'L':>6} {'default GiB':>11} {'devices':>7} {'setting':<26} {'GiB/device':>10} {'time s':>9}  peak at")
    top = "(the model's own forward)"
    for r in out:
        setting = ", ".join(f"{k}={v}" for k, v in (r["setting"] or {}).items()) or "-"
        print(f"{r['seq_len']:>6} {r['default_peak_gib']:>11.3g} "
              f"{r['devices'] if r['fits'] else f'>{args.max_devices}':>7} {setting:<26} "
              f"{r['peak_gib_per_device'] or float('nan'):>10.3g} {r['seconds'] or float('nan'):>9.3g}  {r['peak_at'] or top}")
    return 0
