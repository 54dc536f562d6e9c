"""Worker entry: ``python -m dualtrain.backends.torch RUN_DIR`` (one per rank, torchrun
environment).

A user-facing problem (no GPU, bad data) prints one line and exits 2; anything else is a bug and
keeps its traceback (exit 1).
"""

from __future__ import annotations

import gc
import sys

gc.disable()  # until training starts (dualtrain.runtime.start.settle_gc)

from dualtrain.runtime import clock  # noqa: E402

clock.mark("entry")

from dualtrain.runtime.entry import exit_now, worker_main  # noqa: E402


def main(argv: list[str]) -> int:
    from dualtrain.backends.torch.worker import run_worker  # lazy: framework

    clock.mark("framework")  # torch is imported (worker.py)

    # The process ends right after the run (below), so the process group is not torn down.
    return worker_main(
        "torch", argv, lambda spec, run_dir, start: run_worker(spec, run_dir, start, destroy=False)
    )


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))  # no interpreter teardown, the process group left as it is
