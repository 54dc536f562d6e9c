"""The test suite's worker hook, and the hooks it runs (tests only).

dualtrain calls every entry point of its ``dualtrain.worker_hooks`` group in each worker right
before the engine is built (dualtrain.runtime.entry.run_worker_hooks). Nothing dualtrain installs
is in that group: the tests put :data:`SITE` on their processes' PYTHONPATH (:func:`install`), whose
one distribution declares :func:`from_environment`. That entry does nothing unless
``DUALTRAIN_TEST_HOOK=module:function[=argument]`` is set, and then calls
``function(backend, argument)``: the detection-power tests (tools/mutants/) and the hooks below
change one backend's arithmetic, or stop a worker, on purpose. :func:`hook_env` is the environment
that does it.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from dualtrain.errors import UserError

TEST_HOOK = "DUALTRAIN_TEST_HOOK"
#: a folder holding one distribution's metadata (no code): its entry point in dualtrain's
#: ``dualtrain.worker_hooks`` group is :func:`from_environment`
SITE = Path(__file__).resolve().parent / "hook_site"
ROOT = SITE.parent.parent


def python_path(existing: str | None = None) -> str:
    """PYTHONPATH with the hook's site and this checkout first (``existing`` after them)."""
    folders = [str(SITE), str(ROOT), *(existing or "").split(os.pathsep)]
    return os.pathsep.join(dict.fromkeys(f for f in folders if f))


def install() -> None:
    """This test process's children (runs, their workers, warm servers) see the hook."""
    os.environ["PYTHONPATH"] = python_path(os.environ.get("PYTHONPATH"))


def hook_env(target: str) -> dict[str, str]:
    """The environment that makes every worker of a run call ``target``
    (``module:function[=argument]``)."""
    return {TEST_HOOK: target, "PYTHONPATH": python_path(os.environ.get("PYTHONPATH"))}


def from_environment(backend: str) -> str | None:
    """The entry point dualtrain calls: runs the DUALTRAIN_TEST_HOOK, if any, and returns it (what
    the worker reports on stderr and in summary.json's ``test_hook``)."""
    text = os.environ.get(TEST_HOOK, "").strip()
    if not text:
        return None
    target, _, argument = text.partition("=")
    module, _, function = target.partition(":")
    if not module or not function:
        raise ValueError(f"{TEST_HOOK} must be module:function[=argument]. Received: {text!r}")
    getattr(importlib.import_module(module), function)(backend, argument)
    return text


def user_error(backend: str, argument: str) -> None:
    """Stop the worker on a user error, as a mistake only a worker can see would."""
    raise UserError(argument)


def run_fails(backend: str, argument: str) -> None:
    """Stop the workers of the run whose folder is named ``argument`` (a compare's ``fp64-torch``:
    the worker's arguments hold its run folder) on an error that is no user mistake."""
    import sys  # lazy: only this hook reads the worker's arguments

    if any(Path(a).name == argument for a in sys.argv[1:]):
        raise RuntimeError(f"planted: the {argument} run fails")


def probe_state_does_not_load(backend: str, argument: str) -> None:
    """The ``argument`` backend's requested-precision run cannot load the probe states the other
    backend recorded (as an optimizer state with a slot this side does not keep would): its
    replay stops on a user error naming it."""
    if backend != argument:
        return
    from dualtrain.runtime import probes  # lazy: cycle

    def load(run_dir, step):
        raise UserError(
            f"the probe state at step {step} holds optimizer slot 'velocity', which this "
            f"backend's optimizer does not keep"
        )

    probes.load = load


def layernorm_eps(backend: str, argument: str) -> None:
    """The TF backend's layernorm layers at another eps (``argument``): Keras's LayerNormalization
    default (1e-3) where torch's nn.LayerNorm has 1e-5, the classic porting slip."""
    if backend != "tf":
        return
    import dataclasses  # lazy: cycle

    from dualtrain.backends.tf import model  # lazy: framework
    from dualtrain.spec import LayerType  # lazy: cycle

    build = model.LAYERS[LayerType.LAYERNORM]

    def other_eps(b, r, name, x):
        spec = dataclasses.replace(r.spec, eps=float(argument))
        return build(b, dataclasses.replace(r, spec=spec), name, x)

    model.LAYERS[LayerType.LAYERNORM] = other_eps


def attention_heads_transposed(backend: str, argument: str) -> None:
    """The TF backend's attention splits the packed projection's rows into heads in the other
    order (head_dim x heads where torch has heads x head_dim), a classic porting slip; the
    parameters and every shape stay the same."""
    if backend != "tf":
        return
    import tensorflow as tf  # lazy: framework

    from dualtrain.backends.tf import tokens  # lazy: framework

    def split(a, n, t, h, hd):
        return tf.transpose(tf.reshape(a, [n, t, hd, h]), [0, 3, 1, 2])

    tokens.SelfAttention.split_heads = staticmethod(split)


def chief_finishes_late(backend: str, argument: str) -> None:
    """Each task of a multi_worker TF run writes its pid to ``argument``/pid-RANK; task 0 finishes
    its run 2 s after the others and writes when to ``argument``/chief-done (a monotonic time)."""
    import os  # lazy: cycle
    import time  # lazy: cycle
    from pathlib import Path  # lazy: cycle

    from dualtrain.backends.tf.launch import TF_CONFIG, parse_tf_config  # lazy: framework
    from dualtrain.runtime.loop import TrainLoop  # lazy: cycle

    folder = Path(argument)
    rank = parse_tf_config(os.environ[TF_CONFIG]).rank
    (folder / f"pid-{rank}").write_text(str(os.getpid()))
    if rank != 0:
        return
    run = TrainLoop.run

    def late(self):
        out = run(self)
        time.sleep(2)
        (folder / "chief-done").write_text(repr(time.monotonic()))
        return out

    TrainLoop.run = late


def huber_delta(backend: str, argument: str) -> None:
    """The TF backend's Huber loss at another delta (``argument``): a port whose Huber is not
    torch's default (Keras's Huber(delta=...) against torch's huber_loss(delta=1.0))."""
    if backend != "tf":
        return
    import tensorflow as tf  # lazy: framework

    from dualtrain.backends.tf import ops  # lazy: framework

    delta = float(argument)

    def other(d):
        a = tf.abs(d)
        return tf.where(a <= delta, 0.5 * a * a, delta * (a - 0.5 * delta))

    ops.huber_elementwise = other
