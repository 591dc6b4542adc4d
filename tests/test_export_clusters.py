"""The launch artefacts of a plan (issue 34 item 2): ``partita export --to slurm`` (an sbatch
script) and ``--to k8s-trainjob | k8s-pytorchjob | k8s-ascendjob`` (Kubernetes manifests).

Oracles, none of them ours:
- the operators' own CRD schemas (``../shared/data/k8s/``, sources in its SOURCES.md: Kubeflow
  Trainer's TrainJob, the Training Operator's PyTorchJob, MindCluster's AscendJob), checked with
  ``jsonschema`` in strict mode: every object that lists its properties refuses any other
  (``additionalProperties: false`` added where the CRD leaves it open, except under
  ``x-kubernetes-preserve-unknown-fields``), and a manifest with one unknown field is refused, so
  the strictness is shown to bite;
- ``bash -n`` for the script's syntax, and bash itself running the script with stand-ins for
  ``srun`` and ``scontrol`` that record the command a node would run;
- ``partita train``'s own argument parser and :meth:`Plan.parse` reading the command inside each
  artefact back: the plan it trains is the plan exported.

Submitting the script to a real Slurm and watching it complete is in S1's Slurm tests (issue 34
item 4), which start the local slurmctld/slurmd.
"""
from __future__ import annotations

import argparse
import copy
import os
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import SHARED
from partita.cli import main
from partita.errors import PartitaError
from partita.export import export
from partita.export.context import ExportContext
from partita.export.jobs import JobOptions
from partita.export.k8s import K8sOptions, ascendjob_manifest, pytorchjob_manifest, trainjob_manifest
from partita.export.slurm import SlurmOptions, render_sbatch
from partita.plan import Plan
from partita.spec.hardware import make_cluster

yaml = pytest.importorskip("yaml")
jsonschema = pytest.importorskip("jsonschema")

K8S = SHARED / "data" / "k8s"
CRDS = {"TrainJob": "trainjobs.crd.yaml", "PyTorchJob": "pytorchjobs.crd.yaml", "AscendJob": "ascendjob.crd.yaml"}
PLAN = Plan.parse("dp=4,tp=4,gbs=32,seq_len=1024")


def strict(schema: dict) -> dict:
    """``schema`` with ``additionalProperties: false`` on every object that lists properties and
    says nothing of others (and is not ``x-kubernetes-preserve-unknown-fields``)."""
    out = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(out)
    return out


_SCHEMAS: dict[str, object] = {}


def validator(kind: str):
    """A Draft 7 validator of the strict openAPIV3Schema of ``kind``'s CRD (its storage version)."""
    if kind not in _SCHEMAS:
        path = K8S / CRDS[kind]
        if not path.is_file():
            pytest.skip(f"{path} is not here")
        crd = next(d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "CustomResourceDefinition"
                   and d["spec"]["names"]["kind"] == kind)
        version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
        _SCHEMAS[kind] = (f"{crd['spec']['group']}/{version['name']}",
                          jsonschema.Draft7Validator(strict(version["schema"]["openAPIV3Schema"])))
    return _SCHEMAS[kind]


def errors(doc: dict) -> list[str]:
    api_version, v = validator(doc["kind"])
    assert doc["apiVersion"] == api_version
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in v.iter_errors(doc)]


def _ctx(hardware: str, nodes: int = 2, per_node: int = 8, plan: Plan = PLAN, job: JobOptions | None = None):
    return ExportContext(plan, None, make_cluster(hardware, nodes * per_node, per_node), job)


MANIFESTS = [(trainjob_manifest, "h100-sxm"), (trainjob_manifest, "ascend-910b2"), (trainjob_manifest, "cpu"),
             (pytorchjob_manifest, "h100-sxm"), (pytorchjob_manifest, "ascend-910b3"), (pytorchjob_manifest, "cpu"),
             (ascendjob_manifest, "ascend-910b2"), (ascendjob_manifest, "ascend-910c"),
             (ascendjob_manifest, "ascend-910")]
OPTIONS = [K8sOptions(), K8sOptions(name="llama-8b", namespace="ml", image="registry.example/partita:1",
                                    pvc="shared-rwx", env={"NCCL_SOCKET_IFNAME": "eth0"}, queue="training")]


@pytest.mark.parametrize("target,hardware", [("k8s-trainjob", "h100-sxm"), ("k8s-pytorchjob", "cpu"),
                                             ("k8s-ascendjob", "ascend-910b2")])
def test_manifest_text_is_the_yaml_of_its_documents(target, hardware):
    """The manifest text (written without PyYAML, which partita does not depend on) reads back
    with PyYAML as the documents the exporter built, quotes and all."""
    job = JobOptions(name="q-run", image="reg.example:5000/partita:it's", env={"A": "true", "B": "0,1", "C": "x: y"},
                     train_args=("--model", "tiny-llama", "--run-dir", "/data/run dir"))
    e = export(target, PLAN, None, make_cluster(hardware, 16, 8), job)
    assert list(yaml.safe_load_all(e.text)) == e.data
    assert errors(the_job(e.data)) == []


def the_job(docs: list[dict]) -> dict:
    return next(d for d in docs if d["kind"] in CRDS)


@pytest.mark.parametrize("options", OPTIONS, ids=["defaults", "all-options"])
@pytest.mark.parametrize("build,hardware", MANIFESTS, ids=[f"{b.__name__}-{h}" for b, h in MANIFESTS])
def test_manifest_is_accepted_by_its_crd_schema_in_strict_mode(build, hardware, options):
    per_node = 16 if hardware == "ascend-910c" else 8
    plan = Plan.parse(f"dp={2 * per_node // 4},tp=4")
    docs, _ = build(_ctx(hardware, 2, per_node, plan), ["--model", "tiny-llama", "--steps", "5"], options)
    assert errors(the_job(docs)) == []


@pytest.mark.parametrize("build,hardware", [(trainjob_manifest, "h100-sxm"), (pytorchjob_manifest, "h100-sxm"),
                                            (ascendjob_manifest, "ascend-910b2")])
def test_an_unknown_field_is_refused(build, hardware):
    """The strict check bites: one field the operator does not know, in the job's spec or deep
    in the pod's container, is an error (and the CRD as shipped would have let the second pass)."""
    docs, _ = build(_ctx(hardware), None, OPTIONS[1])
    job = the_job(docs)
    job["spec"]["nodeCount"] = 2
    assert any("'nodeCount' was unexpected" in e for e in errors(job))
    job = copy.deepcopy(the_job(docs))
    container = (job["spec"]["trainer"] if job["kind"] == "TrainJob" else
                 next(iter((job["spec"].get("pytorchReplicaSpecs") or job["spec"]["replicaSpecs"]).values()))
                 ["template"]["spec"]["containers"][0])
    container["gpus"] = 8
    assert any("'gpus' was unexpected" in e for e in errors(job))


def train_args(argv: list[str]) -> argparse.Namespace:
    """``partita ... train ARGS`` read by partita train's own parser."""
    from partita.cli import train
    parser = argparse.ArgumentParser()
    train.add_parser(parser.add_subparsers())
    return parser.parse_args(argv[argv.index("train"):])


def command_of(job: dict) -> list[str]:
    """The argv each node's container runs (the AscendJob's bash -c line split as bash would,
    after the CANN environment is sourced)."""
    if job["kind"] == "TrainJob":
        return job["spec"]["trainer"]["command"]
    spec = job["spec"].get("pytorchReplicaSpecs") or job["spec"]["replicaSpecs"]
    commands = [r["template"]["spec"]["containers"][0] for r in spec.values()]
    assert all(c == commands[0] for c in commands)  # master and workers run the same command
    c = commands[0]
    if c["command"][:2] == ["/bin/bash", "-c"]:
        line = c["args"][0]
        return shlex.split(line[line.index("exec ") + 5:])
    return c["command"]


@pytest.mark.parametrize("build,hardware,device,endpoint", [
    (trainjob_manifest, "h100-sxm", "cuda", "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)"),
    (pytorchjob_manifest, "cpu", "cpu", "$(MASTER_ADDR):$(MASTER_PORT)"),
    (ascendjob_manifest, "ascend-910b2", "npu", "$MASTER_ADDR:$MASTER_PORT")])
def test_the_manifests_command_trains_the_exported_plan(build, hardware, device, endpoint):
    plan = Plan.parse("dp=6,tp=4,gbs=48")
    docs, _ = build(_ctx(hardware, 3, plan=plan), ["--model", "llama-8b", "--steps", "7"], OPTIONS[1])
    args = train_args(command_of(the_job(docs)))
    assert Plan.parse(args.plan).to_dict() == plan.to_dict()
    assert (args.model, args.steps, args.nnodes, args.nproc, args.device) == ("llama-8b", 7, 3, 8, device)
    assert (args.rdzv_endpoint, args.rdzv_id) == (endpoint, "llama-8b")
    assert (args.run_dir, args.checkpoint_dir) == ("/mnt/partita/llama-8b/run", "/mnt/partita/llama-8b/checkpoints")


def test_the_ascendjob_carries_minclusters_settings():
    """Labels, gang scheduling, the rank-table ConfigMap mounted where the Ascend Operator writes
    hccl.json, the NPU resource and HCCL environment (MindCluster's acjob parameters)."""
    configmap, job = ascendjob_manifest(_ctx("ascend-910b2", 4, plan=Plan.parse("dp=8,tp=4")), None, OPTIONS[1])[0]
    assert job["metadata"]["labels"] == {"framework": "pytorch", "ring-controller.atlas": "ascend-910b",
                                         "tor-affinity": "null"}
    assert job["spec"]["schedulerName"] == "volcano"
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 4, "queue": "training"}
    reps = job["spec"]["replicaSpecs"]
    assert (reps["Master"]["replicas"], reps["Worker"]["replicas"]) == (1, 3)
    pod = reps["Worker"]["template"]
    assert pod["metadata"]["labels"]["ring-controller.atlas"] == "ascend-910b"
    container = pod["spec"]["containers"][0]
    assert container["name"] == "ascend" and container["ports"] == [{"containerPort": 2222, "name": "ascendjob-port"}]
    assert container["resources"]["requests"] == container["resources"]["limits"] == {"huawei.com/Ascend910": 8}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RANK_TABLE_FILE"] == "/user/serverid/devindex/config/hccl.json"
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7" and int(env["HCCL_CONNECT_TIMEOUT"]) >= 120
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/user/serverid/devindex/config")
    assert volumes[mount["name"]]["configMap"]["name"] == configmap["metadata"]["name"] == "rings-config-llama-8b"
    assert configmap["metadata"]["labels"] == {"ring-controller.atlas": "ascend-910b"}
    assert configmap["metadata"]["namespace"] == job["metadata"]["namespace"] == "ml"


def test_the_ascendjob_refuses_a_gpu():
    with pytest.raises(PartitaError, match="k8s-ascendjob runs on Ascend NPUs; h100-sxm is not one"):
        ascendjob_manifest(_ctx("h100-sxm"))


# ---------------------------------------------------------------- Slurm


def test_sbatch_header_per_device():
    gpu = render_sbatch(PLAN, 2, 8, "cuda", ["--model", "tiny-llama"],
                        SlurmOptions(time="02:00:00", partition="gpu", account="proj"))
    header = [line for line in gpu.splitlines() if line.startswith("#SBATCH")]
    assert header == ["#SBATCH --job-name=partita", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                      "#SBATCH --gpus-per-node=8", "#SBATCH --time=02:00:00", "#SBATCH --partition=gpu",
                      "#SBATCH --account=proj", "#SBATCH --output=partita-%x-%j.out"]
    cpu = render_sbatch(Plan.parse("dp=4"), 2, 2, "cpu", ["--model", "tiny-llama"])
    assert "gpus" not in cpu and "gres" not in cpu and "NCCL" not in cpu and "HCCL" not in cpu
    npu = render_sbatch(PLAN, 2, 8, "npu", ["--model", "tiny-llama"])
    assert "#SBATCH --exclusive" in npu and "export ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in npu
    assert "export HCCL_CONNECT_TIMEOUT=" in npu and "set_env.sh" in npu
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1' in npu


@pytest.mark.parametrize("accelerator", ["cuda", "npu", "cpu"])
@pytest.mark.parametrize("image", [None, "nvcr.io#nvidia/pytorch:24.05-py3"])
def test_sbatch_script_is_valid_bash(tmp_path, accelerator, image):
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(PLAN, 2, 8, accelerator, ["--model", "tiny-llama", "--run-dir", "/shared/r x"],
                                    SlurmOptions(image=image, container_mounts="/shared:/shared")))
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("image", [None, "nvcr.io#nvidia/pytorch:24.05-py3"])
def test_sbatch_script_runs_partita_train_with_the_exported_plan(tmp_path, image):
    """bash runs the script as sbatch would on the first node, with stand-ins for scontrol (the
    allocation's hosts, a long list) and srun (records its argv, one word a line): each node runs partita
    train with the plan exported, the c10d rendezvous at the first node's address keyed by the
    job id."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # show hostnames: a long host list (head -n1 closes the pipe early: SIGPIPE must not fail the
    # script); show node: the first node's record, its NodeAddr the rendezvous host
    _stub(bin_dir, "scontrol", 'if [ "$1 $2" = "show node" ]; then\n'
                               '  echo "NodeName=$3 Arch=x86_64 CoresPerSocket=4"\n'
                               '  echo "   NodeAddr=10.1.2.3 NodeHostName=$3 Version=23.02.6"\n'
                               'else printf "node-a\\nnode-b\\n"; seq 200000 | sed "s/^/node-x/"; fi\n')
    _stub(bin_dir, "srun", f'printf "%s\\n" "$@" > {shlex.quote(str(tmp_path / "srun.argv"))}\n')
    plan = Plan.parse("dp=8,pp=2,gbs=64,mbs=2,recompute=full")
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(plan, 2, 8, "cuda", ["--model", "tiny-llama", "--steps", "3"],
                                    SlurmOptions(image=image, env={"NCCL_SOCKET_IFNAME": "ib0"})))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "node-[a-b]"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    argv = (tmp_path / "srun.argv").read_text().splitlines()
    srun_opts = argv[:argv.index("partita")]
    assert "--ntasks-per-node=1" in srun_opts and "--nodes=2" in srun_opts
    assert (f"--container-image={image}" in srun_opts) == bool(image)
    args = train_args(argv)
    assert Plan.parse(args.plan).to_dict() == plan.to_dict()
    assert (args.nnodes, args.nproc, args.device, args.steps) == (2, 8, "cuda", 3)
    assert (args.rdzv_endpoint, args.rdzv_id) == ("10.1.2.3:29742", "4242")


def test_sbatch_script_stops_when_the_allocation_names_no_host(tmp_path):
    """An empty node list (scontrol prints nothing) stops the script with a message before srun,
    not a rendezvous endpoint ':PORT' that every node waits on."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir, "scontrol", "true\n")
    _stub(bin_dir, "srun", f"touch {shlex.quote(str(tmp_path / 'srun.ran'))}\n")
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(PLAN, 2, 8, "cuda", ["--model", "tiny-llama"]))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": ""}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode != 0 and "no host in SLURM_JOB_NODELIST" in done.stderr
    assert not (tmp_path / "srun.ran").exists()


@pytest.mark.parametrize("kwargs,message", [
    ({"nodes": 3}, "the plan needs 16 devices but the job has 3 node"),
    ({"train_args": ["--model", "x", "--plan", "dp=2"]}, "--plan is written by the launch artefact"),
    ({"train_args": ["--nnodes=2"]}, "--nnodes is written by the launch artefact"),
    ({"options": SlurmOptions(time="two hours")}, "--time 'two hours' is not a Slurm time"),
    ({"options": SlurmOptions(partition="gpu; rm -rf /")}, "--partition 'gpu; rm -rf /'"),
    ({"options": SlurmOptions(env={"BAD-NAME": "1"})}, "environment variable name 'BAD-NAME'"),
    ({"accelerator": "tpu"}, "accelerator 'tpu'"),
])
def test_sbatch_refusals_are_one_line(kwargs, message):
    call = {"plan": PLAN, "nodes": 2, "devices_per_node": 8, "accelerator": "cuda", "train_args": ["--model", "x"],
            **kwargs}
    with pytest.raises(PartitaError, match=f"^{message}".replace("(", r"\(").replace(";", ";")) as e:
        render_sbatch(**call)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- the command line


@pytest.mark.parametrize("target", ["slurm", "k8s-trainjob", "k8s-pytorchjob", "k8s-ascendjob"])
def test_a_launch_target_without_hardware_is_one_line(tmp_path, capsys, target):
    plan_file = tmp_path / "plan.json"
    PLAN.to_json(plan_file)
    assert main(["export", "--to", target, str(plan_file)]) == 2
    assert capsys.readouterr().err.strip() == (f"partita: error: --to {target} needs the cluster: give --hardware "
                                               "(and --devices or --nodes / --devices-per-node)")


def test_export_cli_writes_the_sbatch_script(tmp_path, capsys):
    out = tmp_path / "job.sbatch"
    rc = main(["export", "--to", "slurm", "dp=4,tp=2", "--hardware", "cpu", "--nodes", "2", "--model", "tiny-llama",
               "--job-name", "tiny", "--time", "10", "--partition", "debug", "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    text = out.read_text()
    assert "#SBATCH --nodes=2\n" in text and "#SBATCH --job-name=tiny\n" in text and "#SBATCH --time=10\n" in text
    args = train_args(shlex.split(text.splitlines()[-1]))
    assert (args.model, args.nnodes, args.nproc, args.device) == ("tiny-llama", 2, 4, "cpu")
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0


def test_export_cli_train_args_reach_partita_train(tmp_path, capsys):
    """--train-args (one string, split as a shell would) join --model in the command each node
    runs; a launch flag among them is refused, the artefact writes those itself."""
    rc = main(["export", "--to", "k8s-trainjob", "dp=8", "--hardware", "h100-sxm", "--model", "tiny-llama",
               "--image", "p:1", "--train-args", "--steps 1000 --checkpoint-dir '/data/my ckpt'"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    args = train_args(next(yaml.safe_load_all(captured.out))["spec"]["trainer"]["command"])
    assert (args.model, args.steps, args.checkpoint_dir) == ("tiny-llama", 1000, "/data/my ckpt")
    assert main(["export", "--to", "slurm", "dp=8", "--hardware", "h100-sxm", "--train-args", "--nproc 4"]) == 2
    assert "--nproc is written by the launch artefact itself" in capsys.readouterr().err


def test_export_cli_writes_a_manifest_the_crd_accepts(tmp_path, capsys):
    rc = main(["export", "--to", "k8s-ascendjob", "dp=4,tp=4", "--hardware", "ascend-910b2", "--devices-per-node",
               "8", "--model", "llama3-8b", "--job-name", "llama", "--image", "swr.example/partita:1", "--pvc", "ckpt"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    docs = list(yaml.safe_load_all(captured.out))
    assert [d["kind"] for d in docs] == ["ConfigMap", "AscendJob"]
    assert errors(docs[1]) == []
    args = train_args(command_of(docs[1]))
    assert (args.model, args.nnodes, args.nproc) == ("llama3-8b", 2, 8)
    assert args.checkpoint_dir == "/mnt/partita/llama/checkpoints"


@pytest.mark.parametrize("flags,message", [
    (["--nodes", "2"], "--nodes needs --hardware"),
    (["--hardware", "h100-sxm", "--nodes", "3"], "16 devices do not split over --nodes 3"),
    (["--hardware", "h100-sxm", "--nodes", "2", "--devices", "8", "--devices-per-node", "8"],
     "--devices 8 is not --nodes 2 x 8"),
    (["--hardware", "h100-sxm", "--nodes", "2", "--devices", "8"], "the plan needs 16 devices but the job has 2 node"),
])
def test_export_cli_cluster_flags_refusals(capsys, flags, message):
    assert main(["export", "--to", "slurm", "dp=16", *flags]) == 2
    assert capsys.readouterr().err.startswith(f"partita: error: {message}")


def test_plan_export_passes_the_searched_cluster(capsys):
    """plan --export k8s-pytorchjob: the best plan for 16 H100s as a PyTorchJob of 2 nodes."""
    rc = main(["plan", "--model", "tiny-llama", "--hardware", "h100-sxm", "--devices", "16", "--global-batch", "16",
               "--seq-len", "256", "--top", "1", "--export", "k8s-pytorchjob"])
    out = capsys.readouterr().out
    assert rc == 0
    job = next(d for d in yaml.safe_load_all(out[out.index("apiVersion:"):]) if d)
    assert errors(job) == []
    args = train_args(command_of(job))
    assert (args.nnodes, args.nproc, Plan.parse(args.plan).world_size) == (2, 8, 16)


def test_the_library_dispatch_reads_job_options():
    e = export("slurm", PLAN, None, make_cluster("h100-sxm", 16), JobOptions(name="run1", account="acct",
                                                                             train_args=("--model", "llama-8b")))
    assert "#SBATCH --job-name=run1\n" in e.text and "#SBATCH --account=acct\n" in e.text and not e.warnings
