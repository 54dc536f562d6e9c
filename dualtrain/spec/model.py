"""The model section: layers (a closed vocabulary with per-type fields) and the shipped presets."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from dualtrain.errors import UserError
from dualtrain.spec.fields import COSMETIC, SPEC_DATACLASS, check_field, tagged_field
from dualtrain.spec.layers import KINDS, RANGES, REQUIRED
from dualtrain.spec.vocab import Approximate, LayerType, Loss, Padding, TokenPool


@dataclass(**SPEC_DATACLASS)
class LayerSpec:
    """One layer of ``model.layers``: its type and the fields that type takes (each type's
    fields, defaults and shape rule are declared once in dualtrain.spec.layers.KINDS; a field the
    type does not take is refused)."""

    type: LayerType
    """One of dense, conv2d, maxpool2d, avgpool2d, global_avgpool, flatten, relu, tanh, sigmoid,
    silu, gelu, dropout, batchnorm, layernorm, patches, position, attention, token_pool, embedding,
    residual."""
    units: int | None = None
    """dense: output features (on tokens (T, D): per token, D -> units)."""
    filters: int | None = None
    """conv2d: output channels."""
    kernel_size: int | None = None
    """conv2d: square kernel size."""
    pool_size: int | None = None
    """maxpool2d, avgpool2d: square window (stride defaults to the window)."""
    stride: int | None = None
    """conv2d (default 1), maxpool2d and avgpool2d (default pool_size)."""
    rate: float | None = None
    """dropout: the drop probability p in [0, 1) (inverted scaling by 1/(1-p), off in evaluation;
    the mask is a hash of seed, step, sample id, layer and element: dualtrain/core/dropout.py)."""
    padding: Padding | int = Padding.VALID
    """conv2d: valid, same ('same' only with stride 1, where torch and Keras agree), or an integer
    P: P zeros on every side (torch's ``padding=P``), with any stride."""
    bias: bool = True
    """dense, conv2d, patches, attention: add a bias (torch's ``bias=False`` / Keras's
    ``use_bias=False`` when false, as before a batchnorm, whose mean subtraction cancels it)."""
    momentum: float | None = None
    """batchnorm: torch's momentum (default 0.1): running = (1 - momentum) * running + momentum *
    batch statistic (the unbiased variance for running_var)."""
    eps: float | None = None
    """batchnorm, layernorm: added to the biased variance before the square root (default 1e-5,
    torch's; Keras's LayerNormalization defaults to 1e-3)."""
    approximate: Approximate | None = None
    """gelu: none (the exact erf form, the default) or tanh (torch's approximate="tanh")."""
    sync: bool | None = None
    """batchnorm: true: statistics over the whole global batch, every replica weighted by its sample
    count (torch SyncBatchNorm); false (default): each replica's own batch, and the running
    statistics are replica 0's (DDP's buffer broadcast), on both backends. docs/parity.md §9."""
    size: int | None = None
    """patches: the patch side (a stride = kernel = size convolution; it must divide H and W)."""
    dim: int | None = None
    """patches, embedding: the token width D."""
    heads: int | None = None
    """attention: the number of heads (it divides the token width; head_dim = width / heads, the
    scores scaled by 1/sqrt(head_dim), torch's)."""
    causal: bool | None = None
    """attention: true: token t attends to tokens <= t only (default false)."""
    pool: TokenPool | None = None
    """token_pool: mean (the mean over the tokens, the default) or first (the first token)."""
    vocab: int | None = None
    """embedding: how many ids (the input's values are whole numbers in [0, vocab))."""
    body: tuple[LayerSpec, ...] = ()
    """residual: the layers of the residual branch; the block outputs body(x) + shortcut(x)."""
    shortcut: tuple[LayerSpec, ...] = ()
    """residual: layers on the skip path (e.g. a 1x1 conv2d with stride 2 and a batchnorm); empty:
    the identity."""

    def __post_init__(self) -> None:
        """Refuse the fields this type does not take, require and default the ones it does
        (KINDS), check each value's range (RANGES), then the type's own check."""
        t = self.type
        kind = KINDS[t]
        for f in fields(self):
            name, v = f.name, getattr(self, f.name)
            if name == "type":
                continue
            unset = v == f.default
            if name not in kind.fields:
                if not unset:
                    raise UserError(
                        f"layer type {t.value!r} takes no '{name}'. Received: {name}={v!r}"
                    )
                continue
            default = kind.fields[name]
            if unset and default is REQUIRED:
                raise UserError(f"layer type {t.value!r} needs '{name}'. Received: {name}=None")
            if unset and default is not None:
                object.__setattr__(self, name, default)
            holds = RANGES.get(name)
            if holds is not None and getattr(self, name) is not None:
                check_field(holds[0](getattr(self, name)), f"layer {t.value}.{name}", holds[1], v)
        if kind.check is not None:
            kind.check(self)


@dataclass(**SPEC_DATACLASS)
class InputSpec:
    """One model input: its name (the arrays ``{name}_train`` / ``{name}_test`` in the data), the
    shape of one sample, and, in a model with several inputs, the branch of layers that input goes
    through before the ``concat`` that merges the branches."""

    name: str = "x"
    shape: tuple[int, ...] = (1, 28, 28)
    """One sample's shape: (C, H, W) for images (channels first, the canonical layout), (F,) for a
    table's features."""
    layers: tuple[LayerSpec, ...] = ()
    """This input's branch (several inputs only); its output must be flat."""

    def __post_init__(self) -> None:
        check_field(
            self.name.isidentifier() and self.name not in ("body", "shortcut"),
            "model.inputs[].name",
            "must be a Python identifier (not body/shortcut)",
            self.name,
        )
        check_field(
            len(self.shape) in (1, 3) and all(d >= 1 for d in self.shape),
            f"model.inputs[{self.name}].shape",
            "must be [C, H, W] (an image) or [F] (features), every size >= 1",
            list(self.shape),
        )


@dataclass(**SPEC_DATACLASS)
class ModelSpec:
    inputs: tuple[InputSpec, ...] = (InputSpec(),)
    """The model's inputs, in order: ``[{name: x, shape: [1, 28, 28]}]`` (MNIST's) unless given.
    Two or more: each has a branch (``layers``) and the model's ``layers`` start with ``concat``
    (docs/data.md)."""
    loss: Loss = Loss.CROSS_ENTROPY
    """cross_entropy (integer class labels, one logit per class), binary_cross_entropy (targets in
    [0, 1], one logit per target column), mse or huber (float targets, one output per target
    column; huber: delta 1, torch's huber_loss and smooth_l1_loss, Keras's Huber); the
    per-sample loss is the mean over output columns, and the step differentiates its sum over the
    global batch divided by the global batch size, on both backends."""
    preset: str | None = None
    """``mlp`` (784-256-128-10, the default) or ``cnn`` (two conv blocks + dense). Mutually
    exclusive with layers; set ``preset: null`` to use layers."""
    layers: tuple[LayerSpec, ...] = ()
    """Explicit layer list, e.g. ``[{type: flatten}, {type: dense, units: 10}]``."""
    init_from: str | None = tagged_field(COSMETIC, default=None)
    """Canonical-layout .npz with the initial weights; None: generate them from the seed."""
    torch: str | None = None
    """A model pair's PyTorch side: ``"package.module:factory"``, a callable returning an
    ``nn.Module`` that takes the inputs NCHW (images) or (N, F) (tables) and returns (N, outputs);
    called with ``model.args`` as keyword arguments (docs/own-models.md). With ``keras``, instead
    of preset/layers."""
    keras: str | None = None
    """A model pair's Keras side: ``"package.module:factory"`` returning a Keras 3 model that takes
    the inputs NHWC (images) or (N, F) and returns (N, outputs)."""
    convert: str | None = None
    """Instead of ``keras``: ``"package.module:function"``, a converter that takes the torch module
    (built by ``model.torch``) and returns its Keras port (KerasHub's ``from_preset`` on a
    ``save_pretrained`` folder, or a team's own converter). dualtrain learns the weight map from
    what the converter does with distinct values (docs/own-models.md)."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for both factories (e.g. ``{width: 16, blocks: 2}``)."""
    path: str | None = tagged_field(COSMETIC, default=None)
    """A folder searched first for the factories' modules (default: the working directory)."""
    weight_map: str | None = None
    """A model pair's explicit weight map (YAML/JSON: ``[{torch: NAME, keras: PATH, transform:
    T}]``); null: matched automatically (layer order, shapes, layout transforms)."""

    PAIR_FIELDS = ("torch", "keras", "convert", "args", "path", "weight_map")

    @property
    def is_pair(self) -> bool:
        return self.torch is not None or self.keras is not None or self.convert is not None

    @property
    def keras_side(self) -> str:
        """What builds the Keras side, as the spec names it (``model.keras`` or
        ``model.convert``)."""
        return f"model.convert={self.convert!r}" if self.convert else f"model.keras={self.keras!r}"

    def __post_init__(self) -> None:
        if self.is_pair:
            self._check_pair()
            return
        for name in ("args", "weight_map"):
            if getattr(self, name):
                raise UserError(
                    f"model.{name} is for a model pair (model.torch and model.keras). Received: "
                    f"{name}={getattr(self, name)!r}"
                )
        if self.preset is not None:
            check_field(
                self.preset in PRESETS,
                "model.preset",
                f"must be one of {sorted(PRESETS)}",
                self.preset,
            )
            if self.layers:
                raise UserError("model: give either 'preset' or 'layers', not both. Received: both")
        elif not self.layers:
            raise UserError(
                "model: give a 'preset' (mlp, cnn) or a 'layers' list. Received: neither"
            )

        names = [i.name for i in self.inputs]
        check_field(bool(names), "model.inputs", "must list at least one input", [])
        check_field(
            len(set(names)) == len(names), "model.inputs", "must have distinct names", names
        )
        layers = self.resolved_layers()
        concat = [j for j, layer in enumerate(layers) if layer.type is LayerType.CONCAT]
        if len(self.inputs) == 1:
            check_field(
                not self.inputs[0].layers,
                f"model.inputs[{names[0]}].layers",
                "is only for models with several inputs (put the layers in model.layers)",
                len(self.inputs[0].layers),
            )
            check_field(not concat, "model.layers", "has a concat layer but one input", names)
        else:
            for i in self.inputs:
                check_field(
                    bool(i.layers),
                    f"model.inputs[{i.name}].layers",
                    "must list this input's branch (a model with several inputs)",
                    [],
                )
            check_field(
                concat == [0],
                "model.layers",
                "must start with one concat layer (it merges the inputs' branches) and have no "
                "other",
                [layer.type.value for layer in layers],
            )
        for i in self.inputs:
            for j, layer in enumerate(i.layers):
                check_field(
                    layer.type is not LayerType.CONCAT,
                    f"model.inputs[{i.name}].layers[{j}]",
                    "cannot be a concat layer",
                    layer.type.value,
                )

    def _check_pair(self) -> None:
        if self.keras is not None and self.convert is not None:
            raise UserError(
                "model: give either model.keras (a factory of the Keras port) or model.convert (a "
                "converter of the torch module), not both. Received: both"
            )
        if self.torch is None or (self.keras is None and self.convert is None):
            given = "torch" if self.torch is not None else ("keras" if self.keras else "convert")
            raise UserError(
                f"a model pair needs model.torch and model.keras (the PyTorch module and its "
                f"Keras port), or model.torch and model.convert (a converter of it). Received: "
                f"only model.{given}"
            )
        if self.convert is not None and self.weight_map is not None:
            raise UserError(
                "model.weight_map is for a model.keras factory: with model.convert, dualtrain "
                f"learns the map from the converter. Received: weight_map={self.weight_map!r}"
            )
        if self.preset is not None or self.layers:
            raise UserError(
                "model: give either a model pair (torch, keras) or dualtrain layers "
                "(preset/layers), not both. Received: both"
            )
        for side in ("torch", "keras", "convert"):
            text = getattr(self, side)
            if text is None:
                continue
            mod, _, attr = text.partition(":")
            ok = bool(mod) and bool(attr) and all(p.isidentifier() for p in mod.split("."))
            check_field(
                ok and all(p.isidentifier() for p in attr.split(".")),
                f"model.{side}",
                "must be 'package.module:factory'",
                text,
            )
        names = [i.name for i in self.inputs]
        check_field(
            len(set(names)) == len(names), "model.inputs", "must have distinct names", names
        )
        for i in self.inputs:
            check_field(
                not i.layers,
                f"model.inputs[{i.name}].layers",
                "is for dualtrain layers; a model pair's branches are in its own code",
                len(i.layers),
            )

    def resolved_layers(self) -> tuple[LayerSpec, ...]:
        return PRESETS[self.preset] if self.preset is not None else self.layers


def _layers(*items: dict[str, Any]) -> tuple[LayerSpec, ...]:
    def layer(d: dict[str, Any]) -> LayerSpec:
        kwargs: dict[str, Any] = {k: (LayerType(v) if k == "type" else v) for k, v in d.items()}
        return LayerSpec(**kwargs)

    return tuple(layer(d) for d in items)


PRESETS: dict[str, tuple[LayerSpec, ...]] = {
    "mlp": _layers(
        {"type": "flatten"},
        {"type": "dense", "units": 256},
        {"type": "relu"},
        {"type": "dense", "units": 128},
        {"type": "relu"},
        {"type": "dense", "units": 10},
    ),
    "cnn": _layers(
        {"type": "conv2d", "filters": 32, "kernel_size": 3},
        {"type": "relu"},
        {"type": "maxpool2d", "pool_size": 2},
        {"type": "conv2d", "filters": 64, "kernel_size": 3},
        {"type": "relu"},
        {"type": "maxpool2d", "pool_size": 2},
        {"type": "flatten"},
        {"type": "dense", "units": 128},
        {"type": "relu"},
        {"type": "dense", "units": 10},
    ),
}
