"""A model pair's dropout modules on the torch side (dualtrain.core.pair.dropout): each nn.Dropout
/ Dropout2d of the user's module is replaced by PairDropout, whose mask in a training forward is
dualtrain.core.dropout's, bit for bit (the Keras side: tests/backends/tf/test_pair_dropout_tf.py);
the identity outside one, at rate 0 and in eval mode; a random layer it cannot carry is one
line."""

import numpy as np
import pytest

from dualtrain.core.dropout import NUMPY, keep
from dualtrain.core.pair import dropout as pair_dropout
from dualtrain.errors import UserError

torch = pytest.importorskip("torch")
nn = torch.nn


class Net(nn.Module):
    """Dropout on feature maps, whole channels, a shared module called twice, a rate-0 dropout
    and a transformer layer with dropout=0.0 (its three nn.Dropout(0.0))."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 1)
        self.drop = nn.Dropout(0.25)
        self.chan = nn.Dropout2d(0.5)
        self.none = nn.Dropout(0.0)
        self.fc = nn.Linear(3 * 4 * 5, 8)
        self.enc = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)

    def forward(self, x):
        x = self.chan(self.drop(self.conv(x)))
        x = self.drop(self.none(self.fc(x.flatten(1))))
        return self.enc(x[:, None, :])[:, 0]


def _calls(module, x):
    """The dropout calls of ``module``'s forward, as the describe child records them."""
    from dualtrain.backends.torch.pair import dropout_kind

    calls = []

    def hook(name):
        def record(m, inputs, out):
            kind, _ = dropout_kind(m)
            if kind is not None:
                calls.append(
                    pair_dropout.call_record(name, type(m).__name__, kind, m.p, inputs[0].shape[1:])
                )

        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in module.named_modules()]
    with torch.no_grad():
        module.eval()(x)
    for h in handles:
        h.remove()
    return calls


def test_pair_dropout_masks_are_the_hash_masks_and_off_outside_training():
    from dualtrain.backends.torch.layers import PairDropout
    from dualtrain.backends.torch.pair import install_dropouts

    torch.manual_seed(0)
    net = Net().double()
    x = torch.randn(6, 2, 4, 5, dtype=torch.float64)
    calls = _calls(net, x)
    assert [c["name"] for c in calls][:4] == ["drop", "chan", "none", "drop"]
    entries = pair_dropout.match(calls, calls)  # the rate-0 ones take no part
    assert [(e.torch, e.kind) for e in entries] == [
        ("drop", "element"),
        ("chan", "channel"),
        ("drop", "element"),
    ]
    install_dropouts(net)
    assert isinstance(net.drop, PairDropout) and isinstance(net.enc.dropout1, PairDropout)
    assert not any(isinstance(m, nn.modules.dropout._DropoutNd) for m in net.modules())
    net.train()
    ref = net(x)  # no training forward open: the identity (the locator, a bare call)
    ids, step = np.array([3, 1, 4, 1, 5, 9]), 7
    seen = []
    net.chan.register_forward_hook(lambda m, i, o: seen.append((i[0], o)))
    with pair_dropout.training_forward("torch", entries, 11, torch.tensor(step), torch.tensor(ids)):
        out = net(x)
    assert not torch.equal(out, ref)
    ((inp, got),) = seen
    mask = keep(NUMPY, 11, np.int64(step), ids, 2, np.arange(3), 0.5)  # call 2: one per channel
    expected = np.where(mask[:, :, None, None], inp.detach().numpy() * 2.0, 0.0)
    assert np.array_equal(got.detach().numpy(), expected)
    net.eval()
    ctx = pair_dropout.training_forward("torch", entries, 11, torch.tensor(step), torch.tensor(ids))
    with pytest.raises(UserError, match="made 0 dropout call"), ctx:
        net(x)  # eval mode: no mask taken, and the forward is not the one described
    assert torch.equal(net(x), ref)


def test_the_first_call_takes_the_element_mask_in_torch_layout():
    from dualtrain.backends.torch.layers import PairDropout

    e = pair_dropout.DropoutEntry("d", "d", 0.25, "element", (3, 4, 5), "channels_last")
    m = PairDropout("d", 0.25, "element", "Dropout").double().train()
    x = torch.ones(2, 3, 4, 5, dtype=torch.float64)
    with pair_dropout.training_forward("torch", [e], 0, torch.tensor(5), torch.tensor([8, 9])):
        y = m(x)
    mask = keep(NUMPY, 0, np.int64(5), np.array([8, 9]), 1, np.arange(60), 0.25)
    assert np.array_equal(y.numpy().reshape(2, -1) != 0, mask)
    assert set(np.unique(y.numpy())) == {0.0, 1.0 / 0.75}


@pytest.mark.parametrize(
    "module, text",
    [
        (nn.AlphaDropout(0.1), "AlphaDropout, which a model pair does not carry"),
        (nn.MultiheadAttention(8, 2, dropout=0.1), "MultiheadAttention with dropout=0.1"),
    ],
)
def test_a_random_layer_the_pair_cannot_mask_is_one_line(module, text):
    from dualtrain.backends.torch.pair import check_dropout

    with pytest.raises(UserError, match=text):
        check_dropout("layer", module)
    check_dropout("attn", nn.MultiheadAttention(8, 2, dropout=0.0))  # rate 0: the identity
