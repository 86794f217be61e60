"""The Pathfinder generator: labels checked by an independent connectivity test on the
image alone, determinism, splits, and bad arguments."""
from collections import deque

import numpy as np
import pytest

from flexformer.data.pathfinder import Pathfinder


def dots_joined(image: np.ndarray, reach: int) -> bool:
    """Breadth-first search over the non-zero pixels, neighbours within Chebyshev distance
    ``reach`` (bridging the dash gaps), from one dot (value-255 pixels) to the other."""
    on = image > 0
    dot = np.argwhere(image == 255)
    assert len(dot) >= 2
    # the two dots are the two groups of 255-pixels (3 x 3 squares, possibly clipped)
    first = tuple(dot[0])
    group = {tuple(p) for p in dot if np.abs(p - dot[0]).max() <= 2}
    other = {tuple(p) for p in dot} - group
    assert other, "both dots must be visible and apart"
    seen = {first}
    todo = deque([first])
    n = image.shape[0]
    while todo:
        r, c = todo.popleft()
        if (r, c) in other:
            return True
        for dr in range(-reach, reach + 1):
            for dc in range(-reach, reach + 1):
                rr, cc = r + dr, c + dc
                if 0 <= rr < n and 0 <= cc < n and on[rr, cc] and (rr, cc) not in seen:
                    seen.add((rr, cc))
                    todo.append((rr, cc))
    return False


@pytest.mark.parametrize("size,kw", [(16, {}), (32, {}), (32, {"gap": 2, "distractors": 3}),
                                     (24, {"curve_length": 12, "dash": 1})])
def test_labels_agree_with_an_independent_connectivity_test(size, kw):
    pf = Pathfinder(size, **kw)
    labels = []
    for seed in range(120):
        image, label = pf.draw(seed)
        assert image.shape == (size, size) and image.dtype == np.uint8
        assert dots_joined(image, pf.gap + 1) == bool(label), seed
        labels.append(label)
    assert 0.35 < np.mean(labels) < 0.65  # both classes, roughly balanced


def test_deterministic_per_seed_and_splits_differ():
    pf = Pathfinder(16)
    a, la = pf.draw([0, 7])
    b, lb = pf.draw([0, 7])
    np.testing.assert_array_equal(a, b)
    assert la == lb
    ids, mask, labels = pf.batch(np.random.default_rng(3), 8)
    ids2, _, labels2 = pf.batch(np.random.default_rng(3), 8)
    np.testing.assert_array_equal(ids, ids2)
    np.testing.assert_array_equal(labels, labels2)
    assert ids.shape == (8, 256) and mask.all() and ids.max() <= 255
    test_ids, _, _ = pf.batch(np.random.default_rng(3), 8, "test")
    assert not np.array_equal(ids, test_ids)
    # the same example index in the two splits is two different images
    assert not np.array_equal(pf.example("train", 5)[0], pf.example("test", 5)[0])
    np.testing.assert_array_equal(pf.example("train", 5)[0], Pathfinder(16).example("train", 5)[0])


def test_images_carry_the_same_number_of_curves_in_both_classes():
    pf = Pathfinder(32)
    grey = {0: [], 1: []}
    for seed in range(60):
        image, label = pf.draw(seed)
        grey[label].append(np.count_nonzero((image > 0) & (image < 255)))
    # similar ink in both classes: the pixel count alone does not give the label away
    assert abs(np.mean(grey[0]) - np.mean(grey[1])) < 0.15 * np.mean(grey[1])


@pytest.mark.parametrize("kw,match", [({"size": 8}, "size must be an int >= 16"),
                                      ({"curve_length": 1}, "curve_length must be an int >= 2"),
                                      ({"curve_length": 1000}, "curve_length must be at most"),
                                      ({"distractors": -1}, "distractors must be an int >= 0"),
                                      ({"dash": 0}, "dash must be an int >= 1"),
                                      ({"gap": 1.5}, "gap must be an int >= 0"),
                                      ({"turn": float("nan")}, "turn must be a finite number"),
                                      ({"train_examples": 0}, "train_examples must be an int >= 1")])
def test_bad_arguments_name_themselves(kw, match):
    args = dict(size=16)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        Pathfinder(**args)


def test_knobs_that_cannot_fit_are_refused_at_construction():
    with pytest.raises(ValueError, match="4 curves of 30 steps do not fit apart in a 24 x 24 image"):
        Pathfinder(24, curve_length=30)


def test_bad_split():
    with pytest.raises(ValueError, match="split must be 'train' or 'test'"):
        Pathfinder(16).batch(np.random.default_rng(0), 2, "valid")
