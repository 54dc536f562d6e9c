"""Worker entry: ``python -m dualtrain.backends.tf RUN_DIR`` (reads RUN_DIR/spec.yaml)."""

import gc
import os
import sys

gc.disable()  # until training starts (dualtrain.runtime.start.settle_gc)

from dualtrain.runtime import clock  # noqa: E402

clock.mark("entry")

from dualtrain.backends.tf.cluster import have_left_together  # noqa: E402
from dualtrain.backends.tf.launch import TF_CONFIG  # noqa: E402
from dualtrain.backends.tf.worker import main  # noqa: E402
from dualtrain.runtime.entry import exit_now  # noqa: E402

code = main()
if os.environ.get(TF_CONFIG) and not have_left_together():
    sys.exit(code)  # a task of a parameter-server cluster, or one that failed: TF's own teardown
exit_now(code)  # the run is complete, its files closed, its peers done with it: skip the teardown
