"""A torch run that trained steps in eval mode: ``model.eval()`` before a validation pass and no
``model.train()`` after it, so dropout is off and BatchNorm normalises with its running statistics
(and stops updating them) for the rest of training. Keras's ``fit`` sets the mode itself."""

from __future__ import annotations

from dualtrain.audit.finding import fix
from dualtrain.audit.read import Recorded
from dualtrain.records.verdict import Finding


def eval_mode(a: Recorded, b: Recorded) -> list[Finding]:
    out = []
    for run, tag in ((a, "A"), (b, "B")):
        steps = run.config.eval_steps
        layers = run.config.mode_layers
        if not steps or not layers:  # no layer computes otherwise in eval mode: nothing changes
            continue
        shown = ", ".join(layers[:3]) + (", ..." if len(layers) > 3 else "")
        out.append(
            Finding(
                "training steps in eval mode (model.train() not called)",
                f"{tag} trains {len(steps)} of {len(run.steps)} steps (the first: step "
                f"{steps[0]}) with the model in eval mode: its dropout and BatchNorm layers "
                f"({shown}) compute as in evaluation",
                [
                    fix(
                        run,
                        tag,
                        (".eval()", "no_grad"),
                        "call model.train() before each epoch's training loop (after evaluation)",
                    )
                ],
                step=steps[0],
            )
        )
    return out


__all__ = ["eval_mode"]
