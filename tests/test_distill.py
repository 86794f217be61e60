"""Distillation: the loss against an independent loop, its gradients against finite
differences, non-positive kernels, and fitting a known softmax teacher."""
import os

import numpy as np
import pytest

import flexformer as ff
from flexformer import reference
from flexformer.distill import (DISTILL_KINDS, _soft_floor, attention_rows, distill_loss, evaluate, fit_kernels,
                                teacher_entropy, teacher_rows)
from flexformer.testing import numerical_gradient


def _data(S=3, H=2, N=7, d=4, seed=0, dtype=np.float64, scale=0.8):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((S, H, N, d)) * scale).astype(dtype)
    k = (rng.standard_normal((S, H, N, d)) * scale).astype(dtype)
    mask = rng.random((S, N)) < 0.8
    mask[:, 0] = True
    return q, k, mask


def _params(kind, H=2, d=4, m=5, seed=1, dtype=np.float64):
    p = ff.get_attention(kind).init(H, d, num_features=m, rng=seed, dtype=dtype)
    if kind == "flex_n":  # leave the A = B start for the general case
        rng = np.random.default_rng(seed)
        p["omega2"] = (p["omega2"] + 0.3 * rng.standard_normal(p["omega2"].shape)).astype(dtype)
        p["tau"] = (p["tau"] + 0.2 * rng.standard_normal(p["tau"].shape)).astype(dtype)
    return p


def _phi(kind, x, p):
    if kind == "flex_n":
        return reference.flex_n_phi(x, p["omega1"], p["omega2"], p["tau"])
    if kind in ("flex_s", "rfa"):
        return reference.flex_s_phi(x, p["omega"])
    if kind == "performer":
        return reference.performer_phi(x, p["omega"])
    if kind == "taylor":  # [1, x', vec(x' x'^T) / sqrt 2], x' = x / d^(1/4), written out
        xs = x / x.shape[-1] ** 0.25
        quad = (xs[..., :, None] * xs[..., None, :]).reshape(xs.shape[:-1] + (-1,)) / np.sqrt(2)
        return np.concatenate([np.ones(xs.shape[:-1] + (1,)), xs, quad], -1)
    if kind == "rebased":  # vec(y y^T), y = gamma LN(x) + beta, written out
        centred = x - x.mean(-1, keepdims=True)
        y = p["gamma"][:, None] * centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + 1e-5) \
            + p["beta"][:, None]
        return (y[..., :, None] * y[..., None, :]).reshape(y.shape[:-1] + (-1,))
    return reference.hedgehog_phi(x, p["W"])


def _teacher_row(qi, keys):
    """Softmax of q_i.k_j / sqrt d over the given keys, one dot at a time."""
    logits = np.array([qi @ kj for kj in keys]) / np.sqrt(qi.shape[-1])
    a = np.exp(logits - logits.max())
    return a / a.sum()


@pytest.mark.parametrize("kind", DISTILL_KINDS)
def test_loss_matches_a_plain_loop_over_rows(kind):
    """Independent twin: literal phi from flexformer.reference, loops over rows."""
    q, k, mask = _data()
    p = _params(kind)
    floor = 1e-6
    loss, per_head, _ = distill_loss(kind, q, k, p, mask, floor=floor, grad=False)
    pq, pk = _phi(kind, q, p), _phi(kind, k, p)
    S, H, N, d = q.shape
    want = np.zeros(H)
    for h in range(H):
        total, rows = 0.0, 0
        for s in range(S):
            keys = np.flatnonzero(mask[s])
            for i in keys:
                a = _teacher_row(q[s, h, i], k[s, h, keys])
                # kernel with the documented floor: exp(s_q + s_k) max(f.f, floor) = max(K, floor |phi_q||phi_k|)
                # for the trig maps (|f| = bound); for positive maps the floor is never reached here
                K = np.array([pq[s, h, i] @ pk[s, h, j] for j in keys])
                if kind in ("flex_n", "flex_s", "rfa"):
                    bq = np.exp((q[s, h, i] ** 2).sum() * (np.exp(-p["tau"][h]) if kind == "flex_n"
                                                           else 1 / (2 * np.sqrt(d))))
                    bk = np.array([np.exp((k[s, h, j] ** 2).sum() * (np.exp(-p["tau"][h]) if kind == "flex_n"
                                                                     else 1 / (2 * np.sqrt(d)))) for j in keys])
                    K = np.maximum(K, floor * bq * bk)
                b = K / K.sum()
                total += -(a * np.log(b)).sum()
                rows += 1
        want[h] = total / rows
    np.testing.assert_allclose(per_head, want, rtol=1e-10)
    assert loss == pytest.approx(want.mean(), rel=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", ["flex_n", "flex_s", "hedgehog"])
def test_gradients_match_finite_differences(kind, dtype):
    q, k, mask = _data(dtype=np.float64)
    p = _params(kind)
    floor = 1e-3  # some entries on each side of the floor
    _, _, grads = distill_loss(kind, q.astype(dtype), k.astype(dtype), {n: v.astype(dtype) for n, v in p.items()},
                               mask, floor=floor)
    assert set(grads) == set(ff.get_attention(kind).learnable)
    for name, g in grads.items():
        assert g.dtype == dtype and g.shape == p[name].shape

        pp = dict(p)
        pp[name] = p[name].copy()
        num = numerical_gradient(lambda: distill_loss(kind, q, k, pp, mask, floor=floor, grad=False)[0], pp[name])
        tol = 1e-7 if dtype == np.float64 else 2e-3
        assert np.abs(g - num).max() <= tol * max(np.abs(num).max(), 1e-3), name


def test_non_positive_kernel_rows_stay_finite():
    """Trig features with huge frequencies give kernels that are negative or zero for
    whole rows; the loss and gradients must stay finite."""
    q, k, mask = _data(N=12)
    p = _params("flex_s")
    p["omega"] = p["omega"] * 200.0
    p2 = _params("flex_n")
    p2["omega1"] = -p2["omega1"] * 50.0
    for kind, params in (("flex_s", p), ("flex_n", p2)):
        loss, per_head, grads = distill_loss(kind, q, k, params, mask)
        dot_rows = attention_rows(kind, q, k, params, mask)
        assert np.isfinite(loss) and np.isfinite(per_head).all()
        assert all(np.isfinite(g).all() for g in grads.values())
        assert (dot_rows[..., mask[0]] >= 0).all() and np.isfinite(dot_rows).all()
    # a fully masked sequence counts no rows and contributes nothing
    mask[1] = False
    assert np.isfinite(distill_loss("flex_n", q, k, p2, mask)[0])


def test_attention_rows_and_teacher_rows_are_distributions():
    q, k, mask = _data()
    a = teacher_rows(q, k, mask)
    b = attention_rows("hedgehog", q, k, _params("hedgehog"), mask)
    for rows in (a, b):
        np.testing.assert_allclose(rows.sum(-1), 1.0, rtol=1e-12)
        assert (rows[..., ~mask[0]][0] == 0).all()
    # the teacher equals the reference softmax attention applied to an identity of values
    eye = np.broadcast_to(np.eye(q.shape[2]), q.shape[:2] + (q.shape[2], q.shape[2]))
    np.testing.assert_allclose(a, reference.softmax_attention(q, k, eye, key_mask=mask), atol=1e-12)


def test_fit_recovers_a_known_softmax_kernel():
    """Teacher: exact softmax attention on Gaussian queries and keys (d=8, N=32). Fitting
    brings every learnable kind's held-out KL well below where it started: flex_n and
    flex_s from > 2 nats (negative trig kernels hit the floor) to < 0.35, Hedgehog from
    0.25 to < 0.2; Performer (nothing to learn) stays at its ~0.5."""
    rng = np.random.default_rng(0)
    H, N, d = 2, 32, 8
    train = (rng.standard_normal((64, H, N, d)), rng.standard_normal((64, H, N, d)), None)
    val = (rng.standard_normal((16, H, N, d)), rng.standard_normal((16, H, N, d)), None)
    ent = teacher_entropy(val[0], val[1])
    got = {}
    unbiased = {"flex_n": {"symmetric": True}, "flex_s": {"scale": 1.0}}  # the start this test is about
    for kind in ("flex_n", "flex_s", "hedgehog", "performer"):
        p = ff.get_attention(kind).init(H, d, num_features=16, rng=0, **unbiased.get(kind, {}))
        res = fit_kernels(kind, train, val, p, steps=200, lr=2e-2, batch_size=16, eval_every=20)
        got[kind] = (res.val_loss[0] - ent, res.best_val - ent)
        np.testing.assert_allclose(res.best_val, evaluate(kind, *val, res.params))
    assert (got["flex_n"][0] > 2).all() and (got["flex_n"][1] < 0.35).all()
    assert (got["flex_s"][0] > 2).all() and (got["flex_s"][1] < 0.4).all()
    assert (got["hedgehog"][1] < 0.2).all() and (got["hedgehog"][1] < got["hedgehog"][0]).all()
    assert (got["performer"][1] == got["performer"][0]).all()
    assert (got["flex_n"][1] < got["performer"][1]).all()  # learned beats the fixed positive features here
    # distillation's start (smaller bandwidth, spread pair, matched tau) begins far closer:
    # 0.36-0.38 nats here
    from flexformer.distill.experiment import DISTILL_INIT
    default = ff.get_attention("flex_n").init(H, d, num_features=16, rng=0, **DISTILL_INIT)
    assert (evaluate("flex_n", *val, default) - ent < 0.5).all()


def test_fit_early_stop_and_input_params_untouched():
    rng = np.random.default_rng(1)
    H, N, d = 1, 16, 4
    data = (rng.standard_normal((8, H, N, d)), rng.standard_normal((8, H, N, d)), None)
    p = ff.get_attention("flex_n").init(H, d, num_features=4, rng=0)
    before = {n: v.copy() for n, v in p.items()}
    res = fit_kernels("flex_n", data, data, p, steps=2000, lr=1e-6, eval_every=1, patience=2)
    assert res.stopped_early and res.steps < 2000
    for n in p:
        np.testing.assert_array_equal(p[n], before[n])


def test_bad_inputs():
    q, k, mask = _data()
    p = _params("flex_n")
    with pytest.raises(ValueError, match="kind must be one of"):
        distill_loss("softmax", q, k, p, mask)
    with pytest.raises(ValueError, match="missing tau"):
        distill_loss("flex_n", q, k, {"omega1": p["omega1"], "omega2": p["omega2"]}, mask)
    with pytest.raises(ValueError, match="4-d"):
        distill_loss("flex_n", q[0], k[0], p)
    with pytest.raises(ValueError, match="one shape and dtype"):
        distill_loss("flex_n", q, k[:, :, :3], p)
    with pytest.raises(TypeError, match="q must be float32 or float64"):
        distill_loss("flex_n", q.astype(int), k, p)
    with pytest.raises(ValueError, match=r"key_mask must be a bool array \(S, N\)"):
        distill_loss("flex_n", q, k, p, mask[:, :3])
    with pytest.raises(ValueError, match=r"omega1 must have shape \(H, m, d\) with H = 2, d = 3"):
        distill_loss("flex_n", q[..., :3], k[..., :3], p)
    with pytest.raises(ValueError, match="must be finite"):
        distill_loss("flex_n", q, k, dict(p, tau=p["tau"] * np.nan))
    with pytest.raises(ValueError, match="teacher must have shape"):
        distill_loss("flex_n", q, k, p, teacher=np.zeros((1, 2, 3, 3)))
    with pytest.raises(ValueError, match="steps must be an int >= 0"):
        fit_kernels("flex_n", (q, k, mask), (q, k, mask), p, steps=-1)
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        fit_kernels("flex_n", (q, k, mask), (q, k, mask), p, lr=0.0)
    with pytest.raises(TypeError, match="lr must be a float, got str"):
        fit_kernels("flex_n", (q, k, mask), (q, k, mask), p, lr="1e-3")
    with pytest.raises(ValueError, match=r"train must be a tuple \(q, k, key_mask\), key_mask None for none, "
                                         r"got tuple of 2"):
        fit_kernels("flex_n", (q, k), (q, k, mask), p)
    with pytest.raises(ValueError, match=r"q must be 4-d \(S, H, N, d\)"):
        teacher_rows(q[0], k)
    with pytest.raises(ValueError, match="q and k must have one shape and dtype"):
        teacher_entropy(q, k[..., :2])


# ------------------------------------------------------------ the BERT teacher


def test_numpy_bert_matches_transformers_on_a_tiny_random_model():
    """The extractor's encoder against Hugging Face's BertModel (random weights, BERT
    shape: 2 layers, 4 heads of 8); queries and keys against the model's own projections."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from flexformer.distill.bert import BertWeights, encode, kernel_attention_fn, sentence_embeddings

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=40)
    model = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    ids = np.random.default_rng(0).integers(0, 50, (3, 12))
    mask = np.ones((3, 12), bool)
    mask[1, 8:] = False
    mask[2, 5:] = False
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask.astype(np.int64)))
        ref_hidden = ref.last_hidden_state.double().numpy()
    W = BertWeights.from_torch(model)
    hidden, cap = encode(W, ids, mask, capture=True)
    assert len(cap) == 2 and cap[0][0].shape == (3, 4, 12, 8)
    np.testing.assert_allclose(hidden[mask], ref_hidden[mask], atol=2e-5)
    with torch.no_grad():  # layer 0's queries straight from the module
        x0 = model.embeddings(input_ids=torch.tensor(ids)).double()
        q0 = model.encoder.layer[0].attention.self.query.double()(x0).numpy()
    np.testing.assert_allclose(cap[0][0].transpose(0, 2, 1, 3).reshape(3, 12, 32), q0, atol=1e-5)  # embeddings in float32
    emb = sentence_embeddings(hidden, mask)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=-1), 1.0, rtol=1e-12)
    # swapping in a kernel changes the output; a Hedgehog kernel gives finite embeddings
    params = [ff.get_attention("hedgehog").init(4, 8, rng=i) for i in range(2)]
    swapped = sentence_embeddings(encode(W, ids, mask, attention=kernel_attention_fn("hedgehog", params)), mask)
    assert np.isfinite(swapped).all() and 0.0 < (swapped * emb).sum(-1).min() < 1.0


def test_sentence_splitting_and_novel_splits(tmp_path):
    from flexformer.distill.bert import read_sentences, split_sentences
    from flexformer.distill.experiment import novel_splits

    text = 'It was late.  "Come in!" said she. Mr. Knightley smiled;\nhe said nothing? Yes. End of it all here.'
    assert split_sentences(text) == ["It was late.", '"Come in!" said she.', "Mr. Knightley smiled; he said nothing?",
                                     "Yes.", "End of it all here."]
    for name in ("a.txt", "b.txt", "c.txt", "d.txt"):
        (tmp_path / name).write_text("One two three four five six. Short one. " * 3)
    splits = novel_splits(str(tmp_path))
    assert [os.path.basename(f) for f in splits["train"]] == ["a.txt", "b.txt"]
    assert [os.path.basename(f) for f in splits["val"] + splits["test"]] == ["c.txt", "d.txt"]
    assert read_sentences(splits["test"]) == ["One two three four five six."] * 3
    few = tmp_path / "few"
    few.mkdir()
    for name in ("a.txt", "b.txt"):
        (few / name).write_text("x")
    with pytest.raises(ValueError, match="at least three"):
        novel_splits(str(few))


def _soft_loss_loop(kind, q, k, p, mask, eps):
    """Independent twin of the soft-floor loss: per row, b_j = exp(s_k) g(f_q.f_k) / sum, with
    g(x) = (x + sqrt(x^2 + 4 eps^2)) / 2 written out on the literal phi split into bound and f."""
    S, H, N, d = q.shape
    pq, pk = _phi(kind, q, p), _phi(kind, k, p)
    want = np.zeros(H)
    for h in range(H):
        total, rows = 0.0, 0
        norm = (lambda x: np.exp((x ** 2).sum() * np.exp(-p["tau"][h]))) if kind == "flex_n" else \
            (lambda x: np.exp((x ** 2).sum() / (2 * np.sqrt(d))))
        for s in range(S):
            keys = np.flatnonzero(mask[s])
            for i in keys:
                a = _teacher_row(q[s, h, i], k[s, h, keys])
                bk = np.array([norm(k[s, h, j]) for j in keys])
                x = np.array([pq[s, h, i] @ pk[s, h, j] for j in keys]) / (norm(q[s, h, i]) * bk)
                w = bk * (x + np.sqrt(x * x + 4 * eps * eps)) / 2
                total += -(a * np.log(w / w.sum())).sum()
                rows += 1
        want[h] = total / rows
    return want


@pytest.mark.parametrize("kind", ["flex_n", "flex_s"])
def test_soft_floor_loss_matches_a_loop_and_its_gradients_finite_differences(kind):
    q, k, mask = _data(N=9)
    p = _params(kind)
    p = {n: (v * (3.0 if n.startswith("omega") else 1.0)) for n, v in p.items()}  # some f.f below zero
    eps = 1e-2
    fq = _phi(kind, q, p)
    assert (np.einsum("shid,shjd->shij", fq, _phi(kind, k, p)) < 0).any()
    loss, per_head, grads = distill_loss(kind, q, k, p, mask, soft_floor=eps)
    np.testing.assert_allclose(per_head, _soft_loss_loop(kind, q, k, p, mask, eps), rtol=1e-10)
    for name, g in grads.items():
        pp = dict(p)
        pp[name] = p[name].copy()
        num = numerical_gradient(lambda: distill_loss(kind, q, k, pp, mask, soft_floor=eps, grad=False)[0], pp[name])
        assert np.abs(g - num).max() <= 1e-7 * max(np.abs(num).max(), 1e-3), name


def test_soft_floor_lifts_entries_the_hard_floor_leaves_without_gradient():
    """A kernel whose f.f is negative on the keys the teacher attends to: under the hard floor
    omega gets no gradient from those entries; the soft floor's gradient step raises them."""
    q, k, mask = _data(N=9, seed=3)
    p = _params("flex_s")
    p["omega"] = p["omega"] * 4.0
    for eps in (1e-3, 1e-4):  # the float32 form stays finite and positive far below zero
        g, _ = _soft_floor(np.array([-1.0, -1e-3, 0.0, 1e-3, 1.0], np.float32), eps)
        assert (g > 0).all() and np.isfinite(g).all()
        assert g[-1] == pytest.approx(1.0, rel=1e-6) and g[0] == pytest.approx(eps * eps, rel=1e-3)
    hard = distill_loss("flex_s", q, k, p, mask, grad=False)[0]
    stepped = {}
    for sf in (None, 1e-3):
        _, _, grads = distill_loss("flex_s", q, k, p, mask, soft_floor=sf)
        stepped[sf] = distill_loss("flex_s", q, k, {"omega": p["omega"] - 0.5 * grads["omega"]}, mask, grad=False)[0]
    assert stepped[1e-3] < hard  # the hard-floor loss itself goes down under the soft step


def test_soft_floor_bad_values():
    q, k, mask = _data()
    p = _params("flex_n")
    for bad in (0.0, -1e-3, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="soft_floor must be None or a finite number > 0"):
            distill_loss("flex_n", q, k, p, mask, soft_floor=bad)
        with pytest.raises(ValueError, match="soft_floor must be None or a finite number > 0"):
            fit_kernels("flex_n", (q, k, mask), (q, k, mask), p, steps=1, soft_floor=bad)


def test_decay_follows_a_cosine_to_a_tenth_of_lr():
    """fit_kernels(decay=True) against Adam written out here, with the rate of step t
    (from 0) lr (0.1 + 0.9 (1 + cos(pi t / T)) / 2); every step uses all sequences, so the
    batches are the data in some order and the losses agree to rounding."""
    q, k, mask = _data(S=4, N=6)
    p = _params("flex_n")
    T, lr = 6, 0.05
    res = fit_kernels("flex_n", (q, k, mask), (q, k, mask), p, steps=T, lr=lr, batch_size=4, eval_every=T,
                      decay=True)
    want = {n: v.copy() for n, v in p.items()}
    m = {n: np.zeros_like(v) for n, v in want.items()}
    s = {n: np.zeros_like(v) for n, v in want.items()}
    for t in range(T):
        _, _, grads = distill_loss("flex_n", q, k, want, mask)
        rate = lr * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * t / T)))
        for n, g in grads.items():
            m[n] = 0.9 * m[n] + 0.1 * g
            s[n] = 0.999 * s[n] + 0.001 * g * g
            want[n] = want[n] - rate * (m[n] / (1 - 0.9 ** (t + 1))) / (np.sqrt(s[n] / (1 - 0.999 ** (t + 1))) + 1e-8)
    assert res.steps == T and (res.best_val < res.val_loss[0]).all()  # the final step is the best
    for n in p:
        np.testing.assert_allclose(res.params[n], want[n], rtol=1e-9, atol=1e-12)
    # the same fit at a constant rate ends elsewhere, so the schedule is what was checked
    flat = fit_kernels("flex_n", (q, k, mask), (q, k, mask), p, steps=T, lr=lr, batch_size=4, eval_every=T)
    assert np.abs(flat.params["omega1"] - want["omega1"]).max() > 1e-4
    with pytest.raises(ValueError, match="decay must be a bool"):
        fit_kernels("flex_n", (q, k, mask), (q, k, mask), p, steps=1, decay="cosine")
    with pytest.raises(ValueError, match="seed must be an int >= 0, got -1"):  # was NumPy's unnamed message
        fit_kernels("flex_n", (q, k, mask), (q, k, mask), p, steps=1, seed=-1)


def test_distill_command_defaults_are_the_experiments():
    """`python -m flexformer distill` starts as the experiment does (DISTILL_INIT, the
    cosine rate), while `train` keeps the training start; flags override."""
    from flexformer.__main__ import build_parser
    from flexformer.distill.experiment import DISTILL_DECAY, DISTILL_INIT
    from flexformer.init import DEFAULT_SCALE

    args = build_parser().parse_args(["distill", "--data-dir", "x"])
    assert args.kernel_init_scale == DISTILL_INIT["scale"] != DEFAULT_SCALE
    assert args.kernel_init_match_tau is DISTILL_INIT["match_tau"]
    assert args.lr_schedule == ("cosine" if DISTILL_DECAY else "constant")
    assert build_parser().parse_args(["train"]).kernel_init_scale == DEFAULT_SCALE
    args = build_parser().parse_args(["distill", "--data-dir", "x", "--kernel-init-scale", "0.3",
                                      "--lr-schedule", "constant"])
    assert args.kernel_init_scale == 0.3 and args.lr_schedule == "constant"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["distill", "--data-dir", "x", "--lr-schedule", "linear"])
