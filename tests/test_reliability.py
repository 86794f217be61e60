"""Reliability: property-based parity over every kernel, invalid inputs in a subprocess,
memory flat over many calls, long sequences, and checkpoints killed mid-write."""
import re
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import flexformer as ff  # noqa: E402
from flexformer import _C  # noqa: E402
from flexformer import reference as ref  # noqa: E402

from conftest import layout  # noqa: E402

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def problems(draw, causal_ok=True):
    B = draw(st.integers(1, 2))
    H = draw(st.integers(1, 3))
    N = draw(st.integers(1, 140))
    Nk = N if draw(st.booleans()) else draw(st.integers(1, 140))
    causal = causal_ok and Nk == N and draw(st.booleans())
    d = draw(st.integers(1, 6))
    e = draw(st.integers(1, 5))
    m = draw(st.integers(1, 6))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    how = draw(st.sampled_from(["c", "fortran", "strided", "readonly"]))
    mask_kind = draw(st.sampled_from(["none", "random", "all", "nothing"]))
    seed = draw(st.integers(0, 2 ** 31))
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, N, d)) * 0.5
    k = rng.standard_normal((B, H, Nk, d)) * 0.5
    v = rng.standard_normal((B, H, Nk, e))
    mask = {"none": None, "random": rng.random((B, Nk)) < 0.6, "all": np.ones((B, Nk), bool),
            "nothing": np.zeros((B, Nk), bool)}[mask_kind]
    return dict(q=q, k=k, v=v, mask=mask, causal=causal, m=m, dtype=dtype, how=how, rng=rng)


def check(got, want, dtype):
    tol = 1e-9 if dtype == np.float64 else 2e-3
    assert got.dtype == dtype and got.shape == want.shape
    assert np.isfinite(got).all()
    scale = max(np.max(np.abs(want)) if want.size else 0.0, 1.0)
    assert np.max(np.abs(got - want)) <= tol * scale if want.size else True


def check_grads(grads, like):
    for g, x in zip(grads, like):
        assert g.shape == x.shape and g.dtype == x.dtype and np.isfinite(g).all()


def cast(p, *arrays):
    return [layout(np.asarray(a, dtype=p["dtype"]), p["how"]) for a in arrays]


@SETTINGS
@given(problems())
def test_flex_kernels_any_valid_shape(p):
    H, d, m = p["q"].shape[1], p["q"].shape[3], p["m"]
    omega = ff.init.flex_s_omega(H, m, d, rng=p["rng"])
    o1, o2, tau = ff.init.flex_n_params(H, m, d, rng=p["rng"])
    o2 = o2 + 0.2
    q, k, v, om, a, b, t = cast(p, p["q"], p["k"], p["v"], omega, o1, o2, tau)
    kw = dict(causal=p["causal"], key_mask=p["mask"])
    check(ff.flex_s_attention(q, k, v, om, **kw), ref.flex_s_attention(q, k, v, om, **kw), p["dtype"])
    check(ff.flex_n_attention(q, k, v, a, b, t, **kw), ref.flex_n_attention(q, k, v, a, b, t, **kw), p["dtype"])
    do = np.ones(q.shape[:3] + (v.shape[3],), p["dtype"])
    check_grads(ff.flex_n_attention_backward(do, q, k, v, a, b, t, **kw), (q, k, v, a, b, t))
    check_grads(ff.flex_s_attention_backward(do, q, k, v, om, **kw), (q, k, v, om))


@SETTINGS
@given(problems())
def test_baseline_kernels_any_valid_shape(p):
    H, d, m = p["q"].shape[1], p["q"].shape[3], p["m"]
    q, k, v = cast(p, p["q"], p["k"], p["v"])
    kw = dict(causal=p["causal"], key_mask=p["mask"])
    W = layout(ff.init.hedgehog_weights(H, d, m, rng=p["rng"], dtype=p["dtype"]), p["how"])
    check(ff.hedgehog_attention(q, k, v, W, **kw), ref.hedgehog_attention(q, k, v, W, **kw), p["dtype"])
    do = np.ones(q.shape[:3] + (v.shape[3],), p["dtype"])
    check_grads(ff.hedgehog_attention_backward(do, q, k, v, W, **kw), (q, k, v, W))
    check_grads(ff.softmax_attention_backward(do, q, k, v, **kw), (q, k, v))
    om = layout(ff.init.performer_omega(H, m, d, rng=p["rng"], dtype=p["dtype"]), p["how"])
    check(ff.performer_attention(q, k, v, om, **kw), ref.performer_attention(q, k, v, om, **kw), p["dtype"])
    check_grads(ff.performer_attention_backward(do, q, k, v, om, **kw), (q, k, v))
    check(ff.softmax_attention(q, k, v, **kw), ref.softmax_attention(q, k, v, **kw), p["dtype"])
    pq, pk = (np.abs(x) + 0.1 for x in (q, k))
    check(ff.linear_attention(pq, pk, v, **kw), ref.linear_attention(pq, pk, v, **kw), p["dtype"])
    check_grads(ff.linear_attention_backward(do, pq, pk, v, **kw), (pq, pk, v))
    if not p["causal"]:
        E = layout(ff.init.linformer_projections(m, k.shape[2] + 3, rng=p["rng"], dtype=p["dtype"]), p["how"])
        check(ff.linformer_attention(q, k, v, E, E, key_mask=p["mask"]),
              ref.linformer_attention(q, k, v, E, E, key_mask=p["mask"]), p["dtype"])
        check_grads(ff.linformer_attention_backward(do, q, k, v, E, E, key_mask=p["mask"]), (q, k, v, E, E))


BAD_INPUTS = r"""
import numpy as np, flexformer as ff
rng = np.random.default_rng(int(__import__("sys").argv[1]))
good = lambda *s: rng.standard_normal(s)
calls = []
q, k, v, om = good(1, 2, 5, 3), good(1, 2, 5, 3), good(1, 2, 5, 4), good(2, 4, 3)
bad_values = [None, "text", 3.0, [[1, 2]], np.array([object()] * 3), np.zeros(0), np.zeros((2, 2, 2, 2, 2)),
              good(1, 2, 5), good(2, 2, 5, 3), good(1, 3, 5, 3), good(1, 2, 5, 7), q.astype(np.int32),
              q.astype(np.complex64), q.astype(np.float16), np.full((1, 2, 5, 3), np.nan),
              np.broadcast_to(np.float64(1), (1 << 20, 1 << 20, 1 << 10, 3))]
fns = [lambda x, i: ff.flex_s_attention(*[x if j == i else a for j, a in enumerate((q, k, v, om))]),
       lambda x, i: ff.performer_attention(*[x if j == i else a for j, a in enumerate((q, k, v, om))]),
       lambda x, i: ff.softmax_attention(*[x if j == i else a for j, a in enumerate((q, k, v))]),
       lambda x, i: ff.hedgehog_attention(*[x if j == i else a for j, a in enumerate((q, k, v, good(2, 3, 4)))]),
       lambda x, i: ff.linformer_attention(*[x if j == i else a for j, a in enumerate((q, k, v, good(2, 5), good(2, 5)))]),
       # the key state: any value in its place, including arrays of the wrong shape or dtype
       lambda x, i: ff.flex_s_attention_backward(good(1, 2, 5, 4), q, k, v, om, key_state=x),
       lambda x, i: ff.hedgehog_attention_backward(good(1, 2, 5, 4), q, k, v, good(2, 3, 4), key_state=x),
       lambda x, i: ff.flex_s_attention(q, k, v, om, return_key_state=x)]
raised = 0
for trial in range(300):
    fn = fns[rng.integers(len(fns))]
    x = bad_values[rng.integers(len(bad_values))]
    try:
        fn(x, int(rng.integers(4)))
    except (TypeError, ValueError, MemoryError):
        raised += 1
print("survived", raised)
"""


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_invalid_inputs_raise_in_a_subprocess(seed):
    # a crash would kill the child, not the test run; the child must finish every trial
    out = subprocess.run([sys.executable, "-c", BAD_INPUTS, str(seed)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "survived" in out.stdout


def test_memory_flat_over_many_calls_including_raising_ones():
    code = textwrap.dedent("""
        import numpy as np, flexformer as ff
        def rss():
            return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20
        rng = np.random.default_rng(0)
        q = rng.standard_normal((2, 2, 70, 4)); v = rng.standard_normal((2, 2, 70, 3))
        om = ff.init.flex_s_omega(2, 4, 4, rng=1); o1, o2, tau = ff.init.flex_n_params(2, 4, 4, rng=2)
        W = ff.init.hedgehog_weights(2, 4); E = ff.init.linformer_projections(4, 70, rng=3)
        mask = rng.random((2, 70)) < 0.7; do = np.ones((2, 2, 70, 3))
        def round_():
            ff.flex_s_attention_backward(do, q, q, v, om, causal=True, key_mask=mask)
            ff.flex_n_attention_backward(do, q, q, v, o1, o2, tau, key_mask=mask)
            ff.performer_attention_backward(do, q, q, v, om, causal=True)
            ff.hedgehog_attention_backward(do, q, q, v, W, key_mask=mask)
            ff.linear_attention_backward(do, np.abs(q), np.abs(q), v)
            ff.softmax_attention_backward(do, q, q, v, causal=True)
            ff.linformer_attention_backward(do, q, q, v, E, E, key_mask=mask)
            for bad in (lambda: ff.flex_n_attention(q, q, v, o1, o2, tau[:1]),
                        lambda: ff.softmax_attention(q, q, v[:, :1]),
                        lambda: ff.linformer_attention(q, q, v, E, E, causal=True)):
                try:
                    bad()
                except ValueError:
                    pass
        for _ in range(300):
            round_()
        start = rss()
        for _ in range(3000):
            round_()
        print(rss() - start)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip()) < 8.0  # MiB grown over 3000 rounds of every entry point


def test_sequence_of_65536_tokens_float32_matches_float64():
    rng = np.random.default_rng(5)
    N = 65536
    q, k = (rng.standard_normal((1, 1, N, 16)) * 0.5 for _ in range(2))
    v = rng.standard_normal((1, 1, N, 8))
    o1, o2, tau = ff.init.flex_n_params(1, 16, 16, rng=6)
    for causal in (False, True):
        want = ff.flex_n_attention(q, k, v, o1, o2, tau, causal=causal)
        got = ff.flex_n_attention(*(a.astype(np.float32) for a in (q, k, v, o1, o2, tau)), causal=causal)
        assert np.isfinite(got).all()
        # rows whose denominators are well away from the guard agree to float32 rounding
        np.testing.assert_allclose(np.median(np.abs(got - want)), 0, atol=1e-4)
        assert np.mean(np.abs(got - want) < 1e-3 * (1 + np.abs(want))) > 0.99


def test_checkpoint_killed_mid_write_leaves_the_previous_one(tmp_path):
    code = textwrap.dedent(f"""
        import numpy as np
        from flexformer.training import save_checkpoint
        params = {{"w": np.arange(4_000_000, dtype=np.float64)}}
        save_checkpoint({str(tmp_path / 'ck.npz')!r}, params, {{"t": np.array(0)}}, {{"step": 0, "config": {{}}}})
        print("first", flush=True)
        step = 1
        while True:
            params["w"] += 1
            save_checkpoint({str(tmp_path / 'ck.npz')!r}, params, {{"t": np.array(step)}}, {{"step": step, "config": {{}}}})
            step += 1
    """)
    for delay in (0.05, 0.2, 0.5):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "first"
        import time
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        params, opt, meta = ff.training.load_checkpoint(str(tmp_path / "ck.npz"))
        assert params["w"][0] == meta["step"] and int(opt["t"]) == meta["step"]


def test_many_heads_short_sequences():
    # large B*H with small N: more (b,h) pairs than anything else
    rng = np.random.default_rng(7)
    q, k = (rng.standard_normal((16, 12, 3, 4)) * 0.5 for _ in range(2))
    v = rng.standard_normal((16, 12, 3, 2))
    o1, o2, tau = ff.init.flex_n_params(12, 5, 4, rng=8)
    for causal in (False, True):
        check(ff.flex_n_attention(q, k, v, o1, o2, tau, causal=causal),
              ref.flex_n_attention(q, k, v, o1, o2, tau, causal=causal), np.float64)
        check(ff.softmax_attention(q, k, v, causal=causal), ref.softmax_attention(q, k, v, causal=causal),
              np.float64)


def test_reference_counts_stable_for_every_entry_point():
    rng = np.random.default_rng(9)
    q = rng.standard_normal((1, 2, 9, 4))
    v = rng.standard_normal((1, 2, 9, 3))
    do = np.ones((1, 2, 9, 3))
    mask = rng.random((1, 9)) < 0.7
    om = ff.init.flex_s_omega(2, 3, 4, rng=1)
    o1, o2, tau = ff.init.flex_n_params(2, 3, 4, rng=2)
    W = ff.init.hedgehog_weights(2, 4, 3)
    E = ff.init.linformer_projections(3, 9, rng=3)
    pq = np.abs(q) + 0.1
    x3, taps = q[0], rng.standard_normal((3, 4))  # the short convolution: (B, N, C) and (W, C)
    calls = [
        lambda: ff.flex_s_attention(q, q, v, om, key_mask=mask, return_guard_count=True),
        lambda: ff.flex_s_attention_backward(do, q, q, v, om, causal=True),
        lambda: ff.flex_n_attention(q, q, v, o1, o2, tau, causal=True),
        lambda: ff.flex_n_attention_backward(do, q, q, v, o1, o2, tau, key_mask=mask),
        lambda: ff.performer_attention(q, q, v, om, key_mask=mask),
        lambda: ff.performer_attention_backward(do, q, q, v, om, causal=True),
        lambda: ff.hedgehog_attention(q, q, v, W),
        lambda: ff.hedgehog_attention_backward(do, q, q, v, W, key_mask=mask),
        lambda: ff.linear_attention(pq, pq, v, causal=True),
        lambda: ff.linear_attention_backward(do, pq, pq, v),
        lambda: ff.softmax_attention(q, q, v, key_mask=mask),
        lambda: ff.softmax_attention_backward(do, q, q, v, causal=True),
        lambda: ff.linformer_attention(q, q, v, E, E, key_mask=mask),
        lambda: ff.linformer_attention_backward(do, q, q, v, E, E),
        lambda: _C.short_conv_forward(x3, taps),
        lambda: _C.short_conv_backward(x3, x3, taps),
    ]
    failing = [
        lambda: ff.flex_s_attention(q, q, v, om[:1]),
        lambda: ff.hedgehog_attention_backward(do[:, :1], q, q, v, W),
        lambda: ff.linformer_attention(q, q, v, E, E, causal=True),
        lambda: ff.softmax_attention(q.astype(np.float32), q, v),
        lambda: _C.short_conv_forward(x3, taps[:, :1]),
        lambda: _C.short_conv_backward(x3[:, :2], x3, taps),
    ]
    # every entry point from several Python threads at once equals the serial result
    from concurrent.futures import ThreadPoolExecutor
    serial = [call() for call in calls]
    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(lambda c: c(), calls * 3))
    for i, got in enumerate(parallel):
        want = serial[i % len(calls)]
        for a, b in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
            np.testing.assert_array_equal(a, b)
    tracked = [q, v, do, mask, om, o1, o2, tau, W, E, pq, taps]
    before = [sys.getrefcount(a) for a in tracked]
    for _ in range(500):
        for call in calls:
            call()
        for call in failing:
            with pytest.raises((ValueError, TypeError)):
                call()
    assert [sys.getrefcount(a) for a in tracked] == before


def test_kernel_entries_parse_their_arguments_with_cpythons_parser():
    """Each entry takes its arrays by position or by name and only the options of its kind
    and direction, by name; anything else is a TypeError naming the entry and the argument."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 8, 4)) for _ in range(3))
    omega = ff.init.flex_s_omega(2, 4, 4, rng=0)
    want = _C.flex_s_forward(q, k, v, omega, causal=True)[0]
    got = _C.flex_s_forward(q=q, k=k, v=v, omega=omega, causal=True)[0]
    assert np.array_equal(got, want)
    def unknown_keyword(entry, name):
        # CPython 3.11 and 3.12 word it one way, 3.13 the other
        return (rf"'{name}' is an invalid keyword argument for {entry}\(\)"
                rf"|^{entry}\(\) got an unexpected keyword argument '{name}'")

    cases = [
        (lambda: _C.flex_s_forward(q, k, v), re.escape("flex_s_forward() missing required argument 'omega'")),
        (lambda: _C.flex_s_forward(q, k, v, omega, bogus=1), unknown_keyword("flex_s_forward", "bogus")),
        (lambda: _C.flex_s_forward(q, k, v, omega, True), re.escape("flex_s_forward() takes at most 4 positional")),
        (lambda: _C.flex_s_forward(q, k, v, omega, omega=omega), re.escape("given by name ('omega') and position")),
        (lambda: _C.softmax_forward(q, k, v, eps=1e-3), unknown_keyword("softmax_forward", "eps")),
        (lambda: _C.flex_s_backward(q, q, k, v, omega, return_key_state=True),
         unknown_keyword("flex_s_backward", "return_key_state")),
        (lambda: _C.linear_forward(q, k, v, key_state=None), unknown_keyword("linear_forward", "key_state")),
    ]
    for call, pattern in cases:
        with pytest.raises(TypeError) as exc:
            call()
        assert re.search(pattern, str(exc.value)), str(exc.value)


def test_kernel_entries_take_keyword_names_built_at_run_time():
    """Names spelled in the caller's code reach the entries interned and are matched by
    pointer; names built at run time are other str objects and go through CPython's parser.
    Both give the same outputs, and neither keeps a reference to an argument."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 8, 4)) for _ in range(3))
    omega = ff.init.flex_s_omega(2, 4, 4, rng=0)
    built = {"".join(["ca", "usal"]): True, "".join(["ome", "ga"]): omega}
    assert all(name is not sys.intern(name) for name in built)
    want = _C.flex_s_forward(q, k, v, omega=omega, causal=True)[0]
    assert np.array_equal(_C.flex_s_forward(q, k, v, **built)[0], want)
    assert np.array_equal(_C.flex_s_forward(q=q, k=k, v=v, omega=omega, causal=True)[0], want)
    reference = ff.reference.flex_s_attention(q, k, v, omega, causal=True)
    np.testing.assert_allclose(want, reference, rtol=1e-10, atol=1e-12)
    tracked = [q, k, v, omega]
    before = [sys.getrefcount(a) for a in tracked]
    for _ in range(300):
        _C.flex_s_forward(q, k, v, omega=omega, causal=True)
        _C.flex_s_forward(q, k, v, **built)
        with pytest.raises(TypeError, match="given by name"):
            _C.flex_s_forward(q, k, v, omega, q=q)
    assert [sys.getrefcount(a) for a in tracked] == before
