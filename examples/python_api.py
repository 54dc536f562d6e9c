"""Use dualtrain from Python: load a spec, change it, run both backends, compare.

Run from the repository root, with dualtrain installed (`make install`):
    .venv/bin/python examples/python_api.py
"""

from dualtrain.backends import parse_backend
from dualtrain.runs import start_run
from dualtrain.spec import load_spec

spec = load_spec("configs/mnist_mlp.yaml", ["train.epochs=1", "data.train_limit=12800"])
for name in ("torch", "tf"):
    run_dir, summary = start_run(spec, parse_backend(name), f"runs/api-{name}", overwrite=True)
    print(f"{name}: test accuracy {summary['test_accuracy']:.4f}, "
          f"{summary['train_samples_per_s']:.0f} samples/s -> {run_dir}")
