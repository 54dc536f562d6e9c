"""The torch side of a model pair (dualtrain.core.pair): the user's module, built from
``model.torch`` with ``model.args`` under the run's seed, and its description (state dict, leaf
modules in call order, output shape) for the driver's weight map."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from dualtrain.backends.torch.layers import PairDropout
from dualtrain.core import pair
from dualtrain.core.pair import dropout as pair_dropout
from dualtrain.core.pair.attention import zero_gradients
from dualtrain.errors import UserError
from dualtrain.spec import Experiment, ModelSpec

_KINDS: tuple[tuple[type[nn.Module], str], ...] = (
    (nn.MultiheadAttention, "attention"),
    (nn.Linear, "dense"),
    (nn.Conv2d, "conv2d"),
    (nn.modules.batchnorm._BatchNorm, "batchnorm"),
)
#: Layers whose semantics a pair cannot carry yet, and why: SyncBatchNorm's global statistics
#: (dualtrain's own batchnorm layer has them: model.layers with sync: true). Dropout is carried
#: (dualtrain.core.pair.dropout), save the kinds that module refuses.
_REFUSED: tuple[tuple[type[nn.Module], str, str], ...] = (
    (
        nn.SyncBatchNorm,
        "SyncBatchNorm",
        "a Keras port has no layer with its global statistics",
    ),
)


def kind(m: nn.Module) -> str:
    return next((k for cls, k in _KINDS if isinstance(m, cls)), "other")


def dropout_kind(m: nn.Module) -> tuple[str | None, str | None]:
    """dualtrain.core.pair.dropout.classify for a torch module: (kind, why refused)."""
    if not isinstance(m, nn.modules.dropout._DropoutNd):
        return None, None
    names = [c.__name__ for c in type(m).__mro__ if c.__module__.startswith("torch.nn")]
    return pair_dropout.classify("torch", names)


def _rate(m: nn.Module) -> float:
    assert isinstance(m, nn.modules.dropout._DropoutNd)  # dropout_kind said so
    return float(m.p)


def build_module(model: ModelSpec, seed: int) -> nn.Module:
    """The user's module (:func:`user_module`), its dropout modules dualtrain's
    (:func:`install_dropouts`)."""
    return install_dropouts(user_module(model, seed))


def install_dropouts(module: nn.Module) -> nn.Module:
    """``module`` with each dropout module in it replaced by a :class:`PairDropout` of its rate
    (dualtrain.core.pair.dropout: the pair's masks inside a training forward, the identity
    elsewhere); a module used in two places stays one."""
    names = {id(m): n for n, m in module.named_modules()}  # a shared module's first name
    made: dict[int, PairDropout] = {}
    for parent in list(module.modules()):
        for cname, child in list(parent.named_children()):
            kind, _ = dropout_kind(child)
            if kind is None:
                continue
            if id(child) not in made:
                made[id(child)] = PairDropout(
                    names[id(child)], _rate(child), kind, type(child).__name__
                )
            setattr(parent, cname, made[id(child)])
    return module


def user_module(model: ModelSpec, seed: int) -> nn.Module:
    """The user's ``nn.Module``, its parameters drawn by its own initialisers under
    ``torch.manual_seed(seed)`` (the pair's initial weights: the driver records them once, and
    every run loads the recorded arrays)."""
    assert model.torch is not None
    # nn.MultiheadAttention's (and TransformerEncoderLayer's) inference fast path is a fused
    # kernel around the modules: the same arithmetic as training's path, in another order, and
    # no module of the block runs (the locator sees none of them). A pair runs the modules.
    torch.backends.mha.set_fastpath_enabled(False)
    factory = pair.import_factory(model.torch, model.path, "model.torch")
    torch.manual_seed(seed)
    module = pair.call_factory(factory, model.args, "model.torch")
    if not isinstance(module, nn.Module):
        raise UserError(
            f"model.torch: {model.torch} must return a torch.nn.Module. Received: "
            f"{type(module).__module__}.{type(module).__name__}"
        )
    for name, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, nn.SyncBatchNorm):
            if m.momentum is None or not m.track_running_stats or not m.affine:
                raise UserError(
                    f"model.torch: {name} is a {type(m).__name__} with momentum=None, "
                    f"track_running_stats=False or affine=False: a model pair takes batchnorm "
                    f"with a momentum, running statistics and a weight and bias (what a Keras "
                    f"BatchNormalization holds). Received: momentum={m.momentum}, "
                    f"track_running_stats={m.track_running_stats}, affine={m.affine}"
                )
        check_dropout(name, m)
        for cls, what, why in _REFUSED:
            if isinstance(m, cls):
                raise UserError(
                    f"model.torch: {name or 'the model'} is a {type(m).__name__}: {what} layers "
                    f"are not supported in model pairs yet ({why}; docs/own-models.md); use "
                    f"dualtrain's "
                    f"own layers (model.layers) for a model with {what}. Received: "
                    f"{type(m).__name__} at {name!r}"
                )
    return module


def check_dropout(name: str, m: nn.Module) -> None:
    """One line for a random layer the pair cannot give its masks."""
    _, why = dropout_kind(m)
    if why is not None:
        raise UserError(
            f"model.torch: {name or 'the model'} is a {type(m).__name__}, which a model pair does "
            f"not carry ({why}; docs/own-models.md). Received: {type(m).__name__} at {name!r}"
        )
    if isinstance(m, nn.MultiheadAttention) and m.dropout > 0:
        raise UserError(
            f"model.torch: {name or 'the model'} is a MultiheadAttention with dropout="
            f"{m.dropout}: its attention dropout is torch's functional dropout inside the "
            f"attention, which dualtrain cannot give the pair's masks; use dropout=0.0 there "
            f"(and in the Keras MultiHeadAttention) and nn.Dropout modules elsewhere "
            f"(docs/own-models.md). Received: dropout={m.dropout} at {name!r}"
        )


def batchnorms(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def load_pair(module: nn.Module, weights: dict[str, np.ndarray]) -> None:
    """The canonical arrays into the module (its parameter dtype); BatchNorm's
    num_batches_tracked, which is no weight, stays as it is (0): every other entry must match."""
    dtype = next(module.parameters()).dtype
    state = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dtype) for k, v in weights.items()}
    missing, unexpected = module.load_state_dict(state, strict=False)
    missing = [k for k in missing if k.rsplit(".", 1)[-1] not in pair.SKIPPED_BUFFERS]
    if missing or unexpected:  # a programming error: the run's layout is this module's
        raise RuntimeError(f"weights do not fit the module: missing {missing}, extra {unexpected}")


def _epsilon(m: nn.Module) -> float | None:
    """A normalisation module's epsilon (``eps``; Hugging Face's RMSNorm: ``variance_epsilon``)."""
    for name in ("eps", "variance_epsilon"):
        value = getattr(m, name, None)
        if isinstance(value, float):
            return value
    return None


def unused_parameters(module: nn.Module, spec: Experiment) -> list[str]:
    """The trainable parameters an inference forward on a zero batch gives no gradient (their
    gradient stays None; the module's own modes are kept)."""
    dtype = next(module.parameters()).dtype
    device = next(module.parameters()).device
    xs = [torch.zeros((2, *i.shape), dtype=dtype, device=device) for i in spec.model.inputs]
    training = module.training
    module.eval()
    try:
        with torch.enable_grad():
            module(*xs).sum().backward()
        return [n for n, p in module.named_parameters() if p.requires_grad and p.grad is None]
    finally:
        module.zero_grad(set_to_none=True)
        module.train(training)


def canonical_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {
        k: v
        for k, v in module.state_dict().items()
        if k.rsplit(".", 1)[-1] not in pair.SKIPPED_BUFFERS
    }


def describe(
    spec: Experiment, module: nn.Module | None = None
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(the side's description as JSON, the initial weights in the canonical layout). ``module``:
    the user's module already built (:func:`user_module`; a converted pair's, which the converter
    takes next); its hooks are removed again and its weights left as they are."""
    model = spec.model
    if module is None:
        module = user_module(model, spec.seed)  # its own dropout modules: their calls recorded
    owner = owners(module)
    order: dict[str, int] = {}
    layers: list[dict[str, Any]] = []
    drops: list[dict[str, Any]] = []

    def hook(name: str) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        def record(m: nn.Module, inputs: tuple[Any, ...], out: Any) -> None:
            order.setdefault(name, len(order))
            bn = isinstance(m, nn.modules.batchnorm._BatchNorm)
            drop, _ = dropout_kind(m)
            if drop is not None and isinstance(inputs[0], torch.Tensor):
                shape = inputs[0].shape[1:]
                drops.append(
                    pair_dropout.call_record(name, type(m).__name__, drop, _rate(m), shape)
                )
            layers.append(
                {
                    "name": name,
                    "cls": type(m).__name__,
                    "kind": kind(m),
                    **({"momentum": m.momentum} if bn else {}),
                    # every normalisation's epsilon (batch, layer, group, instance norm; an
                    # RMSNorm's variance_epsilon, as Hugging Face's Llama names it)
                    **({"eps": eps} if isinstance(eps := _epsilon(m), float) else {}),
                    "in": [list(x.shape[1:]) for x in inputs if isinstance(x, torch.Tensor)],
                    "out": list(out.shape[1:]) if isinstance(out, torch.Tensor) else None,
                }
            )

        return record

    leaves = [(n, m) for n, m in module.named_modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook(n)) for n, m in leaves]
    xs = [torch.zeros((2, *i.shape)) for i in model.inputs]
    module.eval()
    try:
        with torch.no_grad(), FirstUse(module) as used:
            out = module(*xs)
    except Exception as exc:  # the user's forward on the spec's input shapes
        shapes = ", ".join(f"{i.name} (N, {', '.join(map(str, i.shape))})" for i in model.inputs)
        raise UserError(
            f"model.torch: {type(module).__name__} fails on the data's inputs {shapes}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}. Received: "
            f"model.inputs {[list(i.shape) for i in model.inputs]}"
        ) from None
    finally:
        for h in handles:
            h.remove()
    if not isinstance(out, torch.Tensor):
        raise UserError(
            f"model.torch: {type(module).__name__} must return one tensor (N, outputs). "
            f"Received: {type(out).__name__}"
        )
    output = pair.check_output(tuple(out.shape[1:]), "torch", type(module).__name__)
    state = canonical_state(module)
    arrays = state_arrays(state, owner, {**order, **used.order})
    side = {
        "factory": model.torch,
        "cls": f"{type(module).__module__}.{type(module).__name__}",
        "output": list(output),
        "torch": arrays,
        "layers": layers,
        "digest": pair.source_digest(type(module)),
        **({"dropouts": drops} if drops else {}),
    }
    weights = {k: v.detach().to(torch.float32).numpy().copy() for k, v in state.items()}
    return side, weights


class FirstUse(TorchFunctionMode):
    """The order in which a forward first uses each module's parameters and buffers, as an order
    of the modules (``order``: module name -> position). Leaf modules' forward hooks give the same
    order for the modules they see; this sees the rest: a parameter of the model itself (a
    position embedding), nn.MultiheadAttention's in_proj and out_proj, which its functional forward
    uses without calling a module."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.owner: dict[int, str] = {}
        for mname, m in module.named_modules():
            for t in list(m.parameters(recurse=False)) + list(m.buffers(recurse=False)):
                self.owner.setdefault(id(t), mname)
        self.order: dict[str, int] = {}

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        for a in (*args, *kwargs.values()):
            for t in a if isinstance(a, (list, tuple)) else (a,):
                name = self.owner.get(id(t)) if isinstance(t, torch.Tensor) else None
                if name is not None:
                    self.order.setdefault(name, len(self.order))
        return func(*args, **kwargs)


def owners(module: nn.Module) -> dict[str, tuple[str, nn.Module, bool]]:
    """Each state dict entry's (module name, module, trainable)."""
    params = {id(p) for p in module.parameters()}
    owner = {}
    for mname, m in module.named_modules():
        for pname, t in list(m.named_parameters(recurse=False)) + list(
            m.named_buffers(recurse=False)
        ):
            owner[f"{mname}.{pname}" if mname else pname] = (mname, m, id(t) in params)
    return owner


def state_arrays(
    state: dict[str, torch.Tensor],
    owner: dict[str, tuple[str, nn.Module, bool]],
    order: dict[str, int],
) -> list[dict[str, Any]]:
    """The description's ``torch`` entries: each array of the state dict, its module's, in the
    order the modules first ran (``order``)."""
    arrays: list[dict[str, Any]] = []
    mods = {mname: m for mname, m, _ in owner.values()}
    for name, t in state.items():
        mname, m, trainable = owner[name]
        # an attention's arrays and its out_proj's: its number of heads (the map's layouts)
        mha = m if isinstance(m, nn.MultiheadAttention) else mods.get(mname.rpartition(".")[0])
        heads = mha.num_heads if isinstance(mha, nn.MultiheadAttention) else None
        arrays.append(
            {
                "name": name,
                "shape": list(t.shape),
                "trainable": trainable,
                "module": mname,
                "kind": kind(m),
                "cls": type(m).__name__,
                **({"heads": heads} if heads is not None else {}),
            }
        )
    # weighted modules in the order they first ran (the automatic map pairs them in that order)
    first = {a["module"]: order.get(a["module"], len(order) + i) for i, a in enumerate(arrays)}
    arrays.sort(key=lambda a: first[a["module"]])
    return arrays


def zero_exact_zeros(module: nn.Module, layout: pair.Layout) -> None:
    """Hooks that set the parts of a pair's gradients whose exact value is zero to zero
    (dualtrain.core.pair.attention.zero_gradients: the key's bias of nn.MultiheadAttention), before
    DDP sums them; the TF side does the same (backends/tf/forward.py)."""
    params = dict(module.named_parameters())
    for name, (start, stop) in zero_gradients(layout.torch.torch).items():

        def hook(g: torch.Tensor, a: int = start, b: int = stop) -> torch.Tensor:
            return torch.cat([g[:a], g.new_zeros(b - a), g[b:]])

        params[name].register_hook(hook)
