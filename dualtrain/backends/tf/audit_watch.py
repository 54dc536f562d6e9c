"""What the Keras recorder watches while the script runs: the fit calls of its model, the one
whose callbacks list the recorder recorded, any other (a warm-up) run with the model as the
script built it; and the arguments the recorded fit was given (its input, shuffle, callbacks,
class and sample weights), read from fit's frame."""

from __future__ import annotations

import sys
import types
from typing import Any


def among_callbacks(recorder: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``recorder`` is among a fit call's callbacks (``callbacks=``, or fit's sixth
    positional argument; a list or a CallbackList)."""
    given = kwargs["callbacks"] if "callbacks" in kwargs else (args[5] if len(args) > 5 else None)
    return any(c is recorder for c in getattr(given, "callbacks", given) or ())


def bare_fit(
    model: Any, fit: Any, step: Any, jit: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """A fit the recorder is not given (a warm-up before the recorded one): run with the model's
    own train step and jit_compile, its train function built for it and again after it (the
    recorded fit then traces the recorder's wrappers, the optimizer's included)."""
    print(
        "dualtrain audit: a fit without the recorder among its callbacks is not recorded "
        "(pass it in callbacks=[...] of the fit to record)",
        file=sys.stderr,
    )
    wrapped, recorded_jit = model.train_step, model.jit_compile
    model.train_step, model.jit_compile, model.train_function = step, jit, None
    try:
        return fit(*args, **kwargs)
    finally:
        model.train_step, model.jit_compile, model.train_function = wrapped, recorded_jit, None


def fit_arguments(model: Any) -> dict[str, Any]:
    """The arguments the running ``fit`` of ``model`` was given (read from fit's frame: a
    callback is not handed them, and a recorder made in fit's own arguments is made after
    ``model.fit`` was looked up, so no wrapper of fit sees that call); {} where no such frame is
    found."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            return dict(frame.f_locals)
        frame = frame.f_back
    return {}


def fit_weights(found: dict[str, Any]) -> dict[str, Any]:
    """What fit's arguments (``found``: fit_arguments') add to the loss: ``class_weight`` (class
    -> weight) and whether a ``sample_weight`` was given."""
    weights = found.get("class_weight")
    return {
        "class_weight": {int(k): float(v) for k, v in weights.items()} if weights else None,
        "sample_weight": found.get("sample_weight") is not None,
    }
