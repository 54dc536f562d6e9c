"""First-divergence diagnosis: where two runs part, which parameters move apart most, and why.

The cause is read from the records, never guessed from the numbers alone:

* ``different sample ids``: shards.jsonl differs at or before the first divergent step;
* ``different initial weights``: weights_init.npz differs;
* ``different learning rate``: the per-step lr differs;
* ``different loss-scale decisions``: loss_scale or skipped differs;
* ``different precision/spec``: spec.yaml differs in a field that changes the numbers and that none
  of the classes above already explains (precision.dtype always counts here);
* ``semantics differ``: none of the above, but the fp64 reference pair disagrees: with the same ids,
  weights, lr and spec the two backends compute a different training run (an update rule, a loss, a
  layer that means something else);
* ``precision path``: the fp64 reference pair agrees, and the one-step probes (or the convergence
  check) find one backend's requested-precision path off: the verdict names it ("numerics: tf fp16
  path"). Only a sample-id, initial-weight, lr or spec difference outranks it; different loss-scale
  decisions are then a consequence of the path, not a cause;
* ``numerics``: none of the above and the fp64 reference pair agrees (or did not run: then the cause
  says so); the runs mean the same thing and differ only in arithmetic.

Every cause has a category, the verdict's first word after FAIL: ``semantics differ`` (the two
backends train differently; fix the code or the spec) or ``numerics`` (same meaning, the requested
precision's arithmetic differs beyond the noise model).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dualtrain.parity import readings as R
from dualtrain.parity.checks import LOCAL_CHECKS, Check, all_passed
from dualtrain.parity.checks.semantics import REFERENCE_CHECKS
from dualtrain.records.record import RunRecord
from dualtrain.records.verdict import LIMIT_CATEGORY, Finding
from dualtrain.spec import SHOWS_IN_IDS, SHOWS_IN_INIT, SHOWS_IN_LR, SHOWS_IN_SCALE, paths_with

IDS = "different sample ids"
INIT = "different initial weights"
LR = "different learning rate"
SCALE = "different loss-scale decisions"
SPEC = "different precision/spec"
SEMANTICS = "semantics differ"
NUMERICS = "numerics"
PATH = "precision path"

#: Tie-break when two causes show up at the same step: what happens earlier in a step wins.
_ORDER = [INIT, SPEC, IDS, LR, SCALE, SEMANTICS, PATH, NUMERICS]

#: The verdict's category of each cause.
CATEGORY = {
    INIT: SEMANTICS,
    SPEC: SEMANTICS,
    IDS: SEMANTICS,
    LR: SEMANTICS,
    SCALE: SEMANTICS,
    SEMANTICS: SEMANTICS,
    PATH: NUMERICS,
    NUMERICS: NUMERICS,
}

#: The record-based cause each spec tag names: the schema declares where a field's difference
#: shows (dualtrain.spec.fields), so a changed field whose record already explains the divergence
#: is not named twice.
_SHOWN_BY = {SHOWS_IN_IDS: IDS, SHOWS_IN_INIT: INIT, SHOWS_IN_LR: LR, SHOWS_IN_SCALE: SCALE}


def cause(name: str, step: int | None, evidence: str) -> Finding:
    """A cause of the divergence, as the verdict's findings hold it: its name (one of the causes
    above), the first step showing it (0: from the start) and the records' evidence."""
    return Finding(name, evidence, step=step)


@dataclass
class Diagnosis:
    passed: bool
    first_divergent_step: int | None = None
    failed_checks: list[str] = field(default_factory=list)
    cause: str | None = None
    category: str | None = None
    """``semantics differ`` or ``numerics`` (None when every check passed)."""
    causes: list[Finding] = field(default_factory=list)
    spec_differences: list[dict[str, Any]] = field(default_factory=list)
    """Every spec.yaml field that differs: {field, a, b, cosmetic}."""
    top_parameters: list[dict[str, Any]] = field(default_factory=list)
    """weights_final tensors ranked by relative difference: {name, rel_diff}."""
    top_gradients: list[dict[str, Any]] = field(default_factory=list)
    gradient_step: int | None = None
    culprits: list[str] = field(default_factory=list)
    """The precision paths the numerics checks found off ("tf fp16 path"), when that is the
    cause."""
    finding: str | None = None
    """A model pair's locator finding (the layer, the mistake, what to do), when the locator ran
    after the fp64 pair disagreed: it leads the verdict line and the Diagnosis."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def where(self) -> str:
        return (
            f"first divergent step {self.first_divergent_step}"
            if self.first_divergent_step is not None
            else "no per-step divergence"
        )

    def summary(self) -> str:
        if self.passed:
            return "all checks pass"
        where = self.where()
        cause = f"likely cause: {self.finding or self.cause}"
        if self.culprits:
            cause += f" ({', '.join(self.culprits)})"
        if self.cause != self.category:
            cause = f"{self.category}: {cause}"
        others = [c.name for c in self.causes if c.name != self.cause]
        if others:
            cause += f" (also: {', '.join(others)})"
        return f"{where}; {cause}"


def _first_shard_difference(a: RunRecord, b: RunRecord) -> tuple[int, str] | None:
    ma, mb = R.shard_map(a), R.shard_map(b)
    for key in sorted(set(ma) | set(mb)):
        if ma.get(key) != mb.get(key):
            return key[0], f"step {key[0]} replica {key[1]}: {ma.get(key)} vs {mb.get(key)}"
    return None


def _first_series_difference(
    a: RunRecord, b: RunRecord, key: str, rel: float = 0.0
) -> tuple[int, str] | None:
    ma, mb = R.step_map(a, key), R.step_map(b, key)
    for s in sorted(set(ma) & set(mb)):
        x, y = ma[s], mb[s]
        if x == y:
            continue
        scale = max(abs(x), abs(y))
        if not (abs(x - y) <= rel * scale):
            return s, f"{key} at step {s}: {x:g} vs {y:g}"
    return None


def _init_difference(a: RunRecord, b: RunRecord) -> str | None:
    wa, wb = R.load_init(a), R.load_init(b)
    if wa is None or wb is None:
        return None
    problem = R.layout_problem(wa, wb)
    if problem:
        return problem
    diffs = {k: v for k, v in R.max_abs_diff(wa, wb).items() if v > 0}
    if not diffs:
        return None
    return "weights_init differs in " + ", ".join(f"{k} (max {v:.3g})" for k, v in diffs.items())


def explained_by(fieldname: str) -> tuple[str, ...]:
    return tuple(
        kind
        for tag, kind in _SHOWN_BY.items()
        if any(fieldname == p or fieldname.startswith(p + ".") for p in paths_with(tag))
    )


def _ranked(wa: dict, wb: dict, top: int) -> list[dict[str, Any]]:
    if R.layout_problem(wa, wb):
        return []
    rel = R.rel_diff(wa, wb)
    return [{"name": k, "rel_diff": v} for k, v in sorted(rel.items(), key=lambda kv: -kv[1])[:top]]


def _reference_causes(checks: list[Check]) -> tuple[list[Check], bool]:
    """(failed semantic checks, whether the fp64 reference ran)."""
    sem = [c for c in checks if c.group == "semantics"]
    return [c for c in sem if not c.passed], any(c.ran for c in sem)


def diagnose(a: RunRecord, b: RunRecord, checks: list[Check], *, top: int = 5) -> Diagnosis:
    failed = [c for c in checks if not c.passed and not c.informational]
    diffs = R.spec_differences(a.spec, b.spec)
    d = Diagnosis(
        passed=all_passed(checks),
        failed_checks=[c.name for c in failed],
        spec_differences=[
            {"field": k, "a": va, "b": vb, "cosmetic": R.is_cosmetic(k)} for k, va, vb in diffs
        ],
    )
    # Step 0 marks a difference that exists before training (spec, initial weights): a cause, not
    # the step where the runs part.
    # The probes' steps are where a one-step error was measured, not where the runs part: they set
    # the first divergent step only when nothing else failed.
    per_step = [c for c in failed if c.name not in LOCAL_CHECKS] or failed
    steps = [c.first_step for c in per_step if c.first_step is not None and c.first_step >= 1]
    d.first_divergent_step = min(steps) if steps else None

    _add_evidence(d, a, b, top)
    if d.passed:
        return d

    causes = _recorded_causes(a, b)
    _add_spec_cause(causes, diffs)
    ref_failed, ref_ran = _reference_causes(checks)
    if ref_failed:
        c = min(ref_failed, key=lambda c: c.first_step if c.first_step is not None else 1 << 60)
        causes.append(
            cause(
                SEMANTICS, c.first_step, f"the fp64 reference pair disagrees ({c.name}: {c.detail})"
            )
        )
    culprits = sorted(
        {
            p
            for c in failed
            if c.group == "numerics" or c.name in ("loss_scale", "skipped")
            for p in c.culprits
        }
    )
    semantic = [c for c in causes if c.name not in (SCALE,)]
    if culprits and not ref_failed and not semantic:
        # The fp64 pair agrees and nothing recorded differs but (perhaps) the loss-scale decisions:
        # a backend's precision path computes something else; name it.
        local = [c for c in failed if c.culprits]
        step = min((c.first_step for c in local if c.first_step is not None), default=None)
        d.culprits = culprits
        d.causes = [
            cause(
                PATH,
                step,
                f"{', '.join(culprits)} off in "
                f"{', '.join(c.name for c in local)}: " + local[0].detail,
            ),
            *causes,
        ]
        d.cause, d.category = PATH, NUMERICS
        return d
    if not causes:
        why = _numerics_why(ref_ran)
        causes.append(cause(NUMERICS, d.first_divergent_step, why))
    # A cause only explains a divergence it precedes: keep those at or before the first divergent
    # step (all of them when no per-step check failed).
    causes = _before_divergence(causes, d)
    causes.sort(key=lambda c: (c.step if c.step is not None else 1 << 60, _ORDER.index(c.name)))
    d.causes = causes
    d.cause = causes[0].name
    d.category = CATEGORY[d.cause]
    return d


def limited(d: Diagnosis, at_limit: bool) -> None:
    """A model pair whose fp64 pair the locator found apart only by a library's float32
    arithmetic (``at_limit``, dualtrain.core.locate's FLOAT32_INSIDE, no mistake after it), and
    whose every other check passed: its category is ``limit`` (the verdict's word LIMIT)."""
    if at_limit and d.failed_checks and set(d.failed_checks) <= set(REFERENCE_CHECKS):
        d.category = LIMIT_CATEGORY


def _add_evidence(d: Diagnosis, a: RunRecord, b: RunRecord, top: int) -> None:
    """The most divergent final weights and, at the first step both dumped, gradients."""
    wa, wb = R.load_final(a), R.load_final(b)
    if wa is not None and wb is not None:
        d.top_parameters = _ranked(wa, wb, top)
    common = sorted(set(R.grad_steps(a)) & set(R.grad_steps(b)))
    if common:
        s = common[0]
        ga = R.load(a, f"grads_step{s}.npz")
        gb = R.load(b, f"grads_step{s}.npz")
        if ga is not None and gb is not None:
            d.gradient_step = s
            d.top_gradients = _ranked(ga, gb, top)


def _recorded_causes(a: RunRecord, b: RunRecord) -> list[Finding]:
    """What the records show differs: initial weights, sample ids, lr, loss-scale decisions."""
    causes: list[Finding] = []
    init = _init_difference(a, b)
    if init:
        causes.append(cause(INIT, 0, init))
    shard = _first_shard_difference(a, b)
    if shard:
        causes.append(cause(IDS, shard[0], shard[1]))
    lr = _first_series_difference(a, b, "lr", rel=1e-12)
    if lr:
        causes.append(cause(LR, lr[0], lr[1]))
    scale = [
        x
        for x in (
            _first_series_difference(a, b, "loss_scale"),
            _first_series_difference(a, b, "skipped"),
        )
        if x
    ]
    if scale:
        first = min(scale, key=lambda x: x[0])
        causes.append(cause(SCALE, first[0], first[1]))
    return causes


def _add_spec_cause(causes: list[Finding], diffs: list[tuple[str, Any, Any]]) -> None:
    """The spec differences that change the run and no recorded cause explains, as a cause."""
    seen = {c.name for c in causes}
    unexplained = [
        (k, va, vb)
        for k, va, vb in diffs
        if not R.is_cosmetic(k) and not (set(explained_by(k)) & seen)
    ]
    if unexplained:
        causes.append(
            cause(
                SPEC,
                0,
                "spec differs: " + ", ".join(f"{k}: {va!r} vs {vb!r}" for k, va, vb in unexplained),
            )
        )


def _numerics_why(ref_ran: bool) -> str:
    """Why the runs differ when nothing recorded does: arithmetic (or, without a reference pair,
    not ruled out semantics)."""
    if ref_ran:
        why = (
            "same spec, ids, initial weights, lr and loss-scale decisions, and the fp64 "
            "reference pair agrees: the runs differ only in arithmetic (op order, kernels, "
            "reductions)"
        )
    else:
        why = (
            "same spec, ids, initial weights, lr and loss-scale decisions; no fp64 reference "
            "ran, so a semantic difference is not ruled out (compare --config runs one unless "
            "--reference none; two run folders take theirs with --reference-runs)"
        )
    return why


def _before_divergence(causes: list[Finding], d: Diagnosis) -> list[Finding]:
    """The causes at or before the first divergent step first (all of them when no per-step check
    failed)."""
    if d.first_divergent_step is not None:
        before = [c for c in causes if c.step is None or c.step <= d.first_divergent_step]
        if not before:  # everything recorded differs only later: arithmetic parted them first
            before = [
                cause(
                    NUMERICS,
                    d.first_divergent_step,
                    "the recorded inputs agree up to the first divergent step",
                )
            ]
        causes = before + [c for c in causes if c not in before]
    return causes
