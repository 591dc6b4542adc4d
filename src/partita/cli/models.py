"""``partita models``: the built-in model presets."""
from __future__ import annotations

import argparse
import json


def add_parser(sub) -> None:
    models = sub.add_parser("models", help="list built-in model presets")
    models.add_argument("--json", action="store_true")
    models.set_defaults(func=cmd_models)


def cmd_models(args: argparse.Namespace) -> int:
    from ..spec.load import load_model, preset_names
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

    from .render import make_console
    t = Table(title="Built-in models (or pass any HF config.json)")
    for col in ("name", "params", "active", "layers", "hidden", "heads/kv", "experts"):
        t.add_column(col, justify="left" if col == "name" else "right")
    for r in rows:
        t.add_row(r["name"], f"{r['params_b']:.2f}B", f"{r['active_b']:.2f}B", str(r["layers"]), str(r["hidden"]),
                  f"{r['heads']}/{r['kv_heads']}", str(r["experts"] or "-"))
    make_console().print(t)
    return 0
