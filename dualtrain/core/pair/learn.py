"""A weight map learned from values (issue 47 item 1: the converter is the map).

A converter (KerasHub's ``from_preset`` on a ``save_pretrained`` folder, nobuco, a team's own)
turns the torch model's arrays into the Keras model's variables: transposed, reshaped, split,
sliced, concatenated. Instead of describing that in a map file, dualtrain gives every torch element
a distinct value, runs the converter, and reads each Keras element's source off its value.

* :func:`probe_arrays`: the values. Element ``i`` of all torch arrays (in the order given, each
  flattened in C order) has the id ``i``; its value is one base-2^23 digit of the id, plus 1, so
  every value is an integer a float32 holds exactly (a converter that keeps float32 keeps them)
  and 0 is never one. One pass holds 2^23 elements; a larger model takes two (or more) passes, one
  digit each.
* :func:`learn`: runs the converter on each pass and decodes every Keras element's id. A variable
  whose ids are an affine function of its index over one torch array (any transpose, reshape whose
  strides line up, slice, or split) is kept as a strided view (:class:`View`: the array, an offset
  and a stride per axis); any other (a concatenation of arrays, a flatten that interleaves axes)
  keeps its ids. What the values cannot explain is named: a Keras element whose value is not an id
  (the converter rescales, rounds or computes), a torch array no Keras variable draws from (or only
  part of it), an element drawn twice (tied weights, said as such).
* :func:`apply`: the real arrays through the learned map; :func:`learn` checks it on the probe
  values bit for bit before it returns.

Framework-free: the converter is any callable from torch arrays (NumPy, canonical names) to Keras
variables (NumPy, Keras names); each backend's side wraps its framework around it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from dualtrain.core.pair.record import MapEntry, ViewOf
from dualtrain.core.pair.transforms import VIEW
from dualtrain.errors import UserError

#: One base-2^23 digit per pass: a float32 holds every integer up to 2^24 exactly
DIGIT_BITS = 23
BASE = 1 << DIGIT_BITS
#: Elements a probe array is filled with at a time
CHUNK = 1 << 20

Arrays = Mapping[str, np.ndarray]
Converter = Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class View:
    """A Keras variable as a strided view of one torch array (flattened in C order)."""

    torch: str
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    """Elements, per axis of ``shape``: the Keras variable's axes, or finer ones where a Keras
    axis merges torch axes that are not contiguous (a flatten after a transpose)."""
    keras: tuple[int, ...] = ()
    """The Keras variable's shape, where ``shape`` is finer."""

    def indices(self, dtype: type = np.int64) -> np.ndarray:
        """Each element's index into the torch array (flattened), in the Keras shape."""
        idx: np.ndarray = np.full(self.shape, self.offset, dtype=dtype)
        for axis, (n, s) in enumerate(zip(self.shape, self.strides, strict=True)):
            shape = [1] * len(self.shape)
            shape[axis] = n
            idx += (np.arange(n, dtype=dtype) * s).reshape(shape)
        return idx.reshape(self.keras) if self.keras else idx

    def take(self, flat: np.ndarray) -> np.ndarray:
        return flat[self.indices()]


@dataclass(frozen=True)
class Source:
    """Where one Keras variable's elements come from."""

    keras: str
    torch: tuple[str, ...]
    """The torch arrays it draws from, in the order of their first element used."""
    view: View | None = None
    ids: np.ndarray | None = field(default=None, repr=False)
    """Else: each element's global id (over the torch arrays concatenated in order)."""


@dataclass(frozen=True)
class LearnedMap:
    order: tuple[str, ...]
    """The torch arrays, in the order their ids run."""
    sizes: tuple[int, ...]
    sources: tuple[Source, ...]
    shared: tuple[str, ...] = ()
    """Torch arrays some element of which two Keras variables (or places) draw: tied weights."""

    def describe(self) -> list[str]:
        """One line per Keras variable: its source in words (the map written out)."""
        out = []
        for s in self.sources:
            if s.view is not None:
                v = s.view
                out.append(
                    f"{s.keras} {list(v.shape)} <- {v.torch}[offset {v.offset}, strides "
                    f"{list(v.strides)}]"
                )
            else:
                out.append(f"{s.keras} <- gathered from {', '.join(s.torch)}")
        return out


def _bases(sizes: tuple[int, ...]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])


def passes_for(total: int) -> int:
    """Digits a total of ``total`` ids needs (each pass's values stay below 2^23 + 1)."""
    return max(1, math.ceil(math.log(max(total, 2), BASE))) if total >= BASE else 1


def probe_arrays(shapes: Mapping[str, tuple[int, ...]], digit: int) -> dict[str, np.ndarray]:
    """Pass ``digit``'s values: each element's id's digit ``digit`` (base 2^23), plus 1, as
    float32."""
    out, base = {}, 0
    for name, shape in shapes.items():
        n = int(np.prod(shape, dtype=np.int64))
        values = np.empty(n, dtype=np.float32)
        for start in range(0, n, CHUNK):  # a chunk at a time: no int64 copy of a whole array
            ids = np.arange(base + start, base + min(n, start + CHUNK), dtype=np.int64)
            values[start : start + len(ids)] = (ids >> (DIGIT_BITS * digit)) % BASE + 1
        out[name] = values.reshape(shape)
        base += n
    return out


def learn(
    shapes: Mapping[str, tuple[int, ...]], convert: Converter, real: Arrays | None = None
) -> LearnedMap:
    """The map ``convert`` applies, from its output on distinct values (see the module's
    docstring); with ``real`` (the torch model's own arrays), checked to give exactly what the
    converter gives them. UserError naming what it cannot explain."""
    order = tuple(shapes)
    sizes = tuple(int(np.prod(shapes[n], dtype=np.int64)) for n in order)
    total = int(sum(sizes))
    ids: dict[str, np.ndarray] = {}
    for digit in range(passes_for(total)):
        out = dict(_converted(convert, probe_arrays(shapes, digit), ids if digit else None))
        for name in list(out):  # each decoded, then let go (the probe's outputs are big)
            d = _digits(name, out.pop(name), total)
            if digit:
                d <<= DIGIT_BITS * digit
                ids[name] += d
            else:
                ids[name] = d
    bases = _bases(sizes)
    used = np.zeros(total, dtype=np.uint8)  # 0, 1, or 2 for "two or more"
    sources = []
    for name, idv in ids.items():
        if idv.size and int(idv.max()) >= total:
            i = np.unravel_index(int(np.argmax(idv >= total)), idv.shape)
            raise UserError(
                f"model.convert: Keras variable {name!r} holds a value no torch element was given "
                f"at element {tuple(map(int, i))}: the converter computes it, not copies it"
            )
        source = _source(name, idv, order, bases)
        _count(used, idv.reshape(-1), source.view, int(bases[order.index(source.torch[0])]))
        sources.append(source)
    _all_used(used, order, shapes, bases)
    learned = LearnedMap(order, sizes, tuple(sources), _shared(used, order, bases))
    del used
    ids.clear()  # a view holds its strides, not its ids: let them go before the check
    if real is not None:
        verify(learned, real, convert)
    return learned


def _count(used: np.ndarray, flat: np.ndarray, view: View | None, base: int) -> None:
    """Count each id's uses (saturating at 2), repeats within one variable too. A view whose
    strides cannot overlap (each axis's step past the span of the smaller ones) has none; any
    other variable's ids are sorted to find them."""
    if view is not None and _injective(view):
        used[flat] = np.minimum(used[flat] + 1, 2)
        return
    ordered = np.sort(flat)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    uniq = np.unique(ordered)
    used[uniq] = np.minimum(used[uniq] + 1, 2)
    used[repeated] = 2


def _injective(view: View) -> bool:
    span = 0
    for n, st in sorted(
        ((n, abs(st)) for n, st in zip(view.shape, view.strides, strict=True) if n > 1),
        key=lambda x: x[1],
    ):
        if st <= span:
            return False
        span += st * (n - 1)
    return True


def verify(m: LearnedMap, real: Arrays, convert: Converter) -> None:
    """The converter on the real arrays gives exactly what the learned map gives them (a converter
    whose output depends on the values, not only on where they are, fails here)."""
    theirs = dict(_converted(convert, {k: np.asarray(v) for k, v in real.items()}, None))
    for s in m.sources:  # one variable at a time: no second copy of the Keras model
        value = theirs.pop(s.keras)
        got = apply(m, real, only=s).astype(value.dtype, copy=False)
        if got.shape != value.shape or not np.array_equal(got, value):
            name = s.keras
            raise UserError(
                f"model.convert: on the real weights it gives Keras variable {name!r} other values "
                f"than the map learned from distinct ones: it does not only move values"
            )


def _converted(
    convert: Converter, probe: dict[str, np.ndarray], before: Mapping[str, np.ndarray] | None
) -> Mapping[str, np.ndarray]:
    try:
        out = convert(probe)
    except UserError:
        raise
    except Exception as exc:  # the user's converter: its failure in one line
        raise UserError(f"model.convert: it raised {type(exc).__name__}: {exc}") from None
    if not isinstance(out, Mapping) or not out:
        raise UserError(
            f"model.convert: it must give the Keras model's variables by name. Received: "
            f"{type(out).__name__}"
        )
    if before is not None and set(out) != set(before):
        raise UserError(
            "model.convert: it gave other variables on the second pass (not deterministic)"
        )
    return {k: np.asarray(v) for k, v in out.items()}


def _digits(name: str, value: np.ndarray, total: int) -> np.ndarray:
    """A converted variable's values back to id digits (int32 where every id fits); UserError
    where one is not a digit."""
    v = value if value.dtype.kind == "f" else value.astype(np.float64)
    iv: np.ndarray = v.astype(np.int64 if total >= 1 << 31 else np.int32)
    bad = iv != v
    bad |= iv < 1
    bad |= iv > BASE
    if bad.any():
        i = np.unravel_index(int(np.argmax(bad)), v.shape)
        raise UserError(
            f"model.convert: Keras variable {name!r} holds {float(v[i])!r} at element "
            f"{tuple(map(int, i))}, which no torch element was given: the converter changes "
            f"values (rescales, rounds or computes them) where it should copy them"
        )
    iv -= 1
    return iv


def _source(name: str, idv: np.ndarray, order: tuple[str, ...], bases: np.ndarray) -> Source:
    if not idv.size:
        return Source(name, (), ids=idv)
    lo, hi = int(idv.min()), int(idv.max())
    k0 = int(np.searchsorted(bases, lo, side="right")) - 1
    if hi < bases[k0 + 1]:  # one torch array: the common case, without an owner per element
        arrays: tuple[str, ...] = (order[k0],)
    else:
        owner = np.searchsorted(bases, idv.reshape(-1), side="right") - 1
        first = np.sort(np.unique(owner, return_index=True)[1])
        arrays = tuple(order[int(k)] for k in owner[first])
    if len(arrays) == 1:
        k = order.index(arrays[0])
        local = idv - bases[k]
        view = _affine(arrays[0], local)
        if view is not None:
            return Source(name, arrays, view=view)
    return Source(name, arrays, ids=idv)


def _affine(torch: str, local: np.ndarray) -> View | None:
    """``local`` as offset + sum(stride_k * index_k) over its own axes, or else over finer axes
    (:func:`_finer`), where it is."""
    offset = int(local.flat[0])
    strides = []
    for axis, n in enumerate(local.shape):
        at = [0] * local.ndim
        if n > 1:
            at[axis] = 1
        strides.append(int(local[tuple(at)]) - offset if n > 1 else 0)
    view = View(torch, offset, tuple(local.shape), tuple(strides))
    if np.array_equal(view.indices(local.dtype.type), local):
        return view
    finer = _finer(local.reshape(-1))
    if finer is None:
        return None
    view = View(torch, offset, finer[0], finer[1], tuple(local.shape))
    return view if np.array_equal(view.indices(local.dtype.type), local) else None


def _finer(flat: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(shape, strides) of axes over which ``flat`` (read in C order) is affine, found from the
    innermost out: each axis is the longest run of equal steps between blocks of the axes inside
    it (a divisor of what is left); None where a block does not repeat at all."""
    n, block, dims = flat.size, 1, []
    while block < n:
        rows = flat.reshape(-1, block)[:, 0].astype(np.int64)
        step = int(rows[1] - rows[0])
        ok = rows - rows[0] == step * np.arange(len(rows), dtype=np.int64)
        k = len(rows) if ok.all() else int(np.argmin(ok))
        while k > 1 and len(rows) % k:
            k -= 1
        if k <= 1:
            return None
        dims.append((k, step))
        block *= k
    return tuple(d for d, _ in reversed(dims)), tuple(st for _, st in reversed(dims))


def _shared(used: np.ndarray, order: tuple[str, ...], bases: np.ndarray) -> tuple[str, ...]:
    return tuple(n for k, n in enumerate(order) if (used[bases[k] : bases[k + 1]] > 1).any())


def _all_used(
    used: np.ndarray,
    order: tuple[str, ...],
    shapes: Mapping[str, tuple[int, ...]],
    bases: np.ndarray,
) -> None:
    """Every torch element reaches some Keras variable; UserError naming the first array that
    does not."""
    for k, name in enumerate(order):
        part = used[bases[k] : bases[k + 1]]
        if not part.all():
            unused = int((part == 0).sum())
            whole = "every element" if unused == part.size else f"{unused} of {part.size} elements"
            raise UserError(
                f"model.convert: torch array {name!r} {list(shapes[name])} reaches no Keras "
                f"variable ({whole} unused): the converter dropped it"
            )


def apply(m: LearnedMap, torch_arrays: Arrays, only: Source) -> np.ndarray:
    """One Keras variable (``only``) of ``torch_arrays`` through the learned map (dtype kept)."""
    if only.view is not None:
        return only.view.take(np.ascontiguousarray(torch_arrays[only.view.torch]).reshape(-1))
    assert only.ids is not None  # a source is a view or ids
    bases = _bases(m.sizes)
    out = np.empty(only.ids.shape, dtype=np.asarray(torch_arrays[m.order[0]]).dtype)
    for k, name in enumerate(m.order):
        if name in only.torch:
            at = (only.ids >= bases[k]) & (only.ids < bases[k + 1])
            out[at] = np.asarray(torch_arrays[name]).reshape(-1)[only.ids[at] - bases[k]]
    return out


def apply_all(m: LearnedMap, torch_arrays: Arrays) -> dict[str, np.ndarray]:
    """Every Keras variable of ``torch_arrays`` through the learned map (dtypes kept)."""
    return {s.keras: apply(m, torch_arrays, s) for s in m.sources}


def entries(m: LearnedMap, shapes: Mapping[str, tuple[int, ...]]) -> tuple[MapEntry, ...]:
    """The learned map as a run's map entries, in the torch arrays' order: an array the converter
    only copies is ``identity``; any other is ``view`` onto the variables it is split across
    (ordered by where each starts in the array). What dualtrain cannot train as a pair is one
    line: a torch array copied into two places (the converter unties tied weights: they would
    train apart) and a Keras variable gathered from several torch arrays."""
    if m.shared:
        raise UserError(
            f"model.convert: torch array {m.shared[0]!r} is copied into two places of the Keras "
            f"model (tied weights made two variables): trained, the copies would part. Received: "
            f"{len(m.shared)} such array(s)"
        )
    parts: dict[str, list[View]] = {}
    targets: dict[View, str] = {}
    for s in m.sources:
        if s.view is None:
            raise UserError(
                f"model.convert: Keras variable {s.keras!r} is gathered from {', '.join(s.torch)} "
                f"(a concatenation, or an order no strided view has): dualtrain trains a pair "
                f"whose variables each are a view of one torch array"
            )
        parts.setdefault(s.view.torch, []).append(s.view)
        targets[s.view] = s.keras
    out = []
    for name in m.order:
        views = sorted(parts.get(name, ()), key=lambda v: v.offset)
        shape = tuple(shapes[name])
        if len(views) == 1 and _whole(views[0], shape):
            out.append(MapEntry(name, targets[views[0]], "identity"))
            continue
        made = tuple(ViewOf(v.offset, v.shape, v.strides, v.keras or v.shape, shape) for v in views)
        keras = tuple(targets[v] for v in views)
        out.append(MapEntry(name, keras[0] if len(keras) == 1 else keras, VIEW, views=made))
    return tuple(out)


def _whole(v: View, shape: tuple[int, ...]) -> bool:
    """The view is the array as it is (same shape, C order)."""
    contiguous = tuple(int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape)))
    same = (v.keras or v.shape) == shape
    return v.offset == 0 and same and v.shape == shape and v.strides == contiguous
