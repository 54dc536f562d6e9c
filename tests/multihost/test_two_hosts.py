"""Two hosts on one machine: two Linux network namespaces joined by a veth pair.

Each namespace has its own network stack and one address on the veth (neither is loopback, and the
machine's host name resolves to neither), so the two ``dualtrain run`` processes find each other
only the way two real hosts do: torch through MASTER_ADDR and the interface that routes to it, TF
through a TF_CONFIG that names both hosts. The traffic stays inside the namespaces the fixture made;
it removes them afterwards.

Checked: the two-host run feeds the same shards and ends with bit-identical weights as the same spec
run on one host at the same world size (same threads per worker: thread counts change rounding);
killing one host's process fails the other within ``distribution.timeout_s``, with one line naming
the lost peer (rank and address) and no traceback.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from testkit.cli import ROOT, cli_env, require, run_cli

# Signals, kills, torchrun or timing: make test runs these alone, after the parallel part.
pytestmark = pytest.mark.serial

require("torch", "tensorflow")

# What the launcher variables of an outer torchrun or TF cluster would otherwise leak into the
# hosts.
_LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TF_CONFIG",
    "GLOO_SOCKET_IFNAME",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_JOB_ID",
)
TIMEOUT_S = 30


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


class Hosts:
    """Two namespaces ``a`` and ``b`` with addresses ``addr[0]`` and ``addr[1]`` on one veth
    pair."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.ns = (f"dualtrain-a{tag}", f"dualtrain-b{tag}")
        self.ifname = (f"dta{tag}", f"dtb{tag}")
        net = 10 + os.getpid() % 240
        self.addr = (f"10.213.{net}.1", f"10.213.{net}.2")

    def create(self) -> str | None:
        """Make the namespaces; on failure return why (the caller skips)."""
        steps = [
            ("netns", "add", self.ns[0]),
            ("netns", "add", self.ns[1]),
            (
                "link",
                "add",
                self.ifname[0],
                "netns",
                self.ns[0],
                "type",
                "veth",
                "peer",
                "name",
                self.ifname[1],
                "netns",
                self.ns[1],
            ),
        ]
        for i in (0, 1):
            steps += [
                ("-n", self.ns[i], "addr", "add", f"{self.addr[i]}/24", "dev", self.ifname[i]),
                ("-n", self.ns[i], "link", "set", self.ifname[i], "up"),
                ("-n", self.ns[i], "link", "set", "lo", "up"),
            ]
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                self.remove()
                return f"`ip {' '.join(step)}` failed: {done.stderr.strip()}"
        return None

    def remove(self) -> None:
        for ns in self.ns:  # deleting a namespace deletes its end of the veth pair, then the pair
            _ip("netns", "del", ns)

    def start(self, host: int, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        """``dualtrain ARGS`` inside host ``host``'s namespace (``ip netns exec`` and ``env`` exec,
        so the Popen's pid is the dualtrain process itself)."""
        full = cli_env()
        for key in _LAUNCH_VARS:
            full.pop(key, None)
        full.update(env)
        out = open(log, "w")
        return subprocess.Popen(
            ["ip", "netns", "exec", self.ns[host], sys.executable, "-m", "dualtrain", *args],
            env=full,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


@pytest.fixture(scope="module")
def hosts():
    if sys.platform != "linux":
        pytest.skip("network namespaces are Linux only")
    if os.geteuid() != 0:
        pytest.skip("creating network namespaces needs root (CI runs as root)")
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2's `ip` to create network namespaces")
    h = Hosts()
    why = h.create()
    if why is not None:
        pytest.skip(f"cannot create network namespaces here: {why}")
    try:
        yield h
    finally:
        h.remove()


def _spec(tmp_path: Path, **data) -> Path:
    limits = {"train_limit": 2000, "test_limit": 500, **data}
    text = (
        f"name: twohosts\n"
        f"data: {{train_limit: {limits['train_limit']}, test_limit: {limits['test_limit']}, "
        f"batch_size: 64}}\n"
        f"train: {{epochs: {limits.get('epochs', 1)}, log_every: 10}}\n"
        f"distribution: {{world_size: 2, timeout_s: {TIMEOUT_S}, threads_per_worker: 1}}\n"
    )
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


def _backend_args(backend: str) -> list[str]:
    return ["--set", "tf.strategy=multi_worker"] if backend == "tf" else []


def _host_env(hosts: Hosts, backend: str, rank: int, port: int) -> dict[str, str]:
    if backend == "torch":  # what torchrun (or Kubeflow's PyTorchJob) sets on each host
        return {
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": hosts.addr[0],
            "MASTER_PORT": str(port),
        }
    import json  # what a TF cluster (Kubeflow's TFJob) sets: TF_CONFIG naming both hosts

    return {
        "TF_CONFIG": json.dumps(
            {
                "cluster": {"worker": [f"{a}:{port}" for a in hosts.addr]},
                "task": {"type": "worker", "index": rank},
            }
        )
    }


def _port() -> int:
    return 29000 + os.getpid() % 1000


def _wait(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(deadline - time.monotonic(), 1)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"the two-host run did not finish within {timeout}s")
    return codes


def _weights(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


# The default suite runs torch; CI's slow set runs TF too (both are the acceptance).
@pytest.mark.parametrize("backend", ["torch", pytest.param("tf", marks=pytest.mark.slow)])
def test_two_hosts_train_like_one(hosts, tmp_path, backend):
    spec = _spec(tmp_path)
    port = _port() + (0 if backend == "torch" else 1)
    args = ["run", "--backend", backend, "--config", str(spec), *_backend_args(backend)]
    t0 = time.monotonic()
    procs = [
        hosts.start(
            h,
            [*args, "--out", str(tmp_path / f"host{h}")],
            _host_env(hosts, backend, h, port),
            tmp_path / f"host{h}.log",
        )
        for h in (0, 1)
    ]
    codes = _wait(procs, 300)
    wall = time.monotonic() - t0
    logs = [(tmp_path / f"host{h}.log").read_text() for h in (0, 1)]
    assert codes == [0, 0], f"host logs:\n{logs[0][-3000:]}\n---\n{logs[1][-3000:]}"
    two = tmp_path / "host0"
    assert not (tmp_path / "host1").exists()  # the chief writes the run; the other host does not

    one = tmp_path / "onehost"
    done = run_cli(*args, "--out", str(one), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    assert (two / "shards.jsonl").read_bytes() == (one / "shards.jsonl").read_bytes()
    w2, w1 = _weights(two / "weights_final.npz"), _weights(one / "weights_final.npz")
    assert w2.keys() == w1.keys()
    different = [k for k in w1 if w1[k].tobytes() != w2[k].tobytes()]
    assert not different, f"weights differ from the one-host run in {different}"
    train = [line for line in (two / "metrics.jsonl").read_text().splitlines() if '"train"' in line]
    assert len(train) == 32
    if backend == "torch":
        # gloo listened on each host's veth, chosen as the route to MASTER_ADDR (the host name
        # resolves to loopback here, which gloo would otherwise use)
        assert f"gloo on interface {hosts.ifname[1]} ({hosts.addr[1]})" in logs[1]
        import json

        assert json.loads((two / "summary.json").read_text())["gloo_interface"] == hosts.ifname[0]
    print(f"\n{backend}: two hosts {wall:.1f}s, shards and weights identical to one host")


@pytest.mark.parametrize(
    "backend,killed", [("torch", 1), pytest.param("tf", 0, marks=pytest.mark.slow)]
)
def test_lost_host_fails_the_other_naming_it(hosts, tmp_path, backend, killed):
    spec = _spec(tmp_path, train_limit=60000, epochs=3)
    port = _port() + (2 if backend == "torch" else 3)
    args = ["run", "--backend", backend, "--config", str(spec), *_backend_args(backend)]
    logs = [tmp_path / f"host{h}.log" for h in (0, 1)]
    procs = [
        hosts.start(
            h,
            [*args, "--out", str(tmp_path / f"host{h}")],
            _host_env(hosts, backend, h, port),
            logs[h],
        )
        for h in (0, 1)
    ]
    survivor = 1 - killed
    try:
        deadline = time.monotonic() + 240
        while "step 50/" not in logs[0].read_text():  # training is under way on both hosts
            assert all(p.poll() is None for p in procs), logs[0].read_text()[-3000:]
            assert time.monotonic() < deadline, "the two-host run did not reach step 50"
            time.sleep(0.2)
        procs[killed].send_signal(signal.SIGKILL)
        t_kill = time.monotonic()
        code = procs[survivor].wait(timeout=TIMEOUT_S + 30)
        after = time.monotonic() - t_kill
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = logs[survivor].read_text()
    assert code == 1, text[-3000:]
    assert after < TIMEOUT_S, f"the surviving host took {after:.1f}s to fail"
    errors = [line for line in text.splitlines() if line.startswith("dualtrain: error:")]
    assert len(errors) == 1, text[-3000:]
    assert (
        f"{backend} rank {survivor} lost its peer rank {killed} ({hosts.addr[killed]}" in errors[0]
    )
    assert "after step" in errors[0]
    assert "Traceback" not in text
    print(
        f"\n{backend}: host {survivor} failed {after:.2f}s after host {killed} was killed: "
        f"{errors[0]}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "tf"])
def test_network_partition_fails_both_hosts_within_the_timeout(hosts, tmp_path, backend):
    """The cable is pulled (host b's veth goes down, no connection reset reaches anyone): both hosts
    stop within distribution.timeout_s, each naming the peer it lost, instead of hanging."""
    timeout_s = 15
    spec = _spec(tmp_path, train_limit=60000, epochs=3)
    port = _port() + (4 if backend == "torch" else 5)
    args = [
        "run",
        "--backend",
        backend,
        "--config",
        str(spec),
        *_backend_args(backend),
        "--set",
        f"distribution.timeout_s={timeout_s}",
    ]
    logs = [tmp_path / f"host{h}.log" for h in (0, 1)]
    procs = [
        hosts.start(
            h,
            [*args, "--out", str(tmp_path / f"host{h}")],
            _host_env(hosts, backend, h, port),
            logs[h],
        )
        for h in (0, 1)
    ]
    try:
        deadline = time.monotonic() + 240
        while "step 50/" not in logs[0].read_text():
            assert all(p.poll() is None for p in procs), logs[0].read_text()[-3000:]
            assert time.monotonic() < deadline, "the two-host run did not reach step 50"
            time.sleep(0.2)
        assert _ip("-n", hosts.ns[1], "link", "set", hosts.ifname[1], "down").returncode == 0
        t_cut = time.monotonic()
        codes = [p.wait(timeout=timeout_s + 60) for p in procs]
        after = time.monotonic() - t_cut
    finally:
        _ip("-n", hosts.ns[1], "link", "set", hosts.ifname[1], "up")
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [1, 1], [log.read_text()[-2000:] for log in logs]
    assert after < timeout_s + 10, f"the hosts took {after:.1f}s to fail"
    for h in (0, 1):
        text = logs[h].read_text()
        errors = [line for line in text.splitlines() if line.startswith("dualtrain: error:")]
        assert len(errors) == 1 and "Traceback" not in text, text[-3000:]
        assert f"rank {1 - h} ({hosts.addr[1 - h]}" in errors[0], errors[0]
    print(
        f"\n{backend}: both hosts failed {after:.1f}s after the network was cut "
        f"(timeout_s {timeout_s})"
    )
