"""Findings the ninth round of unseen scripts got wrong, on records written in the test: a
reparametrised layer's names, an optimizer stepping with no gradients, a second backward under
DDP, an augmentation of the same samples, and an EarlyStopping in one run only."""

from __future__ import annotations

import numpy as np

from dualtrain.audit.diagnose import diagnose
from tests.audit.records import edit_rows, edit_steps, record, with_rows

TORCH = """\
class MLP(nn.Module):
m.fc1 = nn.utils.parametrizations.weight_norm(m.fc1)
optimizer.zero_grad()
loss.backward(retain_graph=True)
class Shifted(Dataset):
for epoch in range(1, args.epochs + 1):
"""
KERAS = """\
stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1)
"""


def _names(a, b) -> dict:
    return {f.name: f for f in diagnose(a, b)}


def test_a_reparametrised_layer_is_named_by_its_arrays_and_line():
    """weight_norm against the plain model: 'A has 4 arrays, B has 5' and the MLP class line,
    which both scripts share."""
    plain = record("torch", script=TORCH)
    plain.weights_init = plain.weights_final = {"fc1.weight": np.zeros(2), "fc1.bias": np.zeros(2)}
    normed = record("torch", script=TORCH)
    normed.weights_init = normed.weights_final = {
        "fc1.parametrizations.weight.original0": np.zeros(1),
        "fc1.parametrizations.weight.original1": np.zeros(2),
        "fc1.bias": np.zeros(2),
    }
    f = _names(plain, normed)["different models"]
    assert "only in A: fc1.weight; only in B: fc1.parametrizations.weight.original0" in f.evidence
    assert "torch.py:2: m.fc1 = nn.utils.parametrizations.weight_norm(m.fc1)" in f.fixes[0]


def test_an_optimizer_stepping_without_gradients_is_named_at_zero_grad():
    """zero_grad() between backward() and step(): every recorded norm None, nothing named."""
    empty = record("torch", script=TORCH, grad_norm=1.0)
    edit_steps(empty, lambda k, s: {"grad_norm": None})
    f = _names(record("torch"), empty)["optimizer steps without gradients"]
    assert "B's optimizer stepped with no gradient at 4 of its 4 steps" in f.evidence
    assert "torch.py:3: optimizer.zero_grad() -> optimizer.zero_grad() before" in f.fixes[0]
    assert "optimizer steps without gradients" not in _names(record("torch"), record("torch"))


def test_a_second_backward_under_ddp_is_its_line_not_a_reduction():
    """loss.backward(retain_graph=True) then backward() again: DDP all-reduces the first only.
    The fix said to call the DDP model instead of .module, and a reduction finding (the
    gradient 2x) told the user to divide the loss by the replicas."""
    twice = record("torch", world=2, grad_norm=2.0, script=TORCH)
    twice.config = twice.config.edited(
        {"ddp": True, "replicas": {"init": {}, "final": {"1": ["fc1.weight"]}}}
    )
    found = _names(record("torch", world=2), twice)
    f = found.pop("replicas out of step (B's replicas end with different weights)")
    assert (
        "torch.py:4: loss.backward(retain_graph=True) -> one backward() per forward" in (f.fixes[0])
    )
    assert not found, list(found)


def test_the_same_samples_with_other_values_are_an_augmentation():
    """The samplers feed the same indices, the values differ (an augmentation with another
    seed): 'different data (another subset, split or dataset)' at an unrun else-branch."""

    def run(seed: int):
        r = record("torch", script=TORCH, config={"loader": {"dataset": "Shifted"}})
        with_rows(r, lambda s, rank: [f"{seed:08x}{s:04x}{rank:04x}"])
        edit_rows(r, lambda s, rank, row: {"indices": [s * 2 + rank]})
        edit_steps(r, lambda k, s: {"samples": 1})  # one row a step, its digest above
        return r

    f = _names(run(7), run(8))["same samples, other values (augmentation or preprocessing)"]
    assert "both runs' samplers feed the same dataset indices" in f.evidence
    assert "torch.py:5: class Shifted(Dataset):" in f.fixes[0]
    other = run(8)
    edit_rows(other, lambda s, rank, row: {"indices": [100 + s]})
    assert "different data" in _names(run(7), other)


def test_an_early_stopping_in_one_run_is_named():
    """Keras's EarlyStopping stopped after epoch 1 of 2; torch trains both: the steps check
    FAILed with nothing named."""
    stop = {"monitor": "val_loss", "patience": 1, "min_delta": 0, "stopped_epoch": 1}
    keras = record(
        "tf", script=KERAS, config={"early_stopping": stop | {"restore_best_weights": True}}
    )
    keras.steps = keras.steps[:2]
    f = _names(record("torch", script=TORCH), keras)["stopped early in one run (EarlyStopping)"]
    assert "B's EarlyStopping (monitor 'val_loss', patience 1" in f.evidence
    assert "stopped fit after epoch 1; A trains 2 epochs" in f.evidence
    assert "tf.py:1: stop = keras.callbacks.EarlyStopping(" in f.fixes[0]
    assert "torch.py:6: for epoch in range(" in f.fixes[1]
    keras.config = keras.config.edited(
        {"early_stopping": {**keras.config.json["early_stopping"], "stopped_epoch": 0}}
    )  # it did not stop: the steps' finding
    assert "stopped early in one run (EarlyStopping)" not in _names(record("torch"), keras)


def test_a_gradient_ratio_from_other_initial_weights_is_no_reduction():
    """Two torch runs from other initial weights (a fine-tuning phase against a fresh run): a
    gradient 1.75x the other's was read as gradients summed over the replicas."""
    fresh, tuned = record("torch", world=2), record("torch", world=2, grad_norm=2.0)
    assert "per-replica loss reduction (local mean vs global batch)" in _names(fresh, tuned)
    tuned.weights_init = {"w": np.ones(2, np.float32)}
    assert "per-replica loss reduction (local mean vs global batch)" not in _names(fresh, tuned)


def _padded(framework: str = "torch") -> dict:
    """A DistributedSampler that pads 3 samples to 4 (two replicas' worth of one row each)."""
    sampler = {"type": "DistributedSampler", "num_replicas": 2, "dataset_size": 3}
    return {"sampler": sampler | {"total_size": 4}} if framework == "torch" else {}


def test_padding_is_named_only_where_a_row_is_fed_twice_and_the_other_run_does_not():
    """Every compare with a torch record listed 'DistributedSampler padding: N row(s) fed twice',
    also when both records were the same script, and counted distinct rows that share a pattern
    digest as repeats (issue 48)."""
    same = _names(record("torch", config=_padded()), record("torch", config=_padded()))
    assert "DistributedSampler padding" not in same, list(same)
    # distinct rows (their exact digests) that share one pattern: nothing was fed twice
    alike = edit_rows(record("torch", config=_padded()), lambda s, r, row: {"pattern": ["p"]})
    assert "DistributedSampler padding" not in _names(alike, record("tf")), "pattern repeats"
    # step 2 feeds step 1's row again (the padding), the Keras run feeds each row once
    padded = edit_rows(
        record("torch", config=_padded(), script="s = DistributedSampler(ds)\n"),
        lambda s, r, row: {"exact": ["00000001" + "0" * 8]} if s == 2 else {},
    )
    f = _names(padded, record("tf"))["DistributedSampler padding"]
    assert "1 row(s) fed twice in epoch 1 (by the rows' exact digests)" in f.evidence, f.evidence
    assert "the other run feeds every row once" in f.evidence
    assert (
        "torch.py:1: s = DistributedSampler(ds) -> DistributedSampler(..., drop_last" in f.fixes[0]
    )


def test_the_same_weights_and_rows_with_another_first_loss_name_the_loss():
    """A Keras kernel_regularizer (2.631 against 2.296) or label smoothing (2.298): bit-identical
    weights and rows, another step-1 loss, and the report named nothing (issue 48)."""
    still = {"random_layers": [], "precision": {"compute_dtype": "float32"}}
    script = "loss = F.cross_entropy(model(x), y)\n"
    torch_run = record("torch", config=still, losses=[2.296] * 4, script=script)
    for other in (2.631, 2.298):
        keras_run = record(
            "tf", config=still, losses=[other] * 4, script="m.compile(optimizer=o, loss=loss)\n"
        )
        f = _names(torch_run, keras_run)["different loss"]
        assert f"the loss is 2.296 in A and {other:g} in B" in f.evidence, f.evidence
        assert "torch.py:1: loss = F.cross_entropy(model(x), y) -> the loss" in f.fixes[0]
        assert "tf.py:1: m.compile(optimizer=o, loss=loss) -> the loss" in f.fixes[1]
    keras_run = record("tf", config=still, losses=[2.631] * 4)
    # dropout in one model (its masks are its own), a record that does not say, float32 rounding
    dropout = record("torch", config={"random_layers": ["1 (Dropout)"]}, losses=[2.296] * 4)
    unsaid = record("torch", losses=[2.296] * 4)
    rounding = record("tf", config=still, losses=[2.296 * (1 + 1e-6)] * 4)
    half = {"random_layers": [], "precision": {"compute_dtype": "bfloat16"}}
    mixed = record("tf", config=half, losses=[2.631] * 4)  # a mixed_bfloat16 forward
    pairs = ((dropout, keras_run), (unsaid, keras_run), (torch_run, rounding), (torch_run, mixed))
    for a, b in pairs:
        assert "different loss" not in _names(a, b)
    # other rows at step 1: the loss says nothing of how it is computed
    moved = edit_rows(
        record("tf", config=still, losses=[2.631] * 4), lambda s, r, row: {"exact": ["x"]}
    )
    assert "different loss" not in _names(torch_run, moved)


def test_a_keras_class_weight_is_named_with_the_torch_loss_that_matches_it():
    """fit's class_weight weights each row's loss and divides by the batch size; torch's
    CrossEntropyLoss(weight=) divides by the weights' sum: the fix is the sum that matches."""
    a = record("torch", losses=[2.296] * 4)
    b = record("tf", losses=[2.9] * 4)
    for run in (a, b):
        run.config = run.config.edited({"random_layers": []})
        run.config = run.config.edited({"precision": {"compute_dtype": "float32"}})
    b.config = b.config.edited(
        {"loss_terms": {"class_weight": {"0": 1.0, "2": 3.0}, "sample_weight": False}}
    )
    (f,) = [f for f in diagnose(a, b) if f.name == "different loss"]
    assert "B's compiled loss has fit's class_weight={'0': 1.0, '2': 3.0}" in f.evidence
    assert "torch.tensor([1.0, 1.0, 3.0])[y]).mean()" in f.fixes[0], f.fixes
    assert "no class_weight or sample_weight in fit" in f.fixes[1], f.fixes


def test_keras_add_loss_terms_and_loss_weights_are_named_with_their_values():
    """Issue 48 item 2: a layer's add_loss term and compile's loss_weights change the loss Keras
    differentiates; the "different loss" finding names each, with what the torch script writes to
    match and what the Keras script removes. Loss weights that are all 1 change nothing."""
    a = record("torch", losses=[2.296] * 4)
    b = record("tf", losses=[2.9] * 4)
    for run in (a, b):
        run.config = run.config.edited({"random_layers": []})
        run.config = run.config.edited({"precision": {"compute_dtype": "float32"}})
    b.config = b.config.edited(
        {"loss_terms": {"add_loss": ["act (Sparse)"], "loss_weights": [1.0, 0.5]}}
    )
    (f,) = [f for f in diagnose(a, b) if f.name == "different loss"]
    assert "B's compiled loss has loss_weights=[1.0, 0.5], add_loss terms from act (Sparse)" in (
        f.evidence
    ), f.evidence
    assert "each output's loss times its weight in loss_weights=[1.0, 0.5], summed" in f.fixes[0]
    assert "the term(s) act (Sparse) add with add_loss, added to the loss before" in f.fixes[0]
    assert "loss_weights=None in compile, no add_loss in act (Sparse)" in f.fixes[1], f.fixes
    b.config = b.config.edited({"loss_terms": {"add_loss": [], "loss_weights": {"out": 1.0}}})
    (f,) = [f for f in diagnose(a, b) if f.name == "different loss"]
    assert "compiled loss has" not in f.evidence  # nothing read explains it: the generic fix
