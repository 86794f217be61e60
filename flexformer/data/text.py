"""Plain-text data as bytes: character-level language modelling and long-document
classification (which file a window of N bytes came from).

Files are read from a folder given by the caller (``../shared/data/austen`` holds six
novels for tests and examples); nothing is downloaded.
"""
from __future__ import annotations

import os
from typing import List, Optional

import numpy as np

from .._checks import check_int, check_path, check_split
from ..init import RngLike, as_generator

HOW_TO_GET = "pass --data-dir with plain-text (.txt) files, e.g. ../shared/data/austen"


def text_files(folder: str) -> List[str]:
    folder = check_path("folder", folder)
    if not os.path.isdir(folder):
        what = "is a file, not a folder" if os.path.exists(folder) else "does not exist"
        raise FileNotFoundError(f"text folder {folder} {what}: {HOW_TO_GET}")
    files = sorted(f for f in os.listdir(folder) if f.endswith(".txt"))
    if len(files) < 2:
        raise FileNotFoundError(f"text folder {folder} needs at least two .txt files, found {len(files)}: "
                                f"{HOW_TO_GET}")
    return [os.path.join(folder, f) for f in files]


def read_bytes(path: str) -> np.ndarray:
    with open(path, "rb") as fh:
        return np.frombuffer(fh.read(), dtype=np.uint8)


class TextLM:
    """Next-byte prediction: trains on every file but the evaluation file (default: the
    last in name order) and evaluates on that one.

    Parameters
    ----------
    folder : str
        A folder of ``.txt`` files.
    seq_len : int, optional
    eval_file : str, optional

    Raises
    ------
    ValueError
        No text files, files shorter than a window, or an unknown ``eval_file``.

    Examples
    --------
    >>> import os, tempfile, numpy as np
    >>> folder = tempfile.mkdtemp()
    >>> for name, line in [("a.txt", "It is a truth universally acknowledged. "), ("b.txt", "Emma Woodhouse, clever. ")]:
    ...     with open(os.path.join(folder, name), "w") as fh:
    ...         _ = fh.write(line * 50)
    >>> from flexformer.data import TextLM
    >>> inputs, targets = TextLM(folder, seq_len=32).batch(np.random.default_rng(0), 4)
    >>> inputs.shape, bool((inputs[:, 1:] == targets[:, :-1]).all())
    ((4, 32), True)
    """

    vocab_size = 256

    def __init__(self, folder: str, seq_len: int = 256, eval_file: Optional[str] = None):
        seq_len = check_int("seq_len", seq_len)
        files = text_files(folder)
        names = [os.path.basename(f) for f in files]
        if eval_file is None:
            eval_file = names[-1]
        if eval_file not in names:
            raise ValueError(f"eval_file {eval_file!r} is not in {folder}; choose one of {names}")
        self.seq_len = seq_len
        self.eval_name = eval_file
        self.train = np.concatenate([read_bytes(f) for f, n in zip(files, names) if n != eval_file])
        self.test = read_bytes(files[names.index(eval_file)])
        if min(len(self.train), len(self.test)) <= seq_len + 1:
            raise ValueError(f"the text files in {folder} are shorter than seq_len + 1 = {seq_len + 1} bytes")

    def batch(self, rng: RngLike, batch_size: int, split: str = "train"):
        """(inputs (B, N), targets (B, N)): windows and the same windows shifted by one."""
        rng, batch_size = as_generator(rng), check_int("batch_size", batch_size, 0)
        data = self.train if check_split(split) == "train" else self.test
        start = rng.integers(len(data) - self.seq_len - 1, size=batch_size)
        win = np.stack([data[s: s + self.seq_len + 1] for s in start]).astype(np.int64)
        return win[:, :-1], win[:, 1:]


class TextClassification:
    """Which file a window of ``seq_len`` bytes came from. The last ``holdout`` fraction
    of every file is kept whole for evaluation, so no evaluation window overlaps training.

    Parameters
    ----------
    folder : str
        A folder of ``.txt`` files, one class each.
    seq_len : int, optional
    holdout : float, optional

    Examples
    --------
    >>> import os, tempfile, numpy as np
    >>> folder = tempfile.mkdtemp()
    >>> for name, line in [("a.txt", "It is a truth universally acknowledged. "), ("b.txt", "Emma Woodhouse, clever. ")]:
    ...     with open(os.path.join(folder, name), "w") as fh:
    ...         _ = fh.write(line * 50)
    >>> from flexformer.data import TextClassification
    >>> data = TextClassification(folder, seq_len=32)
    >>> ids, mask, labels = data.batch(np.random.default_rng(0), 4, split="test")
    >>> data.num_classes, ids.shape
    (2, (4, 32))
    """

    vocab_size = 256

    def __init__(self, folder: str, seq_len: int = 512, holdout: float = 0.1):
        seq_len = check_int("seq_len", seq_len)
        if isinstance(holdout, bool) or not isinstance(holdout, (int, float, np.floating)) or not 0 < holdout < 1:
            raise ValueError(f"holdout must be a fraction between 0 and 1 (exclusive), got {holdout!r}")
        files = text_files(folder)
        self.names = [os.path.basename(f) for f in files]
        self.num_classes = len(files)
        self.seq_len = seq_len
        self.train, self.test = [], []
        for f in files:
            data = read_bytes(f)
            cut = int(len(data) * (1 - holdout))
            if min(cut, len(data) - cut) <= seq_len:
                raise ValueError(f"{f} is too short for seq_len {seq_len} with a {holdout:.0%} held-out part")
            self.train.append(data[:cut])
            self.test.append(data[cut:])

    def batch(self, rng: RngLike, batch_size: int, split: str = "train"):
        """(ids (B, N) int64, mask (B, N) all True, labels (B,)): windows of uniformly drawn
        files, labelled with the file's index."""
        rng, batch_size = as_generator(rng), check_int("batch_size", batch_size, 0)
        parts = self.train if check_split(split) == "train" else self.test
        labels = rng.integers(self.num_classes, size=batch_size)
        ids = np.stack([parts[c][s: s + self.seq_len] for c, s in
                        ((c, rng.integers(len(parts[c]) - self.seq_len)) for c in labels)]).astype(np.int64)
        return ids, np.ones(ids.shape, bool), labels.astype(np.int64)


class TextRetrieval:
    """Pairs of byte windows: do they come from the same file? (The Long Range Arena
    retrieval task asks whether two documents are related; here two windows of
    ``seq_len`` bytes are related when one book holds both.) Half the pairs share a book.
    As in :class:`TextClassification` the last ``holdout`` fraction of every file is kept
    for evaluation, so no evaluation window overlaps training.

    Parameters
    ----------
    folder : str
        A folder of ``.txt`` files.
    seq_len : int, optional
    holdout : float, optional

    Examples
    --------
    >>> import os, tempfile, numpy as np
    >>> folder = tempfile.mkdtemp()
    >>> for name, line in [("a.txt", "It is a truth universally acknowledged. "), ("b.txt", "Emma Woodhouse, clever. ")]:
    ...     with open(os.path.join(folder, name), "w") as fh:
    ...         _ = fh.write(line * 50)
    >>> from flexformer.data import TextRetrieval
    >>> ids, mask, labels = TextRetrieval(folder, seq_len=32).batch(np.random.default_rng(0), 4)
    >>> ids.shape
    (4, 2, 32)
    """

    vocab_size = 256
    num_classes = 2

    def __init__(self, folder: str, seq_len: int = 512, holdout: float = 0.1):
        self._books = TextClassification(folder, seq_len, holdout)
        self.seq_len = seq_len

    def _window(self, rng: np.random.Generator, part: np.ndarray) -> np.ndarray:
        start = rng.integers(len(part) - self.seq_len)
        return part[start: start + self.seq_len]

    def windows(self, rng: RngLike, count: int, split: str = "train"):
        """(ids (count, N) int64, mask (count, N) all True, books (count,)): windows of
        uniformly drawn books, each with the index of its book, for training on every
        pair among them (two windows are related when their books are equal)."""
        return self._books.batch(rng, count, split)

    def batch(self, rng: RngLike, batch_size: int, split: str = "train"):
        """(ids (B, 2, N) int64, mask (B, 2, N) all True, labels (B,)): label 1 when the two
        windows of a pair come from one book."""
        rng, batch_size = as_generator(rng), check_int("batch_size", batch_size, 0)
        parts = self._books.train if check_split(split) == "train" else self._books.test
        n = len(parts)
        labels = rng.integers(2, size=batch_size)
        first = rng.integers(n, size=batch_size)
        other = (first + rng.integers(1, n, size=batch_size)) % n  # a different book, uniformly
        second = np.where(labels == 1, first, other)
        ids = np.stack([np.stack([self._window(rng, parts[a]), self._window(rng, parts[b])])
                        for a, b in zip(first, second)]).astype(np.int64)
        return ids, np.ones(ids.shape, bool), labels.astype(np.int64)
