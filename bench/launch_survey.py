"""Which shell constructs public launch scripts use, and how often (issue 32, docs/export.md "Import").

Run on a checkout (or a bare mirror) of MindSpeed-LLM / Megatron-LM:

    python bench/launch_survey.py /path/to/MindSpeed-LLM [/path/to/Megatron-LM ...]
    python bench/launch_survey.py --compare /path/to/MindSpeed-LLM ...

``--compare`` reads every training script both ways partita can (the static reader of
partita.imports.shell, and bash itself with shims in place of the launchers,
partita.imports.shell_run - this runs the public scripts, in a scratch directory) and counts the
scripts whose training command line agrees, once the values the static reader names as unknown
(``${NAME}``, ``$1``: bash makes them empty) are dropped.

A training script is a ``.sh`` file under ``examples/`` that launches a ``pretrain_*.py`` /
``posttrain_gpt.py`` entry point; each construct is counted once per file (files using it).
Without --compare it only reads: it prints a table, nothing is written.

``--estimate`` runs ``estimate --from-script`` on each training script as a user would, on the
hardware it ships for (:func:`hardware_for`), and counts the verdicts (issue 32: no shipped
config may be said not to fit unless the output names a feature Partita does not model).
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


def _without_unknowns(argv: list[str], unknown: dict[str, str]) -> list[str]:
    """The argv as bash has it: each marker of an unknown value empty (a word left empty: gone)."""
    out = []
    for tok in argv:
        for marker in unknown:
            tok = tok.replace(marker, "")
        if tok:
            out.append(tok)
    return out


def compare(repo: Path) -> None:
    """Count the scripts of ``repo`` whose launch the static reader and bash read alike."""
    import tempfile
    from partita.imports.shell import ShellError, find_launch, read_script
    from partita.imports.shell_run import run_script
    counts = {"same": 0, "bash does not launch": 0, "different": 0, "static reader refuses": 0}
    scripts = _scripts(repo)
    for name, text in scripts.items():
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / Path(name).name
            path.write_text(text)
            try:
                run = read_script(text, [], {}, path)
            except ShellError:
                counts["static reader refuses"] += 1
                continue
            ran = find_launch(run_script(str(path), [], {}))
        read = find_launch(run)
        if ran is None:
            counts["bash does not launch"] += 1  # an exit on a file of the cluster's (pretrain_gpt.py) absent here
        elif read is not None and _without_unknowns(read[1], run.unknown) == ran[1]:
            counts["same"] += 1
        else:
            counts["different"] += 1
            print(f"  differs: {name}")
    print(f"{repo}: {len(scripts)} training scripts, " + ", ".join(f"{k} {v}" for k, v in counts.items()))


def hardware_for(repo: Path, name: str) -> str:
    """The device a public script ships for: MindSpeed-LLM's A3 examples (``*a3*``) Atlas A3
    (ascend-910c), its other examples Atlas 800T A2 (ascend-910b2, 64 GB), Megatron-LM's H100."""
    if "mindspeed" in str(repo).lower():
        return "ascend-910c" if "a3" in name.lower() else "ascend-910b2"
    return "h100-sxm"


def estimate_all(repo: Path) -> dict[str, int]:
    """``partita estimate --from-script`` on every training script of ``repo`` as a user would run
    it (no flags but the hardware it ships for; the world size and the model from the script), in a
    scratch directory: counts of refused (one line) / no model / fits / does not fit, the last split
    by whether the output names a feature Partita does not model. Prints each file that does not
    fit without naming one, and each refusal."""
    import tempfile
    from partita.errors import PartitaError
    from partita.estimate import estimate
    from partita.imports import load_config
    from partita.spec.hardware import make_cluster
    counts = {"refused": 0, "no model": 0, "fits": 0, "does not fit, names a feature": 0,
              "does not fit, names none": 0}
    for name, text in sorted(_scripts(repo).items()):
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / Path(name).name
            path.write_text(text)
            try:
                read = load_config(str(path))
                if read.model is None:
                    counts["no model"] += 1
                    continue
                est = estimate(read.model, make_cluster(hardware_for(repo, name), read.plan.world_size), read.plan)
            except PartitaError as e:
                counts["refused"] += 1
                print(f"  refused: {name}: {str(e).replace(str(path), '')[:160]}")
                continue
        if est.fits:
            counts["fits"] += 1
        elif read.not_modelled:
            counts["does not fit, names a feature"] += 1
        else:
            counts["does not fit, names none"] += 1
            print(f"  does not fit, names nothing: {name}: {est.peak_memory_gib:.1f} GiB, {read.plan.summary()}")
    print(f"{repo}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return counts


def main(argv: list[str]) -> int:
    if argv[:1] == ["--estimate"]:
        for repo in map(Path, argv[1:]):
            estimate_all(repo)
        return 0
    if argv[:1] == ["--compare"]:
        for repo in map(Path, argv[1:]):
            compare(repo)
        return 0
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
