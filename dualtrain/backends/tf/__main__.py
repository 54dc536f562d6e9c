"""Worker entry: ``python -m dualtrain.backends.tf RUN_DIR`` (reads RUN_DIR/spec.yaml)."""

import gc
import os
import sys

gc.disable()  # until training starts (dualtrain.runtime.start.settle_gc)

from dualtrain.runtime import clock  # noqa: E402

clock.mark("entry")

from dualtrain.backends.tf.launch import TF_CONFIG  # noqa: E402
from dualtrain.backends.tf.worker import main  # noqa: E402
from dualtrain.runtime.entry import exit_now  # noqa: E402

code = main()
if os.environ.get(TF_CONFIG):
    # A task of a cluster: TensorFlow's teardown leaves with the other tasks (its coordination
    # service's shutdown barrier), which a peer still fetching this task's part of the last
    # collective needs.
    sys.exit(code)
exit_now(code)  # one process (mirrored): the run is complete, its files closed; skip the teardown
