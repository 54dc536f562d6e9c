"""The first divergent operation: where the fp64 pair parts, which operation of which step.

compare replays the fp64 pair up to its first divergent step (dualtrain.driver.compare_replay):
both backends again, each writing after every step its all-reduced gradient (``grads_step{N}.npz``)
and its whole state (a checkpoint: the weights with the running statistics, the optimizer's slots
in canonical names). :func:`first_divergent_op` walks the steps in the order a step computes them:
the loss (the forward pass and the loss on the same weights and batch), each parameter's gradient,
each optimizer slot, each parameter after the update, each running statistic. The first that
differs beyond rounding is the finding. Where its mechanism is one of a known list it is named: an
update checked against the spec's rule (dualtrain.core.optim_ref) from the same state and gradient,
and against the variants ports are known to carry (amsgrad, Keras's eps, L2 for decoupled decay,
dampening, eps inside the square root, Nesterov, centered); a running statistic against the
other momentum convention and the biased batch variance.

Framework-free: it reads run folders only.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dualtrain.core.weights import Weights, load_weights
from dualtrain.parity import readings as R
from dualtrain.parity import taps
from dualtrain.parity.mechanisms import rel, running_mechanism, update_mechanism
from dualtrain.parity.op_finding import (
    EVALUATION,
    GRADIENT,
    LAYER,
    LOSS,
    RUNNING,
    SLOT,
    UPDATE,
    OpFinding,
    ParamRow,
)
from dualtrain.records.record import WEIGHTS_INIT, RunRecord, read_run
from dualtrain.runtime import checkpoint
from dualtrain.spec import OPTIMIZERS, Experiment, OptimizerSpec

#: compare's replay folder under OUT (torch/ and tf/ in it)
REPLAY = "replay"
#: The longest replay compare makes (a pair that parts later is described by its checks alone).
MAX_STEPS = 64
#: Relative difference that counts as parting: the first steps of a fp64 pair sit at 1e-16-1e-15.
TOL = 1e-10

#: A tensor whose norm is below this share of its kind's largest (gradients, slots) counts as zero.
ZERO_SHARE = 1e-3


def _floor(tensors: Weights) -> float:
    return ZERO_SHARE * max((float(np.linalg.norm(v)) for v in tensors.values()), default=0.0)


@dataclass
class _Side:
    """One replayed run: its record (losses and lrs per step, evaluations) and its state after
    each step (the checkpoints, read once)."""

    label: str
    rec: RunRecord
    loss: dict[int, float]
    lr: dict[int, float]
    states: dict[int, tuple[Weights, Weights, int] | None] = field(default_factory=dict)
    dumped: dict[int, Weights | None] = field(default_factory=dict)

    def grads(self, step: int) -> Weights | None:
        """The all-reduced gradient of ``step`` (``grads_step{N}.npz``), read once."""
        if step not in self.dumped:
            p = Path(self.rec.path) / f"grads_step{step}.npz"
            self.dumped[step] = load_weights(p) if p.is_file() else None
        return self.dumped[step]

    def state(self, step: int) -> tuple[Weights, Weights, int] | None:
        """(weights, optimizer slots, updates applied) after ``step`` (its checkpoint); step 0:
        the initial weights, no slots."""
        if step not in self.states:
            self.states[step] = self._read(step)
        return self.states[step]

    def _read(self, step: int) -> tuple[Weights, Weights, int] | None:
        if step == 0:
            return load_weights(Path(self.rec.path) / WEIGHTS_INIT), {}, 0
        where = checkpoint.step_dir(self.rec.path, step)
        resumed = (self.rec.summary.get("resumed") or [{}])[-1]
        if not where.is_dir() and resumed.get("from_step") == step:  # a run that continued it
            where = Path(str(resumed.get("checkpoint")))
        if not where.is_dir():
            return None
        ckpt = checkpoint.load(where)
        weights = {k: v for k, v in ckpt.weights.items() if not k.startswith(checkpoint.EMA_SLOT)}
        return weights, ckpt.optimizer.slots, ckpt.optimizer.applied


def _side(path: Path, fallback: str) -> _Side:
    rec = read_run(path, require_summary=False)
    return _Side(R.label(rec, fallback), rec, R.step_map(rec, "loss"), R.step_map(rec, "lr"))


def first_divergent_op(a_dir: Path, b_dir: Path, spec: Experiment) -> OpFinding | None:
    """The first operation at which two replayed runs of ``spec`` part (see the module's
    docstring), or None where they agree over every step both replayed."""
    a, b = _side(Path(a_dir), "A"), _side(Path(b_dir), "B")
    steps = sorted(set(a.loss) & set(b.loss))
    for s in steps:
        found = _step(a, b, s, spec)
        if found is not None:
            return dataclasses.replace(found, params=_params(a, b, s))
    return _evaluation(a, b, spec)


def _params(a: _Side, b: _Side, s: int) -> tuple[ParamRow, ...]:
    """Every parameter's gradient and updated value at step ``s``, both sides."""
    ga, gb = a.grads(s), b.grads(s)
    after_a, after_b = a.state(s), b.state(s)
    if ga is None or gb is None:
        return ()
    floor = _floor(ga)
    rows = []
    for name in ga:
        g = rel(ga[name], gb.get(name, np.full(1, np.nan)), floor)
        u = math.nan
        if after_a is not None and after_b is not None and name in after_a[0]:
            u = rel(after_a[0][name], after_b[0].get(name, np.full(1, np.nan)))
        rows.append(ParamRow(name, g, u))
    return tuple(rows)


#: What a loss or an evaluation finding says after its head, by what the step's taps showed
UNTAPPED = "its layers were not tapped (a model pair, or batchnorm synchronised across replicas)"
SAMPLES_AGREE = {
    taps.TRAINING: (
        ", while every layer's output and each sample's loss agree on the first replica's first "
        "micro-batch: another replica's samples, or how the per-sample losses are summed and "
        "normalised"
    ),
    taps.INFERENCE: (
        " while every training step agrees, and every layer's inference output and loss agree "
        "on the tapped samples in the first replica: the evaluated samples (another split, or "
        "other rows of it), or state another replica holds (its own running statistics)"
    ),
}


def _in_layers(
    a: _Side, b: _Side, spec: Experiment, step: int, mode: str, found: OpFinding, head: str
) -> OpFinding:
    """``found`` (the loss or an evaluation, whose words begin with ``head``) told layer by layer
    where both runs tapped ``step`` (debug.dump_layers): the first layer that differs, or the loss
    function, and its mechanism."""
    tapped = taps.read_taps(a.rec.path, step), taps.read_taps(b.rec.path, step)
    if tapped[0] is None or tapped[1] is None:
        return dataclasses.replace(found, what=f"{found.what}; {UNTAPPED}")
    before = a.state(step - 1)
    if before is None:  # no state to recompute a layer from: the finding as it stands
        return found
    rows = tuple(taps.layer_rows(spec, tapped[0], tapped[1]))
    hit = taps.first_layer(spec, (a.label, b.label), (tapped[0], tapped[1]), before[0], step, mode)
    if hit is None:  # the tapped samples agree layer by layer and sample by sample
        return dataclasses.replace(found, what=head + SAMPLES_AGREE[mode], layers=rows)
    return OpFinding(
        found.step,
        LAYER if hit.prefix is not None else found.stage,
        found.tensor,
        hit.rel,
        hit.what,
        hit.mechanism,
        rows,
        hit.prefix,
    )


def _evaluation(a: _Side, b: _Side, spec: Experiment) -> OpFinding | None:
    """Every training step agrees: an evaluation that differs is the evaluation's own (the model in
    inference: dropout left on, batchnorm's running statistics, another split)."""
    ra, rb = a.rec, b.rec
    for key, split in (("loss", "test"), ("val_loss", "validation")):
        ea = R.step_map(ra, key, "eval", present=True)
        eb = R.step_map(rb, key, "eval", present=True)
        for s in sorted(set(ea) & set(eb)):
            d = R.scaled_diff(ea[s], eb[s])
            if d > TOL:
                head = (
                    f"the evaluation of the {split} split after step {s} differs ({a.label} loss "
                    f"{ea[s]:.17g}, {b.label} {eb[s]:.17g})"
                )
                found = OpFinding(
                    s,
                    EVALUATION,
                    None,
                    d,
                    f"{head} while every training step agrees: the model in inference (dropout "
                    f"left on, batchnorm's running statistics) or the evaluated samples",
                )
                tapped = [t for t in taps.tapped_steps(a.rec.path) if t <= s]
                if not tapped:
                    return found
                return _in_layers(a, b, spec, tapped[-1], taps.INFERENCE, found, head)
    return None


def _step(a: _Side, b: _Side, s: int, spec: Experiment) -> OpFinding | None:
    opt = spec.optimizer
    before_a = a.state(s - 1)  # b's is a's: every earlier step agreed
    if R.scaled_diff(a.loss[s], b.loss[s]) > TOL:
        head = (
            f"the loss of step {s} differs on the same weights and batch ({a.label} "
            f"{a.loss[s]:.17g}, {b.label} {b.loss[s]:.17g})"
        )
        d = R.scaled_diff(a.loss[s], b.loss[s])
        differs = OpFinding(s, LOSS, None, d, f"{head}: the forward pass or the loss")
        return _in_layers(a, b, spec, s, taps.TRAINING, differs, head)
    ga, gb = a.grads(s), b.grads(s)
    if ga is None or gb is None:
        return None
    floor = _floor(ga)
    for name in ga:
        r = rel(ga[name], gb.get(name, np.full(1, np.nan)), floor)
        if r > TOL:
            return OpFinding(
                s,
                GRADIENT,
                name,
                r,
                f"the gradient of {name!r} at step {s} differs ({r:.3g} relative); the loss "
                f"agrees: the backward pass, at the layer that holds {name!r}",
            )
    after_a, after_b = a.state(s), b.state(s)
    if after_a is None or after_b is None or before_a is None:
        return None
    (wa, _, _), (wb, _, _) = after_a, after_b
    found = _slots(a, b, s, opt, after_a[1], after_b[1])
    if found is not None and found.tensor is not None:
        name = found.tensor.partition("/")[2]
        if name in ga and not found.mechanism:  # a slot the update reads: which rule moved it
            mechanism = update_mechanism(
                (a.label, b.label), a.lr.get(s), opt, name, before_a, ga, (wa, wb)
            )
            found = dataclasses.replace(found, mechanism=mechanism)
    if found is not None:
        return found
    for name in wa:
        r = rel(wa[name], wb.get(name, np.full(1, np.nan)))
        if r <= TOL:
            continue
        if name in ga:
            mechanism = update_mechanism(
                (a.label, b.label), a.lr.get(s), opt, name, before_a, ga, (wa, wb)
            )
            return OpFinding(
                s,
                UPDATE,
                name,
                r,
                f"{_opt_name(opt)}'s update of {name!r} at step {s} differs ({r:.3g} relative); "
                f"the gradients agree: the optimizer",
                mechanism,
            )
        old = before_a[0].get(name)
        return OpFinding(
            s,
            RUNNING,
            name,
            r,
            f"the running statistic {name!r} after step {s} differs ({r:.3g} relative); the "
            f"gradients agree: the layer's statistics update",
            running_mechanism(a.label, b.label, old, wa[name], wb[name]),
        )
    return None


def _slots(
    a: _Side, b: _Side, s: int, opt: OptimizerSpec, sa: Weights, sb: Weights
) -> OpFinding | None:
    only = sorted(set(sa) ^ set(sb))
    if only:
        side = a.label if only[0] in sa else b.label
        slot = only[0].split("/", 1)[0]
        hint = " (amsgrad)" if slot.startswith("max_exp_avg_sq") else ""
        return OpFinding(
            s,
            SLOT,
            only[0],
            math.inf,
            f"{_opt_name(opt)} on {side} keeps an optimizer slot the other does not: {slot}{hint}",
            f"{side}'s optimizer is another variant than the spec's",
        )
    floor = _floor(sa)
    for key in sa:
        r = rel(sa[key], sb[key], floor)
        if r > TOL:
            slot, _, name = key.partition("/")
            return OpFinding(
                s,
                SLOT,
                key,
                r,
                f"{_opt_name(opt)}'s {slot} of {name!r} after step {s} differs ({r:.3g} "
                f"relative); the gradients agree: the optimizer",
            )
    return None


def _opt_name(opt: OptimizerSpec) -> str:
    return OPTIMIZERS[opt.name].torch_class
