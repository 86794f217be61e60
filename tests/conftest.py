"""Shared helpers: random inputs for the attention kernels."""
import numpy as np
import pytest

import flexformer as ff


def make_inputs(B=2, H=3, Nq=20, Nk=None, d=5, e=4, m=6, *, dtype=np.float64, seed=0, scale=0.5,
                perturb=True):
    """Random q, k, v, flex_s omega and flex_n (omega1, omega2, tau) parameters.

    With ``perturb`` the flex_n pair is moved away from its A = B start (where it equals
    flex_s) so that tests exercise the general case."""
    Nk = Nq if Nk is None else Nk
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((B, H, Nq, d)) * scale).astype(dtype)
    k = (rng.standard_normal((B, H, Nk, d)) * scale).astype(dtype)
    v = rng.standard_normal((B, H, Nk, e)).astype(dtype)
    heads = max(H, 1)  # the initialisers want H >= 1; slice back for H = 0
    # the unbiased softmax starting point (bandwidth 1, A = B): the widest frequencies, so
    # the guard and the stabiliser are exercised
    omega = ff.init.flex_s_omega(heads, m, d, rng=rng, scale=1.0, dtype=dtype)[:H]
    o1, o2, tau = (a[:H] for a in ff.init.flex_n_params(heads, m, d, rng=rng, symmetric=True, dtype=dtype))
    if perturb:
        o2 = (o2 + 0.3 * rng.standard_normal(o2.shape)).astype(dtype)
        tau = (tau + 0.25 * rng.standard_normal(tau.shape)).astype(dtype)
    return dict(q=q, k=k, v=v, omega=omega, omega1=o1, omega2=o2, tau=tau)


def layout(x, how):
    """The same values as C order ("c"), Fortran order, a strided view, read-only, or stored
    in the other byte order: what the glue reads in place and what it must convert."""
    if how == "fortran":
        return np.asfortranarray(x)
    if how == "strided":
        big = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
        big[..., ::2] = x
        return big[..., ::2]
    if how == "readonly":
        y = x.copy()
        y.setflags(write=False)
        return y
    if how == "other byte order":
        return x.astype(x.dtype.newbyteorder("S"))
    return x


def random_mask(B, N, seed=1, keep=0.7):
    mask = np.random.default_rng(seed).random((B, N)) < keep
    mask[:, 0] = True
    return mask


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    """Runs a test under both thread counts, restoring the default afterwards."""
    ff.set_num_threads(request.param)
    yield request.param
    ff.set_num_threads(0)
