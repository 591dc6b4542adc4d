"""``partita profile``: run a plan for a few steps under torch.profiler on every rank, then
put the measured breakdown beside the planner's prediction (analysis in
:mod:`partita.train.profile_report`). Without ``--run-dir`` the run lives in a temp folder that
is removed when the command ends (pass ``--run-dir`` or ``--profile-dir`` to keep the traces)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
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
    check_profile_args(config, launch, args.report)
    own_dir = launch.run_dir is None  # a temp run dir of ours: removed on every exit path (no litter)
    run_dir = launch.run_dir or tempfile.mkdtemp(prefix="partita-profile-")
    try:
        return _profile(config, launch, run_dir, args.report)
    finally:
        if own_dir:
            shutil.rmtree(run_dir, ignore_errors=True)


def check_profile_args(config, launch, report: str | None) -> None:
    """What only ``profile`` reads, checked before any process starts: --steps, the --hardware
    the prediction is made for, the --report, --run-dir and --profile-dir paths."""
    from ..inputs import check_output_path
    if config.steps < 3:
        raise PartitaError("partita profile needs --steps >= 3 (the first step is a warm-up)")
    if report is not None:
        from ..report.html_page import require_plotly
        check_output_path(report, "--report")
        require_plotly()
    from .types import check_device_type
    check_device_type(config.device, "--device")
    if launch.hardware:
        from ..spec.hardware import load_device
        load_device(launch.hardware)  # a typo fails now, not after the run
    for flag, folder in (("--run-dir", launch.run_dir), ("--profile-dir", config.profile_dir)):
        if folder is not None and (not str(folder).strip() or (Path(folder).exists() and not Path(folder).is_dir())):
            raise PartitaError(f"{flag} {folder!r} is " + ("empty" if not str(folder).strip() else "a file")
                               + "; give a folder")


def _profile(config, launch, run_dir: str, report_path: str | None) -> int:
    profile_dir = config.profile_dir or str(Path(run_dir) / "profile")
    hardware = launch.hardware or "cpu"
    # the per-step lines go to the metrics file, not the screen; the prediction is printed here
    code = run_train(dataclasses.replace(config, json=True, profile_dir=profile_dir),
                     dataclasses.replace(launch, run_dir=run_dir, hardware=None), worker_stdout=subprocess.DEVNULL)
    if code:
        return code
    from ..train.profile_report import analyze_run, runtime_plan
    report, timelines = analyze_run(Path(profile_dir), Path(run_dir), config.model, hardware)
    from ..profile.compare_terms import compare_run, print_terms
    plan = runtime_plan(run_dir)
    report["terms"] = compare_run(report, plan, config.model, hardware)
    report["dp_bytes"] = _dp_bytes(Path(profile_dir), plan, config.model)
    if report_path:
        from ..profile.report import write_html_report
        report["html_report"] = str(write_html_report(report, timelines, report_path))
    if config.json:
        print(json.dumps(report, indent=2))
    else:
        from .render import print_report
        print_report(report)
        print_terms(report["terms"])
        from ..profile.dp_bytes import dp_bytes_lines
        for line in dp_bytes_lines(report["dp_bytes"]):
            print(line)
    return 0


def _dp_bytes(profile_dir: Path, plan, model_name: str) -> dict:
    """Measured (each rank's collective counter) vs predicted data-parallel gradient bytes."""
    from ..profile.dp_bytes import compare_dp_bytes
    from ..spec.load import load_model
    summaries = [json.loads(p.read_text()) for p in sorted(profile_dir.glob("rank*.summary.json"))]
    return compare_dp_bytes(summaries, plan, load_model(model_name))
