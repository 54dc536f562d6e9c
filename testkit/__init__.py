"""Helpers the test suites share: tests/ (unit, integration and multi-host tests) and parity_tests/
(the cross-backend parity claims) both import them from here; conftest.py files hold fixtures only.

* :mod:`testkit.cli`: ROOT, running the real CLI in a subprocess (``run_cli``, ``cli_env``), its
  one-line error convention (``one_line_error``), ``require`` (skip without a framework);
* :mod:`testkit.shared`: runs built once per session across pytest-xdist workers, a run's own
  outputs, Python without this checkout;
* :mod:`testkit.synth`: synthetic run directories for the compare checks and the report;
* :mod:`testkit.torch_runs`, :mod:`testkit.tf_runs`: short real runs of one backend (importing
  tf_runs skips the importing module without TensorFlow and Keras);
* :mod:`testkit.parity_runs`: the parity suite's runs of both backends (``Runs``, behind its
  ``runs`` fixture) and the fp64 reference pair's checks;
* :mod:`testkit.unit_guard`: the unit test folders' rules (no process, no framework), loaded by
  their conftest.py files;
* :mod:`testkit.launch_stub` and :mod:`testkit.worker_hooks`: run inside worker processes
  (``python -m testkit.launch_stub``; ``DUALTRAIN_TEST_HOOK=testkit.worker_hooks:...``, run by
  the worker-hook entry point that testkit/hook_site declares).

This file imports nothing: worker processes import the last two.
"""
