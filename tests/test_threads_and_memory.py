"""Thread-count consistency, concurrent calls, reference counts."""
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import flexformer as ff

from conftest import make_inputs, random_mask


def all_calls(x, mask, causal):
    dout = np.ones(x["q"].shape[:3] + (x["v"].shape[3],), dtype=x["q"].dtype)
    return [
        ff.flex_s_attention(x["q"], x["k"], x["v"], x["omega"], causal=causal, key_mask=mask),
        ff.flex_n_attention(x["q"], x["k"], x["v"], x["omega1"], x["omega2"], x["tau"], causal=causal,
                            key_mask=mask),
        *ff.flex_s_attention_backward(dout, x["q"], x["k"], x["v"], x["omega"], causal=causal, key_mask=mask),
        *ff.flex_n_attention_backward(dout, x["q"], x["k"], x["v"], x["omega1"], x["omega2"], x["tau"],
                                      causal=causal, key_mask=mask),
    ]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_one_and_two_threads_agree(causal, dtype, tol):
    if not ff.openmp_enabled():
        pytest.skip("serial build")
    x = make_inputs(B=3, H=3, Nq=100, d=6, e=4, m=5, dtype=dtype, seed=40)
    mask = random_mask(3, 100)
    ff.set_num_threads(1)
    try:
        one = all_calls(x, mask, causal)
        ff.set_num_threads(2)
        assert ff.get_num_threads() == 2
        two = all_calls(x, mask, causal)
    finally:
        ff.set_num_threads(0)
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.max(np.abs(a)))


@pytest.mark.parametrize("causal", [False, True])
def test_pairs_to_free_threads_change_no_bit(causal):
    """The kernels hand (b, h) pairs to whichever thread is free when that cannot change a
    result (a forward; a backward with B = 1, where each head's parameter gradient comes
    from one pair), and in a fixed order otherwise. So with another Python thread burning a
    core (which moves pairs between threads), the B = 1 results equal the 1-thread ones bit
    for bit, and repeated 2-thread calls with B = 2 equal each other bit for bit."""
    if not ff.openmp_enabled():
        pytest.skip("serial build")
    import threading

    ones = make_inputs(B=1, H=6, Nq=192, d=6, e=4, m=5, seed=41)
    twos = make_inputs(B=2, H=3, Nq=192, d=6, e=4, m=5, seed=42)
    stop = threading.Event()

    def burn():
        x = 0
        while not stop.is_set():
            x += 1

    ff.set_num_threads(1)
    try:
        want = all_calls(ones, None, causal)
        ff.set_num_threads(2)
        first = all_calls(twos, None, causal)
        burner = threading.Thread(target=burn)
        burner.start()
        try:
            for _ in range(8):
                for a, b in zip(want, all_calls(ones, None, causal)):
                    np.testing.assert_array_equal(a, b)
                for a, b in zip(first, all_calls(twos, None, causal)):
                    np.testing.assert_array_equal(a, b)
        finally:
            stop.set()
            burner.join()
    finally:
        ff.set_num_threads(0)


def test_concurrent_python_threads_match_serial():
    inputs = [make_inputs(B=2, H=2, Nq=130, seed=s) for s in range(6)]
    serial = [all_calls(x, None, True) for x in inputs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(lambda x: all_calls(x, None, True), inputs * 2))
    for i, got in enumerate(parallel):
        for a, b in zip(serial[i % 6], got):
            np.testing.assert_array_equal(a, b)


def test_reference_counts_stable():
    x = make_inputs(B=1, H=2, Nq=8, seed=41)
    mask = random_mask(1, 8)
    dout = np.ones((1, 2, 8, 4))
    tracked = list(x.values()) + [mask, dout]
    before = [sys.getrefcount(a) for a in tracked]
    for _ in range(1000):
        ff.flex_s_attention(x["q"], x["k"], x["v"], x["omega"], key_mask=mask, causal=True)
        ff.flex_n_attention_backward(dout, x["q"], x["k"], x["v"], x["omega1"], x["omega2"], x["tau"],
                                     key_mask=mask)
        try:  # failing calls must release what they converted, too
            ff.flex_n_attention(x["q"], x["k"], x["v"], x["omega1"], x["omega2"], x["tau"][:1])
        except ValueError:
            pass
    after = [sys.getrefcount(a) for a in tracked]
    assert before == after


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq,Nk", [(300, 300), (200, 70), (70, 200)])
def test_single_pair_split_matches_serial_and_reference(causal, Nq, Nk):
    if causal and Nq != Nk:
        pytest.skip("causal needs Nq == Nk")
    x = make_inputs(B=1, H=1, Nq=Nq, Nk=Nk, d=5, e=3, m=4, seed=42)
    mask = random_mask(1, Nk, seed=43)
    mask[0, 64:140] = False
    try:
        ff.set_num_threads(1)
        one = all_calls(x, mask, causal)
        ff.set_num_threads(2)
        two = all_calls(x, mask, causal)
    finally:
        ff.set_num_threads(0)
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12 * np.max(np.abs(a)))
    want = ff.reference.flex_n_attention(x["q"], x["k"], x["v"], x["omega1"], x["omega2"], x["tau"],
                                         causal=causal, key_mask=mask)
    np.testing.assert_allclose(two[1], want, rtol=1e-10, atol=1e-12)


def _child_attention(queue, x, omega):
    queue.put(ff.flex_s_attention(x, x, x, omega, causal=True))


@pytest.mark.skipif(sys.platform == "win32", reason="no fork on Windows")
def test_forked_child_does_not_hang():
    # GNU OpenMP's thread pool does not survive fork(): without the one-thread fallback a
    # child forked after the kernels ran waits forever.
    import multiprocessing as mp
    x = make_inputs(B=2, H=4, Nq=300, d=8, seed=44)["q"]
    omega = ff.init.flex_s_omega(4, 8, 8, rng=45)
    want = ff.flex_s_attention(x, x, x, omega, causal=True)  # the parent's pool is running
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_attention, args=(queue, x, omega))
    proc.start()
    try:
        got = queue.get(timeout=60)
    finally:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
    np.testing.assert_allclose(got, want, rtol=1e-12)


SPIN_PROBE = r"""
import os
import numpy as np
import flexformer as ff
from flexformer._timing import idle_cpu_ms
ff.set_num_threads(2)
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 2, 256, 16)) for _ in range(3))
omega = ff.init.flex_s_omega(2, 16, 16, rng=0)
print(idle_cpu_ms(lambda: ff.flex_s_attention(q, k, v, omega), 0.2, 7), os.environ.get("GOMP_SPINCOUNT"))
"""


def _spin_probe(**chosen):
    """In a fresh process with only the ``chosen`` spin settings: (median CPU ms burnt in a
    200 ms pause after a call, GOMP_SPINCOUNT after the import, the spin count libgomp
    says it read, or None when the OpenMP runtime is not libgomp)."""
    import os
    import re
    import subprocess
    env = {name: value for name, value in os.environ.items() if name not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update(chosen, OMP_DISPLAY_ENV="VERBOSE")
    out = subprocess.run([sys.executable, "-c", SPIN_PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    burnt_ms, left = out.stdout.split()
    read = re.search(r"GOMP_SPINCOUNT = '(\d+)'", out.stderr)
    return float(burnt_ms), left, read and int(read.group(1))


@pytest.mark.skipif(sys.platform == "win32", reason="resource.getrusage is POSIX")
@pytest.mark.skipif(not ff.openmp_enabled(), reason="a serial build has no kernel threads")
def test_kernel_threads_stop_polling_soon_after_a_call():
    """libgomp's default kept a kernel thread polling for about 9 ms after each call (Zen 4),
    a core taken from whatever runs next; the import bounds it (KERNEL_THREAD_SPIN) and
    leaves the environment as it found it, and a setting of the user's is kept."""
    ours_ms, left, read = _spin_probe()
    if read is None:
        pytest.skip("not libgomp: KERNEL_THREAD_SPIN is a GOMP_SPINCOUNT")
    assert read == ff.KERNEL_THREAD_SPIN and left == "None"
    default_ms, left, read = _spin_probe(GOMP_SPINCOUNT="300000")  # libgomp's own default, chosen
    assert read == 300000 and left == "300000"
    assert ours_ms < default_ms / 2  # 1.5 against 9 ms on the Zen 4
    active_ms, left, read = _spin_probe(OMP_WAIT_POLICY="active")  # polls through the pause
    assert left == "None" and read > 300000 and active_ms > 100
