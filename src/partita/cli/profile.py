"""``partita profile``: run a plan for a few steps under torch.profiler on every rank, then
put the measured breakdown beside the planner's prediction (analysis in
:mod:`partita.train.profile_report`)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import tempfile
from pathlib import Path

from ..errors import PartitaError
from .train import add_train_arguments, configs_from_args, run_train


def add_parser(sub) -> None:
    prof = sub.add_parser("profile", help="run a plan under torch.profiler and compare with the prediction")
    add_train_arguments(prof, "profile")
    prof.add_argument("--report", help="also write a self-contained HTML report (timeline + measured vs predicted; "
                                       "needs plotly: partita[report])")
    prof.set_defaults(func=cmd_profile, steps=5)


def cmd_profile(args: argparse.Namespace) -> int:
    config, launch = configs_from_args(args)
    if config.steps < 3:
        raise PartitaError("partita profile needs --steps >= 3 (the first step is a warm-up)")
    if args.report:
        from ..profile.html_report import require_plotly
        require_plotly()
    run_dir = launch.run_dir or tempfile.mkdtemp(prefix="partita-profile-")
    profile_dir = config.profile_dir or str(Path(run_dir) / "profile")
    hardware = launch.hardware or "cpu"
    # the per-step lines go to the metrics file, not the screen; the prediction is printed here
    code = run_train(dataclasses.replace(config, json=True, profile_dir=profile_dir),
                     dataclasses.replace(launch, run_dir=run_dir, hardware=None), worker_stdout=subprocess.DEVNULL)
    if code:
        return code
    from ..train.profile_report import analyze_run
    report, timelines = analyze_run(Path(profile_dir), Path(run_dir), config.model, hardware)
    if args.report:
        from ..profile.html_report import write_html_report
        report["html_report"] = str(write_html_report(report, timelines, args.report))
    if config.json:
        print(json.dumps(report, indent=2))
    else:
        from .render import print_report
        print_report(report)
    return 0
