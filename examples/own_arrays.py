"""Your own arrays as a dualtrain dataset, in a few lines (docs/data.md).

A dataset is an .npz file (or a folder of .npy files, memory-mapped) with, for every model input
NAME and for the target, ``NAME_train`` and ``NAME_test`` arrays: one row per sample. Images are
(N, C, H, W), tables (N, F); class labels are integers (N,), regression targets floats (N,) or
(N, T). This script writes a two-input one from scikit-learn's 8x8 digits: the image, and a small
vector of per-image facts (ink per quadrant), the cross-modal case a model with one branch per
input merges with a concat layer:

    python examples/own_arrays.py runs/data/digits_two_inputs.npz
    dualtrain compare --config configs/digits_two_inputs.yaml

(configs/digits_two_inputs.yaml reads runs/data/digits_two_inputs.npz; --set data.path=... points
it elsewhere.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits


def main(out: str) -> None:
    digits = load_digits()
    image = digits.images.astype(np.uint8)[:, None]  # (1797, 1, 8, 8), values 0..16
    quads = image[:, 0].reshape(-1, 2, 4, 2, 4).sum(axis=(2, 4)).reshape(-1, 4)  # ink per quadrant
    ink = quads.astype(np.float32)  # (1797, 4)
    label = digits.target.astype(np.int64)  # (1797,), classes 0..9
    test = np.arange(len(label)) % 5 == 4  # every fifth sample is a test sample
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        out,
        image_train=image[~test],
        image_test=image[test],
        ink_train=ink[~test],
        ink_test=ink[test],
        y_train=label[~test],
        y_test=label[test],
    )
    print(f"wrote {out}: {int((~test).sum())} train and {int(test.sum())} test samples")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/data/digits_two_inputs.npz")
