"""Cluster launchers in this process (dualtrain/launch/cluster.py, the backends' launch.detect):
Slurm's compact lists, Slurm's variables map to ranks and addresses, the batch script is never a
replica, torchrun and TF_CONFIG win, and a broken environment is one user error.

Through the real CLI (``run --dry-run --json`` in a subprocess, the Kubeflow operators'
environments, the examples' command lines): tests/integration/test_cluster_env_cli.py.
"""

from __future__ import annotations

import json

import pytest

from dualtrain.backends.tf import launch as tf_launch
from dualtrain.backends.torch import launch as torch_launch
from dualtrain.errors import UserError
from dualtrain.launch import cluster, slurm


def slurm_step(
    procid: int,
    *,
    nodes: str = "node[01-02]",
    tasks: str = "1(x2)",
    ntasks: int = 2,
    localid: int = 0,
    nodename: str | None = None,
    job: str = "4123",
) -> dict[str, str]:
    """What srun gives one task (Slurm's src/common/env.c: env_array_for_step, setup_env)."""
    env = {
        "SLURM_JOB_ID": job,
        "SLURM_JOBID": job,
        "SLURM_JOB_NAME": "dualtrain",
        "SLURM_JOB_NODELIST": nodes,
        "SLURM_NODELIST": nodes,
        "SLURM_NTASKS": str(ntasks),
        "SLURM_TASKS_PER_NODE": tasks,
        "SLURM_STEP_ID": "0",
        "SLURM_STEPID": "0",
        "SLURM_STEP_NODELIST": nodes,
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_STEP_TASKS_PER_NODE": tasks,
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
    }
    if nodename is not None:
        env["SLURMD_NODENAME"] = nodename
    return env


# ------------------------------------------------------------------------------------------------
# Slurm's compact lists


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("node01", ["node01"]),
        ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
        ("n[1-2],m5,o[3-4,6,7-9]", ["n1", "n2", "m5", "o3", "o4", "o6", "o7", "o8", "o9"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),  # no padding: widths grow
        ("n[008-010]", ["n008", "n009", "n010"]),  # the lower bound's padding is kept
        ("n[3]", ["n3"]),
        ("a[1-2]-ib", ["a1-ib", "a2-ib"]),  # suffix after the range
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),  # two groups: a product
        ("b2,a1,b2", ["b2", "a1", "b2"]),  # order kept, nothing deduplicated
        ("host0 host1", ["host0", "host1"]),  # whitespace separates too
        ("[1-2]", ["1", "2"]),
        ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
    ],
)
def test_expand_hostlist(text, hosts):
    assert slurm.expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    "text",
    [
        "",
        "node[01-",
        "node01]",
        "n[[1]]",
        "n[]",
        "n[3-1]",
        "n[a-b]",
        "n[1-2-3]",
        "a,,b",
        "a,",
        "n[1,]",
    ],
)
def test_expand_hostlist_rejects(text):
    with pytest.raises(ValueError):
        slurm.expand_hostlist(text)


@pytest.mark.parametrize(
    "text, counts",
    [
        ("1", [1]),
        ("2(x3),1", [2, 2, 2, 1]),
        ("1(x2)", [1, 1]),
        ("4,2(x2),8", [4, 2, 2, 8]),
    ],
)
def test_expand_tasks_per_node(text, counts):
    assert slurm.expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "x", "2(x)", "2(x0)", "2x3", "1,,2", "-1"])
def test_expand_tasks_per_node_rejects(text):
    with pytest.raises(ValueError):
        slurm.expand_tasks_per_node(text)


# ------------------------------------------------------------------------------------------------
# Slurm mapping, in process


def test_slurm_two_nodes_in_process():
    for procid, node in ((0, "node01"), (1, "node02")):
        env = slurm_step(procid, nodename=node)
        t = torch_launch.detect(env)
        assert (t.kind, t.rank, t.world_size, t.local_rank, t.local_world_size) == (
            "slurm",
            procid,
            2,
            0,
            1,
        )
        assert t.env == {
            "RANK": str(procid),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "node01",
            "MASTER_PORT": "19123",
        }
        assert t.line == f"Slurm task {procid} of 2 ({node}), MASTER_ADDR node01:19123"
        f = tf_launch.detect(env)
        assert json.loads(f.env["TF_CONFIG"]) == {
            "cluster": {"worker": ["node01:19123", "node02:19123"]},
            "task": {"type": "worker", "index": procid},
        }
        # The TF_CONFIG dualtrain builds is one the tf backend itself accepts, with the same rank.
        assert tf_launch.parse_tf_config(f.env["TF_CONFIG"]).rank == procid


def test_slurm_uneven_layout_and_ports():
    # 3 tasks: two on n1, one on n2 (block distribution); TF ports: base + SLURM_LOCALID.
    env = slurm_step(
        1, nodes="n[1-2]", tasks="2,1", ntasks=3, localid=1, nodename="n1", job="987654"
    )
    t = torch_launch.detect(env)
    assert (t.rank, t.local_rank, t.local_world_size, t.master_addr, t.master_port) == (
        1,
        1,
        2,
        "n1",
        15000 + 7654,
    )
    env = slurm_step(
        2, nodes="n[1-2]", tasks="2,1", ntasks=3, localid=0, nodename="n2", job="987654"
    )
    f = tf_launch.detect({**env, cluster.TF_PORT_BASE: "31000"})
    assert f.tf_cluster == {"worker": ["n1:31000", "n1:31001", "n2:31000"]}
    assert (f.rank, f.host, f.local_world_size) == (2, "n2", 1)


def test_slurm_port_rules():
    assert slurm.slurm_port({}, "4123") == 19123  # 15000 + last four digits (Lightning)
    assert slurm.slurm_port({}, "12") == 15012
    assert slurm.slurm_port({}, None) == 12910  # Lightning's fallback without a job id
    assert slurm.slurm_port({"MASTER_PORT": "29400"}, "4123") == 29400  # the user's port wins
    t = torch_launch.detect({**slurm_step(0), "MASTER_ADDR": "node01-ib"})
    assert t.master_addr == "node01-ib"  # and so does the user's address


@pytest.mark.parametrize(
    "change",
    [
        {"SLURM_STEP_ID": None, "SLURM_STEPID": None},  # the batch script / salloc shell
        {"SLURM_STEP_ID": "4294967291", "SLURM_STEPID": "4294967291"},  # the batch pseudo-step
        {"SLURM_STEP_ID": "batch", "SLURM_STEPID": "batch"},
        {"SLURM_JOB_NAME": "interactive"},  # Lightning's interactive-job rule
        {"SLURM_JOB_NAME": "bash"},
        {"SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1", "SLURM_STEP_TASKS_PER_NODE": "1"},
        {cluster.SLURM_SWITCH: "0"},
        {"SLURM_PROCID": None},
    ],
)
def test_not_a_slurm_replica(change):
    env = slurm_step(0)
    for k, v in change.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    assert torch_launch.detect(env) is None
    assert tf_launch.detect(env) is None


def test_other_launchers_win_over_slurm():
    torchrun = {
        "RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "h0",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "j",
    }
    found = torch_launch.detect({**slurm_step(0), **torchrun})
    assert (found.kind, found.rank, found.world_size, found.env) == ("torchrun", 1, 4, {})
    tf_config = json.dumps(
        {"cluster": {"worker": ["a:1", "b:2", "c:3"]}, "task": {"type": "worker", "index": 2}}
    )
    found = tf_launch.detect({**slurm_step(0), "TF_CONFIG": tf_config})
    assert (found.kind, found.rank, found.world_size, found.env) == ("tf-config", 2, 3, {})
    # A TF_CONFIG also keeps a torch run from reading Slurm (another launcher placed this process).
    assert torch_launch.detect({**slurm_step(0), "TF_CONFIG": tf_config}) is None


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"SLURM_PROCID": "2"}, "SLURM_PROCID=2"),
        ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x'"),
        ({"SLURM_STEP_NODELIST": "node[01-"}, "SLURM_STEP_NODELIST='node[01-'"),
        ({"SLURM_STEP_TASKS_PER_NODE": "1(x"}, "SLURM_STEP_TASKS_PER_NODE='1(x'"),
        ({"SLURM_STEP_TASKS_PER_NODE": "1(x3)"}, "SLURM_STEP_TASKS_PER_NODE='1(x3)'"),
        ({"SLURM_LOCALID": "1"}, "SLURM_LOCALID=1"),  # not block distribution
        ({"SLURMD_NODENAME": "node02"}, "SLURMD_NODENAME=node02"),
        ({"SLURM_LOCALID": None}, "SLURM_LOCALID unset"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT='70000'"),
    ],
)
def test_invalid_slurm_env_is_one_user_error(change, needle):
    env = slurm_step(0, nodename="node01")
    for k, v in change.items():
        if v is None:
            env.pop(k)
        else:
            env[k] = v
    with pytest.raises(UserError) as exc:
        torch_launch.detect(env)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_pytorchjob_with_several_processes_per_pod_is_refused():
    env = {
        "MASTER_ADDR": "j-master-0",
        "MASTER_PORT": "23456",
        "WORLD_SIZE": "4",
        "RANK": "1",
        "PET_NPROC_PER_NODE": "2",
        "PET_NODE_RANK": "1",
        "PET_NNODES": "2",
    }
    with pytest.raises(UserError, match="PET_NPROC_PER_NODE=2"):
        torch_launch.detect(env)
