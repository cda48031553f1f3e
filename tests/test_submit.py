"""`podkit submit` without a cluster: the Kubernetes manifests checked against the API's own
schemas (vendored in tests/k8s_schemas/, see vendor.py there for their versions and sources)
and two golden files; the sbatch script's contents; SLURM's host lists; every bad input an
error naming it. The SLURM engine itself runs in tests/test_slurm.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from podkit import errors as podkit_errors
from podkit import jobenv, topology
from podkit.errors import ConfigError, SubmitError
from podkit.submit.k8s import PREEMPTED_EXIT, K8sJob
from podkit.submit.slurm import SlurmJob, slurm_seconds

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = Path(__file__).with_name("k8s_schemas")
GOLDEN = Path(__file__).with_name("golden")
CONFIG = str(ROOT / "configs" / "seed_mlp.toml")


def _schema(name):
    return jsonschema.Draft202012Validator(json.loads((SCHEMAS / name).read_text()))


VALIDATORS = {
    "ConfigMap": _schema("k8s-v1.33-configmap.json"),
    "Service": _schema("k8s-v1.33-service.json"),
    "Job": _schema("k8s-v1.33-job.json"),
    "JobSet": _schema("jobset-v0.9.1-v1alpha2.json"),
}
# The JobSet CRD's schema leaves metadata open (the API server checks it as ObjectMeta).
JOB_SCHEMA = json.loads((SCHEMAS / "k8s-v1.33-job.json").read_text())
OBJECT_META = jsonschema.Draft202012Validator(
    {**JOB_SCHEMA["$defs"]["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"],
     "$defs": JOB_SCHEMA["$defs"]})


def _valid(doc):
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in VALIDATORS[doc["kind"]].iter_errors(doc)]
    errors += [f"metadata.{'.'.join(map(str, e.absolute_path))}: {e.message}"
               for e in OBJECT_META.iter_errors(doc["metadata"])]
    assert errors == [], errors


def test_the_vendored_schemas_catch_what_the_api_would_refuse():
    """The validators can fail: a misspelled field, a wrong type, a missing required field."""
    job = K8sJob(image="img:1", config=CONFIG, cpu_pods=2,
                 checkpoint_dir="gs://b/r").manifests()[-1]
    bad = json.loads(json.dumps(job))
    bad["spec"]["paralelism"] = 2
    assert any("paralelism" in e.message for e in VALIDATORS["Job"].iter_errors(bad))
    bad = json.loads(json.dumps(job))
    bad["spec"]["completions"] = "two"
    assert list(VALIDATORS["Job"].iter_errors(bad))
    jobset = K8sJob(image="img:1", config=CONFIG, tpu="v5p-2x2x2",
                    checkpoint_dir="gs://b/r").manifests()[-1]
    bad = json.loads(json.dumps(jobset))
    del bad["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
    assert list(VALIDATORS["JobSet"].iter_errors(bad))
    bad = json.loads(json.dumps(jobset))
    bad["spec"]["failurePolicy"]["rules"][0]["action"] = "RestartForever"
    assert list(VALIDATORS["JobSet"].iter_errors(bad))


@pytest.mark.parametrize("tpu, slices, hosts, chips", [
    ("v4-2x2x1", 1, 1, 4), ("v4-2x2x4", 1, 4, 4), ("v4-4x4x8", 2, 32, 4),
    ("v5e-1x1", 1, 1, 1), ("v5e-2x4", 1, 1, 8), ("v5e-4x8", 1, 8, 4), ("v5e-16x16", 4, 64, 4),
    ("v5p-2x2x2", 1, 2, 4), ("v5p-2x2x4", 2, 4, 4), ("v5p-8x8x16", 1, 256, 4),
    ("v6e-2x2", 1, 1, 4), ("v6e-8x16", 2, 32, 4),
])
def test_tpu_jobsets_are_valid_and_sized_by_the_kinds_table(tpu, slices, hosts, chips):
    docs = K8sJob(image="us-docker.pkg.dev/p/r/podkit:1", config=CONFIG, tpu=tpu,
                  slices=slices, checkpoint_dir="gs://bucket/run", max_restarts=5).manifests()
    assert [d["kind"] for d in docs] == ["ConfigMap", "JobSet"]
    for doc in docs:
        _valid(doc)
    jobset = docs[1]
    kind, _, shape = tpu.partition("-")
    assert jobset["metadata"]["annotations"] == {
        "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}
    assert jobset["spec"]["failurePolicy"]["maxRestarts"] == 5
    (replicated,) = jobset["spec"]["replicatedJobs"]
    assert replicated["replicas"] == slices
    job = replicated["template"]["spec"]
    assert job["parallelism"] == job["completions"] == hosts
    pod = job["template"]["spec"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": topology.TPU_KINDS[kind].accelerator,
        "cloud.google.com/gke-tpu-topology": shape}
    (container,) = pod["containers"]
    assert container["resources"]["limits"] == {"google.com/tpu": chips}
    assert hosts * chips * slices == topology.tpu_slice(tpu).chips * slices
    env = {e["name"]: e for e in container["env"]}
    assert env["PODKIT_PREEMPTED_EXIT_CODE"]["value"] == str(PREEMPTED_EXIT)
    assert ("MEGASCALE_NUM_SLICES" in env) == (slices > 1)
    # The config travels resolved, with the checkpoint directory the pods share.
    config = docs[0]["data"]["config.toml"]
    assert 'dir = "gs://bucket/run"' in config


def test_cpu_pods_get_a_headless_service_and_an_indexed_job():
    docs = K8sJob(image="img:1", config=CONFIG, cpu_pods=4, cpu_devices=2,
                  checkpoint_dir="s3://b/r").manifests()
    assert [d["kind"] for d in docs] == ["ConfigMap", "Service", "Job"]
    for doc in docs:
        _valid(doc)
    service, job = docs[1], docs[2]
    assert service["spec"]["clusterIP"] == "None"
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] == "seed-mlp"
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["PODKIT_COORDINATOR"]["value"] == "seed-mlp-0.seed-mlp:1234"
    assert env["PODKIT_NUM_PROCESSES"]["value"] == "4"
    assert env["PODKIT_CPU_DEVICES"]["value"] == "2"
    assert "job-completion-index" in env["PODKIT_PROCESS_ID"]["valueFrom"]["fieldRef"][
        "fieldPath"]


def test_a_command_instead_of_a_config():
    docs = K8sJob(image="img:1", command=["python", "train.py", "--steps", "9"],
                  tpu="v5e-2x2").manifests()
    assert [d["kind"] for d in docs] == ["JobSet"]
    _valid(docs[0])
    container = docs[0]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]
    assert container["command"] == ["python", "train.py", "--steps", "9"]
    assert docs[0]["metadata"]["name"] == "train"  # the script's name, not the interpreter's


@pytest.mark.parametrize("case, flags", [
    ("k8s_v5p_2x2x4_2_slices", ["--tpu", "v5p-2x2x4", "--slices", "2"]),
    ("k8s_cpu_pods_4", ["--cpu-pods", "4", "--cpu-devices", "2"]),
])
def test_manifests_match_golden_files(case, flags, tmp_path):
    """What `podkit submit k8s` writes, as committed. A change must be deliberate: regenerate
    with PODKIT_UPDATE_GOLDEN=1 and review the diff."""
    out = tmp_path / "m.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "podkit.cli", "submit", "k8s", CONFIG, "--image",
         "us-docker.pkg.dev/project/repo/podkit:0.1", "--checkpoint-dir", "gs://bucket/seed",
         *flags, "--out", str(out)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"wrote {out}; apply it with: kubectl apply -f {out}\n"
    text = out.read_text()
    for doc in yaml.safe_load_all(text):
        _valid(doc)
    path = GOLDEN / f"{case}.yaml"
    if os.environ.get("PODKIT_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("kwargs, said", [
    (dict(tpu="v7-2x2"), "--tpu 'v7-2x2' is not TYPE-TOPOLOGY; TYPE is one of v4, v5p, v5e, "
                         "v6e"),
    (dict(tpu="v5p-3x3x3"), "'3x3x3' is not a v5p topology. Valid v5p topologies (3D): "
                            "2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4"),
    (dict(tpu="v5e-2x2x2"), "'2x2x2' is not a v5e topology. Valid v5e topologies (2D): 1x1, "
                            "2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16."),
    (dict(tpu="v5e"), "is not TYPE-TOPOLOGY"),
    (dict(tpu="v5e-4x4", cpu_pods=2), "--tpu TYPE-TOPOLOGY (a TPU slice"),
    (dict(), "--tpu TYPE-TOPOLOGY (a TPU slice"),
    (dict(tpu="v5e-4x4", image=""), "--image is required"),
    (dict(tpu="v5e-4x4", image="my img"), "--image 'my img' is not a container image"),
    (dict(tpu="v5p-8"), "--tpu 'v5p-8' is Cloud TPU's name (a count of TensorCores, 2 per "
                        "chip); podkit takes the topology, as GKE's node pools do: --tpu "
                        "v5p-2x2x1 (4 chips)."),
    (dict(tpu="v5litepod-16"), "--tpu v5e-4x4 (16 chips)"),
    (dict(tpu="v5e-4x4", namespace="Bad NS"), "--namespace 'Bad NS' is not"),
    (dict(tpu="v5e-4x4", service_account="a b"), "--service-account 'a b' is not"),
    (dict(tpu="v5e-4x4", checkpoint_dir="file:///x"), "a pod's own disk is lost"),
    (dict(tpu="v5e-4x4", checkpoint_dir="gs://"), "gs://BUCKET/RUN or s3://BUCKET/RUN"),
    (dict(tpu="v5e-4x4", checkpoint_dir="hdfs://x/y"), "gs://BUCKET/RUN or s3://BUCKET/RUN"),
    (dict(tpu="v5e-4x4", config=None, command=["python", "t.py"]),
     "--checkpoint-dir sets a config's checkpoint.dir; with -- COMMAND there is no config"),
    (dict(tpu="v5e-4x4", sets=["checkpoint.enabled=false"]), "checkpoint.enabled = false"),
    (dict(tpu="v5e-4x4", slices=0), "--slices 0 must be a whole number >= 1"),
    (dict(cpu_pods=0), "--cpu-pods 0 must be a whole number >= 1"),
    (dict(cpu_pods=2, slices=2), "--slices is for TPU slices"),
    (dict(tpu="v5e-4x4", cpu_devices=2), "--cpu-devices is for --cpu-pods"),
    (dict(tpu="v5e-4x4", max_restarts=-1), "--max-restarts -1 must be >= 0"),
    (dict(cpu_pods=4, min_processes=3), "--min-processes 3: the manifests run 4 processes "
                                        "and Kubernetes restarts them at that count"),
    (dict(tpu="v5p-2x2x4", slices=2, min_processes=4), "the manifests run 8 processes"),
    (dict(tpu="v5e-4x4", name="My_Job"), "--name 'My_Job' is not a Kubernetes name"),
    (dict(tpu="v5e-4x4", checkpoint_dir="/ckpt"), "--checkpoint-dir '/ckpt': a pod's own disk "
                                                  "is lost when it is recreated"),
    (dict(tpu="v5e-4x4", checkpoint_dir=None), "are lost when a preempted or failed pod is "
                                               "recreated. Pass --checkpoint-dir gs://"),
])
def test_bad_k8s_input_is_an_error_naming_it(kwargs, said):
    args = dict(image="img:1", config=CONFIG, checkpoint_dir="gs://b/r")
    args.update(kwargs)
    with pytest.raises(ConfigError) as e:
        K8sJob(**args).manifests()
    assert said in str(e.value)


def test_k8s_cli_errors_and_apply_without_kubectl(tmp_path):
    def cli(*args, env=None):
        return subprocess.run([sys.executable, "-m", "podkit.cli", "submit", "k8s", *args],
                              capture_output=True, text=True, cwd=tmp_path, env=env)

    done = cli(CONFIG, "--tpu", "v5p-3x3x3", "--image", "i:1", "--checkpoint-dir", "gs://b/r")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("podkit: error: --tpu 'v5p-3x3x3'")
    done = cli(CONFIG, "--tpu", "v5e-4x4", "--checkpoint-dir", "gs://b/r")
    assert done.returncode == 2 and "--image is required" in done.stderr
    for out, why in ((tmp_path / "no" / "x.yaml", "its folder does not exist"),
                     (tmp_path, "is a directory")):
        done = cli(CONFIG, "--tpu", "v5e-4x4", "--image", "i:1", "--checkpoint-dir", "gs://b/r",
                   "--out", str(out))
        assert done.returncode == 2 and why in done.stderr and "Traceback" not in done.stderr
    done = cli(CONFIG, "--tpu", "v5e-4x4", "--image", "i:1", "--checkpoint-dir", "gs://b/r",
               "--out", "x.yaml", "--dry-run")
    assert done.returncode == 2 and "--dry-run prints the manifests and writes nothing" \
        in done.stderr
    env = dict(os.environ, PATH=str(Path(sys.executable).parent))  # python, no kubectl
    done = cli(CONFIG, "--tpu", "v5e-4x4", "--image", "i:1", "--checkpoint-dir", "gs://b/r",
               "--apply", env=env)
    assert done.returncode == 2
    assert "kubectl is not on PATH" in done.stderr and "kubectl apply -f seed-mlp.k8s.yaml" \
        in done.stderr
    assert (tmp_path / "seed-mlp.k8s.yaml").exists()  # written first: apply it by hand


# -- SLURM, without the daemons -----------------------------------------------------------------

def test_the_sbatch_script_says_what_it_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = SlurmJob(config=CONFIG, sets=[f"run.dir={tmp_path}"], nodes=4, tasks_per_node=2,
                   cpus_per_task=8, partition="gpu", time="02:00:00", grace=120,
                   max_restarts=5, sbatch_options=["account=ml", "gres=gpu:8"])
    path = job.write()
    text = path.read_text()
    assert path == tmp_path / "seed_mlp" / "slurm" / "job.sbatch"
    assert os.access(path, os.X_OK)
    for line in ["#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=2", "#SBATCH --cpus-per-task=8",
                 "#SBATCH --partition=gpu", "#SBATCH --time=02:00:00", "#SBATCH --requeue",
                 "#SBATCH --signal=TERM@120", "#SBATCH --account=ml", "#SBATCH --gres=gpu:8",
                 "#SBATCH --open-mode=append",
                 f"#SBATCH --output={tmp_path}/seed_mlp/slurm/job-%j.out",
                 f"export PODKIT_JOB_EVENTS={tmp_path}/seed_mlp/slurm/events.jsonl"]:
        assert line in text.splitlines(), line
    assert f"srun --kill-on-bad-exit=1 --label {sys.executable} -m podkit.cli train " \
           f"{tmp_path}/seed_mlp/slurm/config.toml" in text
    assert "--max-restarts 5" in text and "scontrol" not in text.split("srun")[0]
    # The job trains the resolved config (run.dir absolute), whatever happens to the original.
    assert f'dir = "{tmp_path}"' in (tmp_path / "seed_mlp" / "slurm" / "config.toml").read_text()
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    # Every #SBATCH line comes before the first command (sbatch stops reading at it).
    lines = text.splitlines()
    first_command = next(i for i, line in enumerate(lines)
                         if line and not line.startswith("#"))
    assert all(i < first_command for i, line in enumerate(lines) if line.startswith("#SBATCH"))


def test_an_elastic_job_asks_slurm_for_a_range_of_nodes(tmp_path, monkeypatch):
    """--min-processes K: `#SBATCH --nodes=MIN-MAX` (SLURM's own elastic allocation, MIN
    enough nodes for K tasks) and the full process count for podkit.elastic."""
    monkeypatch.chdir(tmp_path)
    text = SlurmJob(config=CONFIG, sets=[f"run.dir={tmp_path}"], nodes=4, tasks_per_node=2,
                    min_processes=3).script()
    lines = text.splitlines()
    assert "#SBATCH --nodes=2-4" in lines and "#SBATCH --nodes=4" not in lines
    assert "export PODKIT_MAX_PROCESSES=8" in lines
    done = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    # Without it, or at the full count, the script is what it was.
    for kw in ({}, {"min_processes": 8}, {"min_processes": 7}):
        text = SlurmJob(config=CONFIG, sets=[f"run.dir={tmp_path}"], nodes=4, tasks_per_node=2,
                        **kw).script()
        assert "#SBATCH --nodes=4" in text.splitlines()
        assert "PODKIT_MAX_PROCESSES" not in text
    # The manifests accept the count they run.
    K8sJob(image="img:1", config=CONFIG, checkpoint_dir="gs://b/r", cpu_pods=4,
           min_processes=4).manifests()


def test_dry_run_prints_the_script_and_submits_nothing(tmp_path):
    env = dict(os.environ, PATH=str(Path(sys.executable).parent))  # no sbatch here
    done = subprocess.run([sys.executable, "-m", "podkit.cli", "submit", "slurm", CONFIG,
                           "--set", f"run.dir={tmp_path}", "--nodes", "2", "--dry-run"],
                          capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=2" in done.stdout
    # Written nowhere: a queued job of this run directory restarts from those files.
    assert not (tmp_path / "seed_mlp").exists()
    done = subprocess.run([sys.executable, "-m", "podkit.cli", "submit", "slurm", CONFIG,
                           "--set", f"run.dir={tmp_path}"],
                          capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert "podkit: error: sbatch is not on PATH" in done.stderr and "--dry-run" in done.stderr


@pytest.mark.parametrize("kwargs, said", [
    (dict(), "needs a config"),
    (dict(config=CONFIG, command=["python", "x.py"]), "got a config"),
    (dict(command=["python", "x.py"], sets=["train.epochs=2"]), "--set changes a config"),
    (dict(config=CONFIG, nodes=0), "--nodes 0 must be a whole number >= 1"),
    (dict(config=CONFIG, tasks_per_node=-1), "--tasks-per-node -1"),
    (dict(config=CONFIG, max_restarts=-2), "--max-restarts -2 must be >= 0"),
    (dict(config=CONFIG, nodes=2, tasks_per_node=2, min_processes=5),
     "--min-processes 5 must be between 1 and --nodes x --tasks-per-node = 4"),
    (dict(config=CONFIG, time="2h"), "--time '2h' is not a SLURM time"),
    (dict(config=CONFIG, time="1", grace=60), "--grace 60 s is not shorter than --time 1"),
    (dict(config=CONFIG, grace=-1), "--grace -1 is negative"),
    (dict(config=CONFIG, sbatch_options=["--account ml"]), "is not KEY=VALUE"),
    (dict(config=CONFIG, sbatch_options=["comment=a b"]), "is not KEY=VALUE"),
    (dict(config=CONFIG, sbatch_options=["nodes=4"]), "--sbatch nodes=4 sets what podkit "
                                                      "writes itself: use --nodes"),
    (dict(config=CONFIG, sbatch_options=["no-requeue"]), "sets what podkit writes itself"),
    (dict(config=CONFIG, time="1:00", grace=60), "(60 s: SLURM reads MM, MM:SS"),
    (dict(config=CONFIG, partition="a b"), "--partition 'a b' is not a partition name"),
    (dict(config=CONFIG, run_dir="x"), "--run-dir is for -- COMMAND jobs"),
    (dict(config=CONFIG, sets=["checkpoint.enabled=false"]), "checkpoint.enabled = false"),
    (dict(config=CONFIG, sets=["train.epochz=2"]), "epochz"),
])
def test_bad_slurm_input_is_an_error_naming_it(kwargs, said, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        SlurmJob(**kwargs).script()
    assert said in str(e.value)


def test_slurm_times():
    assert [slurm_seconds(t) for t in ("90", "10:30", "01:00:00", "1-0", "1-02:03:04")] == \
        [5400, 630, 3600, 86400, 93784]


def test_submit_without_sbatch_is_a_submit_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    job = SlurmJob(config=CONFIG, sets=[f"run.dir={tmp_path}"])
    with pytest.raises(SubmitError, match="sbatch is not on PATH"):
        job.submit(job.write())


@pytest.mark.parametrize("hostlist, hosts", [
    ("n1", ["n1"]),
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("gpu[08-10],login", ["gpu08", "gpu09", "gpu10", "login"]),
    ("node[001,007-008]-ib", ["node001-ib", "node007-ib", "node008-ib"]),
    ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
    ("a-1,b[3],c", ["a-1", "b3", "c"]),
])
def test_slurm_host_lists_expand_in_full(hostlist, hosts):
    assert jobenv.expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("hostlist, said", [
    ("n[1-3", "unbalanced bracket"), ("n[a-b]", "is not a range list"),
    ("n[5-2]", "runs backwards"), ("", "names no host"),
])
def test_bad_host_lists_are_errors(hostlist, said):
    with pytest.raises(ConfigError, match=said):
        jobenv.expand_hostlist(hostlist)


def test_a_slurm_step_is_read_from_its_variables(monkeypatch):
    for name in list(os.environ):
        if name.startswith("SLURM_"):
            monkeypatch.delenv(name)
    assert jobenv.detect() is None  # not under SLURM
    monkeypatch.setenv("SLURM_JOB_ID", "4100")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_STEP_NODELIST", "localhost")
    assert jobenv.detect() is None  # one task: nothing to join
    # A batch script's shell: the allocation's 8 tasks and SLURM_PROCID=0, but no srun step.
    # Joined as "process 0 of 8" it would wait for 7 processes forever; it runs alone, warned.
    monkeypatch.setenv("SLURM_NTASKS", "8")
    with pytest.warns(UserWarning, match="not in an srun step: it runs alone. Start it with srun"):
        assert jobenv.detect() is None
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "8")
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_STEP_NODELIST", "localhost,node[2-4]")
    env = jobenv.detect()
    # JAX's port for the job id (65535 - 4096 + 1 + 4100 % 4096), task 0's node first.
    assert env == jobenv.JobEnv("localhost:61444", 8, 5, "SLURM job 4100 on localhost,node[2-4]")


def test_a_preempted_exit_code_outside_0_255_is_an_error(monkeypatch):
    monkeypatch.setenv(jobenv.ENV_PREEMPTED_EXIT, "300")
    with pytest.raises(ConfigError, match="PODKIT_PREEMPTED_EXIT_CODE='300'"):
        jobenv.preempted_exit_code()
    monkeypatch.setenv(jobenv.ENV_PREEMPTED_EXIT, "42")
    assert jobenv.preempted_exit_code() == 42


def test_no_time_limit_is_accepted_without_a_signal(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for limit in ("0", "UNLIMITED"):
        text = SlurmJob(config=CONFIG, time=limit).script()
        assert f"#SBATCH --time={limit}" in text and "--signal" not in text


def test_cpus_per_task_reach_the_tasks(tmp_path, monkeypatch):
    """srun does not inherit sbatch's --cpus-per-task (SLURM 22.05's srun(1))."""
    monkeypatch.chdir(tmp_path)
    text = SlurmJob(config=CONFIG, cpus_per_task=8).script()
    assert "#SBATCH --cpus-per-task=8" in text and "export SRUN_CPUS_PER_TASK=8" in text
    assert "SRUN_CPUS_PER_TASK" not in SlurmJob(config=CONFIG).script()


@pytest.mark.parametrize("command, name", [
    (["python", "train.py"], "train"), (["/usr/bin/env", "python3", "-u", "x/fit.py"], "fit"),
    (["python", "-m", "pkg.finetune"], "finetune"), (["./run.sh", "--fast"], "run"),
])
def test_a_command_job_is_named_after_its_script(command, name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = SlurmJob(command=command).script()
    assert f"#SBATCH --job-name={name}" in text
    assert f"# Run directory {tmp_path / 'runs' / name};" in text


@pytest.mark.parametrize("said, partition, fix", [
    ("sbatch: error: invalid partition specified: nope\nsbatch: error: Batch job submission "
     "failed: Invalid partition name specified", "nope", "--partition 'nope' is not one of"),
    ("sbatch: error: Batch job submission failed: Invalid partition name specified", None,
     "the cluster has no default partition for you; pass --partition"),
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition "
     "combination specified", None, "--sbatch account=NAME"),
    ("sbatch: error: Batch job submission failed: Requested time limit is invalid (missing or "
     "exceeds some limit)", None, "the partition needs a time limit; pass --time"),
    ("allocation failure: Requested node configuration is not available", None,
     "the partition has no 2 node(s) that each take --tasks-per-node 1"),
    ("sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\nsbatch: "
     "fatal: Could not establish a configuration source", None,
     "sbatch could not reach a SLURM controller"),
])
def test_sbatch_refusals_name_the_flag_they_are_about(said, partition, fix):
    """sbatch's own words, from SLURM 22.05 (the refusals a real slurmctld gives are in
    tests/test_slurm.py), each with the fix for what it is about, never another flag's."""
    text = SlurmJob(config=CONFIG, nodes=2, partition=partition)._refusal(said)
    assert fix in text, text
    if partition is None:
        assert "None" not in text


def test_the_coordinator_may_be_given_where_node_names_do_not_resolve(monkeypatch):
    for name in list(os.environ):
        if name.startswith("SLURM_"):
            monkeypatch.delenv(name)
    for key, value in dict(SLURM_JOB_ID="9", SLURM_STEP_NUM_TASKS="2", SLURM_PROCID="1",
                           SLURM_STEP_NODELIST="no-such-node[01-02]").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol either
    with pytest.raises(podkit_errors.ConnectError) as e:
        jobenv.detect()
    assert "'no-such-node01' (process 0's) is not known to DNS" in str(e.value)
    assert "export PODKIT_COORDINATOR=HOST:PORT" in str(e.value)
    assert jobenv.detect("10.0.0.1:1234") == jobenv.JobEnv(
        "10.0.0.1:1234", 2, 1, "SLURM job 9 on no-such-node[01-02]")


def test_the_jobs_slices_and_the_configs_are_one_setting(tmp_path):
    # --slices defaults to the config's [strategy] slices and, given, is written there: the
    # JobSet's replicas and the run's dcn mesh axis are the same count.
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "podkit.cli", "submit", "k8s", *args],
                              capture_output=True, text=True, cwd=tmp_path)

    base = (CONFIG, "--tpu", "v5e-4x4", "--image", "i:1", "--checkpoint-dir", "gs://b/r",
            "--dry-run")
    from_config = cli(*base, "--set", "strategy.slices=2")
    assert from_config.returncode == 0, from_config.stderr
    docs = list(yaml.safe_load_all(from_config.stdout))
    jobset = next(d for d in docs if d["kind"] == "JobSet")
    assert jobset["spec"]["replicatedJobs"][0]["replicas"] == 2
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["config.toml"]
    assert "slices = 2" in config
    from_flag = cli(*base, "--slices", "3")
    assert from_flag.returncode == 0, from_flag.stderr
    assert "slices = 3" in from_flag.stdout
    both = cli(*base, "--set", "strategy.slices=2", "--slices", "3")
    assert both.returncode == 2 and "Traceback" not in both.stderr
    assert "--slices 3 but" in both.stderr and "strategy.slices = 2" in both.stderr
