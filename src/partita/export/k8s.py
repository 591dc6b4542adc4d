"""Kubernetes manifests that run a plan: a Kubeflow Trainer v2 ``TrainJob``
(``--to k8s-trainjob``), a Kubeflow Training Operator ``PyTorchJob`` (``--to k8s-pytorchjob``)
and a MindCluster ``AscendJob`` gang-scheduled by Volcano (``--to k8s-ascendjob``).

Every manifest runs one pod per node, each pod one ``partita train`` (one torchrun for the
node's processes) with a c10d rendezvous at the address the operator gives the first pod,
keyed by the job's name; the plan is inside the command as its JSON text (``--plan '{...}'``).
The tests check each manifest against the operator's own CRD schema with nothing unknown
(``tests/test_export_clusters.py``; the CRD files and their sources are in
``../shared/data/k8s/``).

Sources, per operator:

- **TrainJob** (``trainer.kubeflow.org/v1alpha1``; https://www.kubeflow.org/docs/components/trainer/):
  ``spec.runtimeRef`` names a ``ClusterTrainingRuntime`` (``torch-distributed``, installed with
  Kubeflow Trainer); ``spec.trainer`` sets ``image``, ``command``, ``numNodes``,
  ``numProcPerNode``, ``resourcesPerNode`` and ``env``. The Torch plugin
  (kubeflow/trainer ``pkg/runtime/framework/plugins/torch/torch.go``) injects
  ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` (the first
  node's pod, ``<job>-node-0-0.<job>``) and ``PET_MASTER_PORT`` (29400) and refuses a
  TrainJob that sets them itself; the command reads them as ``$(PET_MASTER_ADDR)``
  (Kubernetes expands ``$(VAR)`` in ``command``/``args``). A shared volume is added with a
  ``runtimePatches`` entry (the pod template of the ``node`` replicated job).
- **PyTorchJob** (``kubeflow.org/v1``; https://www.kubeflow.org/docs/components/trainer/legacy-v1/user-guides/pytorch/):
  ``pytorchReplicaSpecs`` ``Master`` (1) and ``Worker`` (nodes - 1), the container named
  ``pytorch``; the operator sets ``MASTER_ADDR`` (``localhost`` on the master, the master's
  service on the workers) and ``MASTER_PORT`` (23456 by default) on every pod
  (training-operator ``pkg/controller.v1/pytorch/envvar.go``); ``nprocPerNode`` is a string.
- **AscendJob** (``mindxdl.gitee.com/v1``, MindCluster's Ascend Operator;
  https://www.hiascend.com/document/detail/en/mindcluster/730/clustersched/schedulingug/mxdlug_scheduling_013.html
  and the example ``pytorch_multinodes_acjob_910b.yaml`` there): labels ``framework: pytorch``
  and ``ring-controller.atlas`` (``ascend-910b`` for Atlas A2/A3, ``ascend-910`` for the Atlas
  800) on the job and the pod templates; ``schedulerName: volcano`` with
  ``runPolicy.schedulingPolicy`` ``minAvailable`` = all pods and ``queue`` (gang scheduling:
  no pod starts until every node is placed); ``successPolicy: AllWorkers``; replicas
  ``Master`` (1) and ``Worker`` (nodes - 1); the container must be named ``ascend`` with the
  port ``ascendjob-port`` (2222); NPUs are the resource ``huawei.com/Ascend910`` (requests =
  limits); the Ascend Operator injects ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``,
  ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` (mind-cluster ``component/ascend-operator/pkg/controllers/v1/env.go``)
  and ``ASCEND_VISIBLE_DEVICES`` from the device plugin's pod annotation. The HCCL rank table
  (``hccl.json``: each NPU's device IP and rank) is written by the Ascend Operator into the
  ConfigMap ``rings-config-<job>`` (labelled ``ring-controller.atlas``), which the pods mount
  at ``/user/serverid/devindex/config`` ("hccl.json File Description",
  https://www.hiascend.com/document/detail/en/mindcluster/730/clustersched/schedulingug/mxdlug_appendices_009.html);
  ``RANK_TABLE_FILE`` points HCCL at it. The ConfigMap is written before the job (one YAML
  stream of two documents).
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import PartitaError
from .context import ExportContext
from .jobs import (ASCEND_SET_ENV, JobOptions, Raw, accelerator_of, check_env, device_env, job_train_args, shell_join,
                   train_argv)
from .result import Export

#: the resource each accelerator is requested as (NVIDIA's device plugin; MindCluster's Ascend
#: Device Plugin, its acjob YAML parameters: the module docstring's AscendJob link)
RESOURCE = {"cuda": "nvidia.com/gpu", "npu": "huawei.com/Ascend910"}
RANK_TABLE_DIR = "/user/serverid/devindex/config"
TRAINJOB_RUNTIME = "torch-distributed"
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@dataclass(frozen=True)
class K8sOptions:
    """The manifest's settings. ``name``: the job (a DNS label, also the rendezvous id);
    ``image``: the container with partita installed; ``pvc``: a PersistentVolumeClaim
    (ReadWriteMany: the shared storage) mounted at ``mount_path`` on every pod, the run and
    checkpoint directories under it; ``queue``: the Volcano queue (AscendJob); ``runtime``:
    the TrainJob's ClusterTrainingRuntime; ``env``: extra variables (after the device's own)."""

    name: str = "partita"
    namespace: str | None = None
    image: str = "partita:latest"
    pvc: str | None = None
    mount_path: str = "/mnt/partita"
    queue: str = "default"
    runtime: str = TRAINJOB_RUNTIME
    launcher: tuple[str, ...] = ("partita",)
    env: Mapping[str, str] = field(default_factory=dict)


def _check(options: K8sOptions) -> None:
    if not _NAME.fullmatch(options.name) or len(options.name) > 50:
        raise PartitaError(f"job name {options.name!r}: use lower-case letters, digits and '-' (at most 50), "
                           "starting and ending with a letter or digit (Kubernetes names)")
    if options.namespace is not None and not _NAME.fullmatch(options.namespace):
        raise PartitaError(f"namespace {options.namespace!r} is not a Kubernetes name")
    if options.pvc is not None and not _NAME.fullmatch(options.pvc):
        raise PartitaError(f"volume claim {options.pvc!r} is not a Kubernetes name")
    if not options.image.strip():
        raise PartitaError("--image is empty; give the container image with partita installed")
    if not options.mount_path.startswith("/"):
        raise PartitaError(f"mount path {options.mount_path!r} must be absolute")


def _metadata(options: K8sOptions, labels: dict | None = None) -> dict:
    meta: dict = {"name": options.name}
    if options.namespace:
        meta["namespace"] = options.namespace
    if labels:
        meta["labels"] = labels
    return meta


def _env_list(env: Mapping[str, str]) -> list[dict]:
    return [{"name": k, "value": v} for k, v in env.items()]


def k8s_options(job: JobOptions | None) -> K8sOptions:
    """The manifest settings a :class:`~partita.export.jobs.JobOptions` names (the rest default)."""
    if job is None:
        return K8sOptions()
    given = {"name": job.name, "image": job.image, "pvc": job.pvc}
    return K8sOptions(**{k: v for k, v in given.items() if v is not None}, env=dict(job.env))


def _args(ctx: ExportContext, options: K8sOptions, train_args: Sequence[str] | None) -> tuple[list[str], list[str]]:
    args, warnings = job_train_args(ctx, train_args)
    if options.image == K8sOptions.image:
        warnings.append(f"no --image: the pods run {options.image}; give the image with partita installed")
    if options.pvc:
        for flag, sub in (("--run-dir", "run"), ("--checkpoint-dir", "checkpoints")):
            if not any(a == flag or a.startswith(flag + "=") for a in args):
                args += [flag, f"{options.mount_path}/{options.name}/{sub}"]
    return args, warnings


def _cluster(ctx: ExportContext, target: str):
    if ctx.cluster is None:
        raise PartitaError(f"--to {target} needs the cluster: give --hardware (and --devices or --nodes / "
                           "--devices-per-node)")
    if ctx.plan.world_size != ctx.cluster.world_size:
        raise PartitaError(f"the plan needs {ctx.plan.world_size} devices but the cluster has "
                           f"{ctx.cluster.world_size} ({ctx.cluster.nodes} node(s) x {ctx.cluster.devices_per_node}); "
                           f"give --nodes/--devices-per-node that multiply to {ctx.plan.world_size}")
    return ctx.cluster


def _resources(accelerator: str, per_node: int) -> dict:
    if accelerator in RESOURCE:
        n = {RESOURCE[accelerator]: per_node}
        return {"limits": dict(n), "requests": dict(n)}
    return {}


def _volume(options: K8sOptions) -> tuple[list[dict], list[dict]]:
    """(volumes, volumeMounts) of the shared storage, empty without ``pvc``."""
    if not options.pvc:
        return [], []
    return ([{"name": "shared", "persistentVolumeClaim": {"claimName": options.pvc}}],
            [{"name": "shared", "mountPath": options.mount_path}])


_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def _scalar(value) -> str:
    """A YAML scalar: bools and numbers as they are, a string plain where YAML reads it back
    as the same string, else single-quoted (``'`` doubled; the manifests hold no newlines)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if value is None:
        return "null"
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS:
        return text
    if "\n" in text or any(ord(c) < 32 for c in text):
        raise ValueError(f"a manifest value holds a control character: {text!r}")
    return "'" + text.replace("'", "''") + "'"


def _yaml_lines(node, pad: str) -> list[str]:
    """Block YAML of a dict or list (Kubernetes style: a list's items at its key's indent)."""
    lines: list[str] = []
    items = node.items() if isinstance(node, dict) else ((None, v) for v in node)
    for key, value in items:
        lead = f"{pad}{_scalar(key)}:" if isinstance(node, dict) else f"{pad}-"
        if isinstance(value, (dict, list)) and value:
            inner = _yaml_lines(value, pad if isinstance(node, dict) and isinstance(value, list) else pad + "  ")
            if isinstance(node, dict):
                lines += [lead, *inner]
            else:  # "- " then the item's first line on the same line
                lines += [f"{lead} {inner[0].lstrip()}", *inner[1:]]
        else:
            lines.append(f"{lead} {'{}' if value == {} else '[]' if value == [] else _scalar(value)}")
    return lines


def to_yaml(docs: Sequence[dict], header: str) -> str:
    """The documents as one YAML stream under a comment header (written here: PyYAML is not a
    dependency of partita; the tests read it back with PyYAML)."""
    body = "---\n".join("\n".join(_yaml_lines(d, "")) + "\n" for d in docs)
    return "".join(f"# {line}\n" for line in header.splitlines()) + body


def _job(ctx: ExportContext, options: K8sOptions | None, train_args: Sequence[str] | None, target: str,
         rdzv_endpoint, need_npu: bool = False) -> tuple[K8sOptions, object, str, list, list[str]]:
    """What every manifest starts from: the options (checked), the cluster, its accelerator,
    the ``partita train`` command line each node runs (rendezvous at ``rdzv_endpoint``, as the
    operator names its master) and the warnings."""
    options = options or k8s_options(ctx.job)
    _check(options)
    cluster = _cluster(ctx, target)
    acc = accelerator_of(cluster.device)
    if need_npu and acc != "npu":
        raise PartitaError(f"--to {target} runs on Ascend NPUs; {cluster.device.name} is not one "
                           "(use k8s-trainjob or k8s-pytorchjob)")
    args, warnings = _args(ctx, options, train_args)
    argv = train_argv(ctx.plan, nodes=cluster.nodes, devices_per_node=cluster.devices_per_node, accelerator=acc,
                      rdzv_endpoint=rdzv_endpoint, rdzv_id=options.name, train_args=args, launcher=options.launcher)
    return options, cluster, acc, argv, warnings


def _replicas(nodes: int, replica) -> dict:
    """The operators' Master (node 0) and Worker (the other nodes) replica specs."""
    return {"Master": replica(1), **({"Worker": replica(nodes - 1)} if nodes > 1 else {})}


def _header(ctx: ExportContext, what: str) -> str:
    c = ctx.cluster
    return (f"partita: {ctx.plan.summary()} on {c.nodes} node(s) x {c.devices_per_node} {c.device.name}\n"
            f"{what}")


def trainjob_manifest(ctx: ExportContext, train_args: Sequence[str] | None = None,
                      options: K8sOptions | None = None) -> tuple[list[dict], list[str]]:
    """The TrainJob (one document) and the warnings."""
    options, cluster, acc, argv, warnings = _job(ctx, options, train_args, "k8s-trainjob",
                                                 "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)")
    trainer: dict = {"image": options.image, "command": argv, "numNodes": cluster.nodes,
                     "numProcPerNode": cluster.devices_per_node}
    if acc in RESOURCE:
        trainer["resourcesPerNode"] = _resources(acc, cluster.devices_per_node)
    env = {**device_env(acc, cluster.devices_per_node), **check_env(options.env)}
    if env:
        trainer["env"] = _env_list(env)
    spec: dict = {"runtimeRef": {"name": options.runtime}, "trainer": trainer}
    volumes, mounts = _volume(options)
    if volumes:
        pod = {"spec": {"containers": [{"name": "node", "volumeMounts": mounts}], "volumes": volumes}}
        spec["runtimePatches"] = [{"manager": "partita", "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": [{"name": "node", "template": {"spec": {"template": pod}}}]}}}}]
    return [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": _metadata(options),
             "spec": spec}], warnings


def pytorchjob_manifest(ctx: ExportContext, train_args: Sequence[str] | None = None,
                        options: K8sOptions | None = None) -> tuple[list[dict], list[str]]:
    """The PyTorchJob (one document) and the warnings."""
    options, cluster, acc, argv, warnings = _job(ctx, options, train_args, "k8s-pytorchjob",
                                                 "$(MASTER_ADDR):$(MASTER_PORT)")
    container: dict = {"name": "pytorch", "image": options.image, "command": argv}
    env = {**device_env(acc, cluster.devices_per_node), **check_env(options.env)}
    if env:
        container["env"] = _env_list(env)
    if acc in RESOURCE:
        container["resources"] = _resources(acc, cluster.devices_per_node)
    volumes, mounts = _volume(options)
    if mounts:
        container["volumeMounts"] = mounts

    def replica(count: int) -> dict:
        pod: dict = {"containers": [container]}
        if volumes:
            pod["volumes"] = volumes
        return {"replicas": count, "restartPolicy": "Never", "template": {"spec": pod}}

    spec = {"nprocPerNode": str(cluster.devices_per_node), "pytorchReplicaSpecs": _replicas(cluster.nodes, replica),
            "runPolicy": {"cleanPodPolicy": "None"}}
    return [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": _metadata(options),
             "spec": spec}], warnings


def ring_controller(device) -> str:
    """``ring-controller.atlas``: ``ascend-910`` for the Atlas 800 (Ascend 910), ``ascend-910b``
    for Atlas A2 (910B) and A3 (910C) products (MindCluster's acjob YAML parameters)."""
    return "ascend-910" if device.name.lower() == "ascend-910" else "ascend-910b"


def ascendjob_manifest(ctx: ExportContext, train_args: Sequence[str] | None = None,
                       options: K8sOptions | None = None) -> tuple[list[dict], list[str]]:
    """The rank-table ConfigMap and the AscendJob (two documents) and the warnings."""
    options, cluster, _, argv, warnings = _job(ctx, options, train_args, "k8s-ascendjob",
                                               Raw('"$MASTER_ADDR:$MASTER_PORT"'), need_npu=True)
    ring = ring_controller(cluster.device)
    # bash: the CANN environment first (as MindSpeed-LLM's scripts), then partita train; the
    # rendezvous is the operator's MASTER_ADDR/MASTER_PORT, read by the shell
    script = f"if [ -f {ASCEND_SET_ENV} ]; then source {ASCEND_SET_ENV}; fi; exec {shell_join(argv)}"
    env = [{"name": "XDL_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
           {"name": "RANK_TABLE_FILE", "value": f"{RANK_TABLE_DIR}/hccl.json"},
           *_env_list({**device_env("npu", cluster.devices_per_node), **check_env(options.env)})]
    volumes, mounts = _volume(options)
    volumes = [{"name": "ascend-driver", "hostPath": {"path": "/usr/local/Ascend/driver"}},
               {"name": "ranktable", "configMap": {"name": f"rings-config-{options.name}"}},
               {"name": "dshm", "emptyDir": {"medium": "Memory"}}, *volumes]
    mounts = [{"name": "ascend-driver", "mountPath": "/usr/local/Ascend/driver"},
              {"name": "ranktable", "mountPath": RANK_TABLE_DIR},
              {"name": "dshm", "mountPath": "/dev/shm"}, *mounts]
    container = {"name": "ascend", "image": options.image, "command": ["/bin/bash", "-c"], "args": [script],
                 "env": env, "ports": [{"containerPort": 2222, "name": "ascendjob-port"}],
                 "resources": _resources("npu", cluster.devices_per_node), "volumeMounts": mounts}
    selector = {"host-arch": "huawei-arm"}
    if ring == "ascend-910b" and cluster.devices_per_node in (8, 16) and "910b" in cluster.device.name.lower():
        selector["accelerator-type"] = f"module-910b-{cluster.devices_per_node}"

    def replica(count: int) -> dict:
        pod = {"nodeSelector": selector, "containers": [container], "volumes": volumes,
               "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                   {"labelSelector": {"matchExpressions": [{"key": "job-name", "operator": "In",
                                                            "values": [options.name]}]},
                    "topologyKey": "kubernetes.io/hostname"}]}}}
        return {"replicas": count, "restartPolicy": "Never",
                "template": {"metadata": {"labels": {"ring-controller.atlas": ring}}, "spec": pod}}

    job = {"apiVersion": "mindxdl.gitee.com/v1", "kind": "AscendJob",
           "metadata": _metadata(options, {"framework": "pytorch", "ring-controller.atlas": ring,
                                           "tor-affinity": "null"}),
           "spec": {"schedulerName": "volcano",
                    "runPolicy": {"schedulingPolicy": {"minAvailable": cluster.nodes, "queue": options.queue}},
                    "successPolicy": "AllWorkers", "replicaSpecs": _replicas(cluster.nodes, replica)}}
    cm_meta = {"name": f"rings-config-{options.name}", "labels": {"ring-controller.atlas": ring}}
    if options.namespace:
        cm_meta["namespace"] = options.namespace
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": cm_meta,
                 "data": {"hccl.json": '{"status":"initializing"}'}}
    return [configmap, job], warnings


def _export(target: str, build, what: str):
    def exporter(ctx: ExportContext, train_args: Sequence[str] | None = None,
                 options: K8sOptions | None = None) -> Export:
        docs, warnings = build(ctx, train_args, options)
        return Export(target, to_yaml(docs, _header(ctx, what)), warnings, data=docs)
    exporter.__name__ = f"export_{target.replace('-', '_')}"
    exporter.__doc__ = f"``partita export --to {target}``: {what}"
    return exporter


# the target names are spelled in the registry; these are the exporters it lists
export_trainjob = _export("k8s-trainjob", trainjob_manifest,
                          "Kubeflow Trainer v2 TrainJob (kubectl apply -f; needs the torch-distributed runtime)")
export_pytorchjob = _export("k8s-pytorchjob", pytorchjob_manifest, "Kubeflow PyTorchJob (kubectl apply -f)")
export_ascendjob = _export("k8s-ascendjob", ascendjob_manifest,
                           "MindCluster AscendJob for Volcano with its rank-table ConfigMap (kubectl apply -f)")

__all__ = ["K8sOptions", "ascendjob_manifest", "export_ascendjob", "export_pytorchjob", "export_trainjob",
           "pytorchjob_manifest", "trainjob_manifest"]
