"""The README is a front page whose code map is the tree (issue 31 item 6).

Why: a newcomer finds their way from the README to the code; a map naming a package that
moved sends them nowhere, and a package missing from the map is one they never find. The
figures live in docs/ beside the command that produces each, not in the README.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MAX_LINES = 200


def _code_map() -> list[tuple[str, str]]:
    """(top-level entry, its description) of the ``src/partita/`` block under 'Where the code is'."""
    section = README.split("## Where the code is", 1)[1]
    block = re.search(r"^```\n(.*?)^```$", section, re.S | re.M).group(1)
    lines = block.splitlines()
    assert lines[0] == "src/partita/", lines[0]
    entries = []
    for line in lines[1:]:
        if not line.startswith("  ") or line.startswith("   "):
            break  # the end of src/partita/'s entries (tests/, bench/, ...) or a continuation line
        name, _, desc = line.strip().partition(" ")
        entries.append((name, desc))
    return entries


def test_readme_is_a_front_page() -> None:
    assert len(README.splitlines()) <= MAX_LINES
    first = README.splitlines()[:6]
    assert any(l.startswith("pip install . && partita plan") for l in first), first
    assert any("python -m pytest" in l for l in first), first


def test_code_map_matches_the_tree() -> None:
    src = ROOT / "src" / "partita"
    mapped = {name.rstrip("/") for name, _ in _code_map()}
    for name in mapped:
        assert (src / name).exists(), f"README's code map names src/partita/{name}, which does not exist"
    packages = {p.name for p in src.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= mapped, f"packages missing from README's code map: {sorted(packages - mapped)}"
    for name, desc in _code_map():  # files a package's description names (registry.py, ...) exist in it
        if not name.endswith("/"):
            continue
        for file in re.findall(r"\b([a-z_]+\.py)\b", desc):
            assert (src / name / file).exists(), f"README's code map names src/partita/{name}{file}"
    for other in ("tests/", "bench/", "docs/", "examples/"):
        assert re.search(rf"^{re.escape(other)}\s", README, re.M), other
        assert (ROOT / other).is_dir(), other


def test_every_linked_doc_exists() -> None:
    for link in re.findall(r"\]\(([^)#]+\.md)\)", README):
        assert (ROOT / link).is_file(), link
