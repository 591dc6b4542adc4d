"""Issue 15: Hugging Face checkpoints in and out. Tiny HF models written by transformers'
own ``save_pretrained`` (random weights, sharded safetensors + index) are trained / loaded
by Partita shard by shard; the oracles are transformers itself: the HF model's loss on the
same batch, ``from_pretrained`` of what ``--save-hf`` wrote, and TensorBoard's own reader."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

F = torch.nn.functional
from hf_weights_worker import TEXT, hf_dir  # noqa: E402  (tests/ is on the path: its conftest)
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


def ce(model, x, y) -> float:
    with torch.no_grad():
        return float(F.cross_entropy(model(input_ids=x).logits.flatten(0, 1).float(), y.flatten()))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One `partita train` of the done-when command (fewer steps) on 4 processes, as pp=2,tp=2 (the
    pipeline with tensor + sequence parallel, its eval and its --save-hf, issue: HF pp with tp)."""
    tmp = tmp_path_factory.mktemp("hfrun")
    model = hf_dir(tmp, "llama")
    (tmp / "corpus.txt").write_text(TEXT)
    (tmp / "eval.txt").write_text(TEXT[::-1])
    cmd = [sys.executable, "-m", "partita", "train", "--model", str(model), "--plan", "pp=2,tp=2", "--nproc", "4",
           "--data", str(tmp / "corpus.txt"), "--steps", "6", "--eval-data", str(tmp / "eval.txt"),
           "--eval-every", "3", "--eval-batches", "2", "--save-hf", str(tmp / "out"), "--tensorboard", str(tmp / "tb"),
           "--run-dir", str(tmp / "run"), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    return tmp, model, records, proc.stderr


def _tokens(tmp: Path, model: Path, name: str):
    from partita.train.data import PackedTokens, tokenize_to_file
    path = tokenize_to_file(str(tmp / name), 320, str(tmp / "run"), str(model / "tokenizer.json"))  # the run's cache
    return PackedTokens(path, 64, 0, 320)


def test_first_step_loss_equals_the_hf_models_own(run):
    tmp, model, records, stderr = run
    assert "loaded the weights of" in stderr
    steps = [r for r in records if "event" not in r]
    data = _tokens(tmp, model, "corpus.txt").sequences(0, 8)  # step 0's global batch (gbs 8, seq 64)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    assert steps[0]["loss"] == pytest.approx(ce(hf, data[:, :-1], data[:, 1:]), abs=1e-4)
    assert steps[-1]["loss"] < steps[0]["loss"]


def test_saved_directory_loads_in_transformers_with_partitas_eval_loss(run):
    tmp, model, records, _ = run
    evals = [r for r in records if r.get("event") == "eval"]
    assert [r["step"] for r in evals] == [2, 5]
    summary = records[-1]
    assert summary["event"] == "summary" and summary["eval_loss"] == evals[-1]["eval_loss"]
    assert summary["eval_perplexity"] == pytest.approx(float(torch.tensor(evals[-1]["eval_loss"]).exp()), rel=1e-6)
    out = tmp / "out"
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    trained = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    data = _tokens(tmp, model, "eval.txt")
    losses = [ce(trained, d[:, :-1], d[:, 1:]) for d in (data.sequences(k * 8, 8) for k in range(2))]
    assert sum(losses) / len(losses) == pytest.approx(evals[-1]["eval_loss"], abs=1e-4)


def test_metrics_and_tensorboard_hold_every_step(run):
    tmp, _, _, _ = run
    metrics = [json.loads(l) for l in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "event" not in m]
    assert [m["step"] for m in steps] == list(range(6))
    assert all(m["grad_norm"] > 0 and m["tokens_per_s"] > 0 and m["lr"] == 3e-4 for m in steps)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tmp / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"train/loss", "train/lr", "train/grad_norm", "eval/loss"} <= set(tags)
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(6))
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx([m["loss"] for m in steps], rel=1e-6)


S = "gbs=8,mbs=1,seq_len=16,dtype=fp32"
CASES = ["llama|dp=2,tp=2,zero=3,sp=false," + S, "qwen2|pp=2,dp=2," + S, "mixtral|dp=4,ep=2,zero=1," + S]


#: the cases run in the session's shared 4-process torchrun (tests/conftest.py ``equivalence``):
#: tests/hf_weights_worker.py's ``run_case`` in the processes the equivalence cases started
WORKER = str(Path(__file__).with_name("hf_weights_worker.py"))
EQUIVALENCE_CASES = [(4, 0, case, WORKER) for case in CASES]


@pytest.fixture(scope="module")
def loaded(equivalence):
    """Every (model type, plan) case, in 4 processes (tests/hf_weights_worker.py)."""
    return {case: equivalence["results"][(4, 0, case, WORKER)] for case in CASES}


@pytest.mark.parametrize("case", CASES)
def test_each_rank_loads_its_shards_and_saves_what_transformers_loads(loaded, case):
    r = loaded[case]
    assert r["loss"] == pytest.approx(r["hf_loss"], abs=1e-4), r  # forward through the plan = transformers' own
    assert r["same_names"] and r["max_weight_diff"] == 0.0, r  # save(load(x)) == x, tensor by tensor
    assert "model.safetensors.index.json" in r["files"] and sum(f.endswith(".safetensors") for f in r["files"]) > 1


def test_a_damaged_hf_directory_is_one_line_before_any_worker(tmp_path, capsys, monkeypatch):
    from partita.cli.main import main
    monkeypatch.chdir(tmp_path)
    model = hf_dir(tmp_path, "llama")
    broken = {"header": tmp_path / "header", "shard": tmp_path / "shard", "type": tmp_path / "type"}
    for d in broken.values():
        d.mkdir()
        (d / "config.json").write_text((model / "config.json").read_text())
    (broken["header"] / "model.safetensors").write_bytes(b"garbage")
    (broken["shard"] / "model.safetensors.index.json").write_text((model / "model.safetensors.index.json").read_text())
    first = sorted(model.glob("model-*.safetensors"))[0]
    (broken["shard"] / first.name).write_bytes(first.read_bytes())
    (broken["type"] / "config.json").write_text((model / "config.json").read_text().replace('"llama"', '"gpt2"'))
    (broken["type"] / "model.safetensors").write_bytes(first.read_bytes())
    capsys.readouterr()  # save_pretrained's progress bar
    needles = {"header": "model.safetensors: not a safetensors file",
               "shard": "model.safetensors.index.json names", "type": "model_type 'gpt2' is not supported"}
    for key, needle in needles.items():
        code = main(["train", "--model", str(broken[key]), "--steps", "1"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and needle in err[0], (key, err)
    assert not (tmp_path / "runs").exists()
