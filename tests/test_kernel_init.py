"""The kernels' initialisation (bandwidth scale, flex_n's spread), the diagnostics that
make a noisy kernel visible, and the behaviour they exist for: flex_n's pair separates."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import flexformer as ff
from flexformer import diagnostics, distill, reference
from flexformer.registry import features
from flexformer.nn import EncoderClassifier
from flexformer.training import TrainConfig, checkpoint, load_model, train


# --------------------------------------------------------------- the draws

@pytest.mark.parametrize("scale", [1.0, 0.3])
def test_frequency_law_follows_scale(scale):
    d = 16
    w = ff.init.gaussian_frequencies(2, 4096, d, rng=0, scale=scale)
    assert w.var() == pytest.approx(scale ** 2 / math.sqrt(d), rel=0.03)
    assert ff.init.flex_s_omega(2, 4096, d, rng=0, scale=scale).var() == pytest.approx(w.var(), rel=1e-12)


def test_flex_n_pair_has_the_documented_correlation_and_tau():
    d, s, r = 16, 0.4, 0.5
    o1, o2, tau = ff.init.flex_n_params(2, 8192, d, rng=3, scale=s, spread=r, match_tau=True)
    for w in (o1, o2):  # each keeps the marginal law N(0, s^2 I / sqrt d)
        assert w.var() == pytest.approx(s * s / math.sqrt(d), rel=0.03)
    corr = (o1 * o2).mean() / np.sqrt(o1.var() * o2.var())
    assert corr == pytest.approx(1 - r * r, abs=0.02)
    sep = np.linalg.norm(o1 - o2) / np.linalg.norm(o1)
    assert sep == pytest.approx(math.sqrt(2) * r, rel=0.03)
    np.testing.assert_allclose(tau, np.log(2 * math.sqrt(d) / s ** 2))
    _, _, fixed = ff.init.flex_n_params(2, 4, d, rng=3, scale=s, match_tau=False)
    np.testing.assert_allclose(fixed, np.log(2 * math.sqrt(d)))
    _, _, default = ff.init.flex_n_params(2, 4, d, rng=3, scale=s)  # the default keeps tau fixed
    np.testing.assert_array_equal(default, fixed)


def test_symmetric_start_is_the_old_unbiased_estimate():
    H, m, d = 3, 5, 9
    o1, o2, tau = ff.init.flex_n_params(H, m, d, rng=7, symmetric=True)
    old = np.random.default_rng(7).standard_normal((H, m, d)) * d ** -0.25  # the earlier draw, literally
    np.testing.assert_array_equal(o1, old)
    np.testing.assert_array_equal(o2, old)
    np.testing.assert_allclose(tau, np.log(2 * math.sqrt(d)))
    z1, z2, _ = ff.init.flex_n_params(H, m, d, rng=7, spread=0.0)
    np.testing.assert_array_equal(z1, z2)


def _kernel_matrix(kind, q, k, params):
    fq, sq = features(kind, q, params)
    fk, sk = features(kind, k, params)
    return np.exp(sq[..., :, None] + sk[..., None, :]) * np.einsum("bhif,bhjf->bhij", fq, fk)


@pytest.mark.parametrize("match_tau", [True, False])
@pytest.mark.parametrize("scale,spread", [(1.0, 0.0), (0.3, 0.3), (0.5, 0.6)])
def test_flex_n_starts_near_the_documented_kernel(scale, spread, match_tau):
    """With many features the random kernel is its expectation:
    (exp(s^2 q.k / sqrt d) + exp(rho s^2 q.k / sqrt d)) / 2, rho = 1 - r^2, with matched tau;
    with tau fixed at log(2 sqrt d), that times exp((1 - s^2) (|q|^2 + |k|^2) / (2 sqrt d))."""
    d, m = 8, 60000
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 1, 5, d)) * 0.5
    k = rng.standard_normal((1, 1, 6, d)) * 0.5
    o1, o2, tau = ff.init.flex_n_params(1, m, d, rng=2, scale=scale, spread=spread, match_tau=match_tau)
    got = _kernel_matrix("flex_n", q, k, {"omega1": o1, "omega2": o2, "tau": tau})
    t = scale ** 2 * np.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(d)
    want = 0.5 * (np.exp(t) + np.exp((1 - spread ** 2) * t))
    if not match_tau:
        norms = (q * q).sum(-1)[..., :, None] + (k * k).sum(-1)[..., None, :]
        want = want * np.exp((1 - scale ** 2) * norms / (2 * math.sqrt(d)))
    np.testing.assert_allclose(ff.init.flex_n_expected_kernel(q, k, scale=scale, spread=spread, match_tau=match_tau),
                               want, rtol=1e-12)
    np.testing.assert_allclose(got, want, rtol=0.03)


def test_flex_s_start_is_softmax_at_the_scaled_temperature_times_a_key_weight():
    d, m, s = 8, 60000, 0.3
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 1, 4, d)) * 0.5
    k = rng.standard_normal((1, 1, 7, d)) * 0.5
    omega = ff.init.flex_s_omega(1, m, d, rng=5, scale=s)
    got = _kernel_matrix("flex_s", q, k, {"omega": omega})
    qn, kn = (q * q).sum(-1)[..., :, None], (k * k).sum(-1)[..., None, :]
    want = np.exp((1 - s * s) * (qn + kn) / (2 * math.sqrt(d))
                  + s * s * np.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(d))
    np.testing.assert_allclose(got, want, rtol=0.03)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "0.3"])
def test_bad_scale_is_refused(bad):
    with pytest.raises(ValueError, match="scale"):
        ff.init.flex_n_params(2, 4, 4, scale=bad)
    with pytest.raises(ValueError, match="scale"):
        ff.init.flex_s_omega(2, 4, 4, scale=bad)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), None])
def test_bad_spread_is_refused(bad):
    with pytest.raises(ValueError, match="spread"):
        ff.init.flex_n_params(2, 4, 4, spread=bad)


def test_registry_passes_its_options_and_refuses_others():
    p = ff.get_attention("flex_n").init(2, 8, rng=0, scale=0.5, spread=0.0)
    np.testing.assert_array_equal(p["omega1"], p["omega2"])
    with pytest.raises(ValueError, match="spread"):
        ff.get_attention("flex_s").init(2, 8, rng=0, spread=0.3)
    with pytest.raises(ValueError, match="no options"):
        ff.get_attention("softmax").init(2, 8, scale=0.3)
    # a model hands one dict to every kind; kinds ignore options they do not take
    for kind in ("softmax", "flex_s", "performer", "flex_n"):
        EncoderClassifier(16, 3, dim=16, heads=2, max_len=8, attention=kind, kernel_init={"scale": 0.4, "spread": 0.2})


# ---------------------------------------------------------------- diagnostics

def _qk(B=2, H=2, N=24, d=8, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, H, N, d)) * scale for _ in range(2))


@pytest.mark.parametrize("kind", ["flex_s", "flex_n", "performer", "hedgehog", "elu"])
@pytest.mark.parametrize("causal", [False, True])
def test_kernel_rows_match_the_kernels_output(kind, causal):
    """The diagnostics' NumPy rows, applied to v, give the C kernel's output."""
    q, k = _qk(seed=1, scale=0.6)
    v = np.random.default_rng(2).standard_normal(k.shape)
    params = ff.get_attention(kind).init(2, 8, rng=3)
    mask = np.ones((2, 24), bool)
    mask[1, 5:9] = False
    rows = diagnostics.kernel_rows(kind, q, k, params, causal=causal, key_mask=mask)
    out = ff.get_attention(kind).forward(q, k, v, params, causal=causal, key_mask=mask)
    np.testing.assert_allclose(np.einsum("bhij,bhje->bhie", rows, v), out, rtol=1e-9, atol=1e-12)


def test_diagnostics_refuse_what_the_kernels_refuse():
    """Row positions, masks, guards and kinds are checked by name (an out-of-range or
    float row was an IndexError, -1 counted from the end, a negative eps was used, and
    linformer got a message about its E's shape)."""
    q, k = _qk(N=6, d=4)
    params = ff.get_attention("flex_n").init(2, 4, rng=0)
    for rows, message in (([6], r"rows must lie in 0\.\.5 \(the query positions\), got 6\.\.6"),
                          ([-1], r"rows must lie in 0\.\.5"), ([1.5], r"rows must be a 1-d array of integer"),
                          ([[1]], r"rows must be a 1-d array of integer")):
        with pytest.raises(ValueError, match=message):
            diagnostics.kernel_rows("flex_n", q, k, params, rows=np.array(rows))
        with pytest.raises(ValueError, match=message):
            diagnostics.softmax_rows(q, k, 0.5, rows=np.array(rows))
    for call in (lambda m: diagnostics.kernel_rows("flex_n", q, k, params, key_mask=m),
                 lambda m: diagnostics.softmax_rows(q, k, 0.5, key_mask=m)):
        with pytest.raises(TypeError, match="key_mask must have dtype bool, got int64"):
            call(np.ones((2, 6), np.int64))
        with pytest.raises(ValueError, match=r"key_mask must have shape \(B, Nk\) = \(2, 6\) to match k, got \(2, 5\)"):
            call(np.ones((2, 5), bool))
    with pytest.raises(ValueError, match="eps must be a finite number > 0, got -1.0"):
        diagnostics.kernel_rows("flex_n", q, k, params, eps=-1.0)
    with pytest.raises(TypeError, match="causal must be a bool"):
        diagnostics.kernel_rows("flex_n", q, k, params, causal="yes")
    with pytest.raises(ValueError, match="kind must be one of .* got 'linformer'"):
        diagnostics.kernel_rows("linformer", q, k, ff.get_attention("linformer").init(2, 4, max_len=6))
    with pytest.raises(ValueError, match="params for flex_n need omega1, omega2, tau"):
        diagnostics.parameter_summary("flex_n", {})
    with pytest.raises(ValueError, match="head_dim must be an int >= 1, got 0"):
        diagnostics.nominal_scale("flex_n", params, 0)
    np.testing.assert_array_equal(diagnostics.kernel_rows("flex_n", q, k, params, rows=np.array([4, 1])),
                                  diagnostics.kernel_rows("flex_n", q, k, params)[:, :, [4, 1]])


def test_kernel_tv_is_zero_against_itself_and_large_for_noise():
    q, k = _qk(N=40, d=16, seed=5, scale=1.0)
    # many features, small scale, matched tau: the estimate is close to its softmax
    good = ff.get_attention("flex_n").init(2, 16, num_features=4096, rng=0, scale=0.3, spread=0.0, match_tau=True)
    d_good = diagnostics.layer_diagnostics("flex_n", q, k, good, rows=40)
    # few features at the old scale: noise, and rows on the guard
    bad = ff.get_attention("flex_n").init(2, 16, num_features=8, rng=0, symmetric=True)
    _, guard = ff.flex_n_attention(q, k, k, bad["omega1"], bad["omega2"], bad["tau"], return_guard_count=True)
    d_bad = diagnostics.layer_diagnostics("flex_n", q, k, bad, guard_count=guard, rows=40)
    assert max(d_good["kernel_tv"]) < 0.05
    assert min(d_bad["kernel_tv"]) > 0.3
    assert 0 < max(d_bad["guard_fraction"]) <= 1
    np.testing.assert_allclose(d_bad["guard_fraction"], guard.sum(0) / (2 * 40))
    assert d_good["separation"] == [0.0, 0.0]
    # softmax rows against the reference at the same temperature
    p = diagnostics.softmax_rows(q, k, 0.25)
    v = np.eye(40)[None, None].repeat(2, 0).repeat(2, 1)
    np.testing.assert_allclose(p, reference.softmax_attention(q, k, v, scale=0.25), rtol=1e-10, atol=1e-14)


def test_training_writes_diagnostics_without_changing_results(tmp_path):
    base = dict(dim=16, heads=2, depth=1, seq_len=32, batch_size=4, steps=6, eval_batches=2, threads=1)
    with_diag = train(TrainConfig(**base, diagnostics_every=2), str(tmp_path / "a"), progress=False)
    without = train(TrainConfig(**base, diagnostics_every=0), str(tmp_path / "b"), progress=False)
    assert with_diag["eval_loss"] == without["eval_loss"]
    lines = [json.loads(x) for x in open(tmp_path / "a" / "diagnostics.jsonl")]
    assert [r["step"] for r in lines] == [0, 2, 4, 5]
    layer = lines[0]["layers"][0]
    assert len(layer["guard_fraction"]) == 2 and len(layer["kernel_tv"]) == 2 and len(layer["separation"]) == 2
    assert with_diag["diagnostics"]["step"] == 5
    assert all(math.isfinite(r["eval_loss_after"]) for r in lines)  # a quick held-out loss after each update
    assert not (tmp_path / "b" / "diagnostics.jsonl").exists()


# ------------------------------------------------------- training behaviour

def _separation(model):
    out = []
    for name, p in model.parameters().items():
        if name.endswith("omega1"):
            o2 = model.parameters()[name[:-1] + "2"]
            out.append(np.linalg.norm(p - o2) / np.linalg.norm(p))
    return np.array(out)


def test_symmetric_pair_is_a_fixed_point_of_training(tmp_path):
    """With A = B the loss is symmetric in A and B: they get the same gradient and stay equal."""
    base = dict(dim=32, heads=2, depth=1, seq_len=48, batch_size=8, steps=30, eval_batches=1, threads=1,
                lr=3e-3, diagnostics_every=0, kernel_lr_scale=10.0)
    train(TrainConfig(**base, kernel_init_scale=1.0, kernel_init_spread=0.0), str(tmp_path / "sym"),
          progress=False)
    sym, _, _ = load_model(str(tmp_path / "sym"))
    assert _separation(sym).tolist() == [0.0]
    train(TrainConfig(**base, kernel_init_spread=0.1), str(tmp_path / "spread"), progress=False)
    moved, _, _ = load_model(str(tmp_path / "spread"))
    start = EncoderClassifier(16, 10, dim=32, heads=2, depth=1, max_len=48, rng=0,
                              kernel_init=TrainConfig(**base, kernel_init_spread=0.1).kernel_init())
    assert _separation(moved)[0] != _separation(start)[0]


def _adam_fit(q, k, teacher, params, steps, lr):
    p = {n: v.copy() for n, v in params.items()}
    m1 = {n: np.zeros_like(v) for n, v in p.items()}
    m2 = {n: np.zeros_like(v) for n, v in p.items()}
    for t in range(1, steps + 1):
        loss, _, g = distill.distill_loss("flex_n", q, k, p, teacher=teacher)
        for n in p:
            m1[n] = 0.9 * m1[n] + 0.1 * g[n]
            m2[n] = 0.999 * m2[n] + 0.001 * g[n] ** 2
            p[n] -= lr * (m1[n] / (1 - 0.9 ** t)) / (np.sqrt(m2[n] / (1 - 0.999 ** t)) + 1e-8)
    return p, loss


def test_spread_pair_separates_towards_a_nonstationary_kernel():
    """Teacher rows softmax(q.(R k) / sqrt d) with a rotation R: no stationary kernel of
    q - k gives them, the cross terms cos(a.x - b.y) with b != a can. From the default
    (spread) start the pair moves far apart and fits better; from A = B it cannot move."""
    rng = np.random.default_rng(0)
    S, H, N, d = 16, 1, 32, 8
    q, k = (rng.standard_normal((S, H, N, d)) * 0.8 for _ in range(2))
    R, _ = np.linalg.qr(rng.standard_normal((d, d)))
    teacher = distill.teacher_rows(q, k @ R.T)
    spread = ff.get_attention("flex_n").init(H, d, num_features=32, rng=1, spread=0.1)
    sym = ff.get_attention("flex_n").init(H, d, num_features=32, rng=1, symmetric=True)
    fitted, loss = _adam_fit(q, k, teacher, spread, steps=300, lr=3e-2)
    fitted_sym, loss_sym = _adam_fit(q, k, teacher, sym, steps=300, lr=3e-2)
    sep = lambda p: np.linalg.norm(p["omega1"] - p["omega2"]) / np.linalg.norm(p["omega1"])
    assert sep(spread) < 0.2 and sep(fitted) > 1.0   # measured 0.165 -> 1.57
    assert sep(fitted_sym) == 0.0
    assert loss < loss_sym


def test_checkpoint_from_before_the_new_options_loads_with_its_initialisation(tmp_path):
    run = tmp_path / "old"
    train(TrainConfig(dim=16, heads=2, depth=1, seq_len=32, batch_size=4, steps=2, eval_batches=1,
                      kernel_init_scale=1.0, kernel_init_spread=0.0), str(run), progress=False)
    params, opt, meta = checkpoint.load(str(run / "checkpoint.npz"))
    for key in ("kernel_init_scale", "kernel_init_spread", "kernel_init_match_tau", "diagnostics_every",
                "kernel_lr_scale"):
        del meta["config"][key]  # what an earlier version wrote
    checkpoint.save(str(run / "checkpoint.npz"), params, opt, meta)
    model, cfg, _ = load_model(str(run))
    assert (cfg.kernel_init_scale, cfg.kernel_init_spread, cfg.kernel_init_match_tau) == (1.0, 0.0, True)
    for name, value in params.items():
        np.testing.assert_array_equal(model.parameters()[name], value)
    again = train(None, str(run), resume=True, steps=3, progress=False)
    assert again["steps"] == 3


@pytest.mark.parametrize("flag,value,word", [("--kernel-init-scale", "0", "scale"),
                                             ("--kernel-init-scale", "nan", "scale"),
                                             ("--kernel-init-spread", "-0.5", "spread"),
                                             ("--kernel-init-spread", "2", "spread"),
                                             ("--kernel-lr-scale", "-1", "kernel_lr_scale"),
                                             ("--diagnostics-every", "-1", "diagnostics_every")])
def test_command_line_refuses_bad_options_in_one_line(tmp_path, flag, value, word):
    proc = subprocess.run([sys.executable, "-m", "flexformer", "train", "--steps", "1", flag, value,
                           "--out", str(tmp_path / "run")], capture_output=True, text=True,
                          env=dict(os.environ, FLEXFORMER_NO_REEXEC="1"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert word in proc.stderr.strip().splitlines()[-1]


# ------------------------------------------------ the model options measured as levers

def _tiny_batch(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(7, size=(2, 9))
    mask = np.ones((2, 9), bool)
    mask[1, 6:] = False
    return ids, mask


def _model_gradient_report(model, ids, mask):
    """Finite-difference check of every parameter of a tiny classifier (float64)."""
    from flexformer.testing import check_cross_entropy_gradients

    return check_cross_entropy_gradients(model, (ids, mask), np.array([1, 2]))


@pytest.mark.parametrize("kind", ["flex_n", "flex_s", "softmax", "performer"])
def test_qk_norm_model_gradients(kind):
    ids, mask = _tiny_batch(0)
    model = EncoderClassifier(7, 3, dim=8, depth=2, heads=2, max_len=9, attention=kind, num_features=4,
                              qk_norm=True, eps=1e-3, rng=1, dtype=np.float64)
    report = _model_gradient_report(model, ids, mask)
    assert "backbone.blocks.0.attn.attn.qk_log_scale" in report  # checked like every other parameter
    # the normalised queries all have the learned length, sqrt(head size) at the start
    model.forward(ids, mask)
    np.testing.assert_allclose(np.linalg.norm(model.backbone.blocks[0].attn._q, axis=-1), 2.0, rtol=1e-12)


@pytest.mark.parametrize("kind", ["flex_s", "flex_n", "softmax"])
def test_learn_scale_model_gradients_and_start(kind):
    ids, mask = _tiny_batch(2)
    common = dict(dim=8, depth=2, heads=2, max_len=9, attention=kind, num_features=4, eps=1e-3, rng=1,
                  dtype=np.float64)
    model = EncoderClassifier(7, 3, learn_scale=True, **common)
    plain = EncoderClassifier(7, 3, **common)
    # g = 0 at the start: the same function as the model without the option
    np.testing.assert_array_equal(model.forward(ids, mask), plain.forward(ids, mask))
    for block in model.backbone.blocks:  # move g off 0 so the check sees its effect
        block.attn.qk_scale.value[:] = [0.3, -0.2]
    report = _model_gradient_report(model, ids, mask)
    assert "backbone.blocks.1.attn.attn.log_scale" in report
    with pytest.raises(ValueError, match="qk_norm and learn_scale are alternatives"):
        EncoderClassifier(7, 3, learn_scale=True, qk_norm=True, **common)


def test_learn_scale_decodes_like_the_parallel_model_and_is_refused_with_qk_norm(tmp_path):
    from flexformer.nn import CausalLM

    model = CausalLM(11, dim=16, depth=2, heads=2, max_len=32, attention="flex_s", learn_scale=True,
                     positional="sinusoidal", rng=3, dtype=np.float64)
    for block in model.backbone.blocks:
        block.attn.qk_scale.value[:] = [0.4, -0.3]
    ids = np.random.default_rng(1).integers(11, size=(1, 20))
    full = model.forward(ids)
    logits, cache = model.prefill(ids[:, :12])
    steps = [model.step(ids[:, i:i + 1], cache) for i in range(12, 20)]
    np.testing.assert_allclose(np.concatenate([logits] + steps, axis=1), full, rtol=1e-9, atol=1e-12)
    proc = subprocess.run([sys.executable, "-m", "flexformer", "train", "--learn-scale", "--qk-norm", "--out",
                           str(tmp_path / "r")], capture_output=True, text=True)
    assert proc.returncode == 2 and "alternatives" in proc.stderr.strip().splitlines()[-1]


def test_qk_norm_and_eps_decode_like_the_parallel_model():
    from flexformer.nn import CausalLM

    model = CausalLM(11, dim=16, depth=2, heads=2, max_len=32, attention="flex_n", qk_norm=True, eps=1e-2,
                     positional="sinusoidal", rng=3, dtype=np.float64)
    ids = np.random.default_rng(1).integers(11, size=(1, 20))
    full = model.forward(ids)
    logits, cache = model.prefill(ids[:, :12])
    steps = [model.step(ids[:, i:i + 1], cache) for i in range(12, 20)]
    np.testing.assert_allclose(np.concatenate([logits] + steps, axis=1), full, rtol=1e-9, atol=1e-12)


def test_eps_reaches_the_kernels():
    q, k = _qk(N=16, d=8, seed=3, scale=1.5)
    v = np.random.default_rng(4).standard_normal(k.shape)
    p = ff.get_attention("flex_n").init(2, 8, num_features=4, rng=0, symmetric=True)
    kind = ff.get_attention("flex_n")
    a = kind.forward(q, k, v, p, eps=0.2)
    np.testing.assert_array_equal(a, ff.flex_n_attention(q, k, v, p["omega1"], p["omega2"], p["tau"], eps=0.2))
    assert not np.array_equal(a, kind.forward(q, k, v, p))
    with pytest.raises(ValueError, match="eps"):
        ff.get_attention("softmax").forward(q, k, v, {}, eps=0.1)


def test_default_tau_start_shapes_attention_rows_where_matched_tau_is_nearly_flat():
    """Why the default tau is fixed (experiments/journal/results-log.md section 11): with tau matched to the
    bandwidth scale the start is softmax at temperature s^2 / sqrt d, rows nearly uniform
    (measured TV from uniform 0.04-0.05 on unit-variance queries and keys, d = 16); the fixed
    tau keeps Flexformer_s's key weight and rows start shaped (0.27-0.28)."""
    rng = np.random.default_rng(0)
    H, N, d, m = 2, 64, 16, 16
    q, k = (rng.standard_normal((1, H, N, d)) for _ in range(2))
    v = np.broadcast_to(np.eye(N), (1, H, N, N)).copy()  # the output rows are the attention rows

    def tv_from_uniform(match_tau, seed):
        o1, o2, tau = ff.init.flex_n_params(H, m, d, rng=seed, match_tau=match_tau)
        rows = ff.flex_n_attention(q, k, v, o1, o2, tau)
        np.testing.assert_allclose(rows.sum(-1), 1.0, rtol=1e-9)
        return 0.5 * np.abs(rows - 1.0 / N).sum(-1).mean()

    for seed in range(3):
        flat, shaped = tv_from_uniform(True, seed), tv_from_uniform(False, seed)
        assert flat < 0.08 and shaped > 0.2, (seed, flat, shaped)
    default = ff.init.flex_n_params(H, m, d, rng=0)
    np.testing.assert_array_equal(default[2], ff.init.flex_n_params(H, m, d, rng=0, match_tau=False)[2])


def test_expected_kernel_refuses_bad_input():
    q = np.zeros((2, 3))
    with pytest.raises(ValueError, match="same d"):
        ff.init.flex_n_expected_kernel(q, np.zeros((2, 4)))
    with pytest.raises(ValueError, match="same d"):
        ff.init.flex_n_expected_kernel(np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="scale"):
        ff.init.flex_n_expected_kernel(q, q, scale=0.0)
    with pytest.raises(ValueError, match="spread"):
        ff.init.flex_n_expected_kernel(q, q, spread=-1.0)
