"""Each optimizer declared once: what torch.optim class is its reference, which OptimizerSpec fields
that class takes, torch's default eps, the per-parameter state it keeps (under torch.optim's slot
names, and on which options), whether its step divides by a running gradient magnitude plus eps
(``normalises``), and whether torch.optim keeps a step count for it (``counts_steps``).

Every other place reads this table: the spec's eps default, the torch side's constructor and its
state, the TF side's slot variables, validation's warnings, and the core's update rule, which
dualtrain.core.update_rules keys by the same name (one rule per declared optimizer, a test holds
both tables to the same names). docs/architecture.md lists what adding one touches."""

from __future__ import annotations

from dataclasses import dataclass

from dualtrain.spec.vocab import OptimizerName

#: Every slot any optimizer keeps, in the order the engines create and write them.
SLOT_ORDER = (
    "momentum_buffer",
    "exp_avg",
    "exp_avg_sq",
    "exp_inf",
    "square_avg",
    "acc_delta",
    "grad_avg",
)


@dataclass(frozen=True)
class Optimizer:
    name: OptimizerName
    torch_class: str
    """The torch.optim class whose semantics both backends follow (the reference)."""
    options: tuple[str, ...]
    """The OptimizerSpec fields its torch.optim constructor takes besides ``lr``."""
    default_eps: float
    """torch's default eps (the resolved spec holds it where the config leaves eps null)."""
    slots: tuple[tuple[str, str | None], ...]
    """(slot, the OptimizerSpec option it needs, or None: always)."""
    normalises: bool
    """Its step divides by a running gradient magnitude (plus eps)."""
    counts_steps: bool
    """torch.optim keeps a ``step`` in its state (bias correction, or just a count)."""

    def slot_names(self, momentum: float, centered: bool) -> tuple[str, ...]:
        """The per-parameter state it keeps with these options, in SLOT_ORDER."""
        on = {None: True, "momentum": bool(momentum), "centered": centered}
        kept = {slot for slot, needs in self.slots if on[needs]}
        return tuple(s for s in SLOT_ORDER if s in kept)


_ADAM_OPTIONS = ("betas", "eps", "weight_decay")
_ADAM_SLOTS = (("exp_avg", None), ("exp_avg_sq", None))

OPTIMIZERS: dict[OptimizerName, Optimizer] = {
    o.name: o
    for o in (
        Optimizer(
            OptimizerName.SGD,
            "SGD",
            ("momentum", "nesterov", "weight_decay"),
            1e-8,
            (("momentum_buffer", "momentum"),),
            normalises=False,
            counts_steps=False,
        ),
        *(
            Optimizer(
                name, cls, _ADAM_OPTIONS, 1e-8, _ADAM_SLOTS, normalises=True, counts_steps=True
            )
            for name, cls in ((OptimizerName.ADAM, "Adam"), (OptimizerName.ADAMW, "AdamW"))
        ),
        Optimizer(
            OptimizerName.ADAMAX,
            "Adamax",
            _ADAM_OPTIONS,
            1e-8,
            (("exp_avg", None), ("exp_inf", None)),
            normalises=True,
            counts_steps=True,
        ),
        Optimizer(
            OptimizerName.ADADELTA,
            "Adadelta",
            ("rho", "eps", "weight_decay"),
            1e-6,
            (("square_avg", None), ("acc_delta", None)),
            normalises=True,
            counts_steps=True,
        ),
        Optimizer(
            OptimizerName.RMSPROP,
            "RMSprop",
            ("alpha", "eps", "weight_decay", "momentum", "centered"),
            1e-8,
            (("momentum_buffer", "momentum"), ("square_avg", None), ("grad_avg", "centered")),
            normalises=True,
            counts_steps=True,
        ),
    )
}
