"""The compare-backends checks: pure functions over two run records and their fp64 reference pair.

Three groups, in report order (docs/report.md):

* ``records``: the inputs of the arithmetic must be exact (spec, sample ids, initial weights, lr,
  loss-scale decisions);
* ``semantics``: the fp64 reference pair (the same spec run in float64 on both backends) agrees to
  rounding over the whole run (:data:`dualtrain.parity.tolerances.REFERENCE`);
* ``numerics``: the requested precision's runs differ by at most ``factor`` times what that
  precision's rounding alone does to a run (each backend's distance to its own fp64 run), and agree
  on accuracy.

Each check returns a :class:`Check`. ``run_checks`` runs them all. The parity tests call these same
functions, so the report and the tests cannot disagree about what "equal" means. Thresholds come
from :mod:`dualtrain.parity.tolerances` only.

The package, by group: ``base`` (Check, Reference, formatting); the ``records`` group in
``inputs`` (spec, sample ids, initial weights, lr), ``loss_scale`` (loss scale and skipped steps,
GradScaler's rule) and ``early_stopping`` (its decisions); ``semantics``; ``numerics`` (whole-run
trajectory, final weights, accuracy), ``probes`` (one-step probes), ``convergence`` (each run's
final metric against its fp64 run's); ``suite`` (the order the report shows them in).
"""

from dualtrain.parity.checks.base import (
    INFO,
    Reference,
    not_run,
    path_name,
    tolerance_of,
)
from dualtrain.parity.checks.convergence import SKIPPED_SHARE, check_convergence
from dualtrain.parity.checks.early_stopping import check_early_stopping
from dualtrain.parity.checks.inputs import (
    check_init_weights,
    check_lr,
    check_sharding,
    check_spec,
)
from dualtrain.parity.checks.loss_scale import (
    FP16_MAX,
    SkipDifference,
    check_loss_scale,
    check_skipped,
    scale_rule_violation,
    skip_differences,
)
from dualtrain.parity.checks.numerics import (
    Trajectory,
    check_eval,
    check_final_weights,
    check_trajectory,
    trajectory,
)
from dualtrain.parity.checks.probes import (
    LOCAL_CHECKS,
    check_local,
    local_checks,
    local_errors,
)
from dualtrain.parity.checks.semantics import (
    check_reference_eval,
    check_reference_loss,
    check_reference_weights,
)
from dualtrain.parity.checks.suite import (
    check_throughput,
    is_fp64_pair,
    run_checks,
)
from dualtrain.records.verdict import NUMERICS, RECORDS, SEMANTICS, Check, all_passed

__all__ = [
    "Check",
    "FP16_MAX",
    "INFO",
    "LOCAL_CHECKS",
    "NUMERICS",
    "RECORDS",
    "Reference",
    "SEMANTICS",
    "SKIPPED_SHARE",
    "SkipDifference",
    "Trajectory",
    "all_passed",
    "check_convergence",
    "check_eval",
    "check_final_weights",
    "check_init_weights",
    "check_local",
    "check_early_stopping",
    "check_loss_scale",
    "check_lr",
    "check_reference_eval",
    "check_reference_loss",
    "check_reference_weights",
    "check_sharding",
    "check_skipped",
    "check_spec",
    "check_throughput",
    "check_trajectory",
    "is_fp64_pair",
    "local_checks",
    "local_errors",
    "not_run",
    "path_name",
    "run_checks",
    "scale_rule_violation",
    "skip_differences",
    "tolerance_of",
    "trajectory",
]
