"""The absolute gradient: the scale against which a gradient's rounding error is judged.

A weight gradient is a sum over the batch (and, for a convolution, over every position) of products
``input x output-gradient``. Rounding in any precision bounds its error componentwise by a small
multiple of the unit roundoff times the same sum of *absolute* products, ``sum |input| |grad|``
(the classical bound for a dot product, Higham, *Accuracy and Stability of Numerical Algorithms*,
§3.1), not times the gradient itself: where the terms cancel, the gradient is small against its
terms and its relative error large, in every correct implementation. The first convolution of
configs/mnist_resnet_bn.yaml is such a case: its input is mostly the constant normalised
background and its output gradient, behind a batchnorm, has zero mean per channel; oneDNN's fp32
weight gradient is 2.4e-4 off there while the absolute sum is ~1,000x the gradient.

:class:`AbsoluteGradient` computes that scale on the fp64 reference run at its probe steps (the
local checks, dualtrain.parity.local): per parameter of every dense and conv layer
(``sum |x| |g|`` for the weight, ``sum |g|`` for the bias) and of every batchnorm
(``sum |x_hat| |g|``, ``sum |g|``), from the same forward and backward, all-reduced over replicas
as the gradient is, with the number of terms ``n`` each element sums (batch x output positions:
the accumulation length, whose rounding grows as sqrt(n), Higham and Mary, "A New Approach to
Probabilistic Rounding Error Analysis", SIAM J. Sci. Comput. 41(5), 2019). Parameters of other
layers have neither (their gradient is its own scale).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle

from dualtrain.backends.torch.layers import BatchNorm
from dualtrain.backends.torch.tokens import Embedding, Patches, Position, SelfAttention

#: AbsoluteGradient's measure: (canonical name -> absolute gradient, canonical name -> terms each
#: element sums, kind of product -> the loss's sensitivity to it)
AbsoluteScale = tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]


class AbsoluteGradient:
    """Context manager around one forward and backward of ``module``; then :meth:`result`."""

    def __init__(self, module: nn.Module):
        self.layers = [
            (name, m)
            for name, m in module.named_modules()
            if isinstance(m, (nn.Linear, nn.Conv2d, BatchNorm, nn.LayerNorm, Position, Embedding))
        ]
        # an attention's packed q/k/v projection is a matmul inside its forward: its tap hands
        # over the projection's input and output
        self.attention = [
            (name, m) for name, m in module.named_modules() if isinstance(m, SelfAttention)
        ]
        # a model pair's nn.MultiheadAttention: its functional forward calls no module (its
        # out_proj included), so its projections are recomputed from its input (_mha)
        self.mha = [
            (name, m) for name, m in module.named_modules() if isinstance(m, nn.MultiheadAttention)
        ]
        self._handles: list[RemovableHandle] = []
        self._seen: dict[str, tuple[nn.Module, torch.Tensor, torch.Tensor]] = {}
        self._grad: dict[str, torch.Tensor] = {}
        self._mha_masks: dict[str, torch.Tensor | None] = {}

    def __enter__(self) -> AbsoluteGradient:
        self._handles = [m.register_forward_hook(self._hook(name)) for name, m in self.layers]
        self._handles += [
            m.register_forward_hook(self._mha_hook(name), with_kwargs=True) for name, m in self.mha
        ]
        for name, m in self.attention:
            m.tap = self._tap(f"{name}.in_proj", m)
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        for _, m in self.attention:
            m.tap = None

    def _hook(
        self, name: str
    ) -> Callable[[nn.Module, tuple[torch.Tensor, ...], torch.Tensor], None]:
        def hook(m: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            if not out.requires_grad:
                return
            self._seen[name] = (m, inputs[0].detach().clone(), out.detach().clone())
            out.register_hook(lambda g: self._grad.__setitem__(name, g.detach()))

        return hook

    def _mha_hook(
        self, name: str
    ) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Any], None]:
        def hook(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            y = out[0] if isinstance(out, tuple) else out
            if not y.requires_grad or name in self._seen:
                return
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            x = args[0] if args else kwargs["query"]
            self._mha_masks[name] = None if mask is None else mask.detach()
            self._seen[name] = (m, x.detach().clone(), y.detach().clone())
            y.register_hook(lambda g: self._grad.__setitem__(name, g.detach()))

        return hook

    def _attention_result(
        self,
        out: dict[str, torch.Tensor],
        terms: dict[str, torch.Tensor],
        sens: dict[str, torch.Tensor],
    ) -> None:
        """:meth:`result`'s part for each nn.MultiheadAttention seen (:func:`_mha`)."""
        for name, (m, x, _) in list(self._seen.items()):
            g = self._grad.get(name)
            if isinstance(m, nn.MultiheadAttention) and g is not None:
                mask = self._mha_masks.get(name)
                sens["matmul"] = sens["matmul"] + _mha(m, x, g, mask, name, out, terms)
                del self._seen[name]

    def _tap(self, name: str, m: SelfAttention) -> Callable[[torch.Tensor, torch.Tensor], None]:
        def tap(x: torch.Tensor, qkv: torch.Tensor) -> None:
            if qkv.requires_grad:
                self._seen[name] = (m, x.detach().clone(), qkv.detach().clone())
                qkv.register_hook(lambda g: self._grad.__setitem__(name, g.detach()))

        return tap

    def result(self, world: int) -> AbsoluteScale:
        """(canonical name -> absolute gradient, canonical name -> the number of terms each of its
        elements sums, kind of product -> the loss's sensitivity to it), all float64 and summed over
        the replicas.

        The sensitivity of a kind (``matmul``: dense layers, ``conv``: convolutions;
        dualtrain.core.kernels.KINDS) is the first-order change of the loss when every product of
        that kind is scaled by (1 + e), per unit e: the sum over its layers of <g, y - b>, the
        product's output (the layer's without its bias) against the loss's gradient there. A
        kernel whose output is off by a directed relative error d (one that truncates: d = -0.73 u
        in bf16) moves the step's loss by d times it (dualtrain.parity.checks.probes)."""
        out: dict[str, torch.Tensor] = {}
        terms: dict[str, torch.Tensor] = {}
        sens = {kind: torch.zeros(1, dtype=torch.float64) for kind in ("matmul", "conv")}
        self._attention_result(out, terms, sens)
        for name, (m, x, y) in self._seen.items():
            g = self._grad.get(name)
            if g is None:
                continue
            if isinstance(m, SelfAttention):  # its packed projection: F.linear(x, W, b)
                sens["matmul"] = sens["matmul"] + _in_proj(m, x, y, g, name, out, terms)
                continue
            if isinstance(m, nn.LayerNorm):
                _layernorm(m, x, g, name, out, terms)
                continue
            # a dense layer's, the patches' and the position's (tokens) outputs on the last axis,
            # a convolution's channels on axis 1
            last = isinstance(m, (nn.Linear, Patches, Position, Embedding))
            if not isinstance(m, (BatchNorm, Position, Embedding)):  # no product: a sum or lookup
                bias = getattr(m, "bias", None)
                kind = "matmul" if isinstance(m, nn.Linear) else "conv"
                if bias is None:
                    prod = y
                else:
                    b = bias.detach()
                    prod = y - (b if last else b.view(1, -1, *([1] * (y.dim() - 2))))
                sens[kind] = sens[kind] + (g * prod).sum().to("cpu", torch.float64).reshape(1)
            g = g.abs()
            # batch x output positions (x tokens); a position embedding's element: the batch
            per = g.shape[0] if isinstance(m, Position) else g.numel() // g.shape[-1 if last else 1]
            n = g.new_full((1,), float(per))
            terms.update({f"{name}.{k}": n for k, _ in m.named_parameters()})
            if isinstance(m, BatchNorm):
                dims = (0, 2, 3) if y.dim() == 4 else (0,)
                view = (1, -1, 1, 1) if y.dim() == 4 else (1, -1)
                w, b = m.weight.detach().view(view), m.bias.detach().view(view)
                x_hat = torch.where(w != 0, (y - b) / torch.where(w != 0, w, 1), 0)
                out[f"{name}.weight"] = (x_hat.abs() * g).sum(dim=dims)
                out[f"{name}.bias"] = g.sum(dim=dims)
                continue
            # dense and conv are linear in their parameters: the gradient of <layer(|x|), |g|>
            # with respect to them is sum |x| |g| (weight) and sum |g| (bias), with the layer's own
            # padding, stride and layout.
            params = {k: p.detach().requires_grad_() for k, p in m.named_parameters()}
            with torch.enable_grad():
                z = torch.func.functional_call(m, params, (x.abs(),))
                grads = torch.autograd.grad(z, list(params.values()), grad_outputs=g)
            out.update({f"{name}.{k}": a for k, a in zip(params, grads, strict=True)})
        self._seen, self._grad = {}, {}
        names = sorted(out)
        kinds = sorted(sens)
        parts = [out[k] for k in names] + [terms[k] for k in names]
        parts += [sens[k].to(parts[0].device if parts else "cpu") for k in kinds]
        if world > 1 and parts:
            flat = torch.cat([t.reshape(-1) for t in parts])
            dist.all_reduce(flat)
            parts = [
                p.view_as(t)
                for p, t in zip(flat.split([t.numel() for t in parts]), parts, strict=True)
            ]
        arrays = [t.to("cpu", torch.float64).numpy() for t in parts]
        k = len(names)
        return (
            dict(zip(names, arrays[:k], strict=True)),
            dict(zip(names, arrays[k : 2 * k], strict=True)),
            dict(zip(kinds, arrays[2 * k :], strict=True)),
        )


def _in_proj(
    m: SelfAttention,
    x: torch.Tensor,
    qkv: torch.Tensor,
    g: torch.Tensor,
    name: str,
    out: dict[str, torch.Tensor],
    terms: dict[str, torch.Tensor],
) -> torch.Tensor:
    """An attention's packed projection: sum |x| |g| and sum |g| as a dense layer's, under the
    canonical names (``in_proj_weight``, ``in_proj_bias``); its sensitivity <g, x W^T>."""
    base = name.removesuffix(".in_proj")
    w = m.in_proj_weight.detach().requires_grad_()
    params = {"in_proj_weight": w}
    if m.in_proj_bias is not None:
        params["in_proj_bias"] = m.in_proj_bias.detach().requires_grad_()
    with torch.enable_grad():
        z = torch.nn.functional.linear(x.abs(), w, params.get("in_proj_bias"))
        grads = torch.autograd.grad(z, list(params.values()), grad_outputs=g.abs())
    n = g.new_full((1,), float(g.numel() // g.shape[-1]))
    for k, a in zip(params, grads, strict=True):
        out[f"{base}.{k}"], terms[f"{base}.{k}"] = a, n
    prod = torch.nn.functional.linear(x, m.in_proj_weight.detach())
    return (g * prod).sum().to("cpu", torch.float64).reshape(1)


def _mha(
    m: nn.MultiheadAttention,
    x: torch.Tensor,
    g: torch.Tensor,
    mask: torch.Tensor | None,
    name: str,
    out: dict[str, torch.Tensor],
    terms: dict[str, torch.Tensor],
) -> torch.Tensor:
    """A model pair's nn.MultiheadAttention (self-attention, batch first, packed projection): its
    in_proj and out_proj as dense layers' (sum |x| |g| and sum |g|), the projection's gradient and
    the heads' context recomputed from its input and output gradient with torch's ops; their
    matmul sensitivity."""
    w, b = m.in_proj_weight.detach(), m.in_proj_bias
    wo, bo = m.out_proj.weight.detach(), m.out_proj.bias
    with torch.enable_grad():
        proj = torch.nn.functional.linear(x, w, None if b is None else b.detach())
        proj = proj.detach().requires_grad_()
        n, t, e = proj.shape[0], proj.shape[1], m.embed_dim
        q, k, v = (
            a.reshape(n, t, m.num_heads, e // m.num_heads).transpose(1, 2)
            for a in proj.split(e, dim=-1)
        )
        keep = None if mask is None else (~mask if mask.dtype == torch.bool else mask)
        ctx = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        ctx = ctx.transpose(1, 2).reshape(n, t, e)
        y = torch.nn.functional.linear(ctx, wo, None if bo is None else bo.detach())
        (g_proj,) = torch.autograd.grad(y, proj, grad_outputs=g)
    ctx = ctx.detach()
    count = g.new_full((1,), float(g.numel() // g.shape[-1]))
    for base, inp, grad, bias in (
        ("in_proj", x, g_proj, b is not None),
        ("out_proj.", ctx, g, bo is not None),
    ):
        weight = f"{name}.{base}weight" if base.endswith(".") else f"{name}.{base}_weight"
        out[weight] = torch.einsum("nto,nti->oi", grad.abs(), inp.abs())
        terms[weight] = count
        if bias:
            key = f"{name}.{base}bias" if base.endswith(".") else f"{name}.{base}_bias"
            out[key], terms[key] = grad.abs().sum(dim=(0, 1)), count
    made = (g_proj * (proj.detach() - (0.0 if b is None else b.detach()))).sum()
    made = made + (g * (y.detach() - (0.0 if bo is None else bo.detach()))).sum()
    return made.to("cpu", torch.float64).reshape(1)


def _layernorm(
    m: nn.LayerNorm,
    x: torch.Tensor,
    g: torch.Tensor,
    name: str,
    out: dict[str, torch.Tensor],
    terms: dict[str, torch.Tensor],
) -> None:
    """A layernorm's weight and bias, as a batchnorm's: sum |x_hat| |g| and sum |g| over every
    row (x_hat from the layer's input)."""
    x_hat = torch.nn.functional.layer_norm(x, m.normalized_shape, None, None, m.eps)
    dims = tuple(range(g.dim() - 1))
    out[f"{name}.weight"] = (x_hat.abs() * g.abs()).sum(dim=dims)
    out[f"{name}.bias"] = g.abs().sum(dim=dims)
    n = g.new_full((1,), float(g.numel() // g.shape[-1]))
    terms[f"{name}.weight"] = terms[f"{name}.bias"] = n
