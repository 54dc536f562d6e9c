"""Dropout in a model pair: the torch module's dropout modules and the Keras model's dropout
layers, matched call by call in forward order, train with dualtrain's hash masks
(:mod:`dualtrain.core.dropout`) on both sides, so both drop the same units.

Which layers: :data:`TORCH` and :data:`KERAS` name the classes a pair carries and how each masks
(``element``: every feature on its own, ``nn.Dropout`` / ``Dropout``; ``channel``: whole channels,
``nn.Dropout1d/2d/3d`` / ``SpatialDropout1D/2D/3D``); :data:`TORCH_REFUSED` and
:data:`KERAS_REFUSED` the random layers it cannot (each backend looks a layer's classes up here,
:func:`classify`).

Their order: each side's describe child records its dropout calls in the order its forward makes
them (:func:`call_record`: name, class, kind, rate, the input's per-sample shape). :func:`match`
pairs the calls whose rate is above 0 in that order (a rate-0 dropout is the identity on both
sides and takes no part: ``nn.TransformerEncoderLayer(dropout=0.0)``'s, Keras's
``MultiHeadAttention``'s internal one) and refuses in one line two sides whose number of dropouts,
kinds, rates or shapes differ. The entries (:class:`DropoutEntry`) are the run's record
(``model_pair.json``).

The masks: call k (1-based) of a training forward takes ``keep(seed, step, sample ids, layer=k,
elements)``, the elements counted in the torch layout (an NHWC Keras activation takes the NCHW
mask transposed, a Flatten's output of one the mask permuted as that flatten permutes:
:attr:`DropoutEntry.keras_layout`). Each backend puts its own dropout layers in the user's model
(torch: a module in each dropout's place; Keras: each dropout layer's ``call``) and its engine
opens :func:`training_forward` around every training forward with the step and
the replica's sample ids; each dropout call asks :func:`mask_for` for its mask. Outside such a
forward (evaluation, export, the locator, describe) a dropout layer is the identity. The state is
per thread: TF's mirrored replicas trace their forwards in threads of their own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from dualtrain.errors import UserError

ELEMENT, CHANNEL = "element", "channel"
#: where the Keras activation's features are against torch's: the same order, torch's first
#: (channel) axis last (NCHW -> NHWC, a conv1d's (C, L) -> (L, C)), or a flattened NHWC tensor
#: (H, W, C order where torch flattens C, H, W: DropoutEntry.chw)
SAME, CHANNELS_LAST, FLATTEN_HWC = "same", "channels_last", "flatten_hwc"

TORCH = {"Dropout": ELEMENT, "Dropout1d": CHANNEL, "Dropout2d": CHANNEL, "Dropout3d": CHANNEL}
KERAS = {
    "Dropout": ELEMENT,
    "SpatialDropout1D": CHANNEL,
    "SpatialDropout2D": CHANNEL,
    "SpatialDropout3D": CHANNEL,
}
_ALPHA = "alpha dropout's affine correction for SELU has no hash-mask form in dualtrain yet"
_NOISE = "it draws its own random noise, which the other side cannot draw alike"
TORCH_REFUSED = {"AlphaDropout": _ALPHA, "FeatureAlphaDropout": _ALPHA}
KERAS_REFUSED = {"AlphaDropout": _ALPHA, "GaussianDropout": _NOISE, "GaussianNoise": _NOISE}
SIDES = {"torch": (TORCH, TORCH_REFUSED), "keras": (KERAS, KERAS_REFUSED)}


def classify(side: str, classes: Iterable[str]) -> tuple[str | None, str | None]:
    """(kind, None) for a dropout layer the pair carries, (None, why) for one it refuses, (None,
    None) for any other layer; ``classes``: the layer's class names, its own first (its MRO), so
    a subclass of ``nn.Dropout`` is a dropout."""
    kinds, refused = SIDES[side]
    for name in classes:
        if name in kinds:
            return kinds[name], None
        if name in refused:
            return None, refused[name]
    return None, None


def call_record(
    name: str,
    cls: str,
    kind: str,
    rate: float,
    shape: Sequence[int],
    channels_last: bool = False,
    flatten_hwc: Sequence[int] | None = None,
) -> dict[str, Any]:
    """One dropout call as a describe child records it (``Side.dropouts``): ``shape`` is the
    input's per-sample shape in that framework's layout; Keras's only: ``channels_last``, a
    channel dropout's data format; ``flatten_hwc``, the (H, W, C) of the NHWC tensor a Flatten
    made its input from (its features in H, W, C order where torch's are in C, H, W)."""
    record: dict[str, Any] = {
        "name": name,
        "cls": cls,
        "kind": kind,
        "rate": float(rate),
        "in": list(shape),
    }
    if channels_last:
        record["channels_last"] = True
    if flatten_hwc:
        record["flatten_hwc"] = list(flatten_hwc)
    return record


@dataclass(frozen=True)
class DropoutEntry:
    """One matched dropout call; the k-th entry (1-based) is hash layer k."""

    torch: str
    """The torch module's name (named_modules())."""
    keras: str
    """The Keras layer's path."""
    rate: float
    kind: str
    """element or channel."""
    shape: tuple[int, ...]
    """The input's per-sample shape in the torch layout."""
    keras_layout: str
    """same, channels_last or flatten_hwc: where the Keras input's features are against
    torch's."""
    chw: tuple[int, int, int] | None = None
    """flatten_hwc: the (C, H, W) torch flattened."""

    @property
    def elements(self) -> int:
        """How many masks a sample takes: one per feature (element), one per channel (channel)."""
        return int(np.prod(self.shape)) if self.kind == ELEMENT else int(self.shape[0])


def elements(entry: DropoutEntry) -> np.ndarray:
    """The canonical element indices of an entry's mask, 0 .. elements - 1."""
    return np.arange(entry.elements, dtype=np.int64)


def _label(side: str, call: dict[str, Any]) -> str:
    return f"{side} {call['name']!r} ({call['cls']}, rate {call['rate']:g})"


def _keras_layout(
    t: dict[str, Any], k: dict[str, Any], i: int
) -> tuple[str, tuple[int, int, int] | None]:
    """(the entry's keras_layout, its chw), or one line when the shapes do not correspond."""
    ts, ks = tuple(t["in"]), tuple(k["in"])
    last = ts[1:] + ts[:1]
    hwc = k.get("flatten_hwc")
    if hwc and t["kind"] == ELEMENT and ks == ts == (int(np.prod(hwc)),):
        h, w, c = hwc
        return FLATTEN_HWC, (c, h, w)
    if t["kind"] == CHANNEL:
        layout = CHANNELS_LAST if k.get("channels_last") else SAME
        fits = len(ts) >= 2 and ks == (last if layout == CHANNELS_LAST else ts)
    elif len(ts) >= 3 and ks == last:  # images: NCHW against NHWC (also when C == H == W)
        layout, fits = CHANNELS_LAST, True
    elif ks == ts:  # features (N, F), sequences (N, T, D): the same layout
        layout, fits = SAME, True
    else:  # a conv1d's (C, L) against Keras's (L, C)
        layout, fits = CHANNELS_LAST, len(ts) >= 2 and ks == last
    if not fits:
        raise UserError(
            f"model pair: dropout {i} differs: {_label('torch', t)} takes {list(ts)} per sample, "
            f"{_label('Keras', k)} {list(ks)}, which no layout explains (dropouts are matched in "
            f"forward order: one on the wrong tensor?). Received: torch {list(ts)}, Keras "
            f"{list(ks)}"
        )
    return layout, None


def match(
    torch: Sequence[dict[str, Any]], keras: Sequence[dict[str, Any]]
) -> tuple[DropoutEntry, ...]:
    """The pair's dropout entries: the two sides' dropout calls with a rate above 0, paired in
    forward order; the same count, kind and rate on both sides, shapes a layout explains, or one
    line naming the first that differs."""
    t_calls = [c for c in torch if c["rate"] > 0]
    k_calls = [c for c in keras if c["rate"] > 0]
    entries = []
    for i, (t, k) in enumerate(zip(t_calls, k_calls, strict=False), start=1):
        if t["rate"] >= 1.0:
            raise UserError(
                f"model pair: {_label('torch', t)} drops every unit: a pair's dropout takes a "
                f"rate below 1. Received: {t['rate']}"
            )
        if t["rate"] != k["rate"] or t["kind"] != k["kind"]:
            what = "rate" if t["kind"] == k["kind"] else "kind (elementwise vs channelwise)"
            raise UserError(
                f"model pair: dropout {i} differs in its {what}: {_label('torch', t)} vs "
                f"{_label('Keras', k)} (dropout layers are matched in forward order and mask "
                f"alike; fix the port). Received: torch {[c['rate'] for c in t_calls]}, Keras "
                f"{[c['rate'] for c in k_calls]}"
            )
        layout, chw = _keras_layout(t, k, i)
        entries.append(
            DropoutEntry(t["name"], k["name"], t["rate"], t["kind"], tuple(t["in"]), layout, chw)
        )
    if len(t_calls) != len(k_calls):
        side, extra = (
            ("torch", t_calls[len(k_calls)])
            if len(t_calls) > len(k_calls)
            else ("Keras", k_calls[len(t_calls)])
        )
        raise UserError(
            f"model pair: dropout layers differ: the torch forward calls {len(t_calls)} with a "
            f"rate above 0 and the Keras one {len(k_calls)}: {_label(side, extra)} has no "
            f"counterpart (a dropout missing from the port?). Received: torch "
            f"{[c['name'] for c in t_calls]}, Keras {[c['name'] for c in k_calls]}"
        )
    return tuple(entries)


def entry_from_json(d: dict[str, Any]) -> DropoutEntry:
    chw = d.get("chw")
    return DropoutEntry(
        d["torch"],
        d["keras"],
        float(d["rate"]),
        d["kind"],
        tuple(d["shape"]),
        d["keras_layout"],
        (int(chw[0]), int(chw[1]), int(chw[2])) if chw else None,
    )


# ---- at run time -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Mask:
    """What one dropout call masks with: ``dualtrain.core.dropout.keep(ops, seed, step, ids,
    layer, elements(entry), entry.rate)``; ``step`` and ``ids`` are the backend's tensors."""

    seed: int
    step: Any
    ids: Any
    layer: int
    entry: DropoutEntry


@dataclass
class _Forward:
    side: str
    entries: tuple[DropoutEntry, ...]
    seed: int
    step: Any
    ids: Any
    calls: int = 0


_LOCAL = threading.local()


@contextmanager
def training_forward(
    side: str, entries: Sequence[DropoutEntry], seed: int, step: Any, ids: Any
) -> Iterator[None]:
    """One training forward of a pair's model (``side``: torch or keras) on this thread: its
    dropout calls take the entries' masks in order, from ``step`` (a scalar int64 tensor) and
    ``ids`` (the replica's sample ids, an int64 vector). The forward must make every call the
    description recorded."""
    state = _Forward(side, tuple(entries), seed, step, ids)
    before = getattr(_LOCAL, "forward", None)
    _LOCAL.forward = state
    try:
        yield
    finally:
        _LOCAL.forward = before
    if state.calls != len(state.entries):
        raise UserError(
            f"model pair: the {side} model's training forward made {state.calls} dropout call(s) "
            f"with a rate above 0 where its description (an inference forward) made "
            f"{len(state.entries)}: a forward whose dropouts depend on training mode is not "
            f"carried. Received: {[getattr(e, side) for e in state.entries]}"
        )


def mask_for(side: str, name: str, rate: float) -> Mask | None:
    """The mask of this dropout call (the layer ``name``: torch's module name, Keras's layer path)
    in the current training forward; None outside one or at rate 0: the identity."""
    state: _Forward | None = getattr(_LOCAL, "forward", None)
    if state is None or rate == 0:
        return None
    k = state.calls
    state.calls += 1
    if k >= len(state.entries) or getattr(state.entries[k], side) != name:
        expected = getattr(state.entries[k], side) if k < len(state.entries) else "no call"
        raise UserError(
            f"model pair: the {side} model's training forward called dropout {name!r} as dropout "
            f"{k + 1}, where its description (an inference forward) had {expected!r}: a forward "
            f"whose dropouts depend on training mode is not carried. Received: {name!r}"
        )
    return Mask(state.seed, state.step, state.ids, k + 1, state.entries[k])
