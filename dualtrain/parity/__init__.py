"""Parity: the checks, the first-divergence diagnosis and the report for two finished runs
(framework-free; it reads run directories and never trains).

The parity tests and ``dualtrain compare`` use the same functions::

    from dualtrain.parity import compare_dirs
    cmp = compare_dirs("runs/a", "runs/b", reference=("runs/a-fp64", "runs/b-fp64"))
    assert cmp.passed, cmp.diagnosis.summary()

Running the four runs of ``dualtrain compare --config`` is the driver's job
(:mod:`dualtrain.driver.compare`); ``dualtrain.compare(...)`` is the Python API's
(:func:`dualtrain.api.compare`).
"""

from dualtrain.parity.checks import Check, Reference, all_passed, run_checks
from dualtrain.parity.diagnose import Diagnosis
from dualtrain.parity.report import Comparison, compare_dirs, compare_records, write_report
from dualtrain.parity.tolerances import REFERENCE, TOLERANCES, Tolerance, tolerance_for

__all__ = [
    "REFERENCE",
    "TOLERANCES",
    "Check",
    "Comparison",
    "Diagnosis",
    "Reference",
    "Tolerance",
    "all_passed",
    "compare_dirs",
    "compare_records",
    "run_checks",
    "tolerance_for",
    "write_report",
]
