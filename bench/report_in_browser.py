"""Does the `partita profile --report` page render? Profile a plan, open the page in
headless Chromium with the network off, and count what plotly drew.

    apt-get install chromium            # Debian's package; or set CHROMIUM=/path/to/chrome
    python bench/report_in_browser.py [--plan dp=2,tp=2 --nproc 4]

Passes when every figure rendered an SVG (plotly.js is inline, so no network is needed),
the timeline has a row per rank and the comparison table shows the measured step time.
Exits 1 otherwise; prints what it found either way.
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
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                               f"--user-data-dir={profile}", "--proxy-server=127.0.0.1:9", "--virtual-time-budget=10000",
                               "--dump-dom", page.resolve().as_uri()],
                              capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode:
        raise SystemExit(f"chromium failed ({proc.returncode}): {proc.stderr[-1500:]}")
    return proc.stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--plan", default="dp=2,tp=2")
    p.add_argument("--nproc", type=int, default=4)
    args = p.parse_args()
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        raise SystemExit("no chromium: apt-get install chromium (or set CHROMIUM)")
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
