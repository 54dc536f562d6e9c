"""Each optimizer declared once: what torch.optim class is its reference, which OptimizerSpec fields
that class takes, torch's default eps, the per-parameter state it keeps (under torch.optim's slot
names, and on which options), whether its step divides by a running gradient magnitude plus eps
(``normalises``), and whether torch.optim keeps a step count for it (``counts_steps``).

Beside it, :data:`KERAS_NAMES`: every torch.optim class a user's script may train with that has a
Keras counterpart, with its options under both frameworks' names (the audit compares a torch
script's optimizer with a Keras one's through it; :attr:`Optimizer.keras` is a declared
optimizer's entry).

Every other place reads these tables: the spec's eps default, the torch side's constructor and its
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

    @property
    def keras(self) -> KerasName:
        """Its Keras optimizer and the options' Keras names."""
        return KERAS_NAMES[self.torch_class]

    def slot_names(self, momentum: float, centered: bool) -> tuple[str, ...]:
        """The per-parameter state it keeps with these options, in SLOT_ORDER."""
        on = {None: True, "momentum": bool(momentum), "centered": centered}
        kept = {slot for slot, needs in self.slots if on[needs]}
        return tuple(s for s in SLOT_ORDER if s in kept)


@dataclass(frozen=True)
class KerasName:
    """A torch.optim class under Keras's names."""

    keras_class: str
    """The keras.optimizers class of the same rule."""
    options: tuple[tuple[str, str, str], ...]
    """(torch option, its Keras name, what it is) for each option both take; a torch option
    ``betas.0`` is an item of a tuple option."""


#: the Adam family's shared options
_ADAM_NAMES = (
    ("eps", "epsilon", "epsilon"),
    ("betas.0", "beta_1", "beta_1"),
    ("betas.1", "beta_2", "beta_2"),
)
_AMSGRAD = ("amsgrad", "amsgrad", "amsgrad")

#: torch.optim class -> its Keras counterpart (a user's script may use any of them)
KERAS_NAMES: dict[str, KerasName] = {
    "SGD": KerasName(
        "SGD", (("momentum", "momentum", "momentum"), ("nesterov", "nesterov", "nesterov"))
    ),
    "Adam": KerasName("Adam", (*_ADAM_NAMES, _AMSGRAD)),
    "AdamW": KerasName(
        "AdamW", (*_ADAM_NAMES, ("weight_decay", "weight_decay", "weight decay"), _AMSGRAD)
    ),
    "NAdam": KerasName("Nadam", _ADAM_NAMES),
    "Adamax": KerasName("Adamax", _ADAM_NAMES),
    "Adadelta": KerasName("Adadelta", (("rho", "rho", "rho"), ("eps", "epsilon", "epsilon"))),
    "Adagrad": KerasName("Adagrad", (("eps", "epsilon", "epsilon"),)),
    "RMSprop": KerasName(
        "RMSprop",
        (
            ("alpha", "rho", "the squared average's decay"),
            ("eps", "epsilon", "epsilon"),
            ("momentum", "momentum", "momentum"),
        ),
    ),
}

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
