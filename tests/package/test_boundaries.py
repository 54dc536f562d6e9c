"""Only dualtrain/backends/torch imports torch; only dualtrain/backends/tf imports tensorflow/keras
(read from the source; the import itself, in a fresh interpreter, is
tests/integration/test_boundaries_import.py)."""

import re

from testkit.cli import ROOT
from testkit.source import (
    PKG,
    cycles,
    dualtrain_imports,
    imported_roots,
    module_name,
)

FRAMEWORKS = {
    "torch": PKG / "backends" / "torch",
    "tensorflow": PKG / "backends" / "tf",
    "keras": PKG / "backends" / "tf",
}


def test_framework_imports_stay_in_their_backend():
    offenders = []
    for path in PKG.rglob("*.py"):
        roots = imported_roots(path)
        for fw, home in FRAMEWORKS.items():
            if fw in roots and home not in path.parents:
                offenders.append(f"{path.relative_to(ROOT)} imports {fw}")
    assert not offenders, offenders


def test_backend_launch_modules_are_framework_free():
    for backend in ("torch", "tf"):
        path = PKG / "backends" / backend / "launch.py"
        if path.exists():
            assert not imported_roots(path) & set(FRAMEWORKS), path


# ---- layers: the package is the pipeline, each folder imports only from the ones before it -------

LAYERS = [
    {"errors", "version", "jsonio"},  # plain helpers every layer may use
    {"spec"},  # the Experiment schema
    {"records"},  # the files a run leaves
    {"core"},  # what both backends compute, defined once
    {"runtime"},  # one worker's training loop, the engine contract, checkpoints
    {"launch"},  # starting and watching workers, cluster conventions
    {"audit"},  # recorded runs of users' own scripts: format, sample identity, checks
    {"backends"},  # torch and tf: engines, models, their launch modules
    {"parity"},  # checks, diagnosis and report on finished runs
    {"driver"},  # run / compare / export in the launcher process
    {"api", "__init__"},  # the Python API (the package root re-exports it lazily)
    {"cli", "__main__"},
]


def layer_of(module: str) -> int:
    """Layer index of a dualtrain module name (``dualtrain.core.plan`` -> 3)."""
    parts = module.split(".")
    head = parts[1] if len(parts) > 1 else "__init__"
    for i, names in enumerate(LAYERS):
        if head in names:
            return i
    raise AssertionError(f"{module} belongs to no layer: add its folder to LAYERS")


def upward_imports(module: str, imports: set[str]) -> list[str]:
    return [
        f"{module} imports {other}"
        for other in sorted(imports)
        if layer_of(other) > layer_of(module)
    ]


def package_imports() -> dict[str, set[str]]:
    return {module_name(p): dualtrain_imports(p) for p in sorted(PKG.rglob("*.py"))}


def test_no_layer_imports_a_higher_one():
    upward = [
        line for me, imports in package_imports().items() for line in upward_imports(me, imports)
    ]
    assert not upward, "\n".join(upward)


def test_the_layer_check_sees_an_upward_import():
    """The check itself: a core module that imports the driver, even inside a function, is named."""
    source = "def f():\n    from dualtrain.driver import runs\n"
    imports = dualtrain_imports(PKG / "core" / "planted.py", source, "dualtrain.core.planted")
    assert upward_imports("dualtrain.core.planted", imports) == [
        "dualtrain.core.planted imports dualtrain.driver",
        "dualtrain.core.planted imports dualtrain.driver.runs",
    ]


def test_no_import_cycle():
    """A package's __init__ importing its own modules is not a cycle (edges into a package's
    __init__ from inside it are left out); any other circle of imports is."""
    graph = {
        me: {o for o in imports if not me.startswith(o + ".")}
        for me, imports in package_imports().items()
    }
    assert not cycles(graph)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]


def test_the_two_backends_do_not_import_each_other():
    for mine, theirs in (("torch", "tf"), ("tf", "torch")):
        for path in (PKG / "backends" / mine).rglob("*.py"):
            bad = [
                m for m in dualtrain_imports(path) if m.startswith(f"dualtrain.backends.{theirs}")
            ]
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


#: Files only one backend has, and why. The gradient's absolute scale (the local checks' yardstick)
#: is measured on the fp64 reference run of one backend, torch's (backends/torch/condition.py).
#: Keras layers for porting a torch model (backends/tf/port.py: TorchBatchNormalization) exist on
#: the Keras side only: torch's layers are the reference a port follows.
#: Keras's float64 ops that are float32-accurate, run exactly (backends/tf/exact.py, core.limits):
#: torch's float64 ops are exact, so the torch side has nothing to substitute.
#: The torch recorder counts a hand-written loop's epochs (backends/torch/audit_epochs.py); Keras's
#: fit tells its callback each epoch, so the Keras recorder has nothing to count. The trainers the
#: audit records (Lightning: backends/torch/audit_trainers.py) are torch's; a KerasHub task trains
#: with Keras's own fit, which the Keras recorder records.
#: The canonical layout is the torch module's state dict: only the Keras side of a pair converts
#: (backends/tf/mapping.py).
#: A converter (model.convert) takes the torch module and returns its Keras port: it runs where the
#: module is built (backends/torch/convert.py); the TF side builds the port again from its JSON.
ONE_SIDED = {
    "torch": {"condition.py", "audit_epochs.py", "audit_trainers.py", "convert.py"},
    "tf": {"port.py", "exact.py", "mapping.py"},
}


def test_both_backends_have_the_same_files():
    """Each backend package has the same modules, each with the same job (the docstrings say
    which): launch, worker, engine, model, ops, optimizer, precision, export, tools, envinfo."""
    files = {
        b: {p.name for p in (PKG / "backends" / b).glob("*.py")} - ONE_SIDED[b]
        for b in ("torch", "tf")
    }
    assert files["torch"] == files["tf"], files["torch"] ^ files["tf"]


# ---- the pipeline the docs draw is the one the imports keep --------------------------------------

#: the folders of the pipeline, in import order (the plain helpers and the package root left out)
PIPELINE = [
    name for layer in LAYERS[1:] for name in sorted(layer) if name not in ("__init__", "__main__")
]


def drawn_pipelines(text: str) -> list[list[str]]:
    """Every chain ``a -> b -> c`` of folder names drawn in ``text``."""
    return [
        [part.strip() for part in line.split("->")]
        for line in text.splitlines()
        if line.count("->") >= 3
        and all(re.fullmatch(r"[a-z_]+", p.strip()) for p in line.split("->"))
    ]


def test_the_pipeline_in_readme_and_architecture_is_the_import_layers():
    for doc in (ROOT / "README.md", ROOT / "docs" / "architecture.md"):
        drawn = drawn_pipelines(doc.read_text())
        assert drawn == [PIPELINE], (doc.name, drawn, PIPELINE)


def test_the_pipeline_check_sees_a_folder_left_out():
    assert drawn_pipelines(" spec -> records -> core -> runtime\n") == [
        ["spec", "records", "core", "runtime"]
    ]
    assert drawn_pipelines("a -> b -> c -> d\n")[0] != PIPELINE
