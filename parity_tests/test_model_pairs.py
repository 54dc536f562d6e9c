"""Your own models (issue 19): a small residual CNN written in PyTorch and its Keras port
(examples/ports), trained by both backends from the torch module's initial weights through the
weight map. The faithful port's fp64 pair agrees to the reference bound; each port that carries a
classic mistake (on either side) makes the fp64 pair fail with "semantics differ"; a pair resumes
bit for bit, continues from torch to TF within the fp64 bound and exports to both frameworks'
own forms."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dualtrain.core.weights import load_weights
from dualtrain.driver.export_check import load_back
from dualtrain.errors import UserError
from dualtrain.parity import compare_records
from dualtrain.parity.checks import (
    Reference,
    check_reference_loss,
    check_reference_weights,
)
from dualtrain.parity.diagnose import SEMANTICS
from dualtrain.records.record import read_run
from dualtrain.runtime import checkpoint
from dualtrain.runtime.entry import run_spec
from testkit.cli import ROOT, run_cli
from testkit.parity_runs import assert_reference_agrees
from testkit.shared import run_outputs, run_without_dualtrain
from tools.mutants import hook

PORT = str(ROOT / "configs" / "port_resnet.yaml")
SHORT = (
    f"model.path={ROOT / 'examples' / 'ports'}",
    "train.epochs=2",
    "train.checkpoint_every=10",
    "train.keep_checkpoints=5",
)


def test_faithful_port_fp64_pair_agrees(runs):
    ref = runs.reference(*SHORT, config=PORT)
    assert_reference_agrees(ref)
    assert ref.a.summary["model_sha256"] == ref.b.summary["model_sha256"]
    assert ref.a.summary["test_accuracy"] > 0.8


#: an MLP as teams write it (Linear, LayerNorm, GELU) and its port with Keras's own layers
GELU_MLP = (
    f"model.path={ROOT / 'examples' / 'ports'}",
    "model.torch=gelu_mlp_torch:gelu_mlp",
    "model.keras=gelu_mlp_keras:gelu_mlp",
    "model.args.width=32",
    "train.max_steps=12",
    "train.epochs=null",
)


def test_keras_own_gelu_port_passes_the_fp64_pair(runs):
    # Keras's gelu is float32-accurate in float64 (core.limits); the fp64 run computes it exactly,
    # says where and how far Keras's own op is from the exact form, and the pair agrees
    ref = runs.reference(*GELU_MLP, config=PORT)
    assert_reference_agrees(ref)
    (limit,) = ref.b.summary["exact_ops"]
    assert limit["op"] == "gelu" and limit["error"] > 1e-10
    assert [w.split("/")[-1] for w in limit["where"]] == ["act1 (32 wide)", "act2 (32 wide)"]
    assert "exact_ops" not in ref.a.summary  # torch's float64 gelu is exact


@pytest.mark.slow
def test_tanh_gelu_on_one_side_fails_named_at_that_layer(tmp_path):
    # the same pair with the tanh approximation on the torch side: a real mistake at the layer
    # whose Keras op is substituted still fails, and the verdict leads with the locator's finding
    sets = (*GELU_MLP, "model.torch=gelu_mlp_torch:gelu_mlp_tanh")
    args = [a for s in sets for a in ("--set", s)]
    out = tmp_path / "cmp"
    proc = run_cli("compare", "--config", PORT, *args, "--out", str(out), timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("verdict:"))
    print(line)
    assert line.startswith(
        "verdict: FAIL, semantics differ: the input of torch 'fc2' / Keras 'fc2': approximate "
        "vs exact gelu"
    )
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["verdict"] == line and verdict["diagnosis"]["finding"] in line
    assert [e["op"] for e in verdict["framework_limits"]] == ["gelu"]
    where = verdict["first_divergent_operation"]  # the report's picture: each module, fc2 marked
    assert where["step"] == 0 and where["layer"] == "fc2" and where["layers"][0]["layer"] == "fc1"


#: each mistaken port: the overrides that make it (the side that carries the mistake, and what
#: the faithful other side needs: the exact gelu, batchnorm layers); the slow set runs SLOW
GELU, BN = ("model.args.act=gelu",), ("model.args.bn=true",)
MISTAKES = {
    "same_padding_strided": ("model.keras=mistaken_keras:same_padding_strided",),
    "flatten_hwc": ("model.torch=mistaken_torch:flatten_hwc",),
    "softmax_inside": ("model.keras=mistaken_keras:softmax_inside",),
    "gelu_tanh (torch)": ("model.torch=mistaken_torch:gelu_tanh", *GELU),
    "gelu_approximate (keras)": ("model.keras=mistaken_keras:gelu_approximate", *GELU),
    "keras_batchnorm": ("model.keras=mistaken_keras:keras_batchnorm", *BN),
    "keras_batchnorm_defaults": ("model.keras=mistaken_keras:keras_batchnorm_defaults", *BN),
    "keras_numbers_batchnorm (torch)": ("model.torch=mistaken_torch:keras_numbers_batchnorm", *BN),
}
MISTAKES["layernorm_keras_eps"] = (*GELU_MLP[:3], "model.keras=gelu_mlp_keras:gelu_mlp_keras_eps")
SLOW = (  # flatten_hwc stays in the default suite for each kind of check
    "same_padding_strided",
    "keras_batchnorm",
    "softmax_inside",
    "gelu_tanh (torch)",
    "gelu_approximate (keras)",
    "keras_batchnorm_defaults",
    "keras_numbers_batchnorm (torch)",
    "layernorm_keras_eps",
)


@pytest.mark.parametrize(
    "name", [n if n not in SLOW else pytest.param(n, marks=pytest.mark.slow) for n in MISTAKES]
)
def test_mistaken_port_fails_with_semantics_differ(runs, name):
    sets = (*SHORT, "precision.dtype=fp64", *MISTAKES[name])
    cmp = compare_records(
        read_run(runs("torch", *sets, config=PORT)), read_run(runs("tf", *sets, config=PORT))
    )
    d = cmp.diagnosis
    print(name, d.summary())
    assert not cmp.passed
    # a batchnorm convention that leaves the outputs alone (the running variance) shows in the
    # evaluation, which uses the running statistics
    seen = "reference_eval" if name == "keras_batchnorm" else "reference_loss"
    assert d.category == SEMANTICS and not cmp.check(seen).passed
    assert cmp.check("init_weights").passed  # both sides started from the same weights


@pytest.mark.slow
def test_batchnorm_port_fp64_pair_agrees(runs):
    # native BatchNorm2d and its port (TorchBatchNormalization): torch's momentum, eps and
    # unbiased running variance on both sides, replica 0's statistics on every replica
    ref = runs.reference(*SHORT, *BN, config=PORT)
    assert_reference_agrees(ref)
    final = load_weights(ref.b.path / "weights_final.npz")
    assert "block1.bn1.running_var" in final and not np.allclose(final["block1.bn1.running_var"], 1)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "tf"])
def test_native_batchnorm_takes_replica_0_statistics(runs, backend):
    # planted on one backend: each replica keeps its own batches' running statistics. As two TF
    # worker processes, worker 1 evaluates its ranges with its own copy, so the evaluation sees it
    sets = (*SHORT, *BN, "precision.dtype=fp64", "tf.strategy=multi_worker")
    env = hook("pair_bn_own_stats", backend=backend)
    a = read_run(runs("torch", *sets, config=PORT, env=env if backend == "torch" else None))
    b = read_run(runs("tf", *sets, config=PORT, env=env if backend == "tf" else None))
    assert (a if backend == "torch" else b).summary["test_hook"].endswith("pair_bn_own_stats")
    cmp = compare_records(a, b)
    print(cmp.diagnosis.summary())
    assert not cmp.passed and cmp.diagnosis.category == SEMANTICS
    assert not cmp.check("reference_eval").passed


# slow: test_resume.py keeps bit-identical resume in the default suite, test_continuation.py the
# torch -> tf continuation
@pytest.mark.slow
@pytest.mark.parametrize("sets", [(), BN], ids=["plain", "batchnorm"])
def test_pair_resumes_bit_for_bit_and_continues_in_tf(runs, sets):
    overrides = (*SHORT, *sets, "precision.dtype=fp64")
    full = runs("torch", *overrides, config=PORT)
    again = runs.resume_from("torch", checkpoint.step_dir(full, 20), *overrides, config=PORT)
    wa, wb = load_weights(full / "weights_final.npz"), load_weights(again / "weights_final.npz")
    assert wa.keys() == wb.keys() and all(np.array_equal(wa[k], wb[k]) for k in wa)
    if sets:  # the Keras side's own batchnorm statistics resume too
        tf_full = runs("tf", *overrides, config=PORT)
        tf_again = runs.resume_from("tf", checkpoint.step_dir(tf_full, 20), *overrides, config=PORT)
        wa = load_weights(tf_full / "weights_final.npz")
        wb = load_weights(tf_again / "weights_final.npz")
        assert all(np.array_equal(wa[k], wb[k]) for k in wa)
    cont = runs.resume_from("tf", checkpoint.step_dir(full, 20), *overrides, config=PORT)
    ref = Reference(read_run(full), read_run(cont))
    assert ref.b.summary["resumed"][0]["checkpoint_backend"] == "torch"
    for check in (check_reference_loss(ref), check_reference_weights(ref)):
        print(check.name, check.detail)
        assert check.passed, check.detail


LOADERS = {
    "torch": """
import importlib.util, sys
import numpy as np, torch
folder, data, out = sys.argv[1:4]
spec = importlib.util.spec_from_file_location("exported", folder + "/model.py")
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
model = mod.load()
with torch.no_grad():
    np.save(out, model(torch.from_numpy(np.load(data)).to(mod.DTYPE)).double().numpy())
""",
    "keras": """
import os, sys; os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np, keras
folder, data, out = sys.argv[1:4]
model = keras.saving.load_model(folder + "/model.keras")
x = np.load(data).transpose(0, 2, 3, 1)
np.save(out, np.asarray(model(x, training=False), dtype=np.float64))
""",
}


@pytest.mark.parametrize(
    "fmt, sets",
    [
        pytest.param("torch", (), marks=pytest.mark.slow),  # default-suite time (docs/testing.md)
        pytest.param("keras", (), marks=(pytest.mark.slow, pytest.mark.sweep)),
        pytest.param("torch", BN, marks=pytest.mark.slow),
        pytest.param("keras", BN, marks=pytest.mark.slow),
    ],
    ids=["torch", "keras", "torch-batchnorm", "keras-batchnorm"],
)
def test_pair_exports_load_without_dualtrain(runs, tmp_path, fmt, sets):
    # with batchnorm: the Keras export saves Keras's own BatchNormalization (the same layer in
    # inference), torch's the module with its running statistics
    run = runs("tf", *SHORT, *sets, config=PORT)
    folder = tmp_path / fmt
    proc = run_cli("export", str(run), "--format", fmt, "--out", str(folder), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((folder / "export.json").read_text())["output"].startswith("(N, 10)")
    expected, (x,) = run_outputs(run, "tf", 50, tmp_path)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "exported.npy"
    proc = run_without_dualtrain(
        LOADERS[fmt], str(folder), str(tmp_path / "x.npy"), str(out), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert float(np.abs(np.load(out) - expected).max()) < 1e-4


def test_an_export_is_loaded_back_before_it_is_done(runs, tmp_path):
    # the torch side imports its neighbour module (mistaken_torch imports small_resnet_torch): the
    # export copies both, and dualtrain export loads it back without dualtrain before it says done
    steps = ("train.max_steps=2", "train.epochs=null")
    run = runs("torch", SHORT[0], "model.torch=mistaken_torch:flatten_hwc", *steps, config=PORT)
    folder = tmp_path / "torch"
    proc = run_cli("export", str(run), "--format", "torch", "--out", str(folder), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "(loaded back without dualtrain)" in proc.stdout
    assert {"mistaken_torch.py", "small_resnet_torch.py"} <= {p.name for p in folder.iterdir()}
    # the check fails on a defect of the class it guards: a module the export needs, missing
    (folder / "small_resnet_torch.py").unlink()
    with pytest.raises(UserError, match="No module named 'small_resnet_torch'. Nothing was"):
        load_back("torch", folder, run_spec(run), 10)


@pytest.mark.slow
@pytest.mark.sweep  # CI's time (docs/testing.md)
def test_keras_export_with_the_users_own_activation_says_how_to_load(runs, tmp_path):
    # Activation(erf_gelu), a function of the user's module: a bare load_model cannot find it, so
    # the export says the exact lines that load it, and those lines work without dualtrain
    sets = (
        SHORT[0],
        "model.torch=gelu_mlp_torch:gelu_mlp",
        "model.keras=gelu_mlp_keras:gelu_mlp_own_activation",
        "train.max_steps=2",
        "train.epochs=null",
    )
    run = runs("tf", *sets, config=PORT)
    folder = tmp_path / "keras"
    proc = run_cli("export", str(run), "--format", "keras", "--out", str(folder), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    how = json.loads((folder / "export.json").read_text())["load"]
    assert "custom_objects={'erf_gelu': gelu_mlp_keras.erf_gelu}" in how and how in proc.stdout
    code = f"import keras\n{how.replace('; ', chr(10))}\n"
    loaded = run_without_dualtrain(code, cwd=folder)
    assert loaded.returncode == 0, loaded.stderr[-2000:]


#: CI's slow part runs the hardest case (3 workers, batchnorm, one TF process per replica); the full
#: sweep every world size and strategy (docs/testing.md)
WORLDS = [
    pytest.param(
        w,
        s,
        strategy,
        id=f"{w}{'-batchnorm' if s else ''}-{strategy}",
        marks=pytest.mark.sweep,  # every world size in the sweep, for CI's time (the pairs at
        # world 2 stay in CI: the exports, the mistakes, the dropout and batchnorm pairs)
    )
    for w, s in [(1, ()), (2, ()), (3, ()), (3, BN)]
    for strategy in ("mirrored", "multi_worker")
]


@pytest.mark.slow
@pytest.mark.parametrize("world, sets, strategy", WORLDS)
def test_faithful_port_compares_at_every_world_size(tmp_path, world, sets, strategy):
    out = tmp_path / "cmp"
    args = [a for s in (*sets, f"tf.strategy={strategy}") for a in ("--set", s)]
    proc = run_cli(
        "compare",
        "--config",
        PORT,
        "--world-size",
        str(world),
        "--set",
        f"model.path={ROOT / 'examples' / 'ports'}",
        *args,
        "--out",
        str(out),
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["passed"], verdict
    for name in ("torch", "tf"):
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["test_accuracy"] >= 0.96, (name, summary["test_accuracy"])


# ---- the locator (dualtrain diff-models, and compare when a pair's fp64 pair fails) -------------

#: each mistaken port: the layer the locator must name, what differs there, the mistake's name
LOCATED = {
    "same_padding_strided": ("'block2.conv1'", "output", "asymmetric 'same' padding"),
    "flatten_hwc": ("'fc'", "input", "flatten order"),
    "softmax_inside": ("'fc'", "output", "softmax inside the model"),
    "gelu_tanh (torch)": ("'block1.conv1'", "input", "approximate vs exact gelu"),
    "gelu_approximate (keras)": ("'block1.conv1'", "input", "approximate vs exact gelu"),
    "keras_batchnorm": (
        "'block1.bn1'",
        "running statistics",
        "BatchNorm running-variance convention",
    ),
    "keras_batchnorm_defaults": ("'block1.bn1'", "output", "BatchNorm eps"),
    "keras_numbers_batchnorm (torch)": ("'block1.bn1'", "output", "BatchNorm eps"),
    "layernorm_keras_eps": ("'norm1'", "output", "LayerNorm eps (torch eps=1e-05, Keras"),
}


def diff_models(*sets: str, agree: bool = False, config: str = PORT) -> dict:
    """diff-models' finding; its exit code says whether the sides agree (0) or differ (1), so it
    can gate CI."""
    args = [a for s in (f"model.path={ROOT / 'examples' / 'ports'}", *sets) for a in ("--set", s)]
    proc = run_cli("diff-models", "--config", config, *args, "--json", timeout=600)
    assert proc.returncode == (0 if agree else 1), proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize(
    "name", [n if n not in SLOW else pytest.param(n, marks=pytest.mark.slow) for n in LOCATED]
)
def test_locator_names_the_layer_and_the_mistake(name):
    finding = diff_models(*MISTAKES[name])
    layer, what, mistake = LOCATED[name]
    print(finding["where"], finding["what"], finding["mistake"])
    assert layer in finding["where"] and finding["what"] == what
    assert finding["mistake"].startswith(mistake), finding["mistake"]
    if "defaults" in name:  # Keras's default momentum 0.99 is torch's 0.01
        assert "momentum convention" in finding["mistake"] and "torch's 0.01" in finding["mistake"]


@pytest.mark.slow
def test_locator_names_a_parameter_without_gradient():
    # a conv bias right before a batchnorm: no gradient in exact arithmetic, each side's rounding
    # noise (which adam scales up) moves it
    finding = diff_models(*BN, "model.args.bn_bias=true")
    assert finding["what"] == "gradient" and "'block1.conv1'" in finding["where"]
    assert finding["mistake"].startswith("a parameter with no gradient in exact arithmetic")
    assert "block1.conv1.bias" in finding["mistake"]


# slow: the default suite keeps the locator's finding (flatten_hwc) and the faithful port's fp64
# pair; this is the locator's control
@pytest.mark.slow
@pytest.mark.parametrize("sets", [(), BN], ids=["plain", "batchnorm"])
def test_locator_finds_nothing_in_the_faithful_port(sets):
    finding = diff_models(*sets, agree=True)
    assert finding["what"] == "nothing" and finding["rows"]
    assert all(r["own"] < 1e-12 and r["grad"] < 1e-12 for r in finding["rows"])
    norms = [r for r in finding["rows"] if r["running"] is not None]
    assert len(norms) == (2 if sets else 0)  # each batchnorm's training mode was compared
    assert all(r["train"] < 1e-12 and r["running"] < 1e-12 for r in norms)


@pytest.mark.slow
def test_compare_of_a_mistaken_port_locates_it(tmp_path):
    out = tmp_path / "cmp"
    sets = (
        f"model.path={ROOT / 'examples' / 'ports'}",
        "precision.dtype=fp64",
        "train.max_steps=3",
        "train.epochs=null",
        *MISTAKES["same_padding_strided"],
    )
    args = [a for s in sets for a in ("--set", s)]
    proc = run_cli("compare", "--config", PORT, *args, "--out", str(out), timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "locator: first difference at torch 'block2.conv1'" in proc.stdout
    finding = json.loads((out / "locator.json").read_text())
    assert finding["mistake"].startswith("asymmetric 'same' padding")
    assert "asymmetric 'same' padding" in (out / "report.md").read_text()
