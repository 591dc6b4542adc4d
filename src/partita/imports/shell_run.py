"""A launch script run under bash with the launchers replaced by shims (``--run-script``, issue 32
item 1): for the scripts the static reader (:mod:`partita.imports.shell`) cannot follow, at the
price of executing the user's script, so only when the user asks for it.

The script runs as ``bash SCRIPT ARGS...`` in a fresh scratch directory (its working directory,
``HOME`` and ``TMPDIR``), with an environment of only ``PATH``, ``HOME``, ``TMPDIR`` and the
user's ``--env`` values, stdin closed and a timeout. ``PATH`` starts with a directory of shims:
each launcher or interpreter (:data:`SHIMS`) records its argv and exits 0, so no training, no
Python and no job submission run; common commands that write or reach the network
(:data:`QUIET`) are shims that do nothing. Other commands are the system's own: a script that
writes to an absolute path or calls a program by its full path still does so, which is why this
mode needs the user's consent. The scratch directory is deleted afterwards.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from .shell import ShellError, ShellRun

#: Commands that would start training or a job: recorded (argv) and not run.
SHIMS = ("torchrun", "python", "python3", "deepspeed", "srun", "mpirun", "mpiexec", "msrun", "accelerate",
         "megatron", "swift", "sbatch", "bsub", "ray", "llamafactory-cli")
#: Commands that write files, reach the network or inspect devices: replaced by no-ops.
QUIET = ("mkdir", "rm", "cp", "mv", "ln", "touch", "tee", "chmod", "chown", "wget", "curl", "git", "pip", "pip3",
         "ssh", "scp", "rsync", "nvidia-smi", "npu-smi", "sleep", "kill", "pkill")
_RECORD = "#!/bin/sh\n{ printf '%s\\0' \"${0##*/}\" \"$@\"; printf '\\036\\0'; } >> \"$PARTITA_SHIM_RECORD\"\nexit 0\n"
_NOOP = "#!/bin/sh\nexit 0\n"
#: ``cmd | tee log``: reads its input to the end (a shim that exited at once would kill cmd with SIGPIPE).
_DRAIN = "#!/bin/sh\ncat > /dev/null\nexit 0\n"
#: sbatch also runs its job script under the same shims (a file argument, else its stdin: a here-document).
#: srun also runs a shell it is given (``srun ... bash -c CMD``) under the same shims.
_SRUN = _RECORD.replace("exit 0\n", 'while [ $# -gt 0 ]; do case "$1" in bash|sh|*/bash|*/sh) exec "$@";; esac; '
                        'shift; done\nexit 0\n')
_SBATCH = _RECORD.replace("exit 0\n", 'for a in "$@"; do last="$a"; done\n'
                          'if [ -n "$last" ] && [ -f "$last" ]; then exec bash "$last"; fi\n'
                          '[ -t 0 ] || exec bash -s\nexit 0\n')
TIMEOUT_S = 20


def run_script(path: str, args: list[str], env: dict[str, str], timeout_s: float = TIMEOUT_S) -> ShellRun:
    """The commands the script at ``path`` calls through the shims, in order (``bash`` must be on PATH)."""
    bash = shutil.which("bash")
    if bash is None:
        raise ShellError("--run-script needs bash, which is not on PATH")
    script = Path(path).resolve()
    with tempfile.TemporaryDirectory(prefix="partita-script-") as scratch:
        shims = Path(scratch) / ".shims"
        shims.mkdir()
        for name in SHIMS + QUIET:
            (shims / name).write_text({"sbatch": _SBATCH, "srun": _SRUN, "tee": _DRAIN}.get(
                name, _RECORD if name in SHIMS else _NOOP))
            (shims / name).chmod(0o755)
        record = Path(scratch) / ".record"
        record.write_bytes(b"")
        base = {"PATH": f"{shims}:/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch,
                "PARTITA_SHIM_RECORD": str(record)}
        try:
            subprocess.run([bash, str(script), *args], cwd=scratch, env={**env, **base}, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise ShellError(f"the script ran over {timeout_s:g} s under --run-script (waiting on something?)") from None
        commands = _commands(record.read_bytes())
        return ShellRun(commands=commands, files=_written_configs(commands, Path(scratch)))


def _written_configs(commands: list[list[str]], scratch: Path) -> dict[str, str]:
    """The ``--deepspeed_config`` files the script wrote inside its scratch directory (read before it is
    deleted; a path outside it is not read), as :attr:`ShellRun.files` holds them for the static reader."""
    out: dict[str, str] = {}
    for argv in commands:
        for i, tok in enumerate(argv):
            name, eq, inline = tok.partition("=")
            if name not in ("--deepspeed_config", "--deepspeed-config") or (not eq and i + 1 >= len(argv)):
                continue
            value = inline if eq else argv[i + 1]
            path = (scratch / value).resolve()
            if path.is_relative_to(scratch.resolve()) and path.is_file() and path.stat().st_size < 1 << 20:
                out[value] = path.read_text(encoding="utf-8", errors="replace")
    return out


def _commands(data: bytes) -> list[list[str]]:
    """Records of ``argv0 NUL arg NUL ... RS NUL`` back into argv lists."""
    out, cur = [], []
    for field in data.split(b"\0"):
        if field == b"\x1e":
            out.append(cur)
            cur = []
        elif field or cur:
            cur.append(field.decode("utf-8", errors="replace"))
    return out
