"""Use dualtrain from Python: load a spec, change it, run both backends and the fp64 reference pair,
compare.

Run from the repository root, with dualtrain installed (`make install`):
    .venv/bin/python examples/python_api.py

Each run starts its own worker processes (this process never imports torch or TensorFlow). The fp64
pair (the same spec with precision.dtype fp64 on both backends) is the semantic check and the noise
model of the fp32 checks; without it compare_dirs falls back to the fixed tolerances of
docs/parity.md and says that semantics were not checked.
"""

from dualtrain.backends import parse_backend
from dualtrain.compare import compare_dirs, write_report
from dualtrain.compare.backends import reference_spec
from dualtrain.runs import start_run
from dualtrain.spec import load_spec

spec = load_spec("configs/mnist_mlp.yaml", ["train.epochs=1", "data.train_limit=12800"])
runs = {}
for label, run_spec in (("", spec), ("fp64-", reference_spec(spec))):
    for name in ("torch", "tf"):
        run_dir, summary = start_run(run_spec, parse_backend(name), f"runs/api-{label}{name}",
                                     overwrite=True)
        runs[label + name] = run_dir
        print(f"{label}{name}: test accuracy {summary['test_accuracy']:.4f}, "
              f"{summary['train_samples_per_s']:.0f} samples/s -> {run_dir}")

cmp = compare_dirs(runs["torch"], runs["tf"], reference=(runs["fp64-torch"], runs["fp64-tf"]))
for check in cmp.checks:
    print(f"  {check.group:<9} {check.name:<17} {'PASS' if check.passed else 'FAIL'}  {check.detail}")
paths = write_report(cmp, "runs/api-compare")
print(f"verdict: {'PASS' if cmp.passed else 'FAIL'} ({cmp.diagnosis.summary()}); report: {paths['html']}")
