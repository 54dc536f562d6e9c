"""The torch backend's dropout masks are dualtrain.core.dropout's, bit for bit (the TF side:
tests/integration/test_tf_dropout.py)."""

import numpy as np
import pytest

from dualtrain.core.dropout import NUMPY, keep

torch = pytest.importorskip("torch")


def test_torch_masks_equal_numpy_masks():
    from dualtrain.backends.torch.layers import INT_OPS

    ids = np.arange(3, 3000, 11, dtype=np.int64)
    el = np.arange(8 * 13 * 13, dtype=np.int64)
    for seed, step, layer, rate in [
        (0, 1, 2, 0.5),
        (7, 123456, 5, 0.25),
        (2**32 - 1, 2**31, 9, 0.1),
    ]:
        ref = keep(NUMPY, seed, np.int64(step), ids, layer, el, rate)
        got = keep(
            INT_OPS,
            seed,
            torch.tensor(step),
            torch.from_numpy(ids),
            layer,
            torch.from_numpy(el),
            rate,
        ).numpy()
        assert np.array_equal(got, ref)


def test_hash_dropout_module_scales_kept_values_and_is_off_in_eval():
    from dualtrain.backends.torch.layers import HashDropout

    m = HashDropout(0.25, 2, (8, 13, 13), seed=0).double()
    x = torch.ones(4, 8, 13, 13, dtype=torch.float64)
    m.step, m.ids = torch.tensor(7), torch.tensor([1, 2, 3, 4])
    y = m(x)
    mask = keep(NUMPY, 0, np.int64(7), np.array([1, 2, 3, 4]), 2, np.arange(8 * 13 * 13), 0.25)
    assert np.array_equal(y.numpy().reshape(4, -1) != 0, mask)
    assert set(np.unique(y.numpy())) == {0.0, 1.0 / 0.75}
    m.eval()
    assert torch.equal(m(x), x)
