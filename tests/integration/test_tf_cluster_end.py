"""The tasks of a multi_worker TF run leave together (dualtrain.backends.tf.cluster): a task that
left while a peer still fetched its part of the last collective failed that peer after the last
step ("Socket closed ... task:1")."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from testkit.worker_hooks import hook_env


def _exit_time(pid_file: Path, deadline: float) -> float | None:
    """When the process whose pid ``pid_file`` will hold exits (a monotonic time), polled."""
    while not pid_file.exists() or not pid_file.read_text():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)
    stat = Path(f"/proc/{int(pid_file.read_text())}/stat")
    while time.monotonic() < deadline:
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return time.monotonic()
        except OSError:
            return time.monotonic()
        time.sleep(0.01)
    return None


def test_no_task_leaves_before_every_task_has_finished(tmp_path, cli):
    watch = tmp_path / "watch"
    watch.mkdir()
    left: list[float | None] = []
    poll = threading.Thread(
        target=lambda: left.append(_exit_time(watch / "pid-1", time.monotonic() + 300)),
        daemon=True,
    )
    poll.start()
    proc = cli(
        "run",
        "--backend",
        "tf",
        "--config",
        "configs/mnist_mlp.yaml",
        "--world-size",
        "2",
        "--out",
        str(tmp_path / "run"),
        *("--set", "tf.strategy=multi_worker", "--set", "train.max_steps=2"),
        *("--set", "train.epochs=null", "--set", "data.test_limit=100"),
        *("--set", "logging.tensorboard=false"),
        env=hook_env(f"testkit.worker_hooks:chief_finishes_late={watch}"),
    )
    poll.join(timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    chief_done = float((watch / "chief-done").read_text())
    assert left and left[0] is not None, "task 1's exit was not seen"
    assert left[0] >= chief_done, (
        f"task 1 left {chief_done - left[0]:.2f} s before task 0 had finished its run"
    )
