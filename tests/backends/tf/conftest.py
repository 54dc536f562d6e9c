"""tests/backends/tf: the tf backend in this process; skipped without TensorFlow and Keras."""

from testkit.cli import require

require("tensorflow", "keras")
