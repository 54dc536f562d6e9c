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
    """The layer's type; each type takes only its own fields. global_avgpool: C,H,W -> C, the mean
    over H and W. silu: ``x·sigmoid(x)``, torch's ``nn.SiLU``, Keras's silu or swish. gelu: the
    exact erf form on both backends, written as torch's ``x·0.5·(1 + erf(x·√½))``. layernorm:
    torch's ``nn.LayerNorm`` over the last axis of features (F,) or tokens (T, D). It starts with
    weight 1 and bias 0; on TF it is Keras's LayerNormalization with torch's eps. patches,
    position, attention, token_pool and embedding are the token layers, below. concat: only as
    ``model.layers[0]`` of a model with several inputs. It puts the branches' outputs side by
    side, in ``model.inputs`` order."""
    units: int | None = None
    """dense: output features. On tokens (T, D) it acts per token, D -> units, as torch's
    ``nn.Linear``."""
    filters: int | None = None
    """conv2d: output channels."""
    kernel_size: int | None = None
    """conv2d: square kernel size."""
    pool_size: int | None = None
    """maxpool2d, avgpool2d: the square window. The stride defaults to the window."""
    stride: int | None = None
    """conv2d: default 1. maxpool2d and avgpool2d: default ``pool_size``."""
    rate: float | None = None
    """dropout: the drop probability p in [0, 1). Kept values are scaled by 1/(1-p); dropout is
    off in evaluation. An element's mask is a hash of the seed, the global step, the sample id,
    the layer index and the element's index in C,H,W order. It is integer arithmetic on both
    backends: dualtrain/core/dropout.py. So it is bit-identical on torch and TF, whatever the
    world size, the strategy and the replica that holds the sample."""
    padding: Padding | int = Padding.VALID
    """conv2d: valid; same, only with stride 1, where torch and Keras agree; or an integer P. P
    puts P zeros on every side, with any stride: torch's ``padding=P``, and on Keras
    ``ZeroPadding2D(P)`` then a valid convolution."""
    bias: bool = True
    """dense, conv2d, patches, attention: add a bias. false is torch's ``bias=False`` and Keras's
    ``use_bias=False``. Use it before a batchnorm, whose mean subtraction cancels the bias. There
    the bias's exact gradient is zero. Under Adam or RMSprop its updates would be rounding noise
    divided by eps. docs/parity.md §9."""
    momentum: float | None = None
    """batchnorm: torch's momentum. running = (1 - momentum)·running + momentum·batch statistic,
    with the unbiased variance for ``running_var``. Keras's ``momentum`` is 1 minus this."""
    eps: float | None = None
    """batchnorm, layernorm: added to the biased variance before the square root. The default is
    torch's; Keras's is 1e-3."""
    approximate: Approximate | None = None
    """gelu: none is the exact erf form, torch's ``nn.GELU()`` and Keras's gelu. tanh is
    ``nn.GELU(approximate="tanh")`` and ``keras.activations.gelu(approximate=True)``:
    ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``, exported to Keras as Keras's own layers."""
    sync: bool | None = None
    """batchnorm: true takes statistics over the whole global batch, every replica weighted by its
    sample count. That is torch SyncBatchNorm's math; an empty replica adds nothing. false takes
    each replica's own batch. The running statistics are then replica 0's, given to every replica
    after each step, as DDP's buffer broadcast does. On both backends; docs/parity.md §9. A step
    that gives fewer than 2 values per channel is refused before launch. That is per replica with
    false, and over the global batch with true."""
    size: int | None = None
    """patches: the patch side. The layer is a convolution with kernel = stride = size, which must
    divide H and W. Its output is read row by row as T = (H/size)·(W/size) tokens of width
    ``dim``: torch's ``conv(x).flatten(2).transpose(1, 2)``."""
    dim: int | None = None
    """patches, embedding: the token width D."""
    heads: int | None = None
    """attention: multi-head self-attention on tokens (T, D), with this many heads; they divide D.
    The parameters are torch's ``nn.MultiheadAttention(D, heads, batch_first=True)``, under its
    names and with its init. ``in_proj_weight`` is (3D, D): q, k, v rows in that order, head h the
    rows h·D/heads.. of each. Then come ``in_proj_bias``, ``out_proj.weight`` and
    ``out_proj.bias``. The scores are scaled by 1/sqrt(D/heads). The key's bias is left out of the
    arithmetic on both backends. The softmax cancels it: its exact gradient is zero, where torch
    computes rounding noise. Exported as torch's ``nn.MultiheadAttention`` and Keras's
    ``MultiHeadAttention``. There key_dim = D/heads, the packed weights split per projection."""
    causal: bool | None = None
    """attention: token t attends to tokens <= t only. That is torch's ``attn_mask`` True above the
    diagonal, and Keras's ``use_causal_mask``."""
    pool: TokenPool | None = None
    """token_pool: (T, D) -> (D,): the ``mean`` over the tokens, or the ``first`` token."""
    vocab: int | None = None
    """embedding: the first layer, on an input of shape [T]. Its ids are whole numbers in
    [0, vocab); each becomes a token of width ``dim``. It is torch's ``nn.Embedding``, N(0, 1) at
    the start, and Keras's ``Embedding``."""
    body: tuple[LayerSpec, ...] = ()
    """residual: the layers of the residual branch. The block outputs ``body(x) + shortcut(x)``;
    the two must have the same shape. Blocks do not nest and hold no flatten."""
    shortcut: tuple[LayerSpec, ...] = ()
    """residual: the layers of the skip path, e.g.
    ``[{type: conv2d, filters: 32, kernel_size: 1, stride: 2}, {type: batchnorm}]``. Empty: the
    identity. Parameters inside block ``i`` are named ``i.body.j.weight`` and
    ``i.shortcut.j.weight``, torch's module paths."""

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
    """A Python identifier, not body or shortcut, distinct from the other inputs' names. The
    data's arrays are ``{name}_train`` and ``{name}_test``."""
    shape: tuple[int, ...] = (1, 28, 28)
    """One sample's shape: ``[C, H, W]`` for images, channels first, or ``[F]`` for a table's
    features. The arrays may be (N, H, W) when C is 1."""
    layers: tuple[LayerSpec, ...] = ()
    """Several inputs only: this input's branch. It ends flat, e.g. with a flatten, or a
    global_avgpool after a convolution. Its layer ``j`` is named ``{name}.{j}.weight``. With one
    input, leave it empty and use ``model.layers``."""

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
    """The model's inputs, in order: MNIST's unless given. Give the data's sample shape for any
    other dataset. Two or more: each has a branch, its ``layers``, and ``model.layers`` starts
    with ``concat``. docs/data.md#several-inputs."""
    loss: Loss = Loss.CROSS_ENTROPY
    """cross_entropy: integer class labels, one logit per class, metric accuracy.
    binary_cross_entropy: targets in [0, 1], one logit per target column, metric accuracy. mse or
    huber: float targets, one output per target column, metric mae. huber has delta 1: torch's
    huber_loss and smooth_l1_loss, Keras's Huber(). The per-sample loss is the mean over output
    columns. A step differentiates its sum over the replica's samples, divided by the samples in
    the global step, on both backends."""
    preset: str | None = None
    """mlp: flatten, then dense 256-128-10, so 784-256-128-10 on MNIST. cnn: two conv blocks, then
    dense layers; both in full: docs/spec.md#presets. Not with ``layers``: a spec that gives
    ``layers`` leaves it out or sets ``preset: null``."""
    layers: tuple[LayerSpec, ...] = ()
    """Explicit layer list, e.g. ``[{type: flatten}, {type: dense, units: 10}]``."""
    init_from: str | None = tagged_field(COSMETIC, default=None)
    """A canonical-layout .npz with the initial weights. null: generate them from the seed. A
    model pair then takes the torch module's own initialisation under
    ``torch.manual_seed(seed)``."""
    torch: str | None = None
    """A model pair's PyTorch side, ``"package.module:factory"``. The factory returns an
    ``nn.Module`` that takes the inputs NCHW for images or (N, F) for tables. It returns
    (N, outputs). It is called with ``model.args`` as keyword arguments. With ``keras`` or
    ``convert``, instead of ``preset`` and ``layers``. docs/own-models.md."""
    keras: str | None = None
    """A model pair's Keras side, ``"package.module:factory"``. It returns a Keras 3 model that
    takes the inputs NHWC or (N, F) and returns (N, outputs)."""
    convert: str | None = None
    """Instead of ``keras``: ``"package.module:function"``, a converter that takes the torch
    module and returns its Keras port. Examples: KerasHub's ``from_preset`` on a
    ``save_pretrained`` folder, or a team's own converter. dualtrain learns the weight map from
    what the converter does with distinct values.
    docs/own-models.md#ports-made-by-a-converter-modelconvert."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for both factories, e.g. ``{width: 8, classes: 10}``. One is set with
    ``--set model.args.width=16``."""
    path: str | None = tagged_field(COSMETIC, default=None)
    """The folder searched first for the factories' modules. A relative one is beside the spec
    file, else in the working directory. null: the working directory."""
    weight_map: str | None = None
    """A model pair's explicit weight map, a YAML or JSON file:
    ``[{torch: NAME, keras: PATH, transform: T, chw: [C, H, W]}]``. T is identity, transpose,
    oihw_hwio or flatten_chw. It names every array of both models once. null: matched
    automatically, by layer order, shapes and layout transforms. A relative path is beside
    ``model.path``, then beside the spec file, else in the working directory. Not with
    ``convert``."""

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
