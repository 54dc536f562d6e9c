"""Worker entry: ``python -m dualtrain.backends.torch RUN_DIR`` (one per rank, torchrun environment).

A user-facing problem (no GPU, bad data) prints one line and exits 2; anything else is a bug and
keeps its traceback (exit 1).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m dualtrain.backends.torch RUN_DIR", file=sys.stderr)
        return 2
    import faulthandler
    import signal

    import yaml

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: where is it stuck?

    from dualtrain.errors import UserError
    from dualtrain.record import SPEC_FILE
    from dualtrain.spec import from_dict

    run_dir = Path(argv[0])
    try:
        spec = from_dict(yaml.safe_load((run_dir / SPEC_FILE).read_text()))
        from dualtrain.backends.torch.worker import run_worker

        run_worker(spec, run_dir)
    except UserError as exc:
        print(f"dualtrain torch worker: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except FileNotFoundError as exc:
        print(f"dualtrain torch worker: error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: the run is complete and its files are closed, and joining the
    # communication library's threads at exit can stall a finished worker.
    os._exit(code)
