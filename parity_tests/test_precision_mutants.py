"""A defect confined to one backend's requested-precision path must FAIL ``dualtrain compare``, as
"numerics: <backend> <precision> path", while the fp64 reference pair (which never runs that path)
passes. The mutants are tools/mutants/'s PRECISION_MUTANTS; they are found by the one-step
probes (dualtrain.parity.local) and, where training suffers, by the convergence check.

The runs are made as ``dualtrain compare --config`` makes them (the fp64 torch run records the probe
states, the requested-precision runs replay them), shared between tests; the verdict comes from the
real CLI, ``dualtrain compare A B --reference-runs REF_A REF_B``. The default suite plants one
defect per precision path (fp32 on torch, fp16 on tf, bf16 on torch); the slow set runs every mutant
on both backends and the unmutated pairs, and the token layers' mutants (TOKEN_PRECISION_MUTANTS)
on a small vision transformer (TOKEN_SPEC)."""

from __future__ import annotations

import json

import pytest

from dualtrain.runtime import probes
from testkit.cli import run_cli
from tools.mutants import (
    PRECISION_MUTANTS,
    PRECISION_SPEC,
    TOKEN_PRECISION_MUTANTS,
    TOKEN_SPEC,
    hook,
)

SPEC = (
    *PRECISION_SPEC,
    "data.train_limit=1001",
    "train.epochs=2",
)  # 16 steps, a partial last batch


def _pair(
    runs,
    precision: str,
    mutant: str | None = None,
    backend: str | None = None,
    base: tuple[str, ...] = SPEC,
):
    """(torch run, tf run, fp64 torch, fp64 tf) of ``base`` at ``precision``; ``mutant`` on
    ``backend``."""
    ref_torch = runs("torch", *base, "precision.dtype=fp64", probe=probes.RECORD)
    ref_tf = runs("tf", *base, "precision.dtype=fp64")
    replay = probes.replay(ref_torch)
    spec = (*base, f"precision.dtype={precision}")
    out = {}
    for b in ("torch", "tf"):
        env = hook(mutant, backend=b) if mutant and b == backend else None
        out[b] = runs(b, *spec, env=env, probe=replay)
    return out["torch"], out["tf"], ref_torch, ref_tf


def _compare(tmp_path, a, b, ra, rb):
    out = tmp_path / "cmp"
    res = run_cli(
        "compare",
        str(a),
        str(b),
        "--reference-runs",
        str(ra),
        str(rb),
        "--out",
        str(out),
        timeout=300,
    )
    verdict = (
        json.loads((out / "verdict.json").read_text()) if (out / "verdict.json").is_file() else {}
    )
    return res, verdict


def mutant_effect(m, mutated, ref) -> tuple[float, str]:
    """The planted defect's own size, measured before detection is asserted: the mutated run's
    error in the quantity its check judges, against the exact step from the fp64 state, over
    that quantity's a priori bound (for the loss, the loss path's on the run's own outputs: the
    forward's kernels do not enter it). Below 1 the defect is within what its precision's own
    rounding may do on this CPU: not a defect to detect there."""
    from dualtrain.parity import local as L
    from dualtrain.parity.tolerances import LOCAL
    from dualtrain.records.record import read_run
    from dualtrain.spec import from_dict

    bound = LOCAL[m.path]
    opt = from_dict(read_run(mutated).spec).optimizer
    got = [p for p in L.measure(mutated, ref, opt, bound) or [] if not p.skipped]
    quantity = m.seen_by.removeprefix("local_")
    if not got:
        return 0.0, "no probes"
    if quantity == "loss":
        ratio = max(p.loss_path / p.loss_path_bound for p in got)
        return ratio, f"loss path {ratio:.3g} x its a priori bound"
    errs = [p.errors[quantity] for p in got]
    agg = L.SUMMARY[quantity](errs)
    prior = L.SUMMARY[quantity]([bound.a_priori(quantity, p.rounding_floor) for p in got])
    return agg / prior, f"{quantity} error {agg:.3g} = {agg / prior:.3g} x its a priori bound"


CASES = [("unscale_factor", "tf"), ("ce_low_precision", "torch")]  # one per backend; ALL: slow
ALL = [(m, b) for m in PRECISION_MUTANTS for b in ("torch", "tf")]


@pytest.mark.parametrize(
    "name,backend",
    [c if c in CASES else pytest.param(*c, marks=pytest.mark.slow) for c in ALL],
    ids=lambda v: str(v),
)
def test_precision_path_defect_fails_naming_the_path(runs, tmp_path, name, backend):
    m = PRECISION_MUTANTS[name]
    a, b, ra, rb = _pair(runs, m.path, name, backend)
    effect, what = mutant_effect(m, a if backend == "torch" else b, ra)
    if effect < 1.0:  # a planted defect this CPU's arithmetic makes too small to matter: said
        pytest.skip(f"{name} on {backend}: {what}, within its a priori bound on this CPU")
    _assert_fails_naming_the_path(tmp_path, m, backend, (a, b, ra, rb), what)


# The token layers' absolute gradient scales (dualtrain/backends/torch/condition.py: LayerNorm,
# position, patches, embedding, the attention's packed projection) must not hide a defect: a
# token layer's gradient summed in bfloat16 in an fp32 run fails local_grad on either backend.
# (The same bfloat16 sums in a bf16 run are within that path's own rounding: 0.1-5.5 bf16 u of the
# absolute scale, computed on this spec at init, against its a priori bound of 32 u; measured on
# the torch bf16 run's probes, 0.016-0.071 x that bound, the unmutated run 0.014 x. A bf16 path
# cannot tell a bfloat16 sum from its own rounding, so the mutants live in the fp32 path.)
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "tf"])
@pytest.mark.parametrize("name", list(TOKEN_PRECISION_MUTANTS))
def test_token_layer_precision_defect_fails_naming_the_path(runs, tmp_path, name, backend):
    m = TOKEN_PRECISION_MUTANTS[name]
    a, b, ra, rb = _pair(runs, m.path, name, backend, TOKEN_SPEC)
    effect, what = mutant_effect(m, a if backend == "torch" else b, ra)
    # its size is its own arithmetic's (a bfloat16 sum in a fixed order), not this CPU's kernels':
    # a mutant under its bound here is a mutant that did not apply
    assert effect > 10.0, f"{name} on {backend}: {what}"
    _assert_fails_naming_the_path(tmp_path, m, backend, (a, b, ra, rb), what)


def _assert_fails_naming_the_path(tmp_path, m, backend, runs4, what):
    a, b, ra, rb = runs4
    print(f"{m.name} on {backend}: {what}")
    res, v = _compare(tmp_path, a, b, ra, rb)
    print(res.stdout[-2500:])
    path = f"{backend} {m.path} path"
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert f"verdict: FAIL, numerics: {path} (" in res.stdout
    checks = {c["name"]: c for c in v["checks"]}
    # the fp64 pair never runs the path: semantics agree, and so do the records
    assert all(
        checks[n]["passed"]
        for n in (
            "reference_loss",
            "reference_weights",
            "reference_eval",
            "spec",
            "sharding",
            "init_weights",
            "lr",
        )
    )
    assert not checks[m.seen_by]["passed"] and checks[m.seen_by]["culprits"] == [path]
    assert v["culprits"] == [path] and v["category"] == "numerics"
    assert v["diagnosis"]["cause"] == "precision path"
    # the other backend's path is clean in every local check
    other = f"{'tf' if backend == 'torch' else 'torch'} {m.path} path"
    assert not any(other in c.get("culprits", []) for c in v["checks"])


# the default suite's unmutated fp32 compare with probes is tests/integration/test_compare_config.py
@pytest.mark.slow
@pytest.mark.parametrize(
    "precision,base",
    [("fp32", SPEC), ("fp16", SPEC), ("bf16", SPEC), ("fp32", TOKEN_SPEC)],
    ids=["fp32", "fp16", "bf16", "tokens-fp32"],
)
def test_unmutated_precision_paths_pass(runs, tmp_path, precision, base):
    res, v = _compare(tmp_path, *_pair(runs, precision, base=base))
    assert res.returncode == 0 and v["passed"], res.stdout[-3000:]
    checks = {c["name"]: c for c in v["checks"]}
    for n in ("local_loss", "local_grad", "local_update", "convergence"):
        assert checks[n]["ran"] and checks[n]["passed"], checks[n]["detail"]
