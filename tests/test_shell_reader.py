"""partita.imports.shell (the static reader of launch scripts) against bash itself: each snippet
uses one construct of issue 32's list; bash runs it with shims in place of the launchers
(partita.imports.shell_run, the oracle) and the reader, which runs nothing, must find the same
launch command. Then what the reader cannot know: named, with the flag that supplies it."""
from __future__ import annotations

import pytest

from partita.errors import PartitaError
from partita.imports import load_config
from partita.imports.shell import ShellError, find_launch, read_script
from partita.imports.shell_run import run_script

LAUNCH = "torchrun --nproc_per_node 8 pretrain_gpt.py"
SNIPPETS = {
    "array and +=": 'A=(--tp 2 "--x y")\nA+=(--pp 4)\n' + LAUNCH + ' "${A[@]}"\n',
    "unquoted array splits": 'A=("--fp8-format hybrid" --bf16)\n' + LAUNCH + ' ${A[@]}\n',
    "re-declared with its contents": 'A=(--tp 2)\nA=("${A[@]}" --pp 4)\nS="--a 1"\nS="$S --b 2"\n' + LAUNCH
                                     + ' "${A[@]}" $S\n',
    "defaults": 'TP=${TP:-2}\nPP=${PP:=4}\nE=${EMPTY:-}\nX=${TP:+set}\n' + LAUNCH + ' --tp $TP --pp $PP $E --x $X\n',
    "arithmetic": 'N=2\nG=8\nW=$(($G*$N))\nB=$((W / 3 + 2 ** 3 - (5 % 3)))\n' + LAUNCH + ' --w $W --b $B\n',
    "export and continuations": 'export TP=4\nexport \\\n  PP=2\n' + LAUNCH + ' \\\n  --tp $TP \\\n  --pp ${PP}\n',
    "if elif else": 'M=${1:-mid}\nif [ "$M" == "big" ]; then TP=8\nelif [[ $M == mi* ]]; then TP=4\nelse TP=1\nfi\n'
                    + LAUNCH + ' --tp $TP\n',
    "case": 'S=8B\ncase "$S" in\n  800M) TP=1 ;;\n  8B|70B) TP=4 ;;\n  *) TP=2 ;;\nesac\n' + LAUNCH + ' --tp $TP\n',
    "and or": 'TP=""\n[ -z "$TP" ] && TP=2\n[[ $TP -gt 4 ]] && TP=9 || PP=3\n' + LAUNCH + ' --tp $TP --pp $PP\n',
    "while case shift": 'set -- --tp 4 --other\nwhile [[ $# -gt 0 ]]; do\n  case $1 in\n    --tp) TP="$2"; shift 2 ;;\n    *) shift ;;\n'
                        '  esac\ndone\n' + LAUNCH + ' --tp $TP\n',
    "for loop and function": 'add() { A+=("$@"); }\nfor k in 1 2; do add --k$k $k; done\nfor j in a b c; do\n'
                             '  [ $j = b ] && break\n  A+=(--$j)\ndone\n' + LAUNCH + ' "${A[@]}"\n',
    "trims and case": 'P=/a/b/run_tp4.sh\nN=${P##*/}\nN=${N%.sh}\nT=${N#*_tp}\nU=${N^^}\n' + LAUNCH
                      + ' --tp $T --n $U --len ${#N}\n',
    "command substitution that only prints": 'D=$(dirname /x/y/z.sh)\nB=$(basename /x/y/z.sh .sh)\nE=`echo 3`\n'
                                             + LAUNCH + ' --d $D --b $B --e $E\n',
    "array length and indices": 'IPs=(a b c)\nN=${#IPs[@]}\nfor i in "${!IPs[@]}"; do L=$i; done\n' + LAUNCH
                                + ' --n $N --l $L --first ${IPs[0]}\n',
    "redirection and pipe": LAUNCH + ' --tp 2 2>&1 | tee log.txt\n' + 'echo done > /dev/null\n',
}


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_the_reader_finds_what_bash_runs(tmp_path, name):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\n" + SNIPPETS[name])
    ran = find_launch(run_script(str(script), [], {}))
    read = find_launch(read_script(script.read_text(), [], {}, script))
    assert ran is not None and read == ran


def test_positional_arguments_and_environment_as_bash_takes_them(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text('TP=${1:-2}\nPP=$2\nshift 2\n' + LAUNCH + ' --tp $TP --pp $PP --cp ${CP:-1} "$@"\n')
    args, env = ["8", "4", "--extra", "a b"], {"CP": "2"}
    assert find_launch(read_script(script.read_text(), args, env, script)) == find_launch(run_script(str(script), args, env))


def test_a_sourced_file_that_exists_is_read(tmp_path):
    (tmp_path / "common.sh").write_text("TP=4\nPARALLEL=(--tensor-model-parallel-size $TP)\n")
    script = tmp_path / "run.sh"
    script.write_text('source "$(dirname "$0")/common.sh"\n. ./missing.sh\n' + LAUNCH + ' "${PARALLEL[@]}"\n')
    run = read_script(script.read_text(), [], {}, script)
    assert find_launch(run)[1] == ["--tensor-model-parallel-size", "4"]
    assert "source ./missing.sh" in run.unknown  # named, not fatal


def _load(tmp_path, text: str, **kw):
    script = tmp_path / "run.sh"
    script.write_text(text)
    return load_config(str(script), **kw)


def test_what_cannot_be_known_is_named_with_the_flag_that_supplies_it(tmp_path):
    base = "--pipeline-model-parallel-size 1 --micro-batch-size 1 --global-batch-size 8"
    with pytest.raises(PartitaError, match=r"--tensor-model-parallel-size is \$\{TP\}.*pass --env TP=\.\.\."):
        _load(tmp_path, f"{LAUNCH} --tensor-model-parallel-size $TP {base}\n")
    with pytest.raises(PartitaError, match=r"--tensor-model-parallel-size is \$1.*pass --args"):
        _load(tmp_path, f"{LAUNCH} --tensor-model-parallel-size $1 {base}\n")
    with pytest.raises(PartitaError, match=r"--nnodes is \$\{NNODES\}.*--env NNODES=\.\.\. \(or --devices\)"):
        _load(tmp_path, f"torchrun --nproc_per_node 8 --nnodes $NNODES pretrain_gpt.py {base}\n")
    with pytest.raises(PartitaError, match=r"is \$\(nproc\).*--run-script"):
        _load(tmp_path, f"{LAUNCH} --tensor-model-parallel-size $(nproc) {base}\n")
    plan, _ = _load(tmp_path, f"{LAUNCH} --tensor-model-parallel-size $TP {base} --data-path $DATA\n",
                    env={"TP": "2"})  # $DATA: not read, so not asked for
    assert (plan.tp, plan.dp) == (2, 4)
    plan, _ = _load(tmp_path, f"{LAUNCH} --tensor-model-parallel-size $1 {base}\n", args=["4"])
    assert plan.tp == 4


def test_a_script_the_reader_cannot_follow_is_one_line(tmp_path):
    with pytest.raises(ShellError):
        read_script('A="unterminated\n')
    with pytest.raises(PartitaError, match="cannot follow the script.*--run-script"):
        _load(tmp_path, f'if [ 1 ]; then\n{LAUNCH} --tensor-model-parallel-size 2\n')
    run = read_script(f"while true; do {LAUNCH} --tp 2; sleep 60; done\n")  # a restart loop: stopped, noted
    assert find_launch(run)[1] == ["--tp", "2"] and "stopped after" in run.assumed["a while loop"]
    assert find_launch(read_script(f"while ! {LAUNCH} --tp 2; do sleep 1; done\n"))[1] == ["--tp", "2"]


def test_run_script_runs_no_training_and_writes_only_its_scratch(tmp_path):
    marker = tmp_path / "written"
    script = tmp_path / "run.sh"
    script.write_text(f'python -c "open(\'{marker}\', \'w\')"\nmkdir -p {tmp_path}/made\n'
                      f'{LAUNCH} --tensor-model-parallel-size 2\n')
    run = run_script(str(script), [], {})
    assert run.commands[0][:2] == ["python", "-c"] and find_launch(run)[1] == ["--tensor-model-parallel-size", "2"]
    assert not marker.exists() and not (tmp_path / "made").exists()
    script.write_text("sleep_forever() { while :; do :; done; }\nsleep_forever\n")
    with pytest.raises(ShellError, match="ran over"):
        run_script(str(script), [], {}, timeout_s=1)


def test_the_three_commands_take_args_and_env(tmp_path, capsys):
    import json
    from partita.cli import main
    script = tmp_path / "run.sh"
    script.write_text("TP=${TP:-1}\nPP=${1:-1}\n" + LAUNCH + " --tensor-model-parallel-size $TP "
                      "--pipeline-model-parallel-size $PP --micro-batch-size 1 --global-batch-size 64 --bf16 "
                      "--seq-length 4096\n")
    assert main(["import", str(script), "--json", "--env", "TP=2", "--args", "2"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["tp"], plan["pp"], plan["dp"]) == (2, 2, 2)
    assert main(["estimate", "--from-script", str(script), "--env", "TP=4", "--devices", "8", "--model", "llama3-8b",
                 "--hardware", "h100-sxm", "--json"]) == 0
    assert '"tp": 4' in capsys.readouterr().out
    for bad, says in ((["--env", "TP"], "--env TP: give NAME=VALUE"), (["--args", "'open"], "--args: No closing")):
        assert main(["import", str(script), *bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err


def test_what_a_condition_assumed_is_one_note(tmp_path):
    text = ('if [ "$MODE" == "big" ]; then TP=8; else TP=2; fi\n[ -f pretrain_gpt.py ] || exit 1\n'
            f"{LAUNCH} --tensor-model-parallel-size $TP --micro-batch-size 1 --global-batch-size 64\n")
    read = _load(tmp_path, text)
    assert read.plan.tp == 2 and "$MODE unset" in read.reading_note and "--env MODE=..." in read.reading_note
    assert "[ -f pretrain_gpt.py ] taken as true" in read.reading_note
    read = _load(tmp_path, text, env={"MODE": "big"})
    assert read.plan.tp == 8 and "MODE" not in read.reading_note


def test_an_sbatch_here_document_is_read_as_the_job_runs(tmp_path):
    from partita.imports.shell import launcher_world_size
    script = tmp_path / "submit.sh"
    script.write_text("TP=${TP:-2}\nsbatch --nodes=4 <<EOF\n#!/bin/bash\n#SBATCH --ntasks-per-node=8\n"
                      "srun --mpi=pmix python pretrain_gpt.py --tensor-model-parallel-size $TP\nEOF\n"
                      "cat > ds.json <<'JSON'\n{\"x\": $TP}\nJSON\n")
    read = find_launch(read_script(script.read_text(), [], {}, script))
    ran = find_launch(run_script(str(script), [], {}))  # bash runs the job body through the sbatch shim
    assert read[1] == ran[1] == ["--tensor-model-parallel-size", "2"]
    assert launcher_world_size(read[0]) == 32  # #SBATCH --ntasks-per-node x sbatch --nodes, given to srun


def test_srun_bash_c_is_followed(tmp_path):
    from partita.imports.shell import launcher_world_size
    script = tmp_path / "submit.sh"
    script.write_text('ARGS=(--tensor-model-parallel-size 2)\nCMD="cd /nowhere; python /m/pretrain_gpt.py ${ARGS[@]}"\n'
                      "sbatch <<EOF\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=8\n"
                      'srun --mpi=pmix -l bash -x -c "${CMD}" 2>&1 | tee log\nEOF\n')
    read = find_launch(read_script(script.read_text(), [], {}, script))
    ran = find_launch(run_script(str(script), [], {}))
    assert read[1] == ran[1] == ["--tensor-model-parallel-size", "2"]
    assert launcher_world_size(read[0]) == 16  # the srun around "bash -c" launches the command inside


def test_any_text_is_read_or_refused_in_one_line():
    # the corpus scripts cut short and with shell metacharacters dropped in: read, or one ShellError
    import random
    from pathlib import Path
    corpus = sorted((Path(__file__).parent / "data" / "launch_configs").rglob("*.sh"))
    rng = random.Random(32)
    for path in corpus:
        text = path.read_text()
        variants = [text[:len(text) // 3], text[:len(text) // 2]]
        for _ in range(2):
            chars = list(text)
            for _ in range(6):
                chars[rng.randrange(len(chars))] = rng.choice("\"'`$(){}[];|&\\\n#=<>!*")
            variants.append("".join(chars))
        for variant in variants:
            try:
                read_script(variant, ["a"], {"X": "1"}, path)
            except ShellError:
                pass


def test_estimate_and_plan_json_carry_the_reading_note_and_what_is_not_modelled(tmp_path, capsys):
    # issue 32: what a script's reading assumed and its flags Partita does not model reach --json too
    import json
    from partita.cli import main
    script = tmp_path / "run.sh"
    script.write_text('if [ "$MODE" == "big" ]; then TP=8; else TP=2; fi\n'
                      f"{LAUNCH} --tensor-model-parallel-size $TP --micro-batch-size 1 --global-batch-size 64 "
                      "--seq-length 4096 --bf16 --swap-attention\n")
    common = ["--from-script", str(script), "--model", "llama3-8b", "--hardware", "h100-sxm", "--json"]
    assert main(["estimate", *common]) == 0  # no --devices: the launcher's world size
    out = json.loads(capsys.readouterr().out)
    assert "$MODE unset" in out["reading_note"] and out["not_modelled"][0].startswith("--swap-attention")
    assert main(["plan", *common, "--top", "1"]) == 0
    mine = json.loads(capsys.readouterr().out)["from_script"]
    assert "$MODE unset" in mine["reading_note"] and mine["not_modelled"][0].startswith("--swap-attention")
    assert mine["plan"]["tp"] == 2 and mine["devices"] == out["devices"] == 8
