"""Issue 31: one registry turns a model name into its spec, builder, vocabulary and family.

The three bugs the spread of that resolution caused, each checked on the path a user takes:
a config-only Hugging Face directory (``config.json``, no weights) is planned by ``--plan auto``
as the model that is really trained, ``--save-hf`` writes it, and ``--model hf-llama --plan cp=2``
is refused by the launcher in one line before any process starts."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


@pytest.fixture
def config_only(tmp_path, monkeypatch) -> Path:
    """A directory with a tiny Llama ``config.json`` and no weights (written by transformers)."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "llama-config-only"
    transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                             tie_word_embeddings=False).save_pretrained(out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]
    return out


def test_auto_plans_the_model_that_is_trained_for_a_config_only_directory(config_only, monkeypatch):
    # bug 1: the worker trains LlamaForCausalLM from config.json; --plan auto planned the
    # reference Transformer. The search must see the very class the worker builds.
    import partita.runtime.auto as auto
    from partita.train.config import LaunchConfig, TrainConfig
    from partita.train.resolve import prepare_run
    seen = []
    choose = auto.choose_plan

    def spy(model, *args, **kwargs):
        seen.append(type(model).__name__)
        return choose(model, *args, **kwargs)
    monkeypatch.setattr(auto, "choose_plan", spy)
    run = prepare_run(TrainConfig(model=str(config_only)), LaunchConfig(plan="auto,gbs=8,mbs=1", nproc=2),
                      say=lambda msg: None)
    assert seen == ["LlamaForCausalLM"], seen
    assert run.plan.world_size == 2


def test_save_hf_writes_a_config_only_directory(config_only):
    # bug 2: --save-hf refused the directory it trains as an HF model
    out = config_only.parent / "out"
    cmd = [sys.executable, "-m", "partita", "train", "--model", str(config_only), "--plan", "dp=1", "--nproc", "1",
           "--steps", "1", "--save-hf", str(out), "--run-dir", str(config_only.parent / "run"), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV, cwd=config_only.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    assert type(loaded).__name__ == "LlamaForCausalLM"
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 64


def test_hf_model_with_cp_is_refused_before_any_process(tmp_path, capsys, monkeypatch):
    # bug 3: the launcher checked a stand-in shape, and the refusal came from a worker
    from partita.cli.main import main
    monkeypatch.chdir(tmp_path)

    def no_process(*args, **kwargs):
        raise AssertionError(f"a process was started: {args[0] if args else kwargs}")
    monkeypatch.setattr(subprocess, "Popen", no_process)
    code = main(["train", "--model", "hf-llama", "--plan", "cp=2", "--nproc", "2", "--steps", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("partita: error:"), err
    assert "no cp" in err[0], err[0]
    assert not (tmp_path / "runs").exists()
