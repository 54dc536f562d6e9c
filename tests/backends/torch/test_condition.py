"""The absolute gradient the local gradient check is judged against, and the loss's sensitivity to
each kind of product the local loss check translates kernels with
(dualtrain.backends.torch.condition).

For every dense, conv and batchnorm parameter it must be the sum of |factor| x |factor| products
that make up the gradient, computed independently here from each layer's input and output gradient
(torch.nn.grad for the conv), so it bounds the gradient componentwise, and the number of terms each
element sums must be batch x output positions."""

from __future__ import annotations

import numpy as np
import pytest

from dualtrain.spec import load_spec

torch = pytest.importorskip("torch")

CONV = "{type: conv2d, filters: 4, kernel_size: 3, stride: 2, padding: 1}, "
HEAD = (
    "{type: relu}, {type: flatten}, {type: dense, units: 16}, {type: relu}, "
    "{type: dense, units: 10}]"
)
LAYERS = "model.layers=[" + CONV + "{type: batchnorm}, " + HEAD
# Without the batchnorm: a batchnorm right after the conv makes the loss invariant to the conv's
# scale (up to its eps), so the conv's sensitivity there is ~1e-4 of the dense layers' and rounding
# noise decides its digits.
NO_BN = "model.layers=[" + CONV + HEAD


def _model_and_batch(layers: str = LAYERS):
    from dualtrain.backends.torch.model import build_model, load_canonical
    from dualtrain.core.weights import init_weights

    spec = load_spec(None, ["model.preset=null", layers])
    model = build_model(spec.model).double().train()
    load_canonical(model, init_weights(spec.model, 1))  # torch's own init draws unseeded
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(12, 1, 28, 28, generator=gen, dtype=torch.float64) - 0.4  # cancelling terms
    y = torch.randint(0, 10, (12,), generator=gen)
    return model, x, y


def test_absolute_gradient_is_the_sum_of_absolute_products():
    from dualtrain.backends.torch.condition import AbsoluteGradient

    model, x, y = _model_and_batch()
    with AbsoluteGradient(model) as absolute:
        loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum")
        loss.backward()
    scale, terms, _ = absolute.result(world=1)
    grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
    assert sorted(scale) == sorted(grads) == sorted(terms)

    # The same quantities from scratch: every layer's input and the loss's gradient at its output.
    acts = [x]
    for m in model:
        acts.append(m(acts[-1]))
    outs = [a for a in acts[1:]]
    g_out = torch.autograd.grad(
        torch.nn.functional.cross_entropy(outs[-1], y, reduction="sum"), outs, allow_unused=True
    )
    conv, bn, dense1, dense2 = model[0], model[1], model[4], model[6]
    gx, g0 = acts[0].abs(), g_out[0].abs()
    want = torch.nn.grad.conv2d_weight(gx, conv.weight.shape, g0, stride=2, padding=1)
    np.testing.assert_allclose(scale["0.weight"], want.numpy(), rtol=1e-12)
    np.testing.assert_allclose(scale["0.bias"], g0.sum((0, 2, 3)).numpy(), rtol=1e-12)
    a1 = acts[1].detach()
    mean, var = a1.mean((0, 2, 3), keepdim=True), a1.var((0, 2, 3), unbiased=False, keepdim=True)
    x_hat = (a1 - mean) / torch.sqrt(var + bn.eps)
    g1 = g_out[1].abs()
    np.testing.assert_allclose(
        scale["1.weight"], (x_hat.abs() * g1).sum((0, 2, 3)).numpy(), rtol=1e-9
    )
    np.testing.assert_allclose(scale["1.bias"], g1.sum((0, 2, 3)).numpy(), rtol=1e-12)
    for _layer, i in ((dense1, 4), (dense2, 6)):
        g = g_out[i].abs()
        np.testing.assert_allclose(
            scale[f"{i}.weight"], (g.T @ acts[i].detach().abs()).numpy(), rtol=1e-12
        )
        np.testing.assert_allclose(scale[f"{i}.bias"], g.sum(0).numpy(), rtol=1e-12)

    for name, g in grads.items():  # a componentwise bound on the gradient, tight nowhere near 1
        assert np.all(np.abs(g) <= scale[name] * (1 + 1e-12)), name
    assert terms["0.weight"][0] == terms["1.bias"][0] == 12 * 14 * 14  # batch x output positions
    assert terms["4.weight"][0] == terms["6.bias"][0] == 12
    assert np.linalg.norm(scale["0.weight"]) > 3 * np.linalg.norm(grads["0.weight"])


def test_sensitivity_is_the_loss_derivative_along_scaled_products():
    """S_kind = d loss / d e when every product of that kind (a layer's output without its bias) is
    scaled by (1 + e): here by central differences through forward hooks that do exactly that."""
    from dualtrain.backends.torch.condition import AbsoluteGradient

    model, x, y = _model_and_batch(NO_BN)
    with AbsoluteGradient(model) as absolute:
        loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum")
        loss.backward()
    _, _, sens = absolute.result(world=1)

    def loss_with(kind: type, e: float) -> float:
        def scaled(m, _inputs, out):
            b = m.bias.view(1, -1, *([1] * (out.dim() - 2))) if m.bias is not None else 0.0
            return (out - b) * (1 + e) + b

        handles = [m.register_forward_hook(scaled) for m in model if isinstance(m, kind)]
        try:
            with torch.no_grad():
                return float(torch.nn.functional.cross_entropy(model(x), y, reduction="sum"))
        finally:
            for h in handles:
                h.remove()

    e = 1e-5
    for kind, cls in (("matmul", torch.nn.Linear), ("conv", torch.nn.Conv2d)):
        fd = (loss_with(cls, e) - loss_with(cls, -e)) / (2 * e)
        assert abs(sens[kind][0]) > 1e-2  # not a vacuous comparison
        np.testing.assert_allclose(sens[kind][0], fd, rtol=1e-4)


TOKENS = (
    "model.layers=[{type: patches, size: 7, dim: 8}, {type: position}, {type: residual, body: "
    "[{type: layernorm}, {type: attention, heads: 2}]}, {type: residual, body: [{type: layernorm}, "
    "{type: dense, units: 16}, {type: gelu}, {type: dense, units: 8}]}, {type: layernorm}, "
    "{type: token_pool}, {type: dense, units: 10}]"
)


def test_every_token_layer_parameter_has_an_absolute_scale_that_bounds_its_gradient():
    # patches, position, layernorm and attention's packed projection (a tap inside its forward)
    # have their sum of |products|, with the number of terms each element sums
    from dualtrain.backends.torch.condition import AbsoluteGradient

    model, x, y = _model_and_batch(TOKENS)
    with AbsoluteGradient(model) as absolute:
        loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum")
        loss.backward()
    scale, terms, _ = absolute.result(world=1)
    grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
    assert sorted(scale) == sorted(grads) == sorted(terms)
    for name, g in grads.items():
        assert scale[name].shape == g.shape, name
        assert np.all(np.abs(g) <= scale[name] * (1 + 1e-12) + 1e-300), name
    assert terms["1.weight"] == 12  # the position embedding: one term per sample
    assert terms["2.body.1.in_proj_weight"] == 12 * 16  # samples x tokens
    assert terms["0.weight"] == 12 * 16
    # the key's bias has an exactly zero gradient (left out of the arithmetic)
    assert not np.any(grads["2.body.1.in_proj_bias"][8:16])
