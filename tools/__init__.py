"""Measurement tools of the parity claims, run by hand, not by pytest (docs/parity.md §7):

* ``python -m tools.compare_matrix``: ``dualtrain compare`` over every shipped config, world size,
  strategy and precision (the false-FAIL matrix);
* ``python -m tools.detection_power``: the smallest planted defect each check detects;
* ``tools/mutants/``: the planted defects themselves (a test-only worker hook applies them;
  parity_tests/test_mutants.py and test_precision_mutants.py use them too).
"""
