"""`podkit submit k8s`: Kubernetes manifests for a training run, as xpk writes them for TPUs.

    job = K8sJob(config="configs/gpt_124m.toml", image="us-docker.pkg.dev/p/podkit:1",
                 tpu="v5p-2x2x4", slices=2, checkpoint_dir="gs://bucket/run")
    docs = job.manifests()     # [ConfigMap, JobSet] as dicts
    text = job.yaml()          # the same as one multi-document YAML file

TPU slices (`--tpu TYPE-TOPOLOGY`) get a JobSet (jobset.x-k8s.io/v1alpha2): one replicated
job per slice (`replicas` = slices), each an indexed Job of one pod per TPU host
(`parallelism` = `completions` = hosts), pinned to a node pool of that accelerator and topology
(`cloud.google.com/gke-tpu-accelerator`, `cloud.google.com/gke-tpu-topology`), one slice per
node pool (the `alpha.jobset.sigs.k8s.io/exclusive-topology` annotation), every chip of a host
requested (`google.com/tpu`). On GKE the TPU webhook gives each pod TPU_WORKER_ID and
TPU_WORKER_HOSTNAMES, from which JAX joins the slice by itself; several slices also get the
MEGASCALE_* variables of multislice training (coordinator: the first pod of slice 0).

CPU nodes (`--cpu-pods N`) get a plain indexed Job of N pods beside a headless Service of the
same name, so pod 0 is `NAME-0.NAME`; each pod's PODKIT_* variables say how to join.

Preemption and failures: the config travels in a ConfigMap (the resolved TOML, mounted at
/etc/podkit/config.toml) and the checkpoints must live where a recreated pod finds them
(`--checkpoint-dir gs://...`). A pod that gets SIGTERM (node preemption, spot reclaim, a
drain) makes every process save at one step (podkit.termination) and exit with
PREEMPTED_EXIT; the Job's pod failure policy fails the Job on that code, and the JobSet's
failure policy restarts every slice without counting it against `--max-restarts` (that budget
is for real failures). The restarted pods resume from the newest checkpoint.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from podkit import topology
from podkit.errors import ConfigError, SubmitError
from podkit.submit.command import check_counts, script_name

PREEMPTED_EXIT = 42  # a preempted process's status in a pod (PODKIT_PREEMPTED_EXIT_CODE)
CONFIG_MOUNT = "/etc/podkit"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # RFC 1035 label: Service and pod names


@dataclasses.dataclass
class K8sJob:
    """What `podkit submit k8s` was asked for."""

    image: str
    config: str | None = None
    sets: Sequence[str] = ()
    command: Sequence[str] = ()
    tpu: str | None = None
    slices: int = 1
    cpu_pods: int | None = None
    cpu_devices: int | None = None
    max_restarts: int = 3
    checkpoint_dir: str | None = None
    name: str | None = None
    namespace: str | None = None
    grace: int = 60  # terminationGracePeriodSeconds: SIGTERM -> SIGKILL
    service_account: str | None = None  # Workload Identity: what may write the bucket
    min_processes: int | None = None  # refused below the job's count (no elastic size here)

    def validate(self) -> None:
        """Raise ConfigError naming the bad flag and the fix."""
        if (self.config is None) == (not self.command):
            raise ConfigError("podkit submit k8s takes a config or a command after --, one "
                              "of the two.")
        if self.command and self.sets:
            raise ConfigError("--set changes a config; with -- COMMAND there is none.")
        if not self.image:
            raise ConfigError("--image is required: a container image with podkit installed, "
                              "e.g. --image us-docker.pkg.dev/PROJECT/REPO/podkit:TAG.")
        if any(c.isspace() for c in self.image):
            raise ConfigError(f"--image {self.image!r} is not a container image (it has "
                              "spaces); pass one such as us-docker.pkg.dev/PROJECT/REPO/"
                              "podkit:TAG.")
        if (self.tpu is None) == (self.cpu_pods is None):
            raise ConfigError("say where the job runs: --tpu TYPE-TOPOLOGY (a TPU slice, e.g. "
                              "v5p-2x2x4) or --cpu-pods N (N pods on CPU nodes), one of the "
                              "two.")
        if self.tpu is not None:
            topology.tpu_slice(self.tpu)  # names the valid topologies
            if self.cpu_devices is not None:
                raise ConfigError("--cpu-devices is for --cpu-pods; a TPU pod uses its chips.")
        check_counts(slices=self.slices, cpu_pods=self.cpu_pods, cpu_devices=self.cpu_devices)
        if self.cpu_pods is not None and self.slices != 1:
            raise ConfigError("--slices is for TPU slices; for CPU pods pass --cpu-pods N.")
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts {self.max_restarts} must be >= 0.")
        if self.min_processes is not None:
            count = self.cpu_pods if self.cpu_pods is not None else (
                topology.tpu_slice(self.tpu).hosts * self.slices if self.tpu else None)
            if count is not None and self.min_processes < count:
                # A JobSet restarts every slice at its size (its failure policy) and an
                # indexed Job's size is changed only by a controller outside it: nothing in
                # these manifests could go on with fewer processes.
                raise ConfigError(
                    f"--min-processes {self.min_processes}: the manifests run {count} "
                    "processes and Kubernetes restarts them at that count (a JobSet restarts "
                    "every slice; an indexed Job keeps its completions), so a job cannot go "
                    "on with fewer. Fix: drop --min-processes (or pass "
                    f"{count}), or run elastic jobs with `podkit launch --min-processes` or "
                    "`podkit submit slurm --min-processes`.")
        if self.grace < 1:
            raise ConfigError(f"--grace {self.grace} must be >= 1 second.")
        if self.name is not None and (not NAME.match(self.name) or len(self.name) > 40):
            raise ConfigError(f"--name {self.name!r} is not a Kubernetes name: lower-case "
                              "letters, digits and '-', starting with a letter, at most 40 "
                              "characters (pods add suffixes to it).")
        if self.namespace is not None and (not NAME.match(self.namespace) or
                                           len(self.namespace) > 63):
            raise ConfigError(f"--namespace {self.namespace!r} is not a Kubernetes namespace "
                              "name: lower-case letters, digits and '-', at most 63.")
        if self.service_account is not None and not re.match(
                r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", self.service_account):
            raise ConfigError(f"--service-account {self.service_account!r} is not a "
                              "Kubernetes service account name.")
        if self.checkpoint_dir is not None:
            if self.command:
                raise ConfigError("--checkpoint-dir sets a config's checkpoint.dir; with -- "
                                  "COMMAND there is no config: pass the directory to your "
                                  "command.")
            scheme, sep, rest = self.checkpoint_dir.partition("://")
            if not sep or scheme not in ("gs", "s3") or not rest.split("/")[0]:
                raise ConfigError(f"--checkpoint-dir {self.checkpoint_dir!r}: a pod's own disk "
                                  "is lost when it is recreated; pass object storage every pod "
                                  "reaches, gs://BUCKET/RUN or s3://BUCKET/RUN.")

    # -- the pieces -----------------------------------------------------------------------------
    def _config(self) -> tuple[str | None, str]:
        """(the config as TOML or None, the job's name)."""
        if self.config is None:
            name = self.name or _k8s_name(script_name(self.command))
            return None, name
        from podkit import config as config_lib

        config = config_lib.load(self.config, list(self.sets))
        if not config.checkpoint.enabled:
            raise ConfigError(f"{self.config} has checkpoint.enabled = false: a recreated pod "
                              "(preemption, a failure) would train from the start. Set "
                              "checkpoint.enabled = true.")
        if self.checkpoint_dir is not None:
            config = dataclasses.replace(config, checkpoint=dataclasses.replace(
                config.checkpoint, dir=self.checkpoint_dir, enabled=True))
        c = config.checkpoint
        if not c.enabled or "://" not in c.dir:
            raise ConfigError(f"{self.config}: checkpoints at "
                              f"{c.dir or '[run] dir/name/checkpoints'!r} live in the pod and "
                              "are lost when a preempted or failed pod is recreated. Pass "
                              "--checkpoint-dir gs://BUCKET/RUN (or set checkpoint.dir).")
        return config_lib.to_toml(config), self.name or _k8s_name(config.run.name)

    def _container(self, name: str, resources: dict | None,
                   env: list[dict[str, Any]]) -> dict[str, Any]:
        if self.config is not None:
            command = ["podkit", "train", f"{CONFIG_MOUNT}/config.toml"]
        else:
            command = list(self.command)
        container: dict[str, Any] = {
            "name": "podkit",
            "image": self.image,
            "command": command,
            "env": [{"name": "PODKIT_PREEMPTED_EXIT_CODE", "value": str(PREEMPTED_EXIT)},
                    {"name": "PYTHONUNBUFFERED", "value": "1"}, *env],
        }
        if resources:
            container["resources"] = resources
        if self.config is not None:
            container["volumeMounts"] = [{"name": "config", "mountPath": CONFIG_MOUNT,
                                          "readOnly": True}]
        return container

    def _pod_spec(self, name: str, container: dict[str, Any]) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": self.grace,
            "containers": [container],
        }
        if self.service_account:
            spec["serviceAccountName"] = self.service_account
        if self.config is not None:
            spec["volumes"] = [{"name": "config", "configMap": {"name": f"{name}-config"}}]
        return spec

    def _failure_policy(self) -> dict[str, Any]:
        """A pod that exits PREEMPTED_EXIT fails its Job at once (reason PodFailurePolicy)."""
        return {"rules": [{"action": "FailJob", "onExitCodes": {
            "containerName": "podkit", "operator": "In", "values": [PREEMPTED_EXIT]}}]}

    def _metadata(self, name: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name,
                                "labels": {"app.kubernetes.io/managed-by": "podkit"}}
        if self.namespace:
            meta["namespace"] = self.namespace
        return meta

    def manifests(self) -> list[dict[str, Any]]:
        """The Kubernetes objects, in the order they are applied."""
        self.validate()
        toml, name = self._config()
        docs: list[dict[str, Any]] = []
        if toml is not None:
            docs.append({"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": self._metadata(f"{name}-config"),
                         "data": {"config.toml": toml}})
        if self.tpu is not None:
            docs.append(self._jobset(name, topology.tpu_slice(self.tpu)))
        else:
            docs += self._cpu_job(name)
        return docs

    def _jobset(self, name: str, tpu: topology.TpuSlice) -> dict[str, Any]:
        env: list[dict[str, Any]] = []
        if self.slices > 1:  # multislice: the slices meet over the data-center network
            env = [
                {"name": "MEGASCALE_COORDINATOR_ADDRESS",
                 "value": f"{name}-slice-0-0.{name}"},
                {"name": "MEGASCALE_NUM_SLICES", "value": str(self.slices)},
                {"name": "MEGASCALE_SLICE_ID", "valueFrom": {"fieldRef": {
                    "fieldPath": "metadata.annotations['jobset.sigs.k8s.io/job-index']"}}},
            ]
        container = self._container(name, {"limits": {"google.com/tpu": tpu.chips_per_host}},
                                    env)
        container["ports"] = [{"containerPort": 8471}, {"containerPort": 8080}]
        container["securityContext"] = {"privileged": True}  # /dev/accel* and ICI, as xpk
        pod = self._pod_spec(name, container)
        pod.update({
            "hostNetwork": True,  # ICI and DCN traffic without the pod network's overhead
            "dnsPolicy": "ClusterFirstWithHostNet",
            "nodeSelector": {"cloud.google.com/gke-tpu-accelerator": tpu.kind.accelerator,
                             "cloud.google.com/gke-tpu-topology": tpu.topology},
        })
        meta = self._metadata(name)
        meta["annotations"] = {
            # One slice per node pool: a slice's hosts are the pool's machines.
            "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}
        return {
            "apiVersion": JOBSET_API,
            "kind": "JobSet",
            "metadata": meta,
            "spec": {
                "failurePolicy": {
                    "maxRestarts": self.max_restarts,
                    "rules": [{
                        # A preemption restarts every slice and is not a failure.
                        "name": "preempted",
                        "action": "RestartJobSetAndIgnoreMaxRestarts",
                        "onJobFailureReasons": ["PodFailurePolicy"],
                    }],
                },
                "replicatedJobs": [{
                    "name": "slice",
                    "replicas": self.slices,
                    "template": {"spec": {
                        "parallelism": tpu.hosts,
                        "completions": tpu.hosts,
                        "completionMode": "Indexed",
                        "backoffLimit": 0,  # any failed pod fails the slice: JobSet restarts
                        "podFailurePolicy": self._failure_policy(),
                        "template": {"spec": pod},
                    }},
                }],
            },
        }

    def _cpu_job(self, name: str) -> list[dict[str, Any]]:
        pods = self.cpu_pods or 1
        env: list[dict[str, Any]] = []
        if pods > 1:
            env = [
                {"name": "PODKIT_COORDINATOR", "value": f"{name}-0.{name}:1234"},
                {"name": "PODKIT_NUM_PROCESSES", "value": str(pods)},
                {"name": "PODKIT_PROCESS_ID", "valueFrom": {"fieldRef": {
                    "fieldPath":
                        "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
            ]
        if self.cpu_devices:
            env.append({"name": "PODKIT_CPU_DEVICES", "value": str(self.cpu_devices)})
        container = self._container(name, None, env)
        container["ports"] = [{"containerPort": 1234}]
        pod = self._pod_spec(name, container)
        pod["subdomain"] = name  # pod i is NAME-i.NAME through the headless Service
        service = {
            "apiVersion": "v1", "kind": "Service", "metadata": self._metadata(name),
            "spec": {"clusterIP": "None", "selector": {"job-name": name},
                     "ports": [{"name": "coordinator", "port": 1234}]},
        }
        job = {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": self._metadata(name),
            "spec": {
                "completionMode": "Indexed",
                "completions": pods,
                "parallelism": pods,
                # A failed pod is started again with its index; the others fail in their
                # next collective and follow, so one failure of the job is a failure of
                # every pod: --max-restarts R is R x pods pod failures.
                "backoffLimit": self.max_restarts * pods,
                "podFailurePolicy": {"rules": [
                    # A preemption does not use up the budget: the evicted pod and the others
                    # (which saved with it and exited PREEMPTED_EXIT) restart and resume.
                    {"action": "Ignore", "onExitCodes": {
                        "containerName": "podkit", "operator": "In",
                        "values": [PREEMPTED_EXIT]}},
                    {"action": "Ignore",
                     "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                ]},
                "template": {"spec": pod},
            },
        }
        return [service, job]

    def yaml(self) -> str:
        """The manifests as one multi-document YAML file, `kubectl apply -f` ready."""
        import yaml

        where = (f"TPU {self.tpu} x {self.slices} slice(s)" if self.tpu
                 else f"{self.cpu_pods} CPU pod(s)")
        head = f"# podkit submit k8s: {where}. Apply with: kubectl apply -f FILE\n"

        class Dumper(yaml.SafeDumper):
            pass

        def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
            style = "|" if "\n" in value else None  # the config reads as a TOML file
            return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

        Dumper.add_representer(str, text)
        return head + yaml.dump_all(self.manifests(), Dumper=Dumper, sort_keys=False)

    # -- applying ------------------------------------------------------------------------------
    def apply(self, path: Path) -> str:
        """`kubectl apply -f PATH`; kubectl's refusals become SubmitError."""
        if shutil.which("kubectl") is None:
            raise SubmitError("kubectl is not on PATH: install it and point it at the "
                              f"cluster, or apply the manifest yourself: kubectl apply -f "
                              f"{shlex.quote(str(path))}")
        done = subprocess.run(["kubectl", "apply", "-f", str(path)], capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0:
            raise SubmitError(f"kubectl apply -f {path} failed: {done.stderr.strip()} Fix: "
                              "check that kubectl reaches the cluster (`kubectl config "
                              "current-context`, `kubectl get nodes`) and that the JobSet "
                              "controller is installed (`kubectl get crd jobsets.jobset.x-k8s.io`"
                              "); the manifest is in the file, apply it again.")
        return done.stdout


def _k8s_name(text: str) -> str:
    """A Kubernetes name from a run or script name (gpt_124m -> gpt-124m)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    name = name if name and name[0].isalpha() else f"podkit-{name}".strip("-")
    return name[:40].rstrip("-") or "podkit"
