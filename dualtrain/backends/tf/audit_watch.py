"""What the Keras recorder watches while the script runs: the fit calls of its model, the one
whose callbacks list the recorder recorded, any other (a warm-up) run with the model as the
script built it."""

from __future__ import annotations

import sys
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
