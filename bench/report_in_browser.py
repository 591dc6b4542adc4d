"""Do the HTML reports render? Write a page, open it in headless Chromium with the network
off, and count what plotly drew.

    apt-get install chromium            # Debian's package; or set CHROMIUM=/path/to/chrome
    python bench/report_in_browser.py [--plan dp=2,tp=2 --nproc 4]   # partita profile --report
    python bench/report_in_browser.py --which plan                   # partita plan --report (no torch)
    python bench/report_in_browser.py --which estimate               # partita estimate --report

profile: passes when every figure rendered an SVG (plotly.js is inline, so no network is
needed), the timeline has a row per rank and the comparison table shows the measured step
time. plan / estimate: every chart of the plan report (partita.report.page.FIGURE_IDS) is
in the page and drew its SVG, the schedule has a row per pipeline rank, plan 1's step time
is in the table, and Chromium logged no console error. Exits 1 otherwise; prints what it
found either way.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def render(page: Path, chromium: str) -> str:
    """The DOM after scripts ran (--dump-dom), in a throw-away profile, offline."""
    return render_logged(page, chromium)[0]


def render_logged(page: Path, chromium: str) -> tuple[str, list[str]]:
    """The DOM after scripts ran, and the page's console errors (Chromium's log on stderr)."""
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                               f"--user-data-dir={profile}", "--proxy-server=127.0.0.1:9", "--virtual-time-budget=10000",
                               "--enable-logging=stderr", "--v=0", "--dump-dom", page.resolve().as_uri()],
                              capture_output=True, text=True, timeout=180, check=False)
    if proc.returncode:
        raise SystemExit(f"chromium failed ({proc.returncode}): {proc.stderr[-1500:]}")
    errors = [line for line in proc.stderr.splitlines() if "CONSOLE" in line and
              re.search(r"error|uncaught|exception", line, re.I)]
    return proc.stdout, errors


PLAN_ARGS = ["plan", "--top", "4", "--tokens", "1.4T"]  # the default scenario: LLaMA-65B on 512 Ascend 910B
ESTIMATE_ARGS = ["estimate", "--model", "llama3-70b", "--hardware", "h100", "--devices", "64", "--global-batch", "64",
                 "--seq-len", "4096", "--tp", "8", "--pp", "4", "--vpp", "2", "--tokens", "15T"]


def check_plan_report(which: str, chromium: str) -> int:
    """``partita plan|estimate --report``: write the page, render it offline, check every chart drew."""
    from partita.report.page import FIGURE_IDS
    args = PLAN_ARGS if which == "plan" else ESTIMATE_ARGS
    page = Path(tempfile.mkdtemp(prefix="partita-report-")) / f"{which}.html"
    js = subprocess.run([sys.executable, "-m", "partita", *args, "--json"], capture_output=True, text=True,
                        timeout=300, check=True).stdout
    proc = subprocess.run([sys.executable, "-m", "partita", *args, "--report", str(page)], capture_output=True,
                          text=True, timeout=300, check=False)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    out = json.loads(js)
    first = out["plans"][0] if which == "plan" else out
    dom, errors = render_logged(page, chromium)
    # each chart's <div> up to the next one: did plotly draw an SVG inside it?
    marks = [(m.start(), m.group(1)) for m in re.finditer(r'<div[^>]*\bid="partita-([a-z-]+?(?:-\d+)?)"', dom)]
    drawn = {name: 'class="main-svg"' in dom[at:(marks[k + 1][0] if k + 1 < len(marks) else len(dom))]
             for k, (at, name) in enumerate(marks)}
    divs = {re.sub(r"-\d+$", "", name) for name in drawn}
    svgs = len(re.findall(r'<svg[^>]*class="main-svg"', dom))
    figures = len(drawn)
    ranks = sorted(set(re.findall(r">rank (\d+)<", dom)), key=int)
    checks = {
        f"every chart in the page ({', '.join(FIGURE_IDS)})": set(FIGURE_IDS) <= divs,
        f"each of the {figures} figures drew its SVG": figures >= len(FIGURE_IDS) and all(drawn.values()),
        f"a schedule row per pipeline rank ({first['plan']['pp']})": len(ranks) >= first["plan"]["pp"],
        f"plan 1's step time {first['step_time_s']:.2f} s in the table": f">{first['step_time_s']:.2f}<" in dom,
        "no console error": not errors,
    }
    print(f"{page} ({page.stat().st_size / 1e6:.1f} MB), rendered by {chromium}: {svgs} plotly SVGs, charts "
          f"{', '.join(sorted(divs))}; schedule rows for ranks {', '.join(ranks)}")
    for line in errors[:5]:
        print("  console:", line[:300])
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--plan", default="dp=2,tp=2")
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--which", choices=["profile", "plan", "estimate"], default="profile",
                   help="which report: partita profile --report (default), plan --report or estimate --report")
    args = p.parse_args()
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        raise SystemExit("no chromium: apt-get install chromium (or set CHROMIUM)")
    if args.which != "profile":
        return check_plan_report(args.which, chromium)
    run_dir = Path(tempfile.mkdtemp(prefix="partita-report-"))
    page = run_dir / "profile.html"
    proc = subprocess.run([sys.executable, "-m", "partita", "profile", "--model", args.model, "--plan", args.plan,
                           "--nproc", str(args.nproc), "--steps", "4", "--json", "--run-dir", str(run_dir),
                           "--report", str(page)], capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    report = json.loads(proc.stdout)
    dom = render(page, chromium)
    svgs = len(re.findall(r'<svg[^>]*class="main-svg"', dom))
    figures = len(re.findall(r'id="partita-fig-\d"', dom))
    rank_rows = sorted(set(re.findall(r">rank (\d+)<", dom)), key=int)
    step_ms = f"{report['overall']['step_time_s'] * 1e3:.1f}"
    checks = {
        "3 figures in the page": figures == 3,
        "each figure drew its SVG": svgs >= 3,
        f"a timeline row per rank ({args.nproc})": len(rank_rows) == args.nproc,
        f"measured step time {step_ms} ms in the table": f">{step_ms}<" in dom,
    }
    print(f"{page} ({page.stat().st_size / 1e6:.1f} MB), rendered by {chromium}: {svgs} plotly SVGs, "
          f"timeline rows for ranks {', '.join(rank_rows)}")
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
