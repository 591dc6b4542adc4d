"""``partita hardware``: the built-in device files."""
from __future__ import annotations

import argparse
import json


def add_parser(sub) -> None:
    hw = sub.add_parser("hardware", help="list built-in devices")
    hw.add_argument("--json", action="store_true")
    hw.set_defaults(func=cmd_hardware)


def cmd_hardware(args: argparse.Namespace) -> int:
    from ..spec.hardware import builtin_devices, load_device
    devices = [load_device(n) for n in builtin_devices()]
    if args.json:
        print(json.dumps([d.to_dict() for d in devices], indent=2))
        return 0
    from rich.table import Table

    from .render import make_console
    t = Table(title="Built-in devices (or pass your own JSON file; see docs/hardware.md)")
    for col in ("name", "bf16 TF", "fp8 TF", "HBM GiB", "HBM TB/s", "intra GB/s", "node", "inter GB/s"):
        t.add_column(col, justify="left" if col == "name" else "right")
    for d in devices:
        t.add_row(d.name, str(d.peak_tflops.get("bf16") or d.peak_tflops.get("fp16")),
                  str(d.peak_tflops.get("fp8") or "-"), f"{d.hbm_gib:g}", f"{d.hbm_tbps:g}",
                  f"{d.intra_gbps:g} ({d.intra_topology})", str(d.devices_per_node), f"{d.inter_gbps:g}")
    make_console().print(t)
    return 0
