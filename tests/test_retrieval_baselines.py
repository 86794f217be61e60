"""experiments/retrieval_baselines.py on books whose identity is obvious: the novel
classifier must find it, and every score is an accuracy."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "experiments"))
import retrieval_baselines  # noqa: E402


def test_baselines_find_obvious_books_and_score_accuracies(tmp_path):
    rng = np.random.default_rng(0)
    for name, alphabet in [("a.txt", "abcdefgh "), ("b.txt", "stuvwxyz "), ("c.txt", "ABCDEFGH ")]:
        text = "".join(rng.choice(list(alphabet), size=20000))
        (tmp_path / name).write_text(text)
    result = retrieval_baselines.run(str(tmp_path), seq_len=64, seed=0, pairs=200)
    assert set(result) == {"cosine-1", "cosine-2", "cosine-3", "logreg", "book-nb",
                           "book-nb per window"}
    assert all(0.0 <= acc <= 1.0 for acc in result.values())
    # disjoint alphabets: the novel of a window, and so the pair's answer, is certain
    assert result["book-nb per window"] == 1.0 and result["book-nb"] == 1.0
    # and so is the unigram comparison
    assert result["cosine-1"] == 1.0
