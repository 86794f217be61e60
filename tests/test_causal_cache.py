"""The causal backward's chunk cache (features and weights kept from its forward sweep for
its reverse sweep, within a memory budget): gradients with and without it must be the
same bit for bit, on the per-pair path and the sequence-segment path, masked and not."""
import os
import subprocess
import sys

import numpy as np
import pytest

import flexformer as ff

from conftest import random_mask
from test_key_state import KINDS, _case


@pytest.fixture
def cache_budget():
    """Set the kernels' chunk-cache budget (flexformer.set_causal_cache); restored after."""
    before = ff.causal_cache_limit()
    yield ff.set_causal_cache
    ff.set_causal_cache(before / 2 ** 20)


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("shape", [(2, 3, 150), (1, 1, 300)], ids=["pairs", "segments"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_causal_gradients_with_and_without_the_chunk_cache(kind, dtype, shape, masked, threads,
                                                          cache_budget):
    fwd, bwd, args, _ = _case(kind, *shape, dtype, seed=3)
    mask = random_mask(shape[0], shape[2]) if masked else None
    out = fwd(*args, key_mask=mask, causal=True)
    dout = np.random.default_rng(7).standard_normal(out.shape).astype(dtype)
    cache_budget(1024)
    cached = bwd(dout, *args, key_mask=mask, causal=True)
    cache_budget(0)
    recomputed = bwd(dout, *args, key_mask=mask, causal=True)
    assert len(cached) == len(recomputed)
    for a, b in zip(cached, recomputed):
        assert np.all(np.isfinite(a))
        np.testing.assert_array_equal(a, b)


def test_budget_too_small_for_the_cache_falls_back(cache_budget):
    """A budget below what the cache needs (about 1.6 KiB per row here) recomputes."""
    fwd, bwd, args, _ = _case("flex_n", 1, 2, 700, np.float64)
    dout = np.ones((1, 2, 700, 4))
    cache_budget(1024)
    big = bwd(dout, *args, causal=True)
    cache_budget(1)  # 1 MiB: less than 2 heads x 700 rows need
    small = bwd(dout, *args, causal=True)
    for a, b in zip(big, small):
        np.testing.assert_array_equal(a, b)


def test_the_budget_is_set_by_the_setter_and_read_from_the_environment_once():
    code = ("import os, flexformer as ff; print(ff.causal_cache_limit()); "
            "os.environ['FLEXFORMER_CAUSAL_CACHE_MIB'] = '3'; print(ff.causal_cache_limit()); "
            "ff.set_causal_cache(0.5); print(ff.causal_cache_limit())")
    env = dict(os.environ, FLEXFORMER_CAUSAL_CACHE_MIB="7")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(7 << 20), str(7 << 20), str(1 << 19)]
    bad = dict(env, FLEXFORMER_CAUSAL_CACHE_MIB="lots")
    res = subprocess.run([sys.executable, "-c", "import flexformer"], env=bad, capture_output=True, text=True)
    assert res.returncode != 0 and "FLEXFORMER_CAUSAL_CACHE_MIB='lots'" in res.stderr
    for wrong in (-1, float("nan"), 2e6):
        with pytest.raises(ValueError, match="mib must be a number from 0 to 1048576"):
            ff.set_causal_cache(wrong)
    with pytest.raises(TypeError, match="mib must be a number"):
        ff.set_causal_cache("3")
