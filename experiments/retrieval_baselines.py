"""Non-neural baselines on the retrieval task: is there a signal for any method to find?

The suite's retrieval task (flexformer.data.TextRetrieval) asks whether two byte windows
come from the same novel. Three baselines, each fitted on training pairs and scored on
held-out pairs drawn from the held-out tail of every novel, exactly as the trainer draws
them:

* ``cosine-n``: cosine similarity of the two windows' byte n-gram count vectors (n = 1, 2,
  3; n-grams hashed into 2^14 bins), one threshold chosen on the training pairs;
* ``logreg``: logistic regression on [|u - v|, u * v] of the two windows' byte frequency
  vectors (256 each: the mean of one-hot byte embeddings), L2-regularised, fitted by
  Newton steps;
* ``book-nb``: a naive Bayes classifier of the novel from hashed byte 3-grams, trained on
  the training part of each novel; a pair is called "same" when both windows get the same
  predicted novel (its per-window accuracy is printed too).

    python experiments/retrieval_baselines.py --data-dir ../shared/data/austen --seq-len 256 1024

Prints a markdown table of held-out accuracy (chance is 50%) per window length and seed.
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np

from flexformer.data import TextRetrieval

BINS = 1 << 14


def ngram_codes(ids: np.ndarray, n: int) -> np.ndarray:
    """The hashed byte n-grams of each row of ids (P, N): (P, N - n + 1) bins."""
    N = ids.shape[1]
    code = np.zeros((ids.shape[0], N - n + 1), np.int64)
    for j in range(n):
        code = code * 257 + ids[:, j: N - n + 1 + j]
    return (code * 2654435761) % BINS


def ngram_counts(ids: np.ndarray, n: int) -> np.ndarray:
    """(P, BINS) counts of each window's byte n-grams (hashed), ids (P, N)."""
    code = ngram_codes(ids, n)
    P = len(ids)
    flat = (np.arange(P)[:, None] * BINS + code).ravel()
    return np.bincount(flat, minlength=P * BINS).reshape(P, BINS).astype(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)


def best_threshold(score: np.ndarray, labels: np.ndarray) -> float:
    """The cut on ``score`` (above = same) with the best training accuracy."""
    order = np.sort(score)
    cuts = (order[1:] + order[:-1]) / 2
    cuts = cuts[:: max(1, len(cuts) // 400)]   # about 400 candidates
    acc = [((score > c) == labels).mean() for c in cuts]
    return float(cuts[int(np.argmax(acc))])


def logistic_regression(X: np.ndarray, y: np.ndarray, l2: float = 1e-2, steps: int = 25) -> np.ndarray:
    """Weights (with a bias last) by Newton's method on the L2-regularised log loss."""
    X = np.hstack([X, np.ones((len(X), 1))])
    w = np.zeros(X.shape[1])
    for _ in range(steps):
        p = 1 / (1 + np.exp(-X @ w))
        grad = X.T @ (p - y) / len(y) + l2 * np.r_[w[:-1], 0]
        hess = (X * (p * (1 - p))[:, None]).T @ X / len(y) + l2 * np.eye(len(w))
        w -= np.linalg.solve(hess, grad)
    return w


def predict(w: np.ndarray, X: np.ndarray) -> np.ndarray:
    return np.hstack([X, np.ones((len(X), 1))]) @ w > 0


def run(folder: str, seq_len: int, seed: int, pairs: int) -> dict:
    data = TextRetrieval(folder, seq_len=seq_len)
    rng = np.random.default_rng(seed)
    train_ids, _, train_y = data.batch(rng, pairs, "train")
    test_ids, _, test_y = data.batch(rng, pairs, "test")
    result = {}
    for n in (1, 2, 3):
        s_train = cosine(ngram_counts(train_ids[:, 0], n), ngram_counts(train_ids[:, 1], n))
        s_test = cosine(ngram_counts(test_ids[:, 0], n), ngram_counts(test_ids[:, 1], n))
        cut = best_threshold(s_train, train_y)
        result[f"cosine-{n}"] = float(((s_test > cut) == test_y).mean())

    def pair_features(ids):
        u = np.stack([np.bincount(w, minlength=256) for w in ids[:, 0]]) / seq_len
        v = np.stack([np.bincount(w, minlength=256) for w in ids[:, 1]]) / seq_len
        return np.hstack([np.abs(u - v), u * v]) * 10.0

    w = logistic_regression(pair_features(train_ids), train_y.astype(np.float64))
    result["logreg"] = float((predict(w, pair_features(test_ids)) == test_y).mean())

    # naive Bayes over the novels from hashed 3-grams of the training parts
    books = data._books
    counts = np.ones((len(books.train), BINS))            # add-one smoothing
    for c, part in enumerate(books.train):
        counts[c] += np.bincount(ngram_codes(part[None].astype(np.int64), 3)[0], minlength=BINS)
    log_p = np.log(counts / counts.sum(1, keepdims=True))

    def book_of(ids):
        return np.argmax(ngram_counts(ids, 3) @ log_p.T, axis=1)

    a, b = book_of(test_ids[:, 0]), book_of(test_ids[:, 1])
    result["book-nb"] = float(((a == b) == test_y).mean())
    # the per-window accuracy of the novel classifier on held-out windows of known novels
    crng = np.random.default_rng(seed + 1000)
    labels = crng.integers(len(books.test), size=pairs)
    wins = np.stack([books.test[c][s: s + seq_len] for c, s in
                     ((c, crng.integers(len(books.test[c]) - seq_len)) for c in labels)]).astype(np.int64)
    result["book-nb per window"] = float((book_of(wins) == labels).mean())
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", required=True, help="folder of plain-text novels (.txt)")
    p.add_argument("--seq-len", type=int, nargs="+", default=[256, 1024], help="window lengths (default 256 1024)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0 to N-1 (default 3)")
    p.add_argument("--pairs", type=int, default=2000, help="training pairs, and as many held-out (default 2000)")
    args = p.parse_args()
    rows = {}
    for seq_len in args.seq_len:
        for seed in range(args.seeds):
            for name, acc in run(args.data_dir, seq_len, seed, args.pairs).items():
                rows.setdefault((name, seq_len), []).append(acc)
    lens = args.seq_len
    print("| baseline | " + " | ".join(f"{n} bytes" for n in lens) + " |")
    print("|---|" + "---:|" * len(lens))
    for name in dict.fromkeys(k[0] for k in rows):
        cells = []
        for n in lens:
            accs = rows[(name, n)]
            spread = f" ± {statistics.stdev(accs) * 100:.1f}" if len(accs) > 1 else ""
            cells.append(f"{statistics.mean(accs) * 100:.1f}%{spread}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\nheld-out accuracy, mean ± std over {args.seeds} seeds, {args.pairs} training and {args.pairs} "
          f"held-out pairs each; chance 50% (per-window novel classification: chance 1 / the number of novels)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
