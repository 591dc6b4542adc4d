"""Issue 31: one registry turns a model name into its spec, builder, vocabulary and family.

The three bugs the spread of that resolution caused, each checked on the path a user takes:
a config-only Hugging Face directory (``config.json``, no weights) is planned by ``--plan auto``
as the model that is really trained, ``--save-hf`` writes it, and a plan the runtime refuses for
the model (now ``--model hf-mixtral --plan tp=2``: HF MoE with sequence parallel; HF cp runs)
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


def test_hf_moe_model_with_sp_is_refused_before_any_process(tmp_path, capsys, monkeypatch):
    # bug 3: the launcher checked a stand-in shape, and the refusal came from a worker
    from partita.cli.main import main
    monkeypatch.chdir(tmp_path)

    def no_process(*args, **kwargs):
        raise AssertionError(f"a process was started: {args[0] if args else kwargs}")
    monkeypatch.setattr(subprocess, "Popen", no_process)
    code = main(["train", "--model", "hf-mixtral", "--plan", "tp=2", "--nproc", "2", "--steps", "1"])  # HF cp runs now
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("partita: error:"), err
    assert "pass sp=false" in err[0], err[0]
    assert not (tmp_path / "runs").exists()


def test_each_kind_of_name_resolves_once(tmp_path, config_only):
    from partita.errors import PartitaError
    from partita.models.registry import resolve_model
    weights = tmp_path / "with-weights"
    weights.mkdir()
    (weights / "config.json").write_text((config_only / "config.json").read_text())
    (weights / "model.safetensors").write_bytes(b"")
    kinds = {name: resolve_model(name) for name in ("tiny-llama", "llama3-8b", "hf-llama", str(config_only),
                                                    str(weights))}
    assert [e.kind for e in kinds.values()] == ["reference", "reference", "hf-tiny", "hf-config", "hf-weights"]
    assert [e.saves_hf for e in kinds.values()] == [False, False, True, True, True]
    assert kinds[str(weights)].weights_dir == str(weights) and kinds[str(config_only)].weights_dir is None
    assert kinds[str(config_only)].source_dir == str(config_only)
    assert type(kinds[str(config_only)].check_model()).__name__ == "LlamaForCausalLM"
    assert kinds["hf-llama"].spec().vocab == kinds["hf-llama"].vocab() == 256
    with pytest.raises(PartitaError, match=r"^unknown model 'hf-lama': did you mean hf-llama") as e:
        resolve_model("hf-lama")
    assert "\n" not in str(e.value)
    with pytest.raises(PartitaError):
        resolve_model("hf-qwen2-moe")  # an equivalence-check model only
    for bad in ("x" * 300, "a\0b"):  # names the system cannot look up: unknown, one line
        with pytest.raises(PartitaError, match="^unknown model"):
            resolve_model(bad)
    assert resolve_model("hf-qwen2-moe", checks=True).kind == "hf-tiny"


def test_resolving_a_preset_and_its_spec_loads_no_torch():
    code = ("import sys\nfrom partita.models.registry import resolve_model\n"
            "e = resolve_model('llama3-8b')\nassert e.spec().layers == 32 and e.vocab() == 128256\n"
            "assert 'torch' not in sys.modules, 'torch loaded'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=ENV)
    assert proc.returncode == 0, proc.stderr
