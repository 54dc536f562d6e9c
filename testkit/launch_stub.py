"""A stand-in worker for tests/integration/test_launch.py:
``python -m testkit.launch_stub``.

Its behaviour comes from the STUB_ROLE environment variable: ``ok`` exits 0 (once the file
STUB_READY names exists, if set), ``fail`` exits 3, ``fail_first`` exits 1 at once while
``killed`` SIGKILLs itself 0.3 s later, ``noisy`` writes the lines of
NOISY_STDERR to stderr and exits 0, ``hang`` enables the workers' SIGUSR1 stack
dump, creates STUB_READY (if set) and waits forever inside ``stuck_here``; ``finishing`` ignores
SIGTERM (as TF's multi-worker runtime did), creates STUB_READY and exits 0 a second later.
"""

import os
import signal
import sys
import time

from dualtrain.runtime.entry import enable_stack_dump

# TF 2.21 start-up lines (captured on this machine) between lines a user must see.
NOISY_STDERR = """\
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1795338929.142772   12724 cudart_stub.cc:31] Could not find cuda drivers \
on your machine, GPU will not be used.
keep: a user-facing line
E0000 00:00:1795338933.718769   12724 cuda_platform.cc:52] failed call to cuInit: \
INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)
I1122 09:15:02.123456   12724 grpc_server_lib.cc:467] Started server with target: grpc://localhost:1234
To enable the following instructions: AVX2 AVX512F FMA, in other operations, \
rebuild TensorFlow with the appropriate compiler flags.
W1122 09:15:03.000001   12724 some_op.cc:12] keep: a TF warning
Traceback (most recent call last):
keep: the last line, without a newline"""


def stuck_here() -> None:
    while True:
        time.sleep(0.05)


def main() -> int:
    role = os.environ["STUB_ROLE"]
    ready = os.environ.get("STUB_READY")
    if role == "ok":
        while ready and not os.path.exists(ready):
            time.sleep(0.05)
        return 0
    if role == "fail":
        return 3
    if role == "killed":  # dies by a signal a moment after the "fail_first" worker exits 1
        time.sleep(0.3)
        os.kill(os.getpid(), 9)
    if role == "fail_first":  # a worker whose collective lost the "killed" one: it exits 1 first
        return 1
    if role == "finishing":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if ready:
            open(ready, "w").close()
        time.sleep(1.0)
        return 0
    if role == "noisy":
        sys.stderr.write(NOISY_STDERR)
        return 0
    enable_stack_dump()
    if ready:
        open(ready, "w").close()
    stuck_here()
    return 1


if __name__ == "__main__":
    sys.exit(main())
