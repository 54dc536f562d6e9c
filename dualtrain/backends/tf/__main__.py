"""Worker entry: ``python -m dualtrain.backends.tf RUN_DIR`` (reads RUN_DIR/spec.yaml)."""

import sys

from dualtrain.backends.tf.worker import main

sys.exit(main())
