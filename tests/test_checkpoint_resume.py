"""Issue 5: checkpoints that reshard across plans, elastic restart after a killed rank, a
crash in the middle of a save, and training on real text."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

COMMON = ["--model", "tiny-llama", "--json", "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.1"]


def train_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "partita", "train", *COMMON, *args]


def train(*args, env=None, timeout=600):
    return subprocess.run(train_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def losses(proc) -> dict[int, float]:
    assert proc.returncode == 0, proc.stderr[-4000:]
    recs = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    return {r["step"]: r["loss"] for r in recs}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Runs without --run-dir go to runs/<timestamp> in the working directory: a temp one."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def _reference_runs(tmp_path_factory):
    """The two independent runs below, started together (tests/conftest.py run_together); the
    uninterrupted one writes its run directory in a temp folder (the module's fixtures run
    before ``_in_tmp``)."""
    from conftest import run_together
    tmp = tmp_path_factory.mktemp("reference")
    ckpt = tmp_path_factory.mktemp("ckpt")
    whole, first = run_together([
        train_cmd("--plan", "dp=2,tp=2", "--nproc", "4", "--steps", "6", "--run-dir", str(tmp / "whole")),
        train_cmd("--plan", "dp=2,tp=2", "--nproc", "4", "--steps", "3", "--checkpoint-dir", str(ckpt),
                  "--checkpoint-every", "3")], timeout=600)
    return losses(whole), (ckpt, losses(first))


@pytest.fixture(scope="module")
def uninterrupted(_reference_runs):
    """6 steps with dp=2,tp=2 and no checkpoint: the reference every resumed run must match."""
    return _reference_runs[0]


@pytest.fixture(scope="module")
def first_half(_reference_runs):
    """3 steps with dp=2,tp=2 and a checkpoint after the third: what the resumed runs start from."""
    return _reference_runs[1]


def _own_copy(ckpt: Path, tmp_path: Path) -> Path:
    import shutil
    return Path(shutil.copytree(ckpt, tmp_path / "ckpt"))


RESUMED = {"same-plan": ("dp=2,tp=2", 4), "pp2-dp2": ("pp=2,dp=2", 4), "one-process": ("dp=1", 1),
           "fewer-processes": (None, 2)}  # no --plan: re-planned for 2 processes


@pytest.fixture(scope="module")
def resumed(first_half, tmp_path_factory) -> dict:
    """Every resumed run of the tests below (6 steps from ``first_half``'s checkpoint, each
    on its own copy of it), started together (tests/conftest.py run_together: independent
    launches, each its own run and checkpoint directory): id -> (CompletedProcess, its run
    directory)."""
    from conftest import run_together
    ckpt, _ = first_half
    cmds, dirs = [], []
    for key, (plan, nproc) in RESUMED.items():
        tmp = tmp_path_factory.mktemp(f"resumed-{key}")
        own = _own_copy(ckpt, tmp)  # a resumed run writes its own (final) checkpoints
        cmds.append(train_cmd(*(["--plan", plan] if plan else []), "--nproc", str(nproc), "--steps", "6",
                              "--checkpoint-dir", str(own), "--resume", "--run-dir", str(tmp)))
        dirs.append(tmp)
    return {key: (proc, d) for key, proc, d in zip(RESUMED, run_together(cmds, timeout=600), dirs)}


@pytest.mark.parametrize("key", ["same-plan", "pp2-dp2", "one-process"])
def test_resume_under_another_plan_matches_uninterrupted(uninterrupted, first_half, resumed, key):
    _, first = first_half
    resumed_losses = losses(resumed[key][0])
    assert sorted(first) == [0, 1, 2] and sorted(resumed_losses) == [3, 4, 5]
    for step, loss in {**first, **resumed_losses}.items():
        assert loss == pytest.approx(uninterrupted[step], rel=1e-5), step


def test_killed_rank_restarts_from_checkpoint(uninterrupted, tmp_path):
    proc = train("--plan", "dp=2,tp=2", "--nproc", "4", "--steps", "6", "--checkpoint-dir", str(tmp_path),
                 "--checkpoint-every", "2", "--max-restarts", "1",
                 env={"PARTITA_CRASH_RANK": "1", "PARTITA_CRASH_STEP": "4", "PARTITA_CRASH_SIGNAL": "KILL"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resumed from" in proc.stderr
    records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "event" not in r]
    assert steps == [0, 1, 2, 3, 4, 5]  # nothing skipped, nothing repeated
    assert any(r.get("event") == "resume" for r in records)
    final = [r for r in records if r.get("step") == 5][0]["loss"]
    assert final == pytest.approx(uninterrupted[5], rel=1e-5)


def test_crash_during_save_leaves_previous_checkpoint_usable(uninterrupted, tmp_path):
    crashed = train("--plan", "dp=2,tp=2", "--nproc", "4", "--steps", "6", "--checkpoint-dir", str(tmp_path),
                    "--checkpoint-every", "2", env={"PARTITA_CRASH_IN_SAVE": "3"})
    assert crashed.returncode != 0
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step_"))
    assert names == ["step_00000001", "step_00000003.partial"]
    resumed = train("--plan", "dp=2,tp=2", "--nproc", "4", "--steps", "6", "--checkpoint-dir", str(tmp_path), "--resume")
    assert "skipping damaged or partial checkpoint" in resumed.stderr and "step_00000003.partial" in resumed.stderr
    got = losses(resumed)
    assert sorted(got) == [2, 3, 4, 5]
    for step, loss in got.items():
        assert loss == pytest.approx(uninterrupted[step], rel=1e-5)


def test_loss_goes_down_on_real_text(tmp_path):
    """100 steps of a cosine schedule on the stdlib corpus: the mean of the last 20 losses
    was measured 2.43 below the mean of the first 10 (the same 1.5 is asserted as when
    this ran 300 steps, three times the time, for 2.9)."""
    from partita.train.data import stdlib_corpus
    data = stdlib_corpus(tmp_path / "corpus.txt")
    proc = subprocess.run([sys.executable, "-m", "partita", "train", "--model", "tiny-llama", "--plan", "dp=2",
                           "--nproc", "2", "--steps", "100", "--data", str(data), "--lr", "3e-3",
                           "--lr-schedule", "cosine", "--warmup-steps", "20", "--run-dir", str(tmp_path / "run"),
                           "--checkpoint-dir", str(tmp_path / "run"), "--checkpoint-every", "50"],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "done: 100 steps" in proc.stdout
    records = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses_ = [r["loss"] for r in records if "loss" in r]
    assert len(losses_) == 100
    first = sum(losses_[:10]) / 10
    last = sum(losses_[-20:]) / 20
    assert first > 5.0            # ~ln(256) at initialisation
    assert last < first - 1.5     # it learned the text
    assert any((tmp_path / "run").glob("tokenizer-*.json"))  # a real BPE was trained on the corpus


def test_resume_on_fewer_processes_replans_keeping_the_global_batch(uninterrupted, resumed):
    proc = resumed["fewer-processes"][0]
    assert "re-planned for 2 keeping global batch 8" in proc.stderr
    got = losses(proc)
    assert sorted(got) == [3, 4, 5]
    for step, loss in got.items():
        assert loss == pytest.approx(uninterrupted[step], rel=1e-5)


COSINE = ["--plan", "dp=1", "--nproc", "1", "--steps", "8", "--lr-schedule", "cosine", "--lr", "3e-3",
          "--warmup-steps", "2", "--min-lr", "1e-4"]


def _records(proc) -> dict[int, dict]:
    assert proc.returncode == 0, proc.stderr[-4000:]
    recs = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    return {r["step"]: r for r in recs if "event" not in r}


def test_resumed_cosine_run_has_the_uninterrupted_lr_cadence_and_a_final_checkpoint(tmp_path, together):
    # issue 15: a cosine run interrupted at step 5 and resumed with no schedule flags (and
    # the helper's --lr 0.1) has the lr of the uninterrupted run at every step, keeps
    # --checkpoint-every 2 and writes a final checkpoint. The uninterrupted and the crashing
    # run are independent: started together (tests/conftest.py run_together)
    ckpt = tmp_path / "ckpt"
    whole, crashed = together([
        train_cmd(*COSINE, "--run-dir", str(tmp_path / "whole")),
        train_cmd(*COSINE, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2")], timeout=600,
        envs=[{}, {"PARTITA_CRASH_RANK": "0", "PARTITA_CRASH_STEP": "5"}])
    whole = _records(whole)
    assert crashed.returncode != 0 and "injected crash on rank 0" in crashed.stderr
    proc = train("--plan", "dp=1", "--nproc", "1", "--steps", "8", "--checkpoint-dir", str(ckpt), "--resume")
    resumed = _records(proc)
    assert "resumed from" in proc.stderr and "schedule" in proc.stderr  # the --lr 0.1 flag is named as not used
    assert sorted(resumed) == [4, 5, 6, 7]
    logged = [json.loads(l) for l in (ckpt / "metrics.jsonl").read_text().splitlines()]
    by_step = {r["step"]: r for r in logged if "event" not in r}
    assert [r["step"] for r in logged if "event" not in r] == list(range(8))  # rewound to step 3, then 4..7
    lrs = [whole[s]["lr"] for s in range(8)]
    assert lrs[0] < lrs[1] == 3e-3 > lrs[7] > 1e-4  # warm-up, then cosine decay
    for step in range(8):
        assert by_step[step]["lr"] == pytest.approx(whole[step]["lr"], rel=1e-12), step
        assert by_step[step]["loss"] == pytest.approx(whole[step]["loss"], rel=1e-5), step
    steps = sorted(p.name for p in ckpt.glob("step_*"))
    assert steps == ["step_00000005", "step_00000007"]  # cadence 2 kept (5), the final one (7); keep 2
