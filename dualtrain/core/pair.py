"""A model pair: a PyTorch module and its Keras port, written by the user (``model.torch`` and
``model.keras``), and the weight map between them. Framework-free.

Each backend describes its own side in a child process (``python -m dualtrain.backends.<b>.pair``,
which imports the user's factory): the torch side lists its state dict (names, shapes, which
module, the module's kind) and the Keras side its variables (paths, shapes, which layer, the
layer's kind and, for a dense layer fed by a flatten, the H, W, C it flattens). :func:`match`
then pairs them, here, once: the map is the run's record (``model_pair.json``) and both backends
read it. The canonical layout of a pair is the torch module's state dict (as for dualtrain's own
layers, docs/weights.md), less ``num_batches_tracked``; the TF backend converts every array with
the map's transform when it loads or exports weights (:func:`to_keras`, :func:`to_canonical`).

Transforms (canonical torch layout -> Keras layout):

* ``identity``: biases, batchnorm's four arrays, anything of the same shape;
* ``transpose``: a dense weight (out, in) -> kernel (in, out);
* ``oihw_hwio``: a conv2d weight (O, I, H, W) -> kernel (H, W, I, O);
* ``flatten_chw``: a dense weight after a flatten of a (C, H, W) tensor: torch flattens C,H,W and
  Keras (NHWC) H,W,C, so the kernel's rows are the weight's columns permuted (the map records C,
  H, W, taken from the Keras layer's input).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dualtrain.errors import UserError

PAIR_FILE = "model_pair.json"
#: The torch state dict entries that are no weight (BatchNorm's counter: the run's step count
#: is the optimizer's, and Keras has no such variable)
SKIPPED_BUFFERS = ("num_batches_tracked",)
TRANSFORMS = ("identity", "transpose", "oihw_hwio", "flatten_chw")


@dataclass(frozen=True)
class TorchArray:
    name: str
    shape: tuple[int, ...]
    trainable: bool
    module: str
    """The module path ("" for the top module), as in named_modules()."""
    kind: str
    """dense, conv2d, batchnorm or other (the module's class: Linear, Conv2d, BatchNorm*)."""
    cls: str = ""


@dataclass(frozen=True)
class KerasVar:
    path: str
    shape: tuple[int, ...]
    trainable: bool
    layer: str
    kind: str
    """dense, conv2d, batchnorm or other (the layer's class)."""
    role: str
    """The variable's own name in its layer: kernel, bias, gamma, beta, moving_mean, ..."""
    cls: str = ""
    flatten_hwc: tuple[int, int, int] | None = None
    """dense only: the (H, W, C) a Flatten layer right before it flattens."""


@dataclass(frozen=True)
class MapEntry:
    torch: str
    keras: str
    transform: str
    chw: tuple[int, int, int] | None = None
    """flatten_chw: the (C, H, W) torch flattens."""


@dataclass(frozen=True)
class Side:
    """One backend's description of its model (what its describe child printed)."""

    factory: str
    cls: str
    """The model's class (nn.Module subclass, keras.Model subclass)."""
    output: tuple[int, ...]
    """One sample's output shape."""
    torch: tuple[TorchArray, ...] = ()
    keras: tuple[KerasVar, ...] = ()
    layers: tuple[dict[str, Any], ...] = ()
    """Every leaf layer in call order, with its kind and settings (the locator's input)."""
    digest: str = ""
    """sha256 of the factory's source file."""


@dataclass(frozen=True)
class Layout:
    """A run's model pair: both sides and the map (``model_pair.json``)."""

    torch: Side
    keras: Side
    entries: tuple[MapEntry, ...]
    explicit: bool = False
    """The map came from model.weight_map (else: matched automatically)."""

    # -- the canonical layout ------------------------------------------------------------------
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {a.name: a.shape for a in self.torch.torch}

    def trainable(self) -> list[str]:
        return [a.name for a in self.torch.torch if a.trainable]

    @property
    def output_width(self) -> int:
        out = self.torch.output
        return int(np.prod(out)) if out else 1

    def by_torch(self) -> dict[str, MapEntry]:
        return {e.torch: e for e in self.entries}

    def digest(self) -> str:
        """sha256 of the pair as recorded (both sides' code digests, arrays and the map): a
        checkpoint continues only the model it was trained as."""
        import hashlib

        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()

    # -- records --------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "torch": asdict(self.torch),
            "keras": asdict(self.keras),
            "map": [asdict(e) for e in self.entries],
            "explicit": self.explicit,
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> Layout:
        return Layout(
            side_from_json(d["torch"]),
            side_from_json(d["keras"]),
            tuple(_entry(e) for e in d["map"]),
            bool(d.get("explicit", False)),
        )


def _entry(e: dict[str, Any]) -> MapEntry:
    chw = e.get("chw")
    return MapEntry(e["torch"], e["keras"], e["transform"], tuple(chw) if chw else None)


def side_from_json(d: dict[str, Any]) -> Side:
    return Side(
        factory=d["factory"],
        cls=d.get("cls", ""),
        output=tuple(d["output"]),
        torch=tuple(
            TorchArray(
                a["name"],
                tuple(a["shape"]),
                a["trainable"],
                a["module"],
                a["kind"],
                a.get("cls", ""),
            )
            for a in d.get("torch", ())
        ),
        keras=tuple(
            KerasVar(
                v["path"],
                tuple(v["shape"]),
                v["trainable"],
                v["layer"],
                v["kind"],
                v["role"],
                v.get("cls", ""),
                tuple(v["flatten_hwc"]) if v.get("flatten_hwc") else None,
            )
            for v in d.get("keras", ())
        ),
        layers=tuple(d.get("layers", ())),
        digest=d.get("digest", ""),
    )


def write(layout: Layout, run_dir: Path) -> None:
    (Path(run_dir) / PAIR_FILE).write_text(json.dumps(layout.to_json(), indent=1) + "\n")


def read(run_dir: Path | str) -> Layout | None:
    p = Path(run_dir) / PAIR_FILE
    return Layout.from_json(json.loads(p.read_text())) if p.is_file() else None


# ---- transforms ---------------------------------------------------------------------------------


def keras_shape(entry: MapEntry, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The Keras shape ``entry``'s transform makes of a torch array of ``shape`` (None: the
    transform does not apply to that shape)."""
    t = entry.transform
    if t == "identity":
        return shape
    if t == "transpose":
        return (shape[1], shape[0]) if len(shape) == 2 else None
    if t == "oihw_hwio":
        return (shape[2], shape[3], shape[1], shape[0]) if len(shape) == 4 else None
    if t == "flatten_chw":
        if len(shape) != 2 or entry.chw is None or int(np.prod(entry.chw)) != shape[1]:
            return None
        return (shape[1], shape[0])
    return None


def to_keras(entry: MapEntry, array: np.ndarray) -> np.ndarray:
    a = np.asarray(array)
    t = entry.transform
    if t == "transpose":
        a = a.T
    elif t == "oihw_hwio":
        a = a.transpose(2, 3, 1, 0)
    elif t == "flatten_chw":
        assert entry.chw is not None
        c, h, w = entry.chw
        a = a.reshape(a.shape[0], c, h, w).transpose(2, 3, 1, 0).reshape(h * w * c, a.shape[0])
    return np.ascontiguousarray(a)


def to_canonical(entry: MapEntry, array: np.ndarray) -> np.ndarray:
    a = np.asarray(array)
    t = entry.transform
    if t == "transpose":
        a = a.T
    elif t == "oihw_hwio":
        a = a.transpose(3, 2, 0, 1)
    elif t == "flatten_chw":
        assert entry.chw is not None
        c, h, w = entry.chw
        out = a.shape[1]
        a = a.reshape(h, w, c, out).transpose(3, 2, 0, 1).reshape(out, c * h * w)
    return np.ascontiguousarray(a)


# ---- matching -----------------------------------------------------------------------------------

_ROLE_ORDER = {
    "dense": ("weight", "bias"),
    "conv2d": ("weight", "bias"),
    "batchnorm": ("weight", "bias", "running_mean", "running_var"),
}
_KERAS_ROLES = {
    "dense": ("kernel", "bias"),
    "conv2d": ("kernel", "bias"),
    "batchnorm": ("gamma", "beta", "moving_mean", "moving_variance"),
}


def _groups(items: Iterable[Any], key: str) -> list[tuple[str, list[Any]]]:
    out: list[tuple[str, list[Any]]] = []
    for it in items:
        k = getattr(it, key)
        if out and out[-1][0] == k:
            out[-1][1].append(it)
        else:
            out.append((k, [it]))
    return out


def _transform(a: TorchArray, v: KerasVar) -> MapEntry:
    """The transform that takes torch array ``a`` to Keras variable ``v`` when their kinds and
    shapes justify one; UserError otherwise."""
    if a.kind == "dense" and a.name.endswith("weight") and len(a.shape) == 2:
        if v.flatten_hwc is not None and len(v.flatten_hwc) == 3:
            h, w, c = v.flatten_hwc
            if c > 1 and h * w > 1:
                e = MapEntry(a.name, v.path, "flatten_chw", (c, h, w))
                if keras_shape(e, a.shape) == v.shape:
                    return e
        e = MapEntry(a.name, v.path, "transpose")
    elif a.kind == "conv2d" and len(a.shape) == 4:
        e = MapEntry(a.name, v.path, "oihw_hwio")
    else:
        e = MapEntry(a.name, v.path, "identity")
    if keras_shape(e, a.shape) != v.shape:
        raise UserError(
            f"model pair: torch {a.name} {list(a.shape)} ({a.cls}) cannot map onto Keras "
            f"{v.path} {list(v.shape)} ({v.cls}) by any layout transform ({e.transform} gives "
            f"{list(keras_shape(e, a.shape) or ())}); the layers differ, or the automatic map "
            f"paired the wrong ones (give model.weight_map, docs/own-models.md). Received: "
            f"{a.name} -> {v.path}"
        )
    return e


def match(torch: Side, keras: Side) -> tuple[MapEntry, ...]:
    """The automatic map: torch modules with weights and Keras layers with variables, paired in
    order (the torch side in the order its modules first ran, the Keras side in the model's layer
    order); within a pair, arrays by role (weight/kernel, bias, ...). Unambiguous only when both
    sides have the same sequence of weighted layers of the same kinds with shapes a layout
    transform explains: anything else is one line naming the first pair that fails."""
    t_groups = _groups(torch.torch, "module")
    k_groups = _groups(keras.keras, "layer")
    entries: list[MapEntry] = []
    for i, ((mod, arrays), (lay, variables)) in enumerate(zip(t_groups, k_groups, strict=False)):
        kinds = (arrays[0].kind, variables[0].kind)
        if kinds[0] != kinds[1] or len(arrays) != len(variables):
            what = _describe_mismatch(arrays, variables)
            raise UserError(
                f"model pair: weighted layer {i + 1} differs: torch {mod!r} ({arrays[0].cls}: "
                f"{', '.join(a.name.rsplit('.', 1)[-1] for a in arrays)}) vs Keras {lay!r} "
                f"({variables[0].cls}: {', '.join(v.role for v in variables)}){what}; fix the "
                f"port or give model.weight_map (docs/own-models.md). Received: {len(t_groups)} "
                f"torch and {len(k_groups)} Keras weighted layers"
            )
        order = {r: j for j, r in enumerate(_KERAS_ROLES.get(kinds[1], ()))}
        variables = sorted(variables, key=lambda v: order.get(v.role, len(order)))
        t_order = {r: j for j, r in enumerate(_ROLE_ORDER.get(kinds[0], ()))}
        arrays = sorted(arrays, key=lambda a: t_order.get(a.name.rsplit(".", 1)[-1], len(t_order)))
        for a, v in zip(arrays, variables, strict=True):
            if a.trainable != v.trainable:
                raise UserError(
                    f"model pair: torch {a.name} is {'a parameter' if a.trainable else 'a buffer'}"
                    f" but Keras {v.path} is {'trainable' if v.trainable else 'not trainable'}. "
                    f"Received: {a.name} -> {v.path}"
                )
            entries.append(_transform(a, v))
    if len(t_groups) != len(k_groups):
        extra = t_groups[len(k_groups) :] or k_groups[len(t_groups) :]
        side = "torch" if len(t_groups) > len(k_groups) else "Keras"
        raise UserError(
            f"model pair: the torch model has {len(t_groups)} weighted layers and the Keras one "
            f"{len(k_groups)}: {side} {extra[0][0]!r} has no counterpart (a layer missing from "
            f"the port?). Received: torch {[g for g, _ in t_groups]}, Keras "
            f"{[g for g, _ in k_groups]}"
        )
    return tuple(entries)


def _describe_mismatch(arrays: list[TorchArray], variables: list[KerasVar]) -> str:
    """The classic reason two paired layers hold different arrays, when it is one."""
    t_bias = any(a.name.endswith(".bias") for a in arrays)
    k_bias = any(v.role == "bias" for v in variables)
    if arrays[0].kind == variables[0].kind and t_bias != k_bias:
        side = "torch" if t_bias else "Keras"
        return f" (a bias on the {side} side only: missing or extra bias)"
    return ""


def read_map_file(path: str) -> list[dict[str, Any]]:
    """``model.weight_map``'s file, read: it exists, parses as YAML/JSON and is a list of
    mappings. Checked before the frameworks load (dualtrain.driver.pair) as well as with them."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"model.weight_map: file not found. Received: {path!r}")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise UserError(
            f"model.weight_map: {p} is not YAML/JSON ({exc}). Received: {path!r}"
        ) from None
    if not isinstance(raw, list) or not all(isinstance(e, dict) for e in raw):
        raise UserError(
            f"model.weight_map: {p} must be a list of {{torch, keras, transform}} mappings. "
            f"Received: {type(raw).__name__}"
        )
    return raw


def load_map_file(path: str, torch: Side, keras: Side) -> tuple[MapEntry, ...]:
    """An explicit map (``model.weight_map``): YAML or JSON, a list of ``{torch: NAME, keras:
    PATH, transform: T}`` (``chw: [C, H, W]`` for flatten_chw), covering every array of both
    sides once."""
    raw = read_map_file(path)
    t_arrays = {a.name: a for a in torch.torch}
    k_vars = {v.path: v for v in keras.keras}
    entries: list[MapEntry] = []
    for i, e in enumerate(raw):
        where = f"model.weight_map[{i}]"
        unknown = sorted(set(e) - {"torch", "keras", "transform", "chw"})
        if unknown or "torch" not in e or "keras" not in e:
            raise UserError(
                f"{where} needs torch and keras (and a transform: {', '.join(TRANSFORMS)}). "
                f"Received: {e!r}"
            )
        t = e.get("transform", "identity")
        if t not in TRANSFORMS:
            raise UserError(f"{where}.transform must be one of {list(TRANSFORMS)}. Received: {t!r}")
        if e["torch"] not in t_arrays:
            raise UserError(
                f"{where}.torch: no such array in the torch model. Received: {e['torch']!r} "
                f"(the model's: {sorted(t_arrays)})"
            )
        if e["keras"] not in k_vars:
            raise UserError(
                f"{where}.keras: no such variable in the Keras model. Received: {e['keras']!r} "
                f"(the model's: {sorted(k_vars)})"
            )
        chw = e.get("chw")
        entry = MapEntry(e["torch"], e["keras"], t, tuple(chw) if chw else None)
        a, v = t_arrays[entry.torch], k_vars[entry.keras]
        if keras_shape(entry, a.shape) != v.shape:
            raise UserError(
                f"{where}: {t} makes {list(keras_shape(entry, a.shape) or ['nothing'])} of torch "
                f"{a.name} {list(a.shape)}, not Keras {v.path}'s {list(v.shape)}: a reshape "
                f"dualtrain cannot justify. Received: {e!r}"
            )
        if a.trainable != v.trainable:
            raise UserError(
                f"{where}: torch {a.name} and Keras {v.path} differ in trainability. Received: "
                f"{e!r}"
            )
        entries.append(entry)
    check_complete(entries, torch, keras)
    return tuple(entries)


def check_complete(entries: Iterable[MapEntry], torch: Side, keras: Side) -> None:
    """Every array of both sides mapped exactly once."""
    entries = list(entries)
    for side, names, used in (
        ("torch", [a.name for a in torch.torch], [e.torch for e in entries]),
        ("Keras", [v.path for v in keras.keras], [e.keras for e in entries]),
    ):
        twice = sorted({n for n in used if used.count(n) > 1})
        if twice:
            raise UserError(
                f"model.weight_map maps {side} {twice[0]} more than once (two arrays onto one). "
                f"Received: {len(used)} entries"
            )
        missing = [n for n in names if n not in used]
        if missing:
            raise UserError(
                f"model.weight_map leaves {side} {missing[0]} out (every array of both models "
                f"needs an entry). Received: {len(missing)} {side} array(s) unmapped"
            )


def layout(torch: Side, keras: Side, weight_map: str | None) -> Layout:
    if weight_map is not None:
        return Layout(torch, keras, load_map_file(weight_map, torch, keras), explicit=True)
    entries = match(torch, keras)
    check_complete(entries, torch, keras)
    return Layout(torch, keras, entries)


def check_identity(initial: dict[str, np.ndarray], read_back: dict[str, np.ndarray]) -> None:
    """The initial weights, carried into the Keras model by the map and read back, are the same
    bits (the transforms are permutations; an fp64 model widens float32 exactly): checked before
    step 1, so a map that lost or moved a value never trains."""
    for name, a in initial.items():
        b = read_back.get(name)
        if b is None or b.shape != a.shape or not np.array_equal(a.astype(b.dtype), b):
            raise UserError(
                f"model pair: {name} does not come back from the Keras model as it went in "
                f"(the weight map loses or moves values). Received: {name}"
            )


# ---- the factories ------------------------------------------------------------------------------


def import_factory(text: str, folder: str | None, field_name: str) -> Any:
    """The callable ``"package.module:factory"`` names (``model.torch`` or ``model.keras``),
    imported with ``folder`` (model.path; default: the working directory) first on sys.path. Each
    backend calls it in its own processes; a module or name that is not there is one line."""
    import importlib
    import sys

    root = str(Path(folder).expanduser().resolve()) if folder else str(Path.cwd())
    if folder and not Path(root).is_dir():
        raise UserError(f"model.path: no such folder. Received: {folder!r}")
    if root not in sys.path:
        sys.path.insert(0, root)
    mod_name, _, attr = text.partition(":")
    try:
        module = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        if exc.name and mod_name.startswith(exc.name):  # the factory's module itself is missing
            raise UserError(
                f"{field_name}: module {mod_name!r} not found (searched {root} and the installed "
                f"packages; set model.path to the folder that holds it). Received: {text!r}"
            ) from None
        raise  # the user's module imports something missing: its own traceback says what
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in dir(module) if not n.startswith("_"))
            raise UserError(
                f"{field_name}: {mod_name} ({getattr(module, '__file__', '?')}) has no {attr!r}. "
                f"Received: {text!r} (the module defines: {', '.join(names[:12])})"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"{field_name}: {text!r} is not callable. Received: {type(obj).__name__}")
    return obj


def source_digest(factory: Any) -> str:
    """sha256 of the file that defines ``factory`` (a model's code, recorded with the run)."""
    import hashlib
    import inspect

    try:
        path = inspect.getsourcefile(factory)
    except TypeError:
        return ""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else ""


def call_factory(factory: Any, args: dict[str, Any], field_name: str) -> Any:
    """``factory(**args)``; arguments it does not take are one line (the factory's own errors
    keep their traceback: they are the user's code)."""
    import inspect

    try:
        inspect.signature(factory).bind(**args)
    except TypeError as exc:
        raise UserError(
            f"{field_name}: the factory does not take model.args {sorted(args)} ({exc}). "
            f"Received: {args!r}"
        ) from None
    except ValueError:  # no signature to check (a builtin)
        pass
    return factory(**args)


def sample_shapes(inputs: Iterable[Any]) -> list[tuple[int, ...]]:
    return [tuple(i.shape) for i in inputs]


def check_output(shape: tuple[int, ...], side: str, cls: str) -> tuple[int, ...]:
    """One sample's output must be a flat vector (logits or values)."""
    if len(shape) != 1:
        raise UserError(
            f"model.{side}: {cls} must return (N, outputs) for a batch of N; it returned "
            f"{list(shape)} per sample. Received: output shape (N, {', '.join(map(str, shape))})"
        )
    return shape
