"""ListOps (Nangia and Bowman, 2018; the Long Range Arena's ListOps task), generated.

Expressions nest the operators MAX, MIN, MED (the lower median) and SM (sum mod 10) over
digits, e.g. ``[MAX 2 9 [MIN 4 7 ] 0 ]`` = 9; the label is the value (10 classes).
Token ids: 0 padding, 1..10 the digits 0..9, then ``[MAX [MIN [MED [SM ]``.
"""
from __future__ import annotations

from typing import List, Tuple, Union

import numpy as np

from .._checks import check_int
from ..init import RngLike, as_generator

OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
VOCAB = ["<pad>"] + [str(i) for i in range(10)] + list(OPERATORS) + ["]"]
TOKEN = {t: i for i, t in enumerate(VOCAB)}
NUM_CLASSES = 10

Tree = Union[int, Tuple[str, list]]


def evaluate(tree: Tree) -> int:
    """The value of an expression tree."""
    if isinstance(tree, int):
        return tree
    op, args = tree
    vals = [evaluate(a) for a in args]
    if op == "[MAX":
        return max(vals)
    if op == "[MIN":
        return min(vals)
    if op == "[MED":
        return sorted(vals)[(len(vals) - 1) // 2]
    return sum(vals) % 10


def tokens(tree: Tree) -> List[str]:
    if isinstance(tree, int):
        return [str(tree)]
    op, args = tree
    out = [op]
    for a in args:
        out += tokens(a)
    return out + ["]"]


def random_tree(rng: np.random.Generator, budget: int, depth: int = 0, max_depth: int = 10,
                max_args: int = 5, leaf_prob: float = 0.15) -> Tree:
    """A random expression of at most ``budget`` tokens: an operator node spends two
    tokens (the operator and ``]``) and shares the rest among 2..max_args arguments."""
    if budget < 4 or depth >= max_depth or (depth > 0 and rng.random() < leaf_prob):
        return int(rng.integers(10))
    op = OPERATORS[rng.integers(len(OPERATORS))]
    inner = budget - 2
    n = int(rng.integers(2, min(max_args, inner) + 1))
    # n - 1 distinct cuts in 1..inner-1, in plain Python (NumPy's per-call overhead on these
    # few numbers dominated generation); an index + 1 draws exactly what choosing from
    # arange(1, inner) did, so every seed gives the same expressions as before
    cuts = [0] + sorted(c + 1 for c in rng.choice(inner - 1, size=n - 1, replace=False).tolist()) + [inner]
    sizes = [b - a for a, b in zip(cuts, cuts[1:])]
    return (op, [random_tree(rng, b, depth + 1, max_depth, max_args, leaf_prob) for b in sizes])


class ListOps:
    """Seeded ListOps batches of at most ``seq_len`` tokens (padded, with a mask).

    Parameters
    ----------
    seq_len : int
        Longest expression in tokens; shorter ones are padded.
    min_len : int
        Shortest expression kept (default seq_len // 4, at least 3), at most seq_len.
    max_depth : int
        Deepest nesting of operators (>= 1).
    max_args : int
        Most arguments of one operator (>= 2).

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.data import ListOps
    >>> ids, mask, labels = ListOps(seq_len=64).batch(np.random.default_rng(0), 8)
    >>> ids.shape, int(labels.min()) >= 0 and int(labels.max()) <= 9
    ((8, 64), True)
    """

    num_classes = NUM_CLASSES
    vocab_size = len(VOCAB)

    def __init__(self, seq_len: int = 128, min_len: int = None, max_depth: int = 10, max_args: int = 5):
        self.seq_len = check_int("seq_len", seq_len, 8)
        self.min_len = max(3, seq_len // 4) if min_len is None else check_int("min_len", min_len, 1)
        if self.min_len > self.seq_len:
            raise ValueError(f"min_len must be at most seq_len = {self.seq_len}, got {self.min_len}")
        self.max_depth, self.max_args = check_int("max_depth", max_depth, 1), check_int("max_args", max_args, 2)

    def sample(self, rng: RngLike) -> Tuple[List[str], int]:
        """One expression's tokens and its value, drawn with ``rng`` (a Generator, or a seed)."""
        rng = as_generator(rng)
        for _ in range(10000):
            budget = int(rng.integers(self.min_len, self.seq_len + 1))
            tree = random_tree(rng, budget, max_depth=self.max_depth, max_args=self.max_args)
            toks = tokens(tree)
            if self.min_len <= len(toks) <= self.seq_len:
                return toks, evaluate(tree)
        raise RuntimeError("could not draw an expression of the requested length; change seq_len")

    def batch(self, rng: RngLike, batch_size: int):
        """(ids (B, N) int64, mask (B, N) bool, labels (B,) int64)."""
        rng, batch_size = as_generator(rng), check_int("batch_size", batch_size, 0)
        ids = np.zeros((batch_size, self.seq_len), np.int64)
        labels = np.zeros(batch_size, np.int64)
        for b in range(batch_size):
            toks, labels[b] = self.sample(rng)
            ids[b, : len(toks)] = [TOKEN[t] for t in toks]
        return ids, ids != 0, labels
