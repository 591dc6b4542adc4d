"""Bad input that still got through after issue 16's table (issue 31, "Bad input that still
gets through"), each a one-line error naming what is wrong and what would be right:

* a model whose structure cannot be a model (a zero FFN width, a shared expert of width 0,
  an MLA head of size 0, learned positions without a table) estimated an answer;
* an output file the OS refuses (a 300-character name) ended in ``internal error: OSError``,
  and a failed write could leave a half-written file where the user's old one was;
* ``partita --help`` into a full disk exited 0 when stdout is unbuffered
  (``PYTHONUNBUFFERED=1``, ``python -u``): argparse swallows the write error.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from partita.cli.main import main as partita_main
from partita.errors import PartitaError
from partita.outputs import write_output
from partita.spec.load import load_model, preset_names
from partita.spec.model import ModelSpec

DENSE = {"name": "m", "hidden": 1024, "layers": 4, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096, "vocab": 32000}
MOE = {"num_experts": 8, "top_k": 2, "expert_ffn_hidden": 1024}
MLA = {"q_lora_rank": 0, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128}
ESTIMATE = ["estimate", "--hardware", "h100-sxm", "--devices", "8", "--global-batch", "64"]


def _one_error_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("partita: error: "), err
    assert "internal error" not in err[0] and "Traceback" not in err[0]
    return err[0]


# ------------------------------------------------------------------ 1. the model's structure
@pytest.mark.parametrize("patch, message", [
    ({"ffn_hidden": 0}, "ffn_hidden must be a whole number from 1 to 4,194,304, got 0"),
    ({"ffn_hidden": -4096}, "ffn_hidden must be a whole number from 1 to 4,194,304, got -4096"),
    ({"ffn_hidden": 4096.0}, "ffn_hidden must be a whole number from 1 to 4,194,304, got 4096.0"),
    ({"ffn_hidden": 0, "moe": MOE}, "ffn_hidden must be a whole number from 1 to 4,194,304, got 0"),
    ({"hidden": 0}, "hidden must be a whole number from 1 to 4,194,304, got 0"),
    ({"heads": 0}, "heads must be a whole number from 1 to 65,536, got 0"),
    ({"kv_heads": -1}, "kv_heads must be a whole number from 1 to 65,536, got -1"),
    ({"kv_heads": 3}, "heads (8) must be a multiple of kv_heads (3)"),
    ({"kv_heads": 16}, "heads (8) must be a multiple of kv_heads (16)"),
    ({"layers": 0}, "layers must be a whole number from 1 to 10,000, got 0"),
    ({"layers": 4.5}, "layers must be a whole number from 1 to 10,000, got 4.5"),
    ({"vocab": 0}, "vocab must be a whole number from 1 to 16,777,216, got 0"),
    ({"heads": 7, "kv_heads": 7}, "hidden (1024) is not divisible by heads (7); set head_dim"),
    ({"head_dim": -1}, "head_dim must be a whole number from 0 to 4,194,304, got -1"),
    ({"moe": {**MOE, "top_k": 9}}, "moe.top_k must be in 1..num_experts (8), got 9"),
    ({"moe": {**MOE, "top_k": 0}}, "moe: top_k must be a whole number from 1 to 65,536, got 0"),
    ({"moe": {**MOE, "num_experts": 0}}, "moe: num_experts must be a whole number from 1 to 65,536, got 0"),
    ({"moe": {**MOE, "expert_ffn_hidden": 0}}, "moe: expert_ffn_hidden must be a whole number from 1 to"),
    ({"moe": {**MOE, "layer_freq": 0}}, "moe: layer_freq must be a whole number from 1 to"),
    ({"moe": {**MOE, "shared_experts": 1}},
     "moe.shared_ffn_hidden must be a whole number from 1 to 4,194,304 with moe.shared_experts 1 (each shared "
     "expert's MLP width), got 0"),
    ({"moe": {**MOE, "shared_experts": -1}}, "moe: shared_experts must be a whole number from 0 to"),
    ({"mla": {**MLA, "v_head_dim": 0}}, "mla: v_head_dim must be a whole number from 1 to 4,194,304, got 0"),
    ({"mla": {**MLA, "kv_lora_rank": 0}}, "mla: kv_lora_rank must be a whole number from 1 to 4,194,304, got 0"),
    ({"mla": {**MLA, "qk_nope_head_dim": 0}}, "mla: qk_nope_head_dim must be a whole number from 1 to"),
    ({"mla": {**MLA, "qk_rope_head_dim": 0}}, "mla: qk_rope_head_dim must be a whole number from 1 to"),
    ({"position": "learned"},
     "max_positions must be a whole number from 1 to 4,194,304 with position 'learned' (the learned position "
     "table's length), got 0"),
])
def test_model_structure_is_checked_in_one_place(patch, message):
    with pytest.raises(PartitaError) as e:
        ModelSpec.from_dict({**DENSE, **patch}, "bad.json")
    text = str(e.value)
    assert text.startswith("bad.json: ") and message in text and "\n" not in text, text


@pytest.mark.parametrize("patch", [
    {},  # the base
    {"moe": MOE},  # every layer MoE
    {"moe": {**MOE, "shared_experts": 2, "shared_ffn_hidden": 512, "first_dense_layers": 1, "layer_freq": 2}},
    {"moe": {**MOE, "shared_ffn_hidden": 512}},  # a width for no shared expert is unused (DeepSeek n_shared 0)
    {"mla": MLA}, {"mla": {**MLA, "q_lora_rank": 1536}},
    {"position": "learned", "max_positions": 2048}, {"head_dim": 96, "heads": 7, "kv_heads": 7},
])
def test_sound_models_still_load(patch):
    ModelSpec.from_dict({**DENSE, **patch}, "good.json")


def test_every_preset_still_loads():
    for name in preset_names():
        assert load_model(name).total_params() > 0


def test_estimate_of_a_zero_ffn_model_file_is_one_line(tmp_path, capsys):
    """`partita estimate --model bad.json` with ``ffn_hidden: 0`` printed an estimate (a model
    with no MLP weights) instead of refusing the file."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({k: v for k, v in DENSE.items() if k != "name"} | {"ffn_hidden": 0}))
    assert partita_main(ESTIMATE + ["--model", str(bad)]) == 2
    line = _one_error_line(capsys)
    assert line == f"partita: error: {bad}: ffn_hidden must be a whole number from 1 to 4,194,304, got 0", line


def test_estimate_of_a_shared_expert_without_width_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad-moe.json"
    bad.write_text(json.dumps({k: v for k, v in DENSE.items() if k != "name"}
                              | {"moe": {**MOE, "shared_experts": 1}}))
    assert partita_main(ESTIMATE + ["--model", str(bad)]) == 2
    assert "moe.shared_ffn_hidden must be a whole number from 1" in _one_error_line(capsys)


# ------------------------------------------------------------------ 2. output files
LONG = "a" * 300 + ".html"


def test_write_output_names_the_flag_the_path_and_the_reason(tmp_path):
    with pytest.raises(PartitaError) as e:
        write_output(tmp_path / LONG, "x", "--report")
    text = str(e.value)  # the path cut to 200 characters: one readable line
    assert text == f"cannot write --report {str(tmp_path / LONG)[:197]}...: File name too long", text
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind


def test_write_output_to_a_full_disk_keeps_no_partial_file(tmp_path):
    with pytest.raises(PartitaError) as e:
        write_output("/dev/full", "x" * 100_000, "-o")
    assert str(e.value) == "cannot write -o /dev/full: No space left on device"
    assert Path("/dev/full").exists() and not Path("/dev/full").is_file()  # written to, never replaced


def test_write_output_replaces_a_file_whole_or_not_at_all(tmp_path, monkeypatch):
    """A failure mid-write (a full disk, an interrupt) leaves the user's old file as it was."""
    target = tmp_path / "plan.json"
    target.write_text("old\n")
    os.chmod(target, 0o640)
    real_fsync = os.fsync

    def failing_fsync(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(PartitaError, match="cannot write -o .*plan.json: No space left on device"):
        write_output(target, "new\n", "-o")
    assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert write_output(target, "new\n", "-o") == target
    assert target.read_text() == "new\n" and (target.stat().st_mode & 0o777) == 0o640  # its mode is kept
    fresh = write_output(tmp_path / "fresh.json", "{}\n", "-o")
    umask = os.umask(0)
    os.umask(umask)
    assert (fresh.stat().st_mode & 0o777) == 0o666 & ~umask  # like open(path, "w")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.json", "plan.json"]


def test_write_output_through_a_symlink_writes_the_file_it_names(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    (tmp_path / "link.json").symlink_to(real)
    write_output(tmp_path / "link.json", "new", "-o")
    assert (tmp_path / "link.json").is_symlink() and real.read_text() == "new"


@pytest.mark.parametrize("command", [
    ["estimate", "--model", "llama-7b", "--hardware", "h100-sxm", "--devices", "8", "--global-batch", "64"],
])
def test_report_with_a_300_character_name_is_one_line(tmp_path, monkeypatch, capsys, command):
    """`--report aaa...a.html` (300 characters) ended in `internal error: OSError`."""
    monkeypatch.chdir(tmp_path)
    assert partita_main(command + ["--report", LONG]) == 2
    assert _one_error_line(capsys) == f"partita: error: cannot write --report {LONG[:197]}...: File name too long"


def test_import_output_with_a_300_character_name_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "run.sh"
    script.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 "
                      "--micro-batch-size 1 --global-batch-size 64\n")
    assert partita_main(["import", str(script), "-o", "b" * 300 + ".json"]) == 2
    line = _one_error_line(capsys)
    assert line.startswith("partita: error: ") and "File name too long" in line and "-o b" in line, line


# ------------------------------------------------------------------ 3. --help into a full disk
def _partita_into_full_disk(argv: list[str], unbuffered: bool) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "partita", *argv], stdout=full, stderr=subprocess.PIPE,
                              text=True, env=env, timeout=120)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("argv", [["--help"], ["plan", "--help"], ["estimate", "-h"], ["--version"]])
@pytest.mark.parametrize("unbuffered", [True, False])
def test_help_into_a_full_disk_fails_in_one_line(argv, unbuffered):
    """`partita --help > /dev/full` exited 0 with PYTHONUNBUFFERED=1: argparse's print
    swallows the OSError of an unbuffered write, so the flush after it found nothing to fail."""
    rc, err = _partita_into_full_disk(argv, unbuffered)
    assert (rc, err.strip()) == (2, "partita: error: cannot write the output: No space left on device"), (rc, err)


def test_help_into_a_closed_pipe_is_quiet():
    """A reader that stops early (`partita --help | head -1`) is not an error."""
    proc = subprocess.run(f"{sys.executable} -m partita --help | head -c 1 >/dev/null", shell=True,
                          stderr=subprocess.PIPE, text=True, timeout=120,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stderr == ""


# ------------------------------------------------------------------ 2b. every output file goes through it
def _partita_with_file_limit(argv: list[str], cwd: Path, limit: int = 64) -> tuple[int, str]:
    """``partita argv`` where no file may grow past ``limit`` bytes (RLIMIT_FSIZE; SIGXFSZ
    ignored, so a write past it fails with EFBIG, like a disk that fills up mid-write)."""
    import resource
    import signal

    def limit_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    proc = subprocess.run([sys.executable, "-m", "partita", *argv], cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=limit_files)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("command", ["export", "import"])
def test_output_that_fails_mid_write_keeps_the_old_file(tmp_path, command):
    """`export -o` / `import -o` truncated the user's file, then failed writing: the old plan
    or config was lost. Now the old file stays as it was, and the error names the file."""
    from partita.plan import Plan
    plan = tmp_path / "plan.json"
    Plan(dp=8, gbs=64).to_json(plan)
    script = tmp_path / "run.sh"
    script.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 "
                      "--micro-batch-size 1 --global-batch-size 64\n")
    out = tmp_path / "out.txt"
    out.write_text("old\n")
    argv = ["export", "--to", "megatron", str(plan)] if command == "export" else ["import", str(script)]
    rc, err = _partita_with_file_limit(argv + ["-o", str(out)], tmp_path)
    assert (rc, err.strip()) == (2, f"partita: error: cannot write -o {out}: File too large"), (rc, err)
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt", "plan.json", "run.sh"]  # no temp file left


def test_calibrate_from_profile_output_names_the_file(tmp_path, monkeypatch, capsys):
    """`calibrate --from-profile RUN -o FILE` onto a full disk said "cannot write the output"
    (as if stdout had failed) instead of naming FILE."""
    import partita.calibrate.refine as refine
    monkeypatch.setattr(refine, "refine_from_runs", lambda base, runs, name: {"name": "x"})
    assert partita_main(["calibrate", "--base", "h100-sxm", "--from-profile", str(tmp_path), "-o", "/dev/full"]) == 2
    assert _one_error_line(capsys) == "partita: error: cannot write -o /dev/full: No space left on device"


def test_save_trace_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    """`--save-trace` with a name the OS refuses ended in an internal error after the trace."""
    import argparse

    import partita.spec.traced as traced
    from partita.cli.traced import load_traced
    from partita.tracing import cache

    class Spec:
        def to_json(self, path=None):
            assert path is None, "the spec is written through partita.outputs"
            return "{}"
    monkeypatch.setattr(traced, "is_traced_file", lambda path: False)
    monkeypatch.setattr(traced.TracedSpec, "load", classmethod(lambda cls, path: Spec()))
    monkeypatch.setattr(cache, "cached_path", lambda key: tmp_path / "cached.json")  # a trace read from the cache

    def args(save_trace: str) -> argparse.Namespace:
        return argparse.Namespace(model="my_models:tiny", example_input=["1,8:int64"], tp_plan=None,
                                  save_trace=save_trace)
    long = tmp_path / ("t" * 300 + ".json")
    with pytest.raises(PartitaError) as e:
        load_traced(args(str(long)))
    assert str(e.value).startswith("cannot write --save-trace ") and str(e.value).endswith(": File name too long")
    load_traced(args(str(tmp_path / "ok.json")))
    assert (tmp_path / "ok.json").read_text() == "{}\n"
