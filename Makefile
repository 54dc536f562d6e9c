# Quickstart targets. Each one creates .venv and installs the pinned versions on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run compare test test-unit test-slow test-slow-ci bench docs clean

# Python caches each module's bytecode (__pycache__/, ignored by git) unless told not to. With
# PYTHONDONTWRITEBYTECODE set (some CI images and sandboxes set it), every process the suite starts
# (CLI runs, fork servers, tools) compiled dualtrain's sources again: the default suite's parallel
# part took 5:00 and 5:12 with it, 4:36 without (docs/testing.md). The targets below write it.
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[all,test,ray,trainers,hub,docs]'
	touch $(STAMP)

install: $(STAMP)

# The main job: PyTorch DDP, 2 processes, MLP on real MNIST, 2 epochs.
run: $(STAMP)
	$(BIN)/dualtrain run --backend torch --config configs/mnist_mlp.yaml --world-size 2

# The docs as a site in site/ (mkdocs.yml: strict, so a broken link or any warning fails it).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build

# Both backends on the same spec, then the parity report.
compare: $(STAMP)
	$(BIN)/dualtrain compare --config configs/mnist_mlp.yaml --world-size 2

# The test suite CI runs (slow cases excluded: CNN convergence, the plain-SGD gap; see test-slow),
# after the linter, the formatter check and the type check of the package (the backend
# contracts: Engine, LaunchModule). Most tests run in two pytest-xdist workers (a test's runs are
# mostly process start-up and rendezvous, which leave the second core idle), a file per worker
# so module fixtures stay shared; the tests marked serial (signals, kills, torchrun, network
# namespaces, hang timeouts) run alone afterwards.
# Where the tests marked serial live (tests/package/test_markers.py keeps it true): the serial
# commands collect only these folders (collecting the whole tree to select 21 tests took 7 of ~50 s).
SERIAL_TESTS = tests/integration tests/multihost

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -n 2 --dist loadfile -m "not slow and not serial"
	$(BIN)/python -m pytest -m "serial and not slow" $(SERIAL_TESTS)

# The unit tests alone, while editing: the folders of tests/ that mirror the package (in this
# process, no framework, no subprocess; testkit/unit_guard.py), without tests/backends (in this
# process with a framework), tests/integration and tests/multihost.
test-unit: $(STAMP)
	$(BIN)/python -m pytest tests --ignore=tests/backends --ignore=tests/integration --ignore=tests/multihost

# The full sweep: every slow case (docs/testing.md), as the default suite runs: two xdist workers,
# then the serial cases alone. On demand; its last green run is logged in docs/testing.md.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile -m "slow and not serial"
	$(BIN)/python -m pytest -m "slow and serial" $(SERIAL_TESTS)

# The slow set's CI part (.ci/run, after make test): the slow cases not marked sweep. Every shipped
# config still runs once; CI's 90 minutes hold it with make test on a machine twice as slow.
test-slow-ci: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile -m "slow and not sweep and not serial"
	$(BIN)/python -m pytest -m "slow and serial and not sweep" $(SERIAL_TESTS)

bench: $(STAMP)
	$(BIN)/python bench/bench_torch.py
	$(BIN)/python bench/bench_tf.py
	$(BIN)/python bench/bench_checkpoint.py

clean:
	rm -rf $(VENV) runs .pytest_cache site
