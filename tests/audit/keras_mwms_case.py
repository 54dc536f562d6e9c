"""Two MultiWorkerMirroredStrategy workers on localhost recording a Keras ``fit``:
``python -m tests.audit.keras_mwms_case OUT [--chief-task | --chief-only]``. ``--chief-task``:
TF_CONFIG names a ``chief`` task and one ``worker`` (both task_id 0; MWMS numbers them 0 and 1);
``--chief-only``: only the chief makes a recorder, and writes its one-line error to
``OUT.rank0.err``. Each worker's exit code is printed (``codes [..]``); a worker that fails has
its peer stopped, as examples/audit/multi_worker.py's launcher does."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "audit"


def launch(out: str, mode: str) -> None:
    socks = [socket.socket() for _ in range(2)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    addrs = [f"127.0.0.1:{s.getsockname()[1]}" for s in socks]
    for s in socks:
        s.close()
    if mode == "--chief-task" or mode == "--chief-only":
        cluster = {"chief": addrs[:1], "worker": addrs[1:]}
        tasks = [{"type": "chief", "index": 0}, {"type": "worker", "index": 0}]
    else:
        cluster = {"worker": addrs}
        tasks = [{"type": "worker", "index": i} for i in range(2)]
    procs = []
    for rank, task in enumerate(tasks):
        env = {
            **os.environ,
            "TF_CONFIG": json.dumps({"cluster": cluster, "task": task}),
            "DUALTRAIN_AUDIT_WAIT_S": "5",  # the lone recorder's wait (its default: 120 s)
        }
        argv = [sys.executable, "-m", "tests.audit.keras_mwms_case", out, mode, f"--rank={rank}"]
        procs.append(subprocess.Popen(argv, env=env))
    while any(p.poll() is None for p in procs):
        if any(p.poll() for p in procs):
            for p in procs:
                if p.poll() is None:
                    p.terminate()
        time.sleep(0.2)
    print("codes", [p.returncode for p in procs], flush=True)


def work(out: str, mode: str, rank: int) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    sys.path.insert(0, str(EXAMPLES))
    from multi_worker import multi_worker_fixes

    import dualtrain.audit
    from dualtrain.errors import UserError

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    multi_worker_fixes(strategy)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    rng = np.random.default_rng(0)
    data = tf.data.Dataset.from_tensor_slices(
        (rng.normal(size=(32, 6)).astype("float32"), rng.normal(size=(32, 3)).astype("float32"))
    ).batch(8)
    callbacks = []
    if mode != "--chief-only" or rank == 0:
        callbacks.append(dualtrain.audit.keras_recorder(out, model=model))
    try:
        model.fit(data, epochs=2, callbacks=callbacks, verbose=0)
    except UserError as e:
        Path(f"{out}.rank{rank}.err").write_text(f"{e}\n")
        sys.exit(3)


if __name__ == "__main__":
    ranks = [a for a in sys.argv if a.startswith("--rank=")]
    modes = [a for a in sys.argv[2:] if a.startswith("--") and not a.startswith("--rank=")]
    mode = modes[0] if modes else ""
    if ranks:
        work(sys.argv[1], mode, int(ranks[0].split("=")[1]))
    else:
        launch(sys.argv[1], mode)
