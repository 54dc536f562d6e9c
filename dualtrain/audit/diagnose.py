"""The diagnoses of two recorded runs: the classic differences between a DDP script and a Keras
``fit`` script, each with its evidence and the line to change. The data pipeline's differences
are read from the sample digests (dualtrain.audit.samples), the learning rate's from the lr
records (dualtrain.audit.schedules); the rest from the loss, gradient norm and loss-scale records
and the configuration the recorders read from the scripts' objects.
"""

from __future__ import annotations

import numpy as np

from dualtrain.audit.early import stopped
from dualtrain.audit.finding import fix
from dualtrain.audit.losses import computed_loss, no_gradients, reduction, reported_loss
from dualtrain.audit.pairing import paired_weights
from dualtrain.audit.read import Recorded
from dualtrain.audit.replicas import replicas_apart
from dualtrain.audit.samples import SAMPLE_DIAGNOSES
from dualtrain.audit.schedules import group_lr, schedule, scheduler_first
from dualtrain.audit.settings import SETTINGS_DIAGNOSES
from dualtrain.records.verdict import Finding


def architecture(a: Recorded, b: Recorded) -> list[Finding]:
    pairs = paired_weights(a, b)
    if isinstance(pairs, str):
        names, lines = _unpaired(a, b)
        return [
            Finding(
                "different models",
                f"the initial arrays do not pair: {pairs}{names}",
                [
                    fix(
                        b,
                        "B",
                        (*lines, "(nn.Module)", "Sequential(", "Model(", "Conv2D", "layers."),
                        "the same layers as A (then load A's weights_init.npz)",
                    )
                ],
                step=0,
            )
        ]
    return []


#: torch's reparametrisations, which rename a layer's weight (weight_norm's original0 and 1)
REPARAMETRISED = ("weight_norm(", "spectral_norm(", "register_parametrization(", "orthogonal(")


def _unpaired(a: Recorded, b: Recorded) -> tuple[str, tuple[str, ...]]:
    """Two runs of one framework: the array names in one run only (e.g. weight_norm's
    ``fc1.parametrizations.weight.original0`` against ``fc1.weight``), and where B makes them."""
    if a.framework != b.framework:
        return "", ()
    only_a = sorted(set(a.weights_init) - set(b.weights_init))
    only_b = sorted(set(b.weights_init) - set(a.weights_init))
    if not only_a and not only_b:
        return "", ()
    shown = "; ".join(
        f"only in {tag}: {', '.join(names[:4])}{', ...' if len(names) > 4 else ''}"
        for tag, names in (("A", only_a), ("B", only_b))
        if names
    )
    layers = [n.split(".")[0] for n in only_a + only_b]
    reparam = any(".parametrizations." in n for n in only_a + only_b)
    return f" ({shown})", (*(REPARAMETRISED if reparam else ()), *(f"{x} =" for x in layers))


def resumed(a: Recorded, b: Recorded) -> list[Finding]:
    """A Keras fit that begins after epoch 1 (``initial_epoch``, a BackupAndRestore resuming)
    from other weights than a run that begins at 1: its initial weights are a checkpoint's."""
    first = [r.steps[0].epoch if r.steps else 1 for r in (a, b)]
    pairs = paired_weights(a, b)
    if isinstance(pairs, str) or all(np.array_equal(p.va, p.vb) for p in pairs):
        return []  # an initial_epoch that only numbers epochs: the same weights
    out = []
    for run, tag, mine, theirs in ((a, "A", first[0], first[1]), (b, "B", first[1], first[0])):
        if run.framework == "tf" and mine > 1 and theirs <= 1:
            out.append(
                Finding(
                    "a resumed run against a fresh one",
                    f"{tag}'s fit begins at epoch {mine} (initial_epoch, or a BackupAndRestore "
                    f"that resumed), from the weights it restored; the other run begins at 1",
                    [
                        fix(
                            run,
                            tag,
                            ("BackupAndRestore", "initial_epoch", "load_weights"),
                            "record a run from its start (an empty backup_dir), or compare it "
                            "with the other run's record of the same epochs",
                        )
                    ],
                    step=0,
                )
            )
    return out


DIAGNOSES = (
    architecture,
    resumed,
    replicas_apart,
    *SAMPLE_DIAGNOSES,
    schedule,
    group_lr,
    scheduler_first,
    *SETTINGS_DIAGNOSES,
    reduction,
    reported_loss,
    computed_loss,
    no_gradients,
    stopped,
)


def diagnose(a: Recorded, b: Recorded) -> list[Finding]:
    """Every classic difference the records show, earliest step first."""
    found = [f for d in DIAGNOSES for f in d(a, b)]
    return sorted(found, key=lambda f: -1 if f.step is None else f.step)
