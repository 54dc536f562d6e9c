"""Use dualtrain from Python: train one backend, then compare both against the fp64 reference pair.

Run from the repository root, with dualtrain installed (`make install`); under a minute on 2 cores:
    .venv/bin/python examples/python_api.py

Every run starts its own worker processes: this process never imports torch or TensorFlow.
Overrides are keyword arguments: a dict per spec section (merged into it), top-level fields such as
seed, and the CLI's shortcuts (world_size, precision, set=["key.path=value"]).
See docs/python-api.md.
"""

import dualtrain

SPEC = "configs/mnist_mlp.yaml"
SMALL: dict = {"train": {"epochs": 1, "log_every": 20}, "data": {"train_limit": 6400}}

# 1. One backend: a typed result, the records and the trained weights.
res = dualtrain.run(SPEC, "torch", **SMALL, world_size=2, out="runs/api-torch", overwrite=True)
losses = [row["loss"] for row in res.metrics().train]
print(
    f"torch: {res.steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, test accuracy "
    f"{res.test_accuracy:.2%}, {res.samples_per_s:,.0f} samples/s, "
    f"{sum(w.size for w in res.final_weights().values()):,} parameters -> {res.run_dir}"
)

# 2. Both backends and their fp64 reference pair (4 runs), then the verdict. A mistake in the spec
#    or the overrides is a dualtrain.UserError raised before anything runs; a failed check is not an
#    exception: look at .passed.
try:
    dualtrain.compare(SPEC, **SMALL, optimizer={"lr_typo": 0.1})
except dualtrain.UserError as exc:
    print(f"rejected before any run: {exc}")

cmp = dualtrain.compare(SPEC, **SMALL, world_size=2, out="runs/api-compare")
# compare printed which of its runs ran when, the table of checks and the verdict; the result holds
# the same, typed (and OUT/verdict.json the same again).
ref = cmp.check("reference_loss")
failed = [c.name for c in cmp.checks if not c.passed]
print(
    f"passed: {cmp.passed} (failed: {failed or 'none'}); fp64 pair max |loss diff| "
    f"{ref.value:.2g}, bound {ref.tolerance:g}; compared {cmp.run_a} and {cmp.run_b}"
)
if not cmp.passed:
    print(f"diagnosis: {cmp.diagnosis.summary()}")

# 3. Finished runs compare as they are: here the torch run of step 1 against compare's tf run.
again = dualtrain.compare(res, cmp.run_b, out="runs/api-torch-vs-tf", quiet=True)
print(f"step-1 torch run vs compare's tf run: {again.verdict}")
