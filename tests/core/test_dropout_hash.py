"""The dropout hash (dualtrain.core.dropout) in NumPy: the drop fraction, what changes a mask, and
what must not (which replica or batch holds the sample)."""

import numpy as np
import pytest

from dualtrain.core.dropout import NUMPY, keep, threshold

IDS = np.arange(0, 60000, 7, dtype=np.int64)  # 8,572 samples
ELEMENTS = np.arange(784, dtype=np.int64)  # 6.7 M mask elements per call


@pytest.mark.parametrize("rate", [0.1, 0.25, 0.5, 0.75])
def test_measured_drop_fraction(rate):
    dropped = 1.0 - keep(NUMPY, 0, np.int64(5), IDS, 3, ELEMENTS, rate).mean()
    # binomial standard deviation at 6.7 M elements is <= 2e-4; the threshold is
    # rate * 2**24 rounded
    assert abs(dropped - rate) < 1e-3, dropped
    assert threshold(rate) == round(rate * 2**24)


def test_every_input_of_the_hash_changes_the_mask():
    base = keep(NUMPY, 0, np.int64(5), IDS, 3, ELEMENTS, 0.5)
    for other in (
        keep(NUMPY, 1, np.int64(5), IDS, 3, ELEMENTS, 0.5),  # seed
        keep(NUMPY, 0, np.int64(6), IDS, 3, ELEMENTS, 0.5),  # step
        keep(NUMPY, 0, np.int64(5), IDS + 1, 3, ELEMENTS, 0.5),  # sample
        keep(NUMPY, 0, np.int64(5), IDS, 4, ELEMENTS, 0.5),
    ):  # layer
        assert 0.45 < (base != other).mean() < 0.55  # independent-looking, not shifted copies


def test_a_samples_mask_does_not_depend_on_its_batch():
    # Replica and world size only decide which ids share a batch; the mask of an id is the same.
    whole = keep(NUMPY, 0, np.int64(9), IDS, 2, ELEMENTS, 0.3)
    parts = [keep(NUMPY, 0, np.int64(9), part, 2, ELEMENTS, 0.3) for part in np.array_split(IDS, 3)]
    assert np.array_equal(np.concatenate(parts), whole)
    shuffled = np.random.default_rng(0).permutation(len(IDS))
    assert np.array_equal(
        keep(NUMPY, 0, np.int64(9), IDS[shuffled], 2, ELEMENTS, 0.3), whole[shuffled]
    )


def test_no_int64_overflow():
    # Every intermediate stays below 2**63: the largest 32-bit value times either multiplier.
    from dualtrain.core.dropout import M1, M2, MASK32

    assert MASK32 * max(M1, M2) < 2**63 and M1 % 2 == 1 and M2 % 2 == 1
    big = np.array([2**32 - 1, 2**31, 0], dtype=np.int64)
    m = keep(NUMPY, 2**32 - 1, np.int64(2**32 - 1), big, 2**31, big, 0.5)
    assert m.shape == (3, 3)
