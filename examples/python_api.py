"""Use dualtrain from Python: load a spec, change it, run both backends, compare.

Run from the repository root, with dualtrain installed (`make install`):
    .venv/bin/python examples/python_api.py

Each run starts its own worker processes (this process never imports torch or TensorFlow). Without a
noise-floor twin (``dualtrain compare --config`` makes one) the trajectory checks fall back to the
fixed tolerances of docs/parity.md.
"""

from dualtrain.backends import parse_backend
from dualtrain.compare import compare_dirs, write_report
from dualtrain.runs import start_run
from dualtrain.spec import load_spec

spec = load_spec("configs/mnist_mlp.yaml", ["train.epochs=1", "data.train_limit=12800"])
runs = {}
for name in ("torch", "tf"):
    run_dir, summary = start_run(spec, parse_backend(name), f"runs/api-{name}", overwrite=True)
    runs[name] = run_dir
    print(f"{name}: test accuracy {summary['test_accuracy']:.4f}, "
          f"{summary['train_samples_per_s']:.0f} samples/s -> {run_dir}")

cmp = compare_dirs(runs["torch"], runs["tf"])
for check in cmp.checks:
    print(f"  {check.name:<14} {'PASS' if check.passed else 'FAIL'}  {check.detail}")
paths = write_report(cmp, "runs/api-compare")
print(f"verdict: {'PASS' if cmp.passed else 'FAIL'} ({cmp.diagnosis.summary()}); report: {paths['html']}")
