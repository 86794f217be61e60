"""The block cache behind output arrays and kernel workspaces (csrc/buffer_cache.c):
reused memory must never be shared by live arrays, results must not change, and the
bound must hold."""
import multiprocessing as mp
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import flexformer as ff

try:  # the memory handler an array was made with
    from numpy._core.multiarray import get_handler_name
except ImportError:  # NumPy 1.x
    from numpy.core.multiarray import get_handler_name


def _inputs(N=2048, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, 4, N, 32)).astype(dtype) * 0.3 for _ in range(3))
    return q, k, v, ff.init.flex_n_params(4, 16, 32, rng=1, dtype=dtype)


@pytest.fixture(autouse=True)
def default_bound():
    yield
    ff.set_buffer_cache(256)


def test_repeated_calls_reuse_blocks_and_give_the_same_results():
    q, k, v, p = _inputs()
    ff.set_buffer_cache(0)  # start empty
    ff.set_buffer_cache(256)
    first = ff.flex_n_attention(q, k, v, *p)  # (1, 4, 2048, 32) float32: 1 MiB, cached size
    before = ff.buffer_cache_info()
    kept = first.copy()
    del first  # its block goes to the cache ...
    assert ff.buffer_cache_info()["blocks"] == before["blocks"] + 1
    second = ff.flex_n_attention(q, k, v, *p)  # ... and comes back for the same size
    after = ff.buffer_cache_info()
    assert after["hits"] > before["hits"]
    np.testing.assert_array_equal(second, kept)


def test_live_results_never_share_memory():
    q, k, v, p = _inputs()
    dout = np.ones_like(v)
    outs = [ff.flex_n_attention(q, k, v, *p) for _ in range(3)]
    grads = [ff.flex_n_attention_backward(dout, q, k, v, *p) for _ in range(2)]
    arrays = outs + [g for gs in grads for g in gs[:3]]
    for i, a in enumerate(arrays):
        for b in arrays[i + 1:]:
            assert not np.shares_memory(a, b)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    for g, h in zip(grads[0], grads[1]):
        np.testing.assert_array_equal(g, h)


@pytest.mark.skipif(sys.platform == "win32", reason="posix_memalign: fresh blocks are aligned on POSIX only")
@pytest.mark.parametrize("cache_mib", [0, 256])
def test_results_start_on_a_cache_line(cache_mib):
    """Output arrays (fresh blocks, and with the cache on, reused ones) start on a 64-byte
    line, so a row's vector accesses never straddle two lines."""
    ff.set_buffer_cache(cache_mib)
    q, k, v, p = _inputs()
    for _ in range(2):  # the second round takes the blocks the first gave back
        out, state, kept = ff.flex_n_attention(q, k, v, *p, return_key_state=True,
                                               return_projections=True)
        grads = ff.flex_n_attention_backward(np.ones_like(v), q, k, v, *p, key_state=state,
                                             projections=kept)
        for a in (out, state, kept, *grads):
            assert a.ctypes.data % 64 == 0, (a.shape, a.ctypes.data % 64)
        del out, state, kept, grads


def _thp_mode():
    """Linux's transparent huge page setting ("always", "madvise", "never"), or None."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as fh:
            return fh.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return None


def _mapping_of(address):
    """The /proc/self/smaps fields of the mapping that holds `address`."""
    fields, inside = {}, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                if inside:
                    break
                inside = lo <= address < hi
                if inside:
                    fields["start"] = lo
            elif inside:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
    return fields


@pytest.mark.skipif(_thp_mode() != "madvise", reason="transparent huge pages not in 'madvise' mode")
def test_large_fresh_blocks_ask_for_huge_pages():
    """A fresh block of 4 MiB or more starts on a 2 MiB boundary and is marked for
    transparent huge pages (MADV_HUGEPAGE), as NumPy marks its own arrays of that size.
    (Whether a smaller block's mapping carries the mark depends on where malloc puts it:
    once the mmap threshold has grown, large blocks come from malloc's heap, and the memory
    keeps the mark when it is reused.)"""
    ff.set_buffer_cache(0)  # every block fresh
    q, k, v, p = _inputs(N=8192)  # the output: (1, 4, 8192, 32) float32, 4 MiB
    large = ff.flex_n_attention(q, k, v, *p)
    small = ff.flex_n_attention(q[:, :, :2048], k[:, :, :2048], v[:, :, :2048], *p)  # 1 MiB
    assert large.nbytes == 4 << 20 and small.nbytes == 1 << 20
    assert large.ctypes.data % (2 << 20) == 0
    mapping = _mapping_of(large.ctypes.data)
    assert mapping["THPeligible"] == "1", mapping
    assert "hg" in mapping["VmFlags"].split(), mapping["VmFlags"]
    np.testing.assert_array_equal(small, ff.flex_n_attention(q[:, :, :2048], k[:, :, :2048],
                                                             v[:, :, :2048], *p))


@pytest.mark.skipif(sys.platform == "win32", reason="posix_memalign: fresh blocks are aligned on POSIX only")
@pytest.mark.parametrize("N", [128, 1024])
def test_resized_results_stay_on_a_cache_line(N):
    """ndarray.resize reallocates through the same handler: a block that realloc moves off
    a line is moved to an aligned one, its contents kept (shrinking and growing). N = 128:
    the output is 64 KiB, the smallest that takes the handler (module.c)."""
    q, k, v, p = _inputs(N)
    for rows in (N, 3 * N, 7 * N, 50 * N, N // 2):
        out = ff.flex_n_attention(q, k, v, *p)
        before = out.ravel().copy()
        n = rows * before.size // N  # the elements of `rows` rows of every head
        out.resize((n,), refcheck=False)
        assert out.ctypes.data % 64 == 0, (rows, out.ctypes.data % 64)
        kept = min(n, before.size)
        np.testing.assert_array_equal(out[:kept], before[:kept])
        if n > before.size:
            assert np.all(out[before.size:] == 0)  # resize fills what it adds with zeros


@pytest.mark.parametrize("N", [1, 4, 127])
def test_small_results_take_numpys_allocator_and_stay_correct(N):
    """Outputs all under 64 KiB (a decoding step's) skip the handler, those of a call with
    a 64 KiB output take it; the small ones have the same values and resize."""
    q, k, v, p = _inputs(128)
    big = ff.flex_n_attention(q, k, v, *p, causal=True)  # (1, 4, 128, 32) float32: 64 KiB
    small = ff.flex_n_attention(q[:, :, :N], k[:, :, :N], v[:, :, :N], *p, causal=True)
    grads = ff.flex_n_attention_backward(np.ones_like(small), q[:, :, :N], k[:, :, :N],
                                         v[:, :, :N], *p, causal=True)
    assert get_handler_name(big) == "flexformer_buffer_cache"
    assert [get_handler_name(a) for a in (small, *grads)] == ["default_allocator"] * 7
    # causal: row i sees keys <= i (up to 8 rows project by row dots: not the same bits)
    np.testing.assert_allclose(small, big[:, :, :N], rtol=1e-5, atol=1e-6)
    assert all(np.isfinite(g).all() for g in grads)
    small.resize((2 * small.size,), refcheck=False)
    assert np.all(small[small.size // 2:] == 0)


def test_bound_holds_and_zero_empties():
    q, k, v, p = _inputs()
    ff.set_buffer_cache(1.5)  # room for one 1 MiB block
    for _ in range(3):
        ff.flex_n_attention(q, k, v, *p)
    info = ff.buffer_cache_info()
    assert info["limit"] == int(1.5 * 2 ** 20) and info["bytes"] <= info["limit"]
    kept = ff.flex_n_attention(q, k, v, *p)
    snapshot = kept.copy()
    ff.set_buffer_cache(0)
    info = ff.buffer_cache_info()
    assert info["blocks"] == 0 and info["bytes"] == 0 and info["limit"] == 0
    np.testing.assert_array_equal(kept, snapshot)  # a live array is not the cache's to free
    del kept
    assert ff.buffer_cache_info()["blocks"] == 0  # nothing is kept with a bound of 0
    np.testing.assert_array_equal(ff.flex_n_attention(q, k, v, *p), snapshot)


def test_threads_calling_at_once_get_correct_results():
    q, k, v, p = _inputs(N=1024, dtype=np.float64)
    dout = np.ones_like(v)
    want = ff.flex_n_attention_backward(dout, q, k, v, *p)
    errors = []

    def work():
        try:
            for _ in range(20):
                got = ff.flex_n_attention_backward(dout, q, k, v, *p)
                for a, b in zip(got, want):
                    np.testing.assert_array_equal(a, b)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.parametrize("bad,exc", [(-1, ValueError), (float("nan"), ValueError), (2e6, ValueError),
                                     ("64", TypeError), (True, TypeError), (None, TypeError)])
def test_bad_bounds(bad, exc):
    with pytest.raises(exc, match="mib"):
        ff.set_buffer_cache(bad)


def test_bound_from_the_environment():
    code = "import flexformer as ff; print(ff.buffer_cache_info()['limit'])"
    run = lambda value: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                       env={**os.environ, "FLEXFORMER_BUFFER_CACHE_MIB": value})
    assert run("0").stdout.strip() == "0"
    assert run("16").stdout.strip() == str(16 * 2 ** 20)
    bad = run("lots")
    assert bad.returncode != 0 and "FLEXFORMER_BUFFER_CACHE_MIB='lots'" in bad.stderr


def _child_checksum():
    q, k, v, p = _inputs()
    return float(ff.flex_n_attention(q, k, v, *p).sum())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_fork_while_another_thread_uses_the_cache():
    """The cache's lock is held across fork(), so a child never inherits it taken."""
    q, k, v, p = _inputs()
    want = _child_checksum()
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            ff.flex_n_attention(q, k, v, *p)

    worker = threading.Thread(target=hammer)
    worker.start()
    try:
        ctx = mp.get_context("fork")
        for _ in range(4):
            with ctx.Pool(1) as pool:
                assert pool.apply_async(_child_checksum).get(timeout=120) == pytest.approx(want, rel=1e-6)
    finally:
        stop.set()
        worker.join()


@pytest.mark.parametrize("kind", ["flex_n", "flex_s", "performer"])
@pytest.mark.parametrize("threads", [1, 2])
def test_bidirectional_backward_writes_every_gradient_element(kind, threads):
    """The bidirectional backward clears each block of dq and dk just before adding to it
    and writes dv outright, instead of zeroing the gradients up front: blocks of the cache
    that come back holding NaN must not leak into any element, including the pairs whose
    keys are all masked (no state) and a key state-less call (one (b,h) per thread split
    into segments when B H < threads)."""
    rng = np.random.default_rng(4)
    spec = ff.get_attention(kind)
    old = ff.get_num_threads()
    ff.set_num_threads(threads)
    try:
        for B, H, N in ((2, 3, 2000), (1, 1, 9000)):  # gradients of 1.5 and 1.1 MiB: cached sizes
            q, k, v, do = (rng.standard_normal((B, H, N, 32)).astype(np.float32) * 0.4 for _ in range(4))
            mask = np.ones((B, N), bool)
            mask[-1] = False  # the last batch row sees no key at all
            p = spec.init(H, 32, num_features=16, rng=1, dtype=np.float32)
            for key_mask in (None, mask):
                _, state = spec.forward(q, k, v, p, key_mask=key_mask, return_key_state=True)
                for st in (state, None):
                    want = spec.backward(do, q, k, v, p, key_mask=key_mask, key_state=st)
                    want = [a.copy() for a in want[:3]]
                    stale = spec.backward(do, q, k, v, p, key_mask=key_mask, key_state=st)
                    for a in stale[:3]:
                        a.fill(np.nan)  # these blocks go back to the cache poisoned ...
                    del stale
                    got = spec.backward(do, q, k, v, p, key_mask=key_mask, key_state=st)  # ... and are reused
                    for g, w in zip(got[:3], want):
                        np.testing.assert_array_equal(g, w)
                    if key_mask is not None:
                        assert not got[0][-1].any() and not got[1][-1].any() and not got[2][-1].any()
    finally:
        ff.set_num_threads(old)
