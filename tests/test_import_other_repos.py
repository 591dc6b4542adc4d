"""Launch-config forms of repositories Partita was not first developed against (issue 32, held out):
Pai-Megatron-Patch's ``eval ${run_cmd}`` and option strings, FlagScale's Hydra YAML, OpenRLHF's
``read -d '' CMD <<EOF`` and the trainers recognised but not read. Oracles: bash itself (the script run
with shims in place of the launchers), PyYAML for the YAML subset, and the refusal's own words naming
what is missing and the flag that supplies it."""
from __future__ import annotations

from pathlib import Path

import pytest

from partita.errors import PartitaError
from partita.imports import load_config
from partita.imports.flagscale import read_yaml
from partita.imports.shell import find_launch, read_script
from partita.imports.shell_run import run_script

CORPUS = Path(__file__).resolve().parent / "data" / "launch_configs"
MODEL = "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --padded-vocab-size 1024 --seq-length 128"


@pytest.mark.parametrize("text, says", [
    ("system:\n  tensor_model_parallel_size: 2\n   bad: [1, 2\n", "x.yaml:3: not valid YAML"),
    ("- just\n- a list\n", "not a YAML list"),
])
def test_bad_yaml_is_one_line_naming_the_file_and_line(text, says):
    with pytest.raises(PartitaError) as e:
        read_yaml(text, "x.yaml")
    assert says in str(e.value) and "\n" not in str(e.value)


def _both(tmp_path: Path, text: str, args=(), env=None):
    script = tmp_path / "run.sh"
    script.write_text(text)
    static = find_launch(read_script(text, list(args), env or {}, script))
    bash = find_launch(run_script(str(script), list(args), env or {}))
    return static, bash


def test_eval_of_a_built_command_line_reads_as_bash_runs_it(tmp_path):
    # Pai-Megatron-Patch: single quotes inside the double-quoted string survive until eval removes them
    text = ("TP=$1\nmoe=\"--moe-layer-freq '([0]*1+[1]*3)'\"\n"
            "cmd=\"torchrun --nproc_per_node 4 pretrain_gpt.py --tensor-model-parallel-size ${TP} " + MODEL +
            " ${moe}\"\neval ${cmd}\n")
    static, bash = _both(tmp_path, text, ["2"])
    assert static is not None and static == bash
    assert "([0]*1+[1]*3)" in static[1] and "2" in static[1]


def test_read_d_heredoc_holds_the_command_line(tmp_path):
    # OpenRLHF's example scripts: read -r -d '' CMD <<EOF ... EOF, then the launcher with $CMD
    text = ("read -r -d '' args <<EOF\n   --tensor-model-parallel-size 2 \\\n   " + MODEL + " \\\n"
            "   --micro-batch-size ${MBS:-3}\nEOF\ntorchrun --nproc_per_node 2 pretrain_gpt.py $args\n")
    static, bash = _both(tmp_path, text)
    assert static is not None and static == bash
    assert static[1][:2] == ["--tensor-model-parallel-size", "2"] and static[1][-1] == "3"


def test_an_empty_option_string_after_a_switch_flag_is_no_value(tmp_path):
    # sp_options set only under [ $SP = true ] && [ $TP -gt 1 ]: empty at tp 1, right after a switch flag
    script = tmp_path / "run.sh"
    script.write_text("TP=1\nif [ $TP -gt 1 ]; then sp_options=--sequence-parallel; fi\n"
                      f"torchrun --nproc_per_node 8 pretrain_gpt.py {MODEL} --use-distributed-optimizer "
                      "${sp_options} --tensor-model-parallel-size ${TP}\n")
    read = load_config(str(script))
    assert (read.plan.dp, read.plan.zero, read.plan.sp) == (8, 1, False)
    # a value flag whose value is unknown is still one line naming what supplies it
    script.write_text(f"torchrun --nproc_per_node 8 pretrain_gpt.py {MODEL} --tensor-model-parallel-size ${{TPS}}\n")
    with pytest.raises(PartitaError, match=r"--tensor-model-parallel-size .*--env TPS="):
        load_config(str(script))


def test_a_hybrid_mamba_model_is_named_not_read_as_a_transformer(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text(f"torchrun --nproc_per_node 8 pretrain_mamba.py {MODEL} --micro-batch-size 1 --is-hybrid-model "
                      "--hybrid-override-pattern M-M*-M-\n")
    read = load_config(str(script))
    assert read.model is None and "--hybrid-override-pattern" in read.model_note and "--model" in read.model_note


@pytest.mark.parametrize("command,names", [
    ("deepspeed --module openrlhf.cli.train_ppo_ray --actor.num_nodes 1", "openrlhf.cli.train_ppo_ray"),
    ("python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
     "verl.trainer.main_ppo"),
    ("torchrun --nproc_per_node 8 -m verl.trainer.fsdp_sft_trainer data.train_batch_size=256",
     "verl.trainer.fsdp_sft_trainer")])
def test_trainers_recognised_but_not_read_are_named(tmp_path, command, names):
    script = tmp_path / "train.sh"
    script.write_text(command + "\n")
    with pytest.raises(PartitaError) as e:
        load_config(str(script))
    message = str(e.value)
    assert names in message and "--model" in message and "\n" not in message


def test_flagscale_world_size_from_a_hostfile_is_asked_for(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "t.yaml").write_text(
        "system:\n  tensor_model_parallel_size: 2\nmodel:\n  num_layers: 4\n  hidden_size: 256\n"
        "  num_attention_heads: 4\n  seq_length: 128\n  micro_batch_size: 1\n  global_batch_size: 8\n"
        "data:\n  tokenizer:\n    vocab_size: 1000\n")
    exp = tmp_path / "train.yaml"
    exp.write_text("defaults:\n  - train: t\nexperiment:\n  task:\n    backend: megatron\n  runner:\n"
                   "    nnodes: 2\n    nproc_per_node: 8\n    hostfile: /etc/hosts.txt\n")
    with pytest.raises(PartitaError, match=r"hostfile.*pass --devices"):
        load_config(str(exp))
    read = load_config(str(exp), devices=16)
    # vocabulary 1000 padded to a multiple of 128 x tp 2 (Megatron's vocab_size_with_padding)
    assert (read.plan.dp, read.plan.tp, read.model.vocab) == (8, 2, 1024)


def test_a_forks_finetune_entry_point_is_the_launch(tmp_path):
    # Pai-Megatron-Patch's run_finetune_mcore_*.sh launch finetune_mcore_llama_withGA.py; read as a text
    # without its launch, "$4" was taken for the micro-batch size
    script = tmp_path / "run.sh"
    script.write_text("BATCH_SIZE=$1\nTP=$2\ncmd=\"torchrun --nproc_per_node 8 finetune_mcore_llama_withGA.py "
                      f"{MODEL} --micro-batch-size ${{BATCH_SIZE}} --tensor-model-parallel-size ${{TP}}\"\neval $cmd\n")
    read = load_config(str(script), args=["2", "4"])
    assert (read.plan.mbs, read.plan.tp, read.plan.dp) == (2, 4, 2)
    static, bash = _both(tmp_path, script.read_text(), ["2", "4"])
    assert static == bash


@pytest.mark.parametrize("rlhf,listed", [("--rlhf_type grpo", "--rlhf_type grpo"), ("", "--rlhf_type dpo")])
def test_megatron_swift_rlhf_is_named_and_its_model_named(tmp_path, rlhf, listed):
    # ms-swift's `megatron rlhf` (dpo when --rlhf_type is absent) was read silently as supervised training
    script = tmp_path / "rlhf.sh"
    script.write_text(f"NPROC_PER_NODE=4 megatron rlhf {rlhf} --model Qwen/Qwen2.5-7B-Instruct "
                      "--tensor_model_parallel_size 2 --micro_batch_size 1 --global_batch_size 8 --max_length 2048\n")
    read = load_config(str(script))
    assert (read.plan.tp, read.plan.dp) == (2, 2)
    assert any(n.startswith(listed) for n in read.not_modelled)
    assert read.model is None and "Qwen/Qwen2.5-7B-Instruct" in read.model_note and "--model" in read.model_note


def test_openrlhf_refuses_what_it_cannot_read_exactly(tmp_path):
    script = tmp_path / "sft.sh"
    for flags, named in (("--ds.ring_attn_size 2", "--ds.ring_attn_size"), ("--micro_train_batch_size 2", "dotted"),
                         ("--ds.tensor_parallel_size 2", "--ds.tensor_parallel_size")):
        script.write_text(f"deepspeed --num_gpus 8 --module openrlhf.cli.train_sft --train.batch_size 64 {flags}\n")
        with pytest.raises(PartitaError, match=named):
            load_config(str(script))
