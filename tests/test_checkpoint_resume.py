"""Issue 5: checkpoints that reshard across plans, elastic restart after a killed rank, a
crash in the middle of a save, and training on real text."""
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

COMMON = ["--model", "tiny-llama", "--json", "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.1"]


def train_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "partita", "train", *COMMON, *args]


def losses(proc) -> dict[int, float]:
    assert proc.returncode == 0, proc.stderr[-4000:]
    recs = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    return {r["step"]: r["loss"] for r in recs}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Runs without --run-dir go to runs/<timestamp> in the working directory: a temp one."""
    monkeypatch.chdir(tmp_path)


COSINE = ["--plan", "dp=1", "--nproc", "1", "--steps", "8", "--lr-schedule", "cosine", "--lr", "3e-3",
          "--warmup-steps", "2", "--min-lr", "1e-4"]


@pytest.fixture(scope="module")
def _first_runs(tmp_path_factory) -> dict:
    """Every run of this module that needs no other run's output, started together
    (tests/conftest.py run_together: independent launches, each its own run or checkpoint
    directory): name -> (CompletedProcess, its folder). On the 2-core CI machine each launch
    leaves a core idle during its start-up, which the others use.

    - ``whole``: 6 steps with dp=2,tp=2 and no checkpoint, the reference;
    - ``crashed``: dp=2,tp=2 saving after its third step (step 2), every rank dying inside the
      save of step 5: its directory holds one complete checkpoint and one ``.partial`` - what
      the resumed runs start from, and the crash-during-save scenario (one launch for both);
    - ``killed``: rank 1 SIGKILLed at step 4, restarted once from its checkpoint;
    - ``text``: 100 steps of a cosine schedule on the stdlib corpus;
    - ``cosine-whole`` / ``cosine-crashed``: the cosine run uninterrupted and crashed at step 5.
    """
    from conftest import run_together
    from partita.train.data import stdlib_corpus
    d = {k: tmp_path_factory.mktemp(k) for k in ("reference", "ckpt", "killed", "text", "cosine")}
    data = stdlib_corpus(d["text"] / "corpus.txt")
    runs = {
        "whole": (train_cmd("--plan", "dp=2,tp=2", "--nproc", "4", "--steps", "6",
                            "--run-dir", str(d["reference"] / "whole")), {}, d["reference"]),
        "crashed": (train_cmd("--plan", "dp=2,tp=2", "--nproc", "4", "--steps", "6", "--checkpoint-dir", str(d["ckpt"]),
                              "--checkpoint-every", "3"), {"PARTITA_CRASH_IN_SAVE": "5"}, d["ckpt"]),
        "killed": (train_cmd("--plan", "dp=2,tp=2", "--nproc", "4", "--steps", "6", "--checkpoint-dir", str(d["killed"]),
                             "--checkpoint-every", "2", "--max-restarts", "1"),
                   {"PARTITA_CRASH_RANK": "1", "PARTITA_CRASH_STEP": "4", "PARTITA_CRASH_SIGNAL": "KILL"}, d["killed"]),
        "text": ([sys.executable, "-m", "partita", "train", "--model", "tiny-llama", "--plan", "dp=2", "--nproc", "2",
                  "--steps", "100", "--data", str(data), "--lr", "3e-3", "--lr-schedule", "cosine", "--warmup-steps",
                  "20", "--run-dir", str(d["text"] / "run"), "--checkpoint-dir", str(d["text"] / "run"),
                  "--checkpoint-every", "50"], {"OMP_NUM_THREADS": "1"}, d["text"]),
        "cosine-whole": (train_cmd(*COSINE, "--run-dir", str(d["cosine"] / "whole")), {}, d["cosine"]),
        "cosine-crashed": (train_cmd(*COSINE, "--checkpoint-dir", str(d["cosine"] / "ckpt"), "--checkpoint-every", "2"),
                           {"PARTITA_CRASH_RANK": "0", "PARTITA_CRASH_STEP": "5"}, d["cosine"]),
    }
    procs = run_together([cmd for cmd, _, _ in runs.values()], timeout=900, envs=[env for _, env, _ in runs.values()],
                         cwd=d["reference"])
    return {name: (proc, folder) for (name, (_, _, folder)), proc in zip(runs.items(), procs)}


@pytest.fixture(scope="module")
def _reference_runs(_first_runs):
    """(the uninterrupted losses, (checkpoint dir, the crashed checkpointing run))."""
    return losses(_first_runs["whole"][0]), (_first_runs["crashed"][1], _first_runs["crashed"][0])


@pytest.fixture(scope="module")
def uninterrupted(_reference_runs):
    """6 steps with dp=2,tp=2 and no checkpoint: the reference every resumed run must match."""
    return _reference_runs[0]


@pytest.fixture(scope="module")
def first_half(_reference_runs):
    """dp=2,tp=2 with a checkpoint after the third step, crashed inside the save of step 5:
    (its checkpoint directory, its losses); what the resumed runs start from."""
    ckpt, crashed = _reference_runs[1]
    recs = [json.loads(l) for l in crashed.stdout.splitlines() if l.startswith("{")]
    return ckpt, {r["step"]: r["loss"] for r in recs if "loss" in r and "event" not in r}


@pytest.fixture(scope="module")
def crashed_in_save(_reference_runs):
    """The checkpointing run's CompletedProcess (it crashed inside the save of step 5)."""
    return _reference_runs[1][1]


def _own_copy(ckpt: Path, tmp_path: Path) -> Path:
    import shutil
    return Path(shutil.copytree(ckpt, tmp_path / "ckpt"))


RESUMED = {"same-plan": ("dp=2,tp=2", 4), "pp2-dp2": ("pp=2,dp=2", 4), "one-process": ("dp=1", 1),
           "fewer-processes": (None, 2)}  # no --plan: re-planned for 2 processes


@pytest.fixture(scope="module")
def resumed(first_half, _first_runs, tmp_path_factory) -> dict:
    """Every resumed run of the tests below (6 steps from ``first_half``'s checkpoint, each
    on its own copy of it) and the resumed cosine run (8 steps from ``cosine-crashed``'s
    checkpoint), started together (tests/conftest.py run_together: independent launches,
    each its own run and checkpoint directory): id -> (CompletedProcess, its run directory)."""
    from conftest import run_together
    ckpt, _ = first_half
    cmds, dirs = [], []
    for key, (plan, nproc) in RESUMED.items():
        tmp = tmp_path_factory.mktemp(f"resumed-{key}")
        own = _own_copy(ckpt, tmp)  # a resumed run writes its own (final) checkpoints
        cmds.append(train_cmd(*(["--plan", plan] if plan else []), "--nproc", str(nproc), "--steps", "6",
                              "--checkpoint-dir", str(own), "--resume", "--run-dir", str(tmp)))
        dirs.append(tmp)
    cosine = _first_runs["cosine-crashed"][1] / "ckpt"
    cmds.append(train_cmd("--plan", "dp=1", "--nproc", "1", "--steps", "8", "--checkpoint-dir", str(cosine), "--resume"))
    dirs.append(cosine)
    return dict(zip([*RESUMED, "cosine"], zip(run_together(cmds, timeout=600, cwd=ckpt.parent), dirs)))


@pytest.mark.parametrize("key", ["same-plan", "pp2-dp2", "one-process"])
def test_resume_under_another_plan_matches_uninterrupted(uninterrupted, first_half, resumed, key):
    _, first = first_half
    resumed_losses = losses(resumed[key][0])
    assert {0, 1, 2} <= set(first) <= set(range(6)) and sorted(resumed_losses) == [3, 4, 5]
    for step, loss in {**first, **resumed_losses}.items():
        assert loss == pytest.approx(uninterrupted[step], rel=1e-5), step


def test_killed_rank_restarts_from_checkpoint(uninterrupted, _first_runs):
    proc, tmp_path = _first_runs["killed"]  # rank 1 SIGKILLed at step 4, --max-restarts 1 (_first_runs)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resumed from" in proc.stderr
    records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "event" not in r]
    assert steps == [0, 1, 2, 3, 4, 5]  # nothing skipped, nothing repeated
    assert any(r.get("event") == "resume" for r in records)
    final = [r for r in records if r.get("step") == 5][0]["loss"]
    assert final == pytest.approx(uninterrupted[5], rel=1e-5)


def test_crash_during_save_leaves_previous_checkpoint_usable(uninterrupted, first_half, crashed_in_save, resumed):
    # the checkpointing run of _reference_runs died inside the save of step 5 (every rank);
    # each resumed run started from a copy of what it left (RESUMED)
    ckpt, _ = first_half
    assert crashed_in_save.returncode != 0
    names = sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step_"))
    assert names == ["step_00000002", "step_00000005.partial"]
    for key in RESUMED:
        proc = resumed[key][0]
        assert "skipping damaged or partial checkpoint" in proc.stderr and "step_00000005.partial" in proc.stderr, key
    got = losses(resumed["same-plan"][0])
    assert sorted(got) == [3, 4, 5]
    for step, loss in got.items():
        assert loss == pytest.approx(uninterrupted[step], rel=1e-5)


def test_loss_goes_down_on_real_text(_first_runs):
    """100 steps of a cosine schedule on the stdlib corpus (``_first_runs["text"]``): the mean
    of the last 20 losses was measured 2.43 below the mean of the first 10 (the same 1.5 is
    asserted as when this ran 300 steps, three times the time, for 2.9)."""
    proc, tmp_path = _first_runs["text"]
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


def _records(proc) -> dict[int, dict]:
    assert proc.returncode == 0, proc.stderr[-4000:]
    recs = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    return {r["step"]: r for r in recs if "event" not in r}


def test_resumed_cosine_run_has_the_uninterrupted_lr_cadence_and_a_final_checkpoint(_first_runs, resumed):
    # issue 15: a cosine run interrupted at step 5 and resumed with no schedule flags (and
    # the helper's --lr 0.1) has the lr of the uninterrupted run at every step, keeps
    # --checkpoint-every 2 and writes a final checkpoint. The uninterrupted and the crashing
    # run are independent (_first_runs); the resumed one is resumed["cosine"]
    whole, crashed = _first_runs["cosine-whole"][0], _first_runs["cosine-crashed"][0]
    proc, ckpt = resumed["cosine"]
    whole = _records(whole)
    assert crashed.returncode != 0 and "injected crash on rank 0" in crashed.stderr
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
