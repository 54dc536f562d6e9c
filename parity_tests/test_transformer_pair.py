"""A transformer model pair (issue 33 item 4): torch's nn.TransformerEncoderLayer against its port
on Keras's MultiHeadAttention and LayerNormalization (examples/ports/transformer_*.py), through the
weight map's split of the packed in_proj_weight. The faithful port passes compare at world 1-3 (the
fp64 pair within 1e-10 over the run), the hand-written attention port agrees too, and a pair with
the split resumes bit for bit and continues from torch in TF (the optimizer's slots in the
canonical layout)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dualtrain.core.weights import load_weights
from dualtrain.parity.checks import Reference, check_reference_loss, check_reference_weights
from dualtrain.records.record import read_run
from dualtrain.runtime import checkpoint
from parity_tests.test_model_pairs import diff_models
from testkit.cli import ROOT, run_cli
from testkit.parity_runs import assert_reference_agrees

TRANSFORMER = str(ROOT / "configs" / "port_transformer.yaml")
#: a dozen steps on a slice of MNIST: the pair, its split map and its update, not its accuracy
TINY = (
    f"model.path={ROOT / 'examples' / 'ports'}",
    "train.max_steps=12",
    "data.train_limit=2000",
    "data.test_limit=500",
)


@pytest.mark.parametrize(
    "world",
    [pytest.param(w, marks=pytest.mark.slow) for w in (1, 2)]  # default-suite time
    + [pytest.param(3, marks=(pytest.mark.slow, pytest.mark.sweep))],  # CI's time
)
def test_faithful_transformer_port_passes_compare(tmp_path, world):
    sets = [a for s in TINY for a in ("--set", s)]
    out = tmp_path / "cmp"
    proc = run_cli(
        "compare", "--config", TRANSFORMER, "--world-size", str(world), *sets, "--out", str(out)
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("verdict:")), proc.stderr)
    print(line)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["passed"] and line.startswith("verdict: PASS")
    # Keras's float64 gelu and attention scale are float32-accurate: run exactly, and said so
    assert {e["op"] for e in verdict["framework_limits"]} == {"attention_scale", "gelu"}


def test_the_key_bias_exact_zero_gradient_is_zero_on_both_sides(runs):
    # torch's key bias (in_proj_bias[E:2E]) has no gradient in exact arithmetic; both backends set
    # that part of the gradient to zero (core/pair/attention.zero_gradients), so under AdamW it
    # stays where it started instead of moving by each side's rounding noise (which parted the fp64
    # pair by 1.3e-10 after 200 steps of adam: a false FAIL of a faithful port)
    sets = (*TINY, "optimizer.name=adamw", "optimizer.lr=0.002", "optimizer.momentum=0.0")
    for backend in ("torch", "tf"):
        run = runs(backend, *sets, "precision.dtype=fp64", config=TRANSFORMER)
        start, end = load_weights(run / "weights_init.npz"), load_weights(run / "weights_final.npz")
        biases = [k for k in start if k.endswith("in_proj_bias")]
        assert biases
        for k in biases:
            e = start[k].shape[0] // 3
            assert np.array_equal(end[k][e : 2 * e], start[k][e : 2 * e]), (backend, k)
            assert not np.array_equal(end[k][:e], start[k][:e])  # the query's bias trains
    assert_reference_agrees(runs.reference(*sets, config=TRANSFORMER))


@pytest.mark.slow
@pytest.mark.parametrize("precision", [pytest.param("fp16", marks=pytest.mark.sweep), "bf16"])
def test_transformer_port_passes_compare_in_mixed_precision(tmp_path, precision):
    # the local checks judge each gradient against its absolute scale: nn.MultiheadAttention's
    # in_proj and out_proj have one (backends/torch/condition._mha); without it bf16's local_grad
    # failed on the TF path at 2.6 x the cross bound (out_proj.bias judged against itself)
    sets = [a for s in (*TINY, f"precision.dtype={precision}") for a in ("--set", s)]
    out = tmp_path / "cmp"
    proc = run_cli("compare", "--config", TRANSFORMER, *sets, "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((out / "verdict.json").read_text())["passed"]


@pytest.mark.slow  # default-suite time: runs in CI's slow part (docs/testing.md)
def test_hand_written_attention_port_agrees(runs):
    # one Dense of 3 x width split into q, k, v by hand: in_proj_weight maps onto its kernel by
    # a plain transpose, and the fp64 pair agrees as with Keras's MultiHeadAttention
    ref = runs.reference(
        *TINY, "model.keras=transformer_keras:transformer_packed", config=TRANSFORMER
    )
    assert_reference_agrees(ref)
    pair = json.loads((ref.b.path / "model_pair.json").read_text())
    entry = next(e for e in pair["map"] if e["torch"].endswith("in_proj_weight"))
    assert entry["transform"] == "transpose" and entry["keras"] == "block0_qkv/kernel"


@pytest.mark.slow
def test_split_pair_resumes_bit_for_bit_and_continues_in_tf(runs):
    # adam's two slots per array: the TF side keeps them per Keras variable (q, k and v apart) and
    # checkpoints them joined in torch's packed layout, which both backends read back
    sets = (*TINY, "precision.dtype=fp64", "train.checkpoint_every=6", "train.keep_checkpoints=3")
    sets = (*sets, "optimizer.name=adam", "optimizer.lr=0.001", "optimizer.momentum=0")
    full = runs("tf", *sets, config=TRANSFORMER)
    state = checkpoint.step_dir(full, 6)
    again = runs.resume_from("tf", state, *sets, config=TRANSFORMER)
    wa, wb = load_weights(full / "weights_final.npz"), load_weights(again / "weights_final.npz")
    assert wa.keys() == wb.keys() and all(np.array_equal(wa[k], wb[k]) for k in wa)
    torch_full = runs("torch", *sets, config=TRANSFORMER)
    cont = runs.resume_from("tf", checkpoint.step_dir(torch_full, 6), *sets, config=TRANSFORMER)
    ref = Reference(read_run(torch_full), read_run(cont))
    checks = [check_reference_loss(ref), check_reference_weights(ref)]
    print([c.detail for c in checks])
    assert ref.b.summary["resumed"][0]["checkpoint_backend"] == "torch"
    assert all(c.passed for c in checks)


# ---- the locator on transformer ports (issue 33 item 5) ------------------------------------------

KERAS = "model.keras=transformer_keras:"
#: each mistaken Keras port: its overrides, the torch module the locator names, what differs there,
#: the start of the mistake's name
LOCATED = {
    "keras_eps": (
        (),
        "'blocks.0.norm1'",
        "output",
        "LayerNorm eps (torch eps=1e-05, Keras LayerNormalization epsilon=0.001; set the Keras "
        "layer's epsilon=1e-05)",
    ),
    "gelu_tanh": ((), "'blocks.0.linear2'", "input", "approximate vs exact gelu"),
    "qkv_order": ((), "'blocks.0.self_attn.out_proj'", "input", "q, k, v taken from the packed"),
    "heads_dh": ((), "'blocks.0.self_attn.out_proj'", "input", "the heads split in the other"),
    "softmax_axis": ((), "'blocks.0.self_attn.out_proj'", "input", "softmax over the wrong axis"),
    "scale_twice": ((), "'blocks.0.self_attn.out_proj'", "input", "the scale applied twice"),
    "scale_none": ((), "'blocks.0.self_attn.out_proj'", "input", "the scale not applied"),
    "first_token": ((), "'head'", "input", "the tokens pooled another way (torch takes the mean"),
    "scale_width": ((), "'blocks.0.self_attn.out_proj'", "input", "the scale 1/sqrt(width)"),
    "no_residual": ((), "'blocks.0.norm2'", "input", "the residual connection left out"),
    "mask_polarity": (
        ("model.args.causal=true",),
        "'blocks.0.self_attn'",
        "output",
        "the attention mask with the other polarity",
    ),
    "mask_missing": (
        ("model.args.causal=true",),
        "'blocks.0.self_attn'",
        "output",
        "the attention mask left out on the Keras side",
    ),
}
TORCH = "model.torch=transformer_torch:"
#: the pair's explicit weight map (the automatic match written out)
MAP = ROOT / "examples" / "ports" / "transformer_map.yaml"
#: the same mistakes made on the torch side (a Keras model written again in torch)
LOCATED_TORCH = {
    "keras_eps": (
        "'blocks.0.norm1'",
        "output",
        "LayerNorm eps (torch eps=0.001, Keras LayerNormalization epsilon=1e-05; the torch side "
        "differs: its eps=0.001, Keras's default, where the Keras layer's is 1e-05; set the torch "
        "layer's eps=1e-05",
    ),
    "gelu_tanh": (
        "'blocks.0.linear2'",
        "input",
        "approximate vs exact gelu (torch uses gelu (tanh",
    ),
}
#: the default suite keeps one finding inside a hand-written attention and one in Keras's own
FAST = ("qkv_order", "mask_polarity")


@pytest.mark.parametrize(
    "name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in LOCATED]
)
def test_locator_names_each_transformer_mistake_at_its_layer(name):
    sets, layer, what, mistake = LOCATED[name]
    finding = diff_models(*TINY[1:], f"{KERAS}{name}", *sets, config=TRANSFORMER)
    print(finding["where"], finding["what"], finding["mistake"])
    assert layer in finding["where"] and finding["what"] == what
    assert finding["mistake"].startswith(mistake), finding["mistake"]


@pytest.mark.slow
@pytest.mark.parametrize("name", LOCATED_TORCH)
def test_locator_names_a_torch_side_mistake(name):
    layer, what, mistake = LOCATED_TORCH[name]
    finding = diff_models(*TINY[1:], f"{TORCH}{name}", config=TRANSFORMER)
    assert layer in finding["where"] and finding["what"] == what
    assert finding["mistake"].startswith(mistake), finding["mistake"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "sets",
    [
        (),
        (f"{KERAS}transformer_packed",),
        ("model.args.causal=true",),
        (f"model.weight_map={MAP}",),
    ],
    ids=["keras-attention", "hand-written", "causal", "explicit-map"],
)
def test_locator_finds_nothing_in_the_faithful_transformer_ports(sets):
    finding = diff_models(*TINY[1:], *sets, agree=True, config=TRANSFORMER)
    assert finding["what"] == "nothing"
    # torch's key bias, which no gradient moves in exact arithmetic, is said beside it
    assert finding["mistake"].startswith("blocks.0.self_attn.in_proj_bias[key]: the key")
    assert all((r["own"] or 0) < 1e-12 and r["grad"] < 1e-12 for r in finding["rows"])


#: the mistakes that change the layers' shapes or order: the map refuses them before launch, in
#: one line that names the fix
REFUSED = {
    f"{KERAS}key_dim_width": "its key_dim is 32, the model width, where torch's head_dim is 32 / "
    "4 = 8; give MultiHeadAttention(num_heads=4, key_dim=8)",
    f"{KERAS}post_ln": "(a LayerNorm on the torch side where the Keras side has its next "
    "sublayer: pre-LN against post-LN?",
    f"{TORCH}post_ln": "(a LayerNorm on the Keras side where the torch side has its next "
    "sublayer: pre-LN against post-LN?",
}


@pytest.mark.parametrize("name", REFUSED)
def test_a_port_with_other_shapes_or_order_is_refused_naming_it(name):
    sets = [a for s in (*TINY, name) for a in ("--set", s)]
    proc = run_cli("diff-models", "--config", TRANSFORMER, *sets, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("dualtrain: error:")]
    assert REFUSED[name] in line, line


#: mistakes an explicit weight map lets through (it pairs arrays by name, not by order): post-LN
#: against pre-LN on either side (the same map pairs the blocks' layers), and q, k, v listed in
#: another order in the map's qkv_heads entry (here key, query, value); the overrides, the torch
#: module, what differs there, the start of the finding
MAPPED = {
    "keras-post-ln": (
        (f"{KERAS}post_ln",),
        "'blocks.0.norm1'",
        "input",
        "post-LN against pre-LN (norm_first): the Keras block is post-LN",
    ),
    "torch-post-ln": (
        (f"{TORCH}post_ln",),
        "'blocks.0.self_attn'",
        "input",
        "pre-LN against post-LN (norm_first): the Keras block is pre-LN",
    ),
    "qkv-order-in-map": (
        (),
        "'blocks.0.self_attn'",
        "output",
        "q, k, v taken from the packed projection in another order (the port reads its thirds as "
        "the key, query, value of torch's",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", MAPPED)
def test_locator_names_a_mistake_an_explicit_map_lets_through(tmp_path, name):
    sets, layer, what, mistake = MAPPED[name]
    weight_map = MAP
    if name == "qkv-order-in-map":  # the qkv_heads entries list key, query, value
        text = MAP.read_text()
        for part in ("kernel", "bias"):
            q, k = f"block0_attn/query/{part}", f"block0_attn/key/{part}"
            assert f"[{q}, {k}," in text
            text = text.replace(f"[{q}, {k},", f"[{k}, {q},")
        weight_map = tmp_path / "map.yaml"
        weight_map.write_text(text)
    finding = diff_models(*TINY[1:], f"model.weight_map={weight_map}", *sets, config=TRANSFORMER)
    print(finding["where"], finding["what"], finding["mistake"])
    assert layer in finding["where"] and finding["what"] == what
    assert finding["mistake"].startswith(mistake), finding["mistake"]
