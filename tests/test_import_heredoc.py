"""The ds_config a launch script writes itself (issue 33): here-documents and ``sed`` over a template
read as bash leaves the file (bash itself is the oracle), and the JSON merged with the Megatron-DeepSpeed
command line as the run merges it (expected values read by hand from the scripts and DeepSpeed's config
semantics: deepspeed/runtime/config.py, runtime/engine.py ``_do_optimizer_sanity_check``)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from partita.errors import PartitaError
from partita.imports import load_config
from partita.imports.shell import read_script

#: What the shell reader must reconstruct: each snippet writes files that bash writes too.
SNIPPETS = {
    "cat heredoc, variables expanded": 'G=32\nM=4\nF=ds.json\ncat <<EOT > $F\n{ "train_batch_size": $G,\n'
                                       '  "m": ${M}, "e": "$((G / M))" }\nEOT\n',
    "quoted delimiter: no expansion": "X=1\ncat <<'EOT' > out.txt\n$X ${X} $((X+1))\nEOT\n",
    "<<- strips leading tabs": 'Z=2\ncat <<-EOT >out.txt\n\t{"stage": $Z}\n\t\tnested\n\tEOT\n',
    "redirection before the here-document, >> appends": 'cat > a.txt <<EOT\none\nEOT\ncat >> a.txt <<"E"\n$two\nE\n',
    "sed over a template, piped": 'B=64\nsed "s/CONFIG_BATCH/${B}/" tpl.json | sed -e "s/ZERO_STAGE/2/g" > c.json\n',
    "sed with -e and a file": 'sed -e "s/CONFIG_BATCH/8/" tpl.json > c.json\n',
}
TEMPLATE = '{"train_batch_size": CONFIG_BATCH, "b": CONFIG_BATCH,\n "zero_optimization": {"stage": ZERO_STAGE}}\n'


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_the_files_are_what_bash_writes(name: str, tmp_path: Path) -> None:
    bash = shutil.which("bash")
    assert bash, "bash is the oracle of these tests"
    run_dir, read_dir = tmp_path / "bash", tmp_path / "read"
    for d in (run_dir, read_dir):
        d.mkdir()
        (d / "tpl.json").write_text(TEMPLATE)
    subprocess.run([bash, "-c", SNIPPETS[name]], cwd=run_dir, check=True, env={"PATH": "/usr/bin:/bin"})
    written = {p.name: p.read_text() for p in run_dir.iterdir() if p.name != "tpl.json"}
    read = read_script(SNIPPETS[name], path=read_dir / "script.sh").files
    assert written and read == written


# microsoft/Megatron-DeepSpeed@f4157be:examples_deepspeed/pretrain_llama2_distributed.sh, trimmed (data, logging,
# learning-rate flags dropped; every line kept that sets the layout, the batch or the ds_config).
LLAMA2 = r"""set -ex
BASE_PATH=./tmp
DS_CONFIG=${BASE_PATH}/deepspeed.json
TP=2
PP=2
ZERO_STAGE=0
GPUS_PER_NODE=8
NNODES=1
MICRO_BATCH_SIZE=4
GLOBAL_BATCH_SIZE=32 # e.g. llama: 4M tokens
activation_checkpoint="false"
cat <<EOT > $DS_CONFIG
{
  "train_batch_size" : $GLOBAL_BATCH_SIZE,
  "train_micro_batch_size_per_gpu": $MICRO_BATCH_SIZE,
  "steps_per_print": 1,
  "zero_optimization": {
    "stage": $ZERO_STAGE
  },
  "bf16": {
    "enabled": true
  }
}
EOT
ds_args=""
ds_args=" --deepspeed ${ds_args}"
ds_args=" --deepspeed_config=$DS_CONFIG ${ds_args}"
ds_args=" --zero-stage=$ZERO_STAGE ${ds_args}"
if [ "${activation_checkpoint}" = "true" ]; then
  ds_args="--deepspeed-activation-checkpointing ${ds_args}"
  ds_args="--recompute-granularity full --recompute-method uniform ${ds_args}"
fi
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES \
       pretrain_gpt.py \
       --tensor-model-parallel-size $TP \
       --pipeline-model-parallel-size $PP \
       --num-layers 24 --hidden-size 2048 --ffn-hidden-size 5504 --num-attention-heads 16 \
       --micro-batch-size $MICRO_BATCH_SIZE \
       --global-batch-size $GLOBAL_BATCH_SIZE \
       --seq-length 2048 --max-position-embeddings 2048 \
       --padded-vocab-size 32000 \
       --bf16 \
       $ds_args
"""


def _no_pipe(text: str) -> str:
    """LLAMA2 on the fork's plain model (ZeRO-2/3 need it: DeepSpeed's pipeline engine refuses them,
    runtime/pipe/engine.py l.77); one stage, as megatron/arguments.py l.94-96 requires."""
    return text.replace("PP=2", "PP=1").replace("       $ds_args", "       --no-pipeline-parallel $ds_args")


def _read(tmp_path: Path, text: str, name: str = "run.sh", **kw):
    path = tmp_path / name
    path.write_text(text)
    return load_config(str(path), **kw)


def test_bf16_at_stage_0_on_the_pipeline_module_is_zero_1(tmp_path: Path) -> None:
    # The JSON: bf16 on, stage 0; --deepspeed without --no-pipeline-parallel builds GPTModelPipe (pretrain_gpt.py
    # l.51), so DeepSpeed's BF16_Optimizer partitions master weights and optimizer states: ZeRO-1.
    plan = _read(tmp_path, LLAMA2).plan
    assert (plan.dp, plan.tp, plan.pp, plan.zero, plan.mbs, plan.gbs, plan.dtype) == (2, 2, 2, 1, 4, 32, "bf16")
    plain = _read(tmp_path, _no_pipe(LLAMA2)).plan
    assert plain.zero == 0  # DDP_BFLOAT16: nothing partitioned


def test_the_engine_runs_the_json_stage_not_the_flag(tmp_path: Path) -> None:
    text = _no_pipe(LLAMA2.replace('"stage": $ZERO_STAGE', '"stage": 3'))  # the JSON says 3, --zero-stage=0
    read = _read(tmp_path, text)
    assert read.plan.zero == 3 and read.plan.overlap_grad_reduce  # overlap_comm unset: on at ZeRO-3
    assert any(n.startswith("--zero-stage 0: the engine runs") for n in read.not_modelled)


def test_the_command_line_batch_wins_the_json_dtype_wins(tmp_path: Path) -> None:
    # training.py l.1252-1258 resets the engine's batch to dp x --micro-batch-size x micro-batches every iteration;
    # the engine casts the parameters to the JSON's dtype (runtime/engine.py _configure_distributed_model).
    text = LLAMA2.replace('"train_batch_size" : $GLOBAL_BATCH_SIZE', '"train_batch_size" : 64').replace(
        "       --bf16 \\\n", "       --fp16 \\\n")
    read = _read(tmp_path, text)
    assert (read.plan.mbs, read.plan.gbs, read.plan.dtype) == (4, 32, "bf16")
    assert any(n.startswith("train_batch_size 64") for n in read.not_modelled)
    assert any(n.startswith("--fp16: ") for n in read.not_modelled)


def test_zero_offload_of_the_json_is_the_optimizer_on_the_host(tmp_path: Path) -> None:
    text = _no_pipe(LLAMA2.replace('"stage": $ZERO_STAGE', '"stage": 2, "offload_optimizer": {"device": "cpu"}'))
    plan = _read(tmp_path, text).plan
    assert (plan.zero, plan.optimizer_offload) == (2, 1.0)
    # Megatron-DeepSpeed@f4157be examples_deepspeed/offload_pp/ds_config_gpt_TEMPLATE.json: ZeRO-3, 30 % offloaded
    # ("ratio", DeepSpeed's partial offload); the script passes --cpu-optimizer beside it
    text = _no_pipe(LLAMA2.replace('"stage": $ZERO_STAGE',
                                   '"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.3}'))
    read = _read(tmp_path, text.replace("       $ds_args", "       --cpu-optimizer $ds_args"))
    assert (read.plan.zero, read.plan.optimizer_offload) == (3, 0.3)
    assert not any("not read" in n for n in read.not_modelled)


@pytest.mark.parametrize("edit, needle", [
    # DeepSpeed's start-up assertion: train_batch_size a multiple of micro x accumulation (runtime/config.py)
    (('"train_batch_size" : $GLOBAL_BATCH_SIZE', '"train_batch_size" : 30'), "DeepSpeed refuses this batch"),
    (('"train_micro_batch_size_per_gpu": $MICRO_BATCH_SIZE', '"train_micro_batch_size_per_gpu": 2'),
     "train_micro_batch_size_per_gpu 2; --micro-batch-size 4 disagrees"),
    (('"stage": $ZERO_STAGE', '"stage": $UNSET_STAGE'), "not JSON when read"),  # bash writes '"stage": ,' too
    (('"stage": $ZERO_STAGE', '"stage": 5'), "zero_optimization.stage"),  # DeepSpeed's stages are 0-3
    # deepspeed runtime/pipe/engine.py l.77: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism", and the
    # fork builds GPTModelPipe under --deepspeed unless --no-pipeline-parallel (pretrain_gpt.py l.51)
    (('"stage": $ZERO_STAGE', '"stage": 2'), "add --no-pipeline-parallel"),
    (('"stage": $ZERO_STAGE', '"stage": 3'), "add --no-pipeline-parallel"),
    (("PP=2", "PP=1"), None),  # one stage is still a PipelineModule: checked in the test body with stage 3
    # megatron/arguments.py l.94-96: pipeline_model_parallel_size must be 1 if pipeline parallel is disabled
    (("       $ds_args", "       --no-pipeline-parallel $ds_args"), "--pipeline-model-parallel-size 2"),
    # deepspeed runtime/zero/config.py offload_ratio_check: "Partial offloading only supported for ZeRO Stage 3."
    (('"stage": $ZERO_STAGE', '"stage": 1, "offload_optimizer": {"device": "cpu", "ratio": 0.5}'),
     "Partial offloading only supported for ZeRO Stage 3"),
])
def test_a_json_the_run_refuses_is_one_line(tmp_path: Path, edit: tuple[str, str], needle: str | None) -> None:
    text = LLAMA2.replace(*edit)
    if needle is None:
        text, needle = text.replace('"stage": $ZERO_STAGE', '"stage": 3'), "add --no-pipeline-parallel"
    with pytest.raises(PartitaError) as e:
        _read(tmp_path, text)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_partial_offload_at_zero_3_without_the_pipeline_reads(tmp_path: Path) -> None:
    # the same ratio the stage-1 case above refuses is DeepSpeed's ZeRO-Offload++ at stage 3
    text = _no_pipe(LLAMA2.replace('"stage": $ZERO_STAGE',
                                   '"stage": 3, "offload_optimizer": {"device": "nvme", "ratio": 0.5}'))
    assert _read(tmp_path, text).plan.optimizer_offload == 0.5


# microsoft/Megatron-DeepSpeed@f4157be:examples_deepspeed/MoE/ds_pretrain_gpt_1.3B_dense_cl.sh l.239-251 (the sed
# over ds_config_gpt_TEMPLATE.json of the same folder) with its command line trimmed to the layout.
TEMPLATE_JSON = """{
  "train_batch_size" : CONFIG_BATCH_SIZE,
  "train_micro_batch_size_per_gpu": CONFIG_MBSIZE,
  "steps_per_print": LOG_INTERVAL,
  "zero_optimization": {
    "stage": ZERO_STAGE
  },
  "gradient_clipping": 1.0,
  "prescale_gradients": PRESCALE_GRAD,
  "fp16": {
    "enabled": CONFIG_FP16_ENABLED,
    "loss_scale": 0
  },
  "bf16": {
    "enabled": CONFIG_BF16_ENABLED
  },
  "wall_clock_breakdown" : false
}
"""
SED = r"""GLOBAL_BATCH_SIZE=256
BATCH_SIZE=4
LOG_INTERVAL=10
ZERO_STAGE=2
template_json="ds_config_gpt_TEMPLATE.json"
config_json="ds_config_gpt_${ZERO_STAGE}.json"
sed "s/CONFIG_BATCH_SIZE/${GLOBAL_BATCH_SIZE}/" ${template_json} \
    | sed "s/CONFIG_MBSIZE/${BATCH_SIZE}/" \
    | sed "s/LOG_INTERVAL/${LOG_INTERVAL}/" \
    | sed "s/ZERO_STAGE/${ZERO_STAGE}/" \
    | sed "s/PRESCALE_GRAD/false/" \
    | sed "s/CONFIG_FP16_ENABLED/true/" \
    | sed "s/CONFIG_BF16_ENABLED/false/" \
      > ${config_json}
deepspeed pretrain_gpt.py --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 \
    --max-position-embeddings 2048 --padded-vocab-size 50304 --micro-batch-size ${BATCH_SIZE} \
    --global-batch-size ${GLOBAL_BATCH_SIZE} --deepspeed --deepspeed_config ${config_json} --fp16 --no-pipeline-parallel
"""


def test_a_sed_template_beside_the_script_gives_the_stage(tmp_path: Path) -> None:
    (tmp_path / "ds_config_gpt_TEMPLATE.json").write_text(TEMPLATE_JSON)
    read = _read(tmp_path, SED, devices=8)
    assert (read.plan.dp, read.plan.zero, read.plan.mbs, read.plan.gbs, read.plan.dtype) == (8, 2, 4, 256, "fp16")
    assert not any("read as 0" in n for n in read.not_modelled)


def test_without_the_template_the_stage_is_said_unknown(tmp_path: Path) -> None:
    read = _read(tmp_path, SED, devices=8)  # the template is not here: the file is not guessed
    assert read.plan.zero == 0 and any("read as 0" in n for n in read.not_modelled)


def test_import_from_names_nanotron_and_internevo(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # a nanotron YAML under a name detection does not take (.txt): --from nanotron reads it as nanotron
    from partita.cli import main
    from partita.cli.main import build_parser
    sub = next(a for a in build_parser()._actions if getattr(a, "choices", None) and "import" in a.choices)
    choices = next(a for a in sub.choices["import"]._actions if "--from" in a.option_strings).choices
    assert {"nanotron", "internevo"} <= set(choices)
    nanotron = Path(__file__).with_name("test_import_survey2_nanotron.py").read_text()
    yaml = nanotron.split('QWEN = """', 1)[1].split('"""', 1)[0]
    (tmp_path / "config.txt").write_text(yaml)
    assert main(["import", "--from", "nanotron", str(tmp_path / "config.txt"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)  # the values test_import_survey2_nanotron.py reads by hand
    assert (out["dp"], out["tp"], out["mbs"], out["gbs"], out["seq_len"]) == (2, 2, 3, 6, 4096)


def test_run_script_keeps_the_config_the_script_wrote(tmp_path: Path) -> None:
    # --run-script: bash itself writes the file in the scratch directory; it is read before that is deleted
    path = tmp_path / "run.sh"
    # BASE_PATH=. : bash cannot write ./tmp/deepspeed.json where ./tmp does not exist (set -e stops the script)
    path.write_text(_no_pipe(LLAMA2.replace('"stage": $ZERO_STAGE', '"stage": 2').replace("BASE_PATH=./tmp", "BASE_PATH=.")))
    read = load_config(str(path), run_script=True)
    assert (read.plan.zero, read.plan.mbs, read.plan.gbs, read.plan.dtype) == (2, 4, 32, "bf16")
