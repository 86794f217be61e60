"""Pathfinder, generated (the Long Range Arena task of Linsley et al., 2018, as used by Tay
et al., 2021): a greyscale image with dashed curves and two marked dots; the label says
whether the dots lie at the two ends of one curve. The image is read as a sequence of
size x size pixel tokens (0..255), row by row.

Every example comes from its own seed, so nothing is stored and a batch depends only on
the generator's draws. How an image is made:

* ``2 + distractors`` curves, each a walk of ``curve_length`` unit steps whose heading
  turns by a Gaussian angle (``turn`` radians) at every step, drawn dashed: ``dash``
  pixels on, ``gap`` pixels off along the walk;
* a new curve keeps a Chebyshev distance of at least ``gap + 2`` pixels from every pixel
  of the curves and dots drawn before it, so no two curves touch or can be joined across
  a dash gap (a curve that cannot be placed is redrawn);
* a curve's two ends are at least max(3, size // 5) pixels apart (Chebyshev);
* label 1: the two dots (3 x 3 squares, value 255) sit at the two ends of the first
  curve; label 0: at one end each of the first and the second curve. Either way the image
  has the same number of curves and dots, so only their connection tells the classes
  apart. Curves have a grey value of their own, from 96 to 191.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from .._checks import check_int, check_split
from ..init import RngLike, as_generator

_SPLIT_TAG = {"train": 0, "test": 1}
#: the smallest image side (the default curves need the room)
MIN_SIZE = 16


class Pathfinder:
    """Batches of generated Pathfinder images as pixel sequences: ids (B, size^2), mask, labels.

    Parameters
    ----------
    size : int
        Image side (>= 16): 32 is LRA's Pathfinder-32, 16 a quick version.
    curve_length : int, optional
        Unit steps per curve (default ``size // 2``).
    distractors : int, optional
        Curves without dots beyond the two that carry them (default 1 at size < 24, else 2).
    dash, gap : int
        Pixels on and off along a curve (defaults 2 and 1).
    turn : float
        Standard deviation of the heading change per step, radians (default 0.25).
    train_examples, test_examples : int
        Size of each split (defaults 32,768 and 2,048); an example is generated when first
        used and kept.

    Examples
    --------
    >>> import numpy as np
    >>> from flexformer.data import Pathfinder
    >>> ids, mask, labels = Pathfinder(16, train_examples=8, test_examples=8).batch(np.random.default_rng(0), 4)
    >>> ids.shape, sorted(set(labels.tolist())) <= [0, 1]
    ((4, 256), True)
    """

    num_classes = 2
    vocab_size = 256

    def __init__(self, size: int = 32, *, curve_length: Optional[int] = None, distractors: Optional[int] = None,
                 dash: int = 2, gap: int = 1, turn: float = 0.25, train_examples: int = 32768,
                 test_examples: int = 2048):
        self.size = check_int("size", size, MIN_SIZE)
        self.curve_length = check_int("curve_length", size // 2 if curve_length is None else curve_length, 2)
        if self.curve_length > 4 * self.size:
            raise ValueError(f"curve_length must be at most 4 x size = {4 * self.size}, got {curve_length}")
        self.distractors = check_int("distractors", (1 if size < 24 else 2) if distractors is None else distractors,
                                      0)
        self.dash = check_int("dash", dash, 1)
        self.gap = check_int("gap", gap, 0)
        if not (np.isfinite(turn) and turn >= 0):
            raise ValueError(f"turn must be a finite number >= 0, got {turn!r}")
        self.turn = float(turn)
        self.seq_len = self.size * self.size
        self.examples = {"train": check_int("train_examples", train_examples, 1),
                         "test": check_int("test_examples", test_examples, 1)}
        self._cache: dict = {}
        # a new curve's pixels are kept out of this Chebyshev radius around every pixel drawn
        # before (so pixels of two curves are >= gap + 2 apart: no dash gap can join them)
        self.separation = self.gap + 1
        self.min_span = max(3, self.size // 5)  # the two ends of a curve at least this far apart
        self.draw([2, 0])  # knobs that cannot fit fail here, with the message of draw

    # ------------------------------------------------------------------ one image
    def _walk(self, gen: np.random.Generator, taken: np.ndarray) -> np.ndarray:
        """Pixels (row, col) of a smooth walk from a pixel not yet ``taken``, mirrored at the
        border to stay inside the image; consecutive pixels are 8-neighbours (repeats dropped)."""
        lo, width = 1.0, self.size - 3.0
        free = np.argwhere(~taken[1:-2, 1:-2])
        start = free[gen.integers(len(free))] + gen.uniform(-0.5, 0.5, size=2) if len(free) else gen.uniform(
            0, width, size=2)
        heading = gen.uniform(0, 2 * np.pi) + np.cumsum(gen.normal(0.0, self.turn, self.curve_length))
        steps = np.stack([np.sin(heading), np.cos(heading)], axis=1)
        points = start + np.concatenate([np.zeros((1, 2)), np.cumsum(steps, axis=0)])
        folded = np.mod(points, 2 * width)  # a triangle wave: mirror images at both borders
        points = lo + np.where(folded > width, 2 * width - folded, folded)
        pix = np.rint(points).astype(np.int64)
        keep = np.ones(len(pix), bool)
        keep[1:] = np.any(pix[1:] != pix[:-1], axis=1)
        return pix[keep]

    def _dashed(self, pix: np.ndarray) -> np.ndarray:
        period = self.dash + self.gap
        on = (np.arange(len(pix)) % period) < self.dash
        on[-1] = True  # the ends are always drawn (the dots sit there)
        return pix[on]

    def _around(self, pix: np.ndarray, radius: int) -> Tuple[np.ndarray, np.ndarray]:
        """(rows, cols) of the pixels within Chebyshev distance ``radius`` of ``pix``."""
        off = np.arange(-radius, radius + 1)
        grid = (len(pix), len(off), len(off))
        r = np.broadcast_to(pix[:, 0, None, None] + off[None, :, None], grid).ravel()
        c = np.broadcast_to(pix[:, 1, None, None] + off[None, None, :], grid).ravel()
        ok = (r >= 0) & (r < self.size) & (c >= 0) & (c < self.size)
        return r[ok], c[ok]

    def draw(self, seed) -> Tuple[np.ndarray, int]:
        """(image (size, size) uint8, label) of the example with this seed."""
        gen = np.random.default_rng(seed)
        label = int(gen.integers(2))
        for _restart in range(200):
            curves: List[np.ndarray] = []
            taken = np.zeros((self.size, self.size), bool)
            for _ in range(2 + self.distractors):
                for _attempt in range(50):
                    pix = self._walk(gen, taken)
                    ends = pix[[0, -1]]
                    if (np.abs(ends[0] - ends[1]).max() >= self.min_span and not taken[pix[:, 0], pix[:, 1]].any()
                            and not taken[self._around(ends, 1)].any()):
                        break
                else:
                    break  # no room: start the image again
                curves.append(pix)
                taken[self._around(pix, self.separation)] = True
                taken[self._around(ends, 1 + self.separation)] = True  # the dots reach one further
            if len(curves) == 2 + self.distractors:
                break
        else:
            raise ValueError(f"{2 + self.distractors} curves of {self.curve_length} steps do not fit apart in a "
                             f"{self.size} x {self.size} image: use fewer distractors, shorter curves or a "
                             f"larger size")
        image = np.zeros((self.size, self.size), np.uint8)
        for pix in curves:
            shown = self._dashed(pix)
            image[shown[:, 0], shown[:, 1]] = gen.integers(96, 192)
        dots = curves[0][[0, -1]] if label == 1 else np.stack([curves[0][0], curves[1][-1]])
        image[self._around(dots, 1)] = 255
        return image, label

    # ------------------------------------------------------------------ batches
    def example(self, split: str, index: int) -> Tuple[np.ndarray, int]:
        """Example ``index`` of a split (drawn from the seed [split, index] on first use,
        then kept: a run revisits its examples as LRA's fixed dataset does)."""
        cache = self._cache.setdefault(check_split(split), {})
        if index not in cache:
            cache[index] = self.draw([_SPLIT_TAG[split], int(index)])
        return cache[index]

    def batch(self, rng: RngLike, batch_size: int, split: str = "train"):
        """(ids (B, size^2) int64, mask (B, size^2) all True, labels (B,)): examples drawn
        uniformly from the split's ``examples`` (train and test never share a seed)."""
        rng, batch_size = as_generator(rng), check_int("batch_size", batch_size, 0)
        picks = rng.integers(self.examples[check_split(split)], size=batch_size)
        images, labels = zip(*(self.example(split, int(i)) for i in picks))
        ids = np.stack(images).reshape(batch_size, -1).astype(np.int64)
        return ids, np.ones(ids.shape, bool), np.array(labels, np.int64)
