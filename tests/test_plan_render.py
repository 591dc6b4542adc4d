"""`partita plan` on a narrow terminal (issue 18): at COLUMNS=80 and 120 no line is wider than the
screen and no cell is cut with an ellipsis, every "why not" line names the alternative's full
layout, the memory limit is one named sentence with the headroom, and a device whose efficiencies
are not fitted to measured runs gets a confidence note. Runs the CLI in-process (no torch)."""
import json
import re
from pathlib import Path

import pytest

from partita.cli.main import main

DEFAULT = ["plan"]  # LLaMA-65B on 512 Ascend 910B2
DEEPSEEK = ["plan", "--model", "deepseek-v3", "--hardware", "h800", "--devices", "2048", "--global-batch", "15360",
            "--seq-len", "4096"]  # bench/search_speed.py's scenario
SCENARIOS = {"default": (DEFAULT, 512, "ascend-910b2"), "deepseek-v3": (DEEPSEEK, 2048, "h800")}
CATALOG = Path(__file__).resolve().parents[1] / "src" / "partita" / "catalog" / "devices"
LAYOUT = re.compile(r"\((dp(\d+) tp(\d+)(?:\+sp)? pp(\d+)(?:v\d+|-dualpipev)?(?: cp(\d+))?(?: ep\d+)? z[0-3] mbs\d+x\d+[^)]*)\)")


def _usable_gib(device: str) -> float:
    """The device file's own usable memory (read from the JSON, not through the planner)."""
    path = CATALOG / f"{device}.json"
    while True:
        raw = json.loads(path.read_text())
        if "usable_gib" in raw.get("memory", {}):
            return raw["memory"]["usable_gib"]
        path = CATALOG / f"{raw['extends']}.json"


@pytest.fixture(scope="module")
def screens():
    """Each scenario at each width, run once for all the tests below."""
    return {}


def _screen(screens, monkeypatch, capsys, name: str, columns: int) -> str:
    if (name, columns) not in screens:
        monkeypatch.setenv("COLUMNS", str(columns))
        assert main(SCENARIOS[name][0]) == 0
        screens[(name, columns)] = capsys.readouterr().out
    return screens[(name, columns)]


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_plan_fits_the_screen_and_names_full_layouts(screens, monkeypatch, capsys, name, columns):
    out = _screen(screens, monkeypatch, capsys, name, columns)
    lines = out.splitlines()
    assert len(lines) > 30
    assert max(len(line) for line in lines) <= columns, max(lines, key=len)
    assert "…" not in out and "..." not in out
    # why-not entries: from the "Why not" header to the end; a wrapped entry continues indented deeper
    start = next(i for i, line in enumerate(lines) if line.startswith("Why not"))
    entries: list[str] = []
    for line in lines[start + 1:]:
        if re.match(r"  [a-z]+=", line):
            entries.append(line.strip())
        elif entries and line.strip():
            entries[-1] += " " + line.strip()
    assert len(entries) >= 5
    devices = SCENARIOS[name][1]
    for entry in entries:
        m = LAYOUT.search(entry)
        assert m, entry
        # the layout is a whole plan: its data x tensor x pipeline x context degrees use every device
        dp, tp, pp, cp = int(m[2]), int(m[3]), int(m[4]), int(m[5] or 1)
        assert dp * tp * pp * cp == devices, entry
        assert "step time" in entry or "GiB >" in entry, entry
    # every ranked plan's layout is printed whole, in the table
    assert re.search(r"^\s*1\s+dp\d+ tp\d+", out, re.M)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_memory_limit_names_the_headroom(screens, monkeypatch, capsys, name):
    out = " ".join(_screen(screens, monkeypatch, capsys, name, 80).split())  # undo the wrapping
    # the one limit (partita.uncertainty.MemoryLimit): usable = HBM - reserved, no headroom by
    # default (P(fit) carries the risk), and the risk rule: discarded only below P(fit) 0.05
    m = re.search(r"memory limit: (\d+\.\d) GiB usable \((\d+\.\d) GiB HBM - (\d+\.\d) GiB reserved\); a plan is "
                  r"discarded only when P\(fit\) < 0.05", out)
    assert m, out[:600]
    usable, hbm, reserved = (float(x) for x in m.groups())
    assert usable == pytest.approx(_usable_gib(SCENARIOS[name][2]), abs=0.05)
    assert hbm - reserved == pytest.approx(usable, abs=0.11)


def test_confidence_note_only_where_efficiencies_are_not_fitted(screens, monkeypatch, capsys):
    ascend = " ".join(_screen(screens, monkeypatch, capsys, "default", 80).split())
    h800 = " ".join(_screen(screens, monkeypatch, capsys, "deepseek-v3", 80).split())
    # the Ascend family's tp_overlap is "assumed" in its device file; the H800's fields are fitted or measured
    assert "confidence:" in ascend and "tp_overlap assumed" in ascend and "Ascend MFU is the least certain" in ascend
    assert "confidence:" not in h800
