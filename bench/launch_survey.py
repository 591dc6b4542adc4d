"""Which shell constructs public launch scripts use, and how often (issue 32, docs/export.md "Import").

Run on a checkout (or a bare mirror) of MindSpeed-LLM / Megatron-LM:

    python bench/launch_survey.py /path/to/MindSpeed-LLM [/path/to/Megatron-LM ...]

A training script is a ``.sh`` file under ``examples/`` that launches a ``pretrain_*.py`` /
``posttrain_gpt.py`` entry point; each construct is counted once per file (files using it).
Read only: it prints a table, nothing is written.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

#: construct -> pattern (re.MULTILINE), in the order of issue 32's list.
CONSTRUCTS = {
    "line continuation \\": r"\\\n",
    "array NAME=( ... )": r"^\s*(?:export\s+|declare\s+-a\s+)?[A-Za-z_]\w*=\(",
    "array append NAME+=( ... )": r"^\s*[A-Za-z_]\w*\+=\(",
    "string append NAME+=...": r"^\s*[A-Za-z_]\w*\+=[^(]",
    "re-declared with own contents": r"^\s*([A-Za-z_]\w*)=\(?\s*\"?\$\{?\1\b",
    "${VAR:-default}": r"\$\{[A-Za-z_]\w*:-",
    "${VAR:=default}": r"\$\{[A-Za-z_]\w*:=",
    "$((arithmetic))": r"\$\(\(",
    "export": r"^\s*export\s",
    "if / else": r"^\s*if\s",
    "case": r"^\s*case\s",
    "positional $1..": r"\$\{?[1-9]",
    "source / .": r"^\s*(?:source|\.)\s+\S",
    "command substitution $(...)": r"\$\((?!\()",
    "for / while loop": r"^\s*(?:for|while)\s",
    "shell function": r"^\s*(?:function\s+)?[A-Za-z_]\w*\s*\(\)\s*\{?",
}
ENTRY = re.compile(r"(pretrain_\w+|posttrain_gpt)\.py")


def _scripts(repo: Path) -> dict[str, str]:
    """path -> text of every training script under examples/ (a work tree, else the git HEAD)."""
    if (repo / "examples").is_dir():
        files = {str(p.relative_to(repo)): p.read_text(errors="replace") for p in (repo / "examples").rglob("*.sh")}
    else:
        names = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "--name-only", "HEAD", "examples"],
                               capture_output=True, text=True, check=True).stdout.split()
        files = {n: subprocess.run(["git", "-C", str(repo), "show", f"HEAD:{n}"], capture_output=True,
                                   text=True, errors="replace").stdout for n in names if n.endswith(".sh")}
    return {n: t for n, t in files.items() if ENTRY.search(t)}


def main(argv: list[str]) -> int:
    for repo in map(Path, argv):
        scripts = _scripts(repo)
        print(f"{repo}: {len(scripts)} training scripts")
        for name, pattern in CONSTRUCTS.items():
            rx = re.compile(pattern, re.MULTILINE)
            n = sum(1 for text in scripts.values() if rx.search(text))
            print(f"  {name:32s} {n:4d}  ({n / max(len(scripts), 1):.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
