"""Fashion-MNIST as 784-pixel sequences (the Long Range Arena image task's analogue).

Reads the four standard IDX files ({train,t10k}-{images-idx3,labels-idx1}-ubyte, gzipped
or not) from a folder; Debian's ``dataset-fashion-mnist`` package installs them in
/usr/share/datasets/fashion-mnist. Each pixel (0..255) is one token.
"""
from __future__ import annotations

import gzip
import math
import os
import struct
from typing import Tuple

import numpy as np

from .._checks import check_int, check_path, check_split
from ..init import RngLike, as_generator

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
HOW_TO_GET = ("install Debian's dataset-fashion-mnist package (apt-get install dataset-fashion-mnist) "
              "or pass --data-dir with the four IDX files")


def _open(folder: str, stem: str):
    for name in (stem + ".gz", stem):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return gzip.open(path, "rb") if name.endswith(".gz") else open(path, "rb")
    raise FileNotFoundError(f"Fashion-MNIST file {stem}(.gz) not found in {folder}: {HOW_TO_GET}")


def read_idx(fh) -> np.ndarray:
    """An IDX array (the MNIST file format: magic, dimensions, unsigned bytes); ValueError
    saying what is wrong with a file that is not one."""
    header = fh.read(4)
    if len(header) < 4:
        raise ValueError(f"not an IDX file: {len(header)} bytes where the 4-byte header belongs")
    zero, dtype_code, ndim = struct.unpack(">HBB", header)
    if zero != 0 or dtype_code != 0x08:
        raise ValueError("not an unsigned-byte IDX file")
    dims = fh.read(4 * ndim)
    if len(dims) < 4 * ndim:
        raise ValueError(f"IDX file is truncated: its header names {ndim} dimensions")
    shape = struct.unpack(">" + "I" * ndim, dims)
    data = np.frombuffer(fh.read(), dtype=np.uint8)
    if data.size != math.prod(shape):
        raise ValueError(f"IDX file is truncated: {data.size} bytes for shape {shape}")
    return data.reshape(shape)


def _read(folder: str, stem: str) -> np.ndarray:
    fh = _open(folder, stem)
    try:
        with fh:
            return read_idx(fh)
    except (ValueError, OSError, EOFError) as exc:  # OSError: gzip's BadGzipFile
        raise ValueError(f"Fashion-MNIST file {fh.name} cannot be read: {exc}") from None


def load(folder: str = DEFAULT_DIR, split: str = "train") -> Tuple[np.ndarray, np.ndarray]:
    """(images (n, 784) uint8, labels (n,) int64) of the train or test split.

    Raises
    ------
    FileNotFoundError
        The folder or a file is missing (the message says how to get them).
    ValueError
        A file is not an IDX file of 28 x 28 images or of labels 0..9, or the two files
        hold different numbers of examples.
    """
    folder = check_path("folder", folder)
    if not os.path.isdir(folder):
        what = "is a file, not a folder" if os.path.exists(folder) else "does not exist"
        raise FileNotFoundError(f"Fashion-MNIST folder {folder} {what}: {HOW_TO_GET}")
    prefix = {"train": "train", "test": "t10k"}[check_split(split)]
    images = _read(folder, f"{prefix}-images-idx3-ubyte")
    labels = _read(folder, f"{prefix}-labels-idx1-ubyte")
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise ValueError(f"Fashion-MNIST images in {folder} must be n x 28 x 28, got {images.shape}")
    if labels.ndim != 1 or len(labels) != len(images):
        raise ValueError(f"Fashion-MNIST labels in {folder} must be one per image ({len(images)}), "
                         f"got shape {labels.shape}")
    if labels.size and labels.max() > 9:
        raise ValueError(f"Fashion-MNIST labels in {folder} must lie in 0..9, got {labels.max()}")
    return images.reshape(len(images), -1), labels.astype(np.int64)


class FashionMNIST:
    """Batches of pixel sequences: ids (B, 784), mask, labels.

    Parameters
    ----------
    folder : str, optional
        The folder of the four IDX files (Debian's ``dataset-fashion-mnist`` by default).

    Raises
    ------
    FileNotFoundError
        The folder or a file is missing (the message says how to get them).

    Examples
    --------
    >>> import os, struct, tempfile, numpy as np
    >>> from flexformer.data import FashionMNIST
    >>> folder = tempfile.mkdtemp()
    >>> for split in ("train", "t10k"):
    ...     with open(os.path.join(folder, f"{split}-images-idx3-ubyte"), "wb") as fh:
    ...         _ = fh.write(struct.pack(">HBBIII", 0, 8, 3, 2, 28, 28) + bytes(2 * 784))
    ...     with open(os.path.join(folder, f"{split}-labels-idx1-ubyte"), "wb") as fh:
    ...         _ = fh.write(struct.pack(">HBBI", 0, 8, 1, 2) + bytes([3, 7]))
    >>> ids, mask, labels = FashionMNIST(folder).batch(np.random.default_rng(0), 5)
    >>> ids.shape, set(labels.tolist()) <= {3, 7}
    ((5, 784), True)
    """

    num_classes = 10
    vocab_size = 256
    seq_len = 784

    def __init__(self, folder: str = DEFAULT_DIR):
        self.train = load(folder, "train")
        self.test = load(folder, "test")

    def batch(self, rng: RngLike, batch_size: int, split: str = "train"):
        """(ids (B, 784) int64, mask (B, 784) all True, labels (B,))."""
        rng, batch_size = as_generator(rng), check_int("batch_size", batch_size, 0)
        images, labels = self.train if check_split(split) == "train" else self.test
        idx = rng.integers(len(images), size=batch_size)
        ids = images[idx].astype(np.int64)
        return ids, np.ones(ids.shape, bool), labels[idx]
