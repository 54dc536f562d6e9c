"""Every command line in examples/kubernetes/*.yaml and examples/slurm/dualtrain.sbatch passes the
CLI's own validation (``run --dry-run --json``, as the pod or the Slurm step would start it)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import yaml

from testkit.cli import ROOT
from tests.integration.dry_runs import EXAMPLES, batch_script_env, clean_env


def _expand_k8s(text: str, env: dict[str, str]) -> str:
    """Kubelet's $(VAR) expansion in command/args."""
    return re.sub(
        r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text
    )


def _pod_command(
    job: dict, template: dict, container_name: str, operator_env: dict[str, str], tmp_path: Path
) -> tuple[list[str], dict[str, str]]:
    """The pod's dualtrain command line and environment, with in-container paths mapped here:
    the ConfigMap made from configs/ -> the repository's configs/, a PVC -> a folder of tmp_path."""
    pod = template["spec"]
    container = next(c for c in pod["containers"] if c["name"] == container_name)
    env = dict(operator_env)
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
        else:
            assert (
                e["valueFrom"]["fieldRef"]["fieldPath"]
                == "metadata.labels['training.kubeflow.org/job-name']"
            )
            env[e["name"]] = job["metadata"]["name"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {}
    for m in container["volumeMounts"]:
        vol = volumes[m["name"]]
        if "configMap" in vol:
            assert (
                vol["configMap"]["name"] == "dualtrain-configs"
            )  # made from configs/ (see header)
            mounts[m["mountPath"]] = ROOT / "configs"
        else:
            mounts[m["mountPath"]] = tmp_path / "pvc" / vol["persistentVolumeClaim"]["claimName"]
    argv = [_expand_k8s(a, env) for a in container["command"] + container.get("args", [])]
    for i, a in enumerate(argv):
        for mount, here in mounts.items():
            if a.startswith(mount + "/"):
                argv[i] = str(here / a[len(mount) + 1 :])
    assert argv[:2] == ["dualtrain", "run"], argv
    return argv, env


def _manifest(name: str) -> tuple[str, dict]:
    text = (EXAMPLES / "kubernetes" / name).read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert "kubectl create configmap dualtrain-configs --from-file=configs/" in text
    return text, next(d for d in docs if d["apiVersion"] == "kubeflow.org/v1")


def _run_pod(argv: list[str], env: dict[str, str]) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "dualtrain", *argv[1:], "--dry-run", "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=clean_env(env),
        timeout=120,
    )
    assert proc.returncode == 0, f"{argv}\n{proc.stderr}"
    return json.loads(proc.stdout)


def test_pytorchjob_manifest_commands_pass_dry_run(tmp_path):
    _, job = _manifest("pytorchjob.yaml")
    assert job["kind"] == "PyTorchJob"
    name, specs = job["metadata"]["name"], job["spec"]["pytorchReplicaSpecs"]
    assert set(specs) == {"Master", "Worker"} and specs["Master"]["replicas"] == 1
    total = sum(r["replicas"] for r in specs.values())
    nproc = job["spec"].get("nprocPerNode", "auto")
    master = next(
        c for c in specs["Master"]["template"]["spec"]["containers"] if c["name"] == "pytorch"
    )
    port = next(p["containerPort"] for p in master["ports"] if p["name"] == "pytorchjob-port")
    ranks = []
    for rtype, rspec in specs.items():
        assert rspec["restartPolicy"] == "OnFailure"
        for i in range(rspec["replicas"]):
            rank = i if rtype == "Master" else i + 1
            operator = {
                "PYTHONUNBUFFERED": "0",
                "MASTER_ADDR": f"{name}-master-0",
                "MASTER_PORT": str(port),
                "WORLD_SIZE": str(total * (int(nproc) if nproc.isdigit() else 1)),
                "RANK": str(rank),
                "PET_NPROC_PER_NODE": nproc,
                "PET_NODE_RANK": str(rank),
                "PET_NNODES": str(total),
                "KUBERNETES_SERVICE_HOST": "10.96.0.1",
            }
            argv, env = _pod_command(job, rspec["template"], "pytorch", operator, tmp_path)
            assert any(a.startswith("train.checkpoint_every=") for a in argv)  # restarts resume
            plan = _run_pod(argv, env)
            assert (plan["launcher"], plan["backend"], plan["rank"], plan["world_size"]) == (
                "kubeflow-pytorchjob",
                "torch",
                rank,
                total,
            )
            assert (plan["master_addr"], plan["master_port"]) == (f"{name}-master-0", port)
            assert plan["run_dir"] == str(tmp_path / "pvc" / "dualtrain-runs" / name)
            assert plan["run_dir_action"] == ("create" if rank == 0 else None)
            ranks.append(rank)
    assert sorted(ranks) == list(range(total))


def test_tfjob_manifest_commands_pass_dry_run(tmp_path):
    _, job = _manifest("tfjob.yaml")
    assert job["kind"] == "TFJob"
    name, specs = job["metadata"]["name"], job["spec"]["tfReplicaSpecs"]
    ns = job["metadata"].get("namespace", "default")

    def port(rspec):
        c = next(c for c in rspec["template"]["spec"]["containers"] if c["name"] == "tensorflow")
        return next(p["containerPort"] for p in c["ports"] if p["name"] == "tfjob-port")

    # genClusterSpec: every replica type but Evaluator, <job>-<type>-<i>.<namespace>.svc:<port>
    cl = {
        rt.lower(): [f"{name}-{rt.lower()}-{i}.{ns}.svc:{port(r)}" for i in range(r["replicas"])]
        for rt, r in specs.items()
        if rt != "Evaluator"
    }
    expected_rank = {
        ("chief", 0): 0,
        **{("worker", i): i + len(cl.get("chief", [])) for i in range(len(cl.get("worker", [])))},
    }
    for rt, rspec in specs.items():
        assert rspec["restartPolicy"] == "OnFailure"
        for i in range(rspec["replicas"]):
            tf_config = {
                "cluster": cl,
                "task": {"type": rt.lower(), "index": i},
                "environment": "cloud",
            }
            argv, env = _pod_command(
                job,
                rspec["template"],
                "tensorflow",
                {"PYTHONUNBUFFERED": "0", "TF_CONFIG": json.dumps(tf_config)},
                tmp_path,
            )
            plan = _run_pod(argv, env)
            rank = expected_rank[(rt.lower(), i)]
            assert (plan["launcher"], plan["backend"], plan["rank"], plan["world_size"]) == (
                "kubeflow-tfjob",
                "tf",
                rank,
                len(expected_rank),
            )
            assert plan["tf_strategy"] == "multi_worker" and plan["tf_cluster"] == cl
            assert plan["run_dir"] == str(tmp_path / "pvc" / "dualtrain-tf-runs" / name)


_SHIM_HEAD = f"""#!{sys.executable}
import json, os, subprocess, sys
sys.path.insert(0, {str(ROOT)!r})
from dualtrain.launch.slurm import expand_hostlist
"""

#: srun: start the command once per task (one after another), with the step's variables.
_SRUN = (
    _SHIM_HEAD
    + """
args, opts = sys.argv[1:], {}
while args[0].startswith("-"):
    key, _, value = args.pop(0).partition("=")
    opts[key] = value
hosts = expand_hostlist(os.environ["SLURM_JOB_NODELIST"])
per = int(opts.get("--ntasks-per-node") or os.environ["SLURM_NTASKS_PER_NODE"])
counter = os.path.join(os.environ["SHIM_DIR"], "steps")
step = len(open(counter).read()) if os.path.exists(counter) else 0
open(counter, "a").write("x")
n, layout = len(hosts) * per, f"{per}(x{len(hosts)})"
for rank in range(n):
    env = dict(os.environ, SLURM_STEP_ID=str(step), SLURM_STEPID=str(step), SLURM_PROCID=str(rank),
               SLURM_LOCALID=str(rank % per), SLURM_NODEID=str(rank // per),
               SLURMD_NODENAME=hosts[rank // per], SLURM_NTASKS=str(n),
               SLURM_STEP_NUM_TASKS=str(n), SLURM_STEP_NODELIST=os.environ["SLURM_JOB_NODELIST"],
               SLURM_STEP_TASKS_PER_NODE=layout, SLURM_TASKS_PER_NODE=layout)
    code = subprocess.call(args, env=env)
    if code:
        sys.exit(code)
"""
)

#: torchrun: one process per --nproc-per-node on this "node", with torchrun's variables.
_TORCHRUN = (
    _SHIM_HEAD
    + """
args, opts = sys.argv[1:], {}
while args[0].startswith("--"):
    key, _, value = args.pop(0).partition("=")
    opts[key] = value
assert opts["--rdzv-backend"] == "c10d" and opts["--rdzv-id"], opts
assert args[0] == "-m", args
nodes, nproc = int(opts["--nnodes"]), int(opts["--nproc-per-node"])
node = int(os.environ["SLURM_NODEID"])
for local in range(nproc):
    env = dict(os.environ, RANK=str(node * nproc + local), LOCAL_RANK=str(local),
               WORLD_SIZE=str(nodes * nproc), LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK=str(node),
               MASTER_ADDR=opts["--rdzv-endpoint"].rsplit(":", 1)[0], MASTER_PORT="29501",
               TORCHELASTIC_RUN_ID=opts["--rdzv-id"])
    code = subprocess.call([args[1], *args[2:]], env=env)
    if code:
        sys.exit(code)
"""
)

#: dualtrain: every `dualtrain run` becomes a dry run whose plan is logged; other commands are
#: logged.
_DUALTRAIN = (
    _SHIM_HEAD
    + """
args = sys.argv[1:]
log = open(os.path.join(os.environ["SHIM_DIR"], "log.jsonl"), "a")
if args[:1] != ["run"]:
    log.write(json.dumps({"args": args}) + "\\n")
    sys.exit(0)
proc = subprocess.run([sys.executable, "-m", "dualtrain", *args, "--dry-run", "--json"],
                      capture_output=True, text=True)
sys.stderr.write(proc.stderr)
if proc.returncode == 0:
    log.write(json.dumps({"args": args, "plan": json.loads(proc.stdout)}) + "\\n")
sys.exit(proc.returncode)
"""
)

_SCONTROL = (
    _SHIM_HEAD
    + """
assert sys.argv[1:3] == ["show", "hostnames"], sys.argv
print("\\n".join(expand_hostlist(sys.argv[3])))
"""
)


def test_sbatch_steps_pass_dry_run(tmp_path):
    script = EXAMPLES / "slurm" / "dualtrain.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    shims = tmp_path / "bin"
    shims.mkdir()
    for name, body in (
        ("srun", _SRUN),
        ("torchrun", _TORCHRUN),
        ("dualtrain", _DUALTRAIN),
        ("scontrol", _SCONTROL),
    ):
        (shims / name).write_text(body)
        (shims / name).chmod(stat.S_IRWXU)
    # The batch script's own environment (sbatch --nodes=2 --ntasks-per-node=1 --cpus-per-task=8).
    env = clean_env(
        {
            **batch_script_env(),
            "SLURM_JOB_ID": "7321",
            "SLURM_JOBID": "7321",
            "SLURM_JOB_NAME": "dualtrain-mnist",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_NNODES": "2",
            "SLURM_NTASKS_PER_NODE": "1",
            "SLURM_CPUS_PER_TASK": "8",
            "SLURM_SUBMIT_DIR": str(ROOT),
            "DUALTRAIN_RUNS": str(tmp_path / "runs"),
            "SHIM_DIR": str(tmp_path),
        }
    )
    env["PATH"] = f"{shims}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    runs = tmp_path / "runs" / "7321"
    by_out: dict[str, list[dict]] = {}
    for entry in log:
        if "plan" in entry:
            by_out.setdefault(entry["plan"]["run_dir"] or "?", []).append(entry["plan"])
    torchrun, srun_torch, srun_tf = (
        by_out.pop(str(runs / d)) for d in ("torchrun", "torch-srun", "tf-srun")
    )
    assert not by_out, by_out
    assert [(p["launcher"], p["rank"]) for p in torchrun] == [("torchrun", 0), ("torchrun", 1)]
    # The preflight dry run and the run itself: both tasks, twice.
    assert [(p["launcher"], p["rank"]) for p in srun_torch] == [("slurm", 0), ("slurm", 1)] * 2
    assert all((p["master_addr"], p["master_port"]) == ("node01", 15000 + 7321) for p in srun_torch)
    assert [(p["launcher"], p["rank"], p["tf_strategy"]) for p in srun_tf] == [
        ("slurm", 0, "multi_worker"),
        ("slurm", 1, "multi_worker"),
    ]
    assert all(p["tf_cluster"] == {"worker": ["node01:22321", "node02:22321"]} for p in srun_tf)
    assert all(p["world_size"] == 2 for p in torchrun + srun_torch + srun_tf)
    # The compare runs once, in the batch script (no step there, so no replica).
    assert [e["args"][0] for e in log if "plan" not in e] == ["compare"]
    assert not runs.exists()  # every step was a dry run
