"""What the Keras audit recorder (dualtrain.backends.tf.audit) reads from a script's model: the
checks of its setup, the weights in canonical names (every variable of the model in torch's layout
and state-dict style names, or through a model pair's weight map), the configuration (optimizer,
LossScaleOptimizer, BatchNorm layers, strategy, dtype policy)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

from dualtrain.audit import meeting
from dualtrain.backends.tf.audit_watch import (
    early_stopping,
    fit_arguments,
    fit_weights,
    lr_callbacks,
    stopping_facts,
)
from dualtrain.core.pair import mapfile
from dualtrain.errors import UserError, shown

#: Keras variable name -> torch's, for the canonical (state-dict) names; other names are kept
NAMES = {
    "kernel": "weight",
    "bias": "bias",
    "gamma": "weight",
    "beta": "bias",
    "moving_mean": "running_mean",
    "moving_variance": "running_var",
    "embeddings": "weight",
}


#: the leaves of the variables that are a layer's parameters (trained unless the layer is frozen)
PARAMETER_LEAVES = (
    "kernel",
    "bias",
    "gamma",
    "beta",
    "embeddings",
    "recurrent_kernel",
    "depthwise_kernel",
    "pointwise_kernel",
)


def _seed_states(model: Any) -> set[int]:
    """The ids of the model's random seed generators' states (Dropout's, a custom layer's
    ``keras.random.SeedGenerator``): the state of a random stream, not a weight. ``model.weights``
    leaves them out already; this also drops one a layer holds as an attribute of its own."""
    return {
        id(gen.state)
        for layer in model._flatten_layers()
        for gen in getattr(layer, "_seed_generators", ())
        if getattr(gen, "state", None) is not None
    }


def model_variables(model: Any) -> list[Any]:
    """The model's weights, trainable and not (BatchNorm's moving statistics, a custom layer's
    ``add_weight``s), in ``model.weights``'s order: Keras's own list, without metric state, seed
    generators' states or the optimizer's variables."""
    seeds = _seed_states(model)
    return [v for v in model.weights if id(v) not in seeds]


def _owners(model: Any) -> dict[int, list[str]]:
    """Each variable's innermost owning layer as the names of the layers that lead to it from the
    model (not the model's own name): ``["left", "fc1"]`` for a tower ``left``'s ``fc1``."""
    out: dict[int, list[str]] = {}

    def walk(layer: Any, prefix: list[str]) -> None:
        for v in layer.weights:
            out[id(v)] = prefix  # overwritten by the layers below that own it
        for sub in layer._flatten_layers(include_self=False, recursive=False):
            walk(sub, [*prefix, sub.name])

    walk(model, [])
    return out


def canonical_names(model: Any, variables: list[Any]) -> list[str]:
    """One distinct name per variable: its path without the model's name, the leaf as torch names
    it (``dense.weight``). Variables that would share one (two towers' ``fc1/kernel``: Keras 3's
    paths repeat a layer name in each sub-model) are named by the layers that own them
    (``left.fc1.weight``, ``right.fc1.weight``); any still alike (one layer's two weights of one
    name) get ``_1``, ``_2``, ... in the model's order. No variable is dropped."""
    leaves = [v.path.rpartition("/")[2] for v in variables]
    first = []
    for v, leaf in zip(variables, leaves, strict=True):
        layer = v.path.rpartition("/")[0]
        inner = layer.split("/")[1:] or ([layer] if layer else [])  # without the model's name
        first.append(".".join([*inner, NAMES.get(leaf, leaf)]))
    counts = Counter(first)
    owners = _owners(model) if any(n > 1 for n in counts.values()) else {}
    names, seen = [], set()
    for v, leaf, name in zip(variables, leaves, first, strict=True):
        if counts[name] > 1:
            name = ".".join([*owners.get(id(v), v.path.split("/")[:-1]), NAMES.get(leaf, leaf)])
        unique, k = name, 1
        while unique in seen:
            unique, k = f"{name}_{k}", k + 1
        seen.add(unique)
        names.append(unique)
    return names


def _torch_layout(leaf: str, a: np.ndarray) -> np.ndarray:
    """Kernels in torch's layout: conv HWIO -> OIHW, dense (in, out) -> (out, in); any other
    variable as Keras holds it."""
    if leaf == "kernel" and a.ndim >= 3:
        a = np.transpose(a, (a.ndim - 1, a.ndim - 2, *range(a.ndim - 2)))
    elif leaf == "kernel" and a.ndim == 2:
        a = a.T
    return np.ascontiguousarray(a)


def canonical_weights(model: Any, weight_map: str | None = None) -> dict[str, np.ndarray]:
    """Every weight of the model (:func:`model_variables`) in torch's layout under a distinct
    state-dict style name (:func:`canonical_names`); or, given a model pair's ``weight_map`` file,
    under the torch names and layout the map gives them."""
    variables = model_variables(model)
    if weight_map is not None:
        paths = Counter(v.path for v in variables)
        twice = next((p for p, n in paths.items() if n > 1), None)
        if twice is not None:
            raise UserError(
                f"weight_map names Keras variables by path, and the model has {paths[twice]} "
                f"variables at {twice!r}: give its layers distinct names"
            )
        values = {v.path: np.asarray(keras.ops.convert_to_numpy(v)) for v in variables}
        trainable = [v.path for v in model.trainable_weights]
        return mapfile.canonical_from_keras(weight_map, values, trainable)
    names = canonical_names(model, variables)
    return {
        name: _torch_layout(v.path.rpartition("/")[2], np.asarray(keras.ops.convert_to_numpy(v)))
        for name, v in zip(names, variables, strict=True)
    }


def check_setup(model: Any) -> Any:
    """The model's strategy, or a one-line error for a model the recorder cannot record: not a
    keras.Model, not compiled, built under no MirroredStrategy or MultiWorkerMirroredStrategy."""
    if not isinstance(model, keras.Model):
        raise UserError(f"keras_recorder's model must be a keras.Model. Received: {shown(model)}")
    if getattr(model, "optimizer", None) is None:  # no such attribute before compile
        raise UserError("keras_recorder needs a compiled model (call model.compile first)")
    strategy = model.distribute_strategy
    if not isinstance(
        strategy, (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
    ):
        raise UserError(
            "keras_recorder needs a model built under a MirroredStrategy or "
            "MultiWorkerMirroredStrategy scope (`with strategy.scope(): model = ...`). "
            f"Received: a model under {type(strategy).__name__}"
        )
    return strategy


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if isinstance(v, (int, float, bool, str, type(None)))}


def optimizer_config(opt: Any) -> dict[str, Any]:
    """``opt.get_config()``, also where its learning rate is a schedule without a get_config
    (Keras serialises the schedule through it; fit trains without one): the options are read with
    the schedule set aside, and the recorder reads the lr each step used from its value."""
    try:
        return dict(opt.get_config())
    except NotImplementedError:
        if not isinstance(opt._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            raise
    schedule = opt._learning_rate
    opt._learning_rate = None  # get_config's branch for an lr it cannot serialise
    try:
        config = dict(opt.get_config())
    finally:
        opt._learning_rate = schedule
    config["learning_rate"] = None  # not a value: the caller names the schedule
    return config


def strategy_name(strategy: Any) -> str:
    """The strategy's public name (MultiWorkerMirroredStrategy's class is
    CollectiveAllReduceStrategy)."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "MultiWorkerMirroredStrategy"
    return type(strategy).__name__


def fit_config(model: Any, ranks: int) -> tuple[dict[str, Any], Any]:
    """The configuration read as the recorded fit starts (the model's, with fit's class and
    sample weights; fit's input; its lr callbacks) and its EarlyStopping callback (or None)."""
    found = fit_arguments(model)
    given = found.get("x"), found.get("shuffle"), found.get("callbacks")
    config = config_of(model, fit_weights(found)) | {"data": data_facts(given, ranks)}
    config["lr_callbacks"] = lr_callbacks(given[2])
    return config, early_stopping(given[2])


def config_of(model: Any, fit_weights: dict[str, Any]) -> dict[str, Any]:
    """The configuration read from the model as fit starts: BatchNorm layers, the strategy, the
    terms of its loss (with ``fit_weights``, fit's class and sample weights), the dtype policy
    (``precision``: the policy's name, compute and variable dtypes), the LossScaleOptimizer's
    settings and the optimizer's own."""
    opt, policy = model.optimizer, model.dtype_policy
    cfg: dict[str, Any] = {
        "batchnorm": [
            {
                "name": layer.name,
                "momentum": layer.momentum,
                "eps": layer.epsilon,
                "convention": "keras",
                "synchronized": bool(getattr(layer, "synchronized", False)),  # over replicas
            }
            for layer in model._flatten_layers()
            if isinstance(layer, keras.layers.BatchNormalization)
        ],
        "strategy": strategy_name(model.distribute_strategy),
        "random_layers": [  # layers drawing random numbers in training (Dropout, noise, ...)
            f"{layer.name} ({type(layer).__name__})"
            for layer in model._flatten_layers(include_self=False)
            if getattr(layer, "_seed_generators", None) and getattr(layer, "rate", 1) != 0
        ],
        "loss_terms": loss_terms(model) | fit_weights,
        "precision": {
            "policy": str(policy.name),
            "compute_dtype": str(policy.compute_dtype),
            "variable_dtype": str(policy.variable_dtype),
        },
    }
    variables = model_variables(model)
    canonical = canonical_names(model, variables)
    cfg["frozen"] = {  # a layer's parameters fit does not train (not its statistics: BatchNorm's
        name: int(np.prod(v.shape))  # moving ones, a Normalization's mean; torch's buffers)
        for name, v in zip(canonical, variables, strict=True)
        if not v.trainable and v.path.rpartition("/")[2] in PARAMETER_LEAVES
    }
    # each trainable variable's own name (exclude_from_weight_decay's var_names match it)
    own = zip(canonical, variables, strict=True)
    cfg["variable_names"] = {n: v.name for n, v in own if v.trainable}
    if isinstance(opt, keras.optimizers.LossScaleOptimizer):
        c = opt.get_config()
        cfg["loss_scale"] = {
            "type": "LossScaleOptimizer",
            "initial_scale": float(c.get("initial_scale", 2.0**15)),
            "growth_interval": int(c.get("dynamic_growth_steps", 2000)),
            "growth_factor": 2.0,
            "backoff_factor": 0.5,
        }
        opt = opt.inner_optimizer
    oc = _plain(optimizer_config(opt))
    if not isinstance(oc.get("learning_rate"), (int, float)):
        oc["learning_rate"] = type(opt._learning_rate).__name__  # a schedule: its lr per step
    cfg["optimizer"] = {"type": type(opt).__name__, **oc}
    if oc.get("weight_decay"):  # exclude_from_weight_decay's variables (not in get_config)
        decays = getattr(opt, "_use_weight_decay", None)  # Keras's own test, per variable
        names = dict(zip(map(id, variables), canonical, strict=True))
        if callable(decays):
            cfg["optimizer"]["no_decay"] = [
                names[id(v)] for v in variables if v.trainable and not decays(v)
            ]
    return cfg


def loss_terms(model: Any) -> dict[str, Any]:
    """What the compiled loss adds to the arithmetic: each layer's kernel, bias and activity
    regularizer (Keras adds them to the loss it reports and differentiates), the loss's own
    options (label smoothing, from_logits) and compile's ``loss_weights`` (each output's loss
    times its weight, summed). The layers that call add_loss are noted as fit traces them."""
    regs = []
    for layer in model._flatten_layers(include_self=False):
        for kind in ("kernel", "bias", "activity"):
            r: Any = getattr(layer, f"{kind}_regularizer", None)
            if r is not None and hasattr(r, "get_config"):
                values = {k: float(v) for k, v in r.get_config().items() if isinstance(v, float)}
                regs.append({"layer": layer.name, "kind": kind, "type": type(r).__name__} | values)
    loss: Any = getattr(model, "loss", None)
    options = loss.get_config() if hasattr(loss, "get_config") else {}
    kept = {k: v for k, v in options.items() if k in ("label_smoothing", "from_logits")}
    compiled = getattr(getattr(model, "_compile_config", None), "config", None) or {}
    weights = compiled.get("loss_weights")
    if isinstance(weights, dict):
        weights = {str(k): float(v) for k, v in weights.items()}
    elif weights is not None:
        weights = [float(v) for v in np.ravel(weights)]
    return {
        "regularizers": regs,
        "loss": {"type": type(loss).__name__, **kept},
        "loss_weights": weights,
    }


def final_weights(model: Any, weight_map: Any, stopper: Any, config: dict[str, Any]) -> Any:
    """The weights fit ends with: an EarlyStopping(restore_best_weights=True) that stopped sets
    its best ones in its own on_train_end, which runs after the recorder's where it is listed
    after it; its settings and stop go into ``config`` (compare names a stop in one run)."""
    if stopper is not None:
        config["early_stopping"] = stopping_facts(stopper)
    best = getattr(stopper, "best_weights", None)
    if best is None or not getattr(stopper, "restore_best_weights", False):
        return canonical_weights(model, weight_map)
    now = model.get_weights()
    model.set_weights(best)
    try:
        return canonical_weights(model, weight_map)
    finally:
        model.set_weights(now)


def data_facts(given: tuple[Any, Any, Any], workers: int) -> dict[str, Any]:
    """What fit was given to read, as far as it says how the workers split it: a tf.data
    dataset's auto-shard policy (MultiWorkerMirroredStrategy's split over workers), or the
    distributed dataset the script made itself; fit's ``shuffle`` where fit itself shuffles
    (arrays and PyDatasets; a dataset's order is its own)."""
    x, shuffle, _ = given
    out: dict[str, Any] = {"kind": type(x).__name__, "workers": workers}
    dataset = getattr(x, "_original_dataset", x)  # experimental_distribute_dataset's input
    if isinstance(dataset, tf.data.Dataset):
        policy = dataset.options().experimental_distribute.auto_shard_policy
        out["auto_shard_policy"] = getattr(policy, "name", str(policy))
    if type(x).__name__ == "DistributedDatasetsFromFunction":
        out["kind"] = "distribute_datasets_from_function"
    elif x is not dataset:
        out["kind"] = "experimental_distribute_dataset"
    elif isinstance(x, tf.data.Dataset):
        out["kind"] = "tf.data.Dataset"
    elif x is not None:
        out["fit_shuffle"] = shuffle  # True (fit's default), False or "batch"
    return out


def rank_of(resolver: Any) -> int:
    """This process's place among the workers, as MultiWorkerMirroredStrategy numbers them
    (tensorflow's multi_worker_util.id_in_cluster): the chief task is 0, worker i is i + the
    number of chiefs (a TF_CONFIG with a chief task has two task_id 0)."""
    kind, task = getattr(resolver, "task_type", None), int(getattr(resolver, "task_id", 0) or 0)
    if kind == "worker":
        return task + len(resolver.cluster_spec().as_dict().get("chief", []))
    return 0 if kind in (None, "chief") else task


def meet(rank: int, ranks: int) -> None:
    """The recorders of every worker meet as fit begins (dualtrain.audit.meeting), through the
    coordination service MultiWorkerMirroredStrategy starts; without one (one worker) there is
    nothing to meet through."""
    ctx = context.context()
    if ranks <= 1 or getattr(ctx, "coordination_service", None) is None:
        return

    def present(key: str) -> bool:
        try:
            ctx.get_config_key_value(key, timeout_in_ms=50)
            return True
        except tf.errors.OpError:  # not there yet (DeadlineExceeded)
            return False

    meeting.meet(
        rank,
        ranks,
        lambda key: ctx.set_config_key_value(key, "1"),
        present,
        noun="worker",
        when="it meets the others' as fit begins",
    )
