"""The PyTorch backend's causal form: every chunk at once (a prefix over the chunks carries the
state) gives the one-chunk-after-another reference and the C kernels to rounding, stays
finite where key weights jump by hundreds in the exponent, and runs bfloat16 and float16
inputs with float32 sums."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flexformer as ff  # noqa: E402
from flexformer.torch import attention  # noqa: E402
from flexformer.torch import functional  # noqa: E402
from flexformer.features import fourier_features_torch  # noqa: E402
from flexformer.torch.functional import _causal_chunked, _causal_loop, _causal_parts  # noqa: E402


def _split_features(B, H, N, F, e, seed, jump=0.0):
    gen = torch.Generator().manual_seed(seed)
    unit = lambda x: x / x.norm(dim=-1, keepdim=True)  # noqa: E731
    fq = unit(torch.randn(B, H, N, F, generator=gen, dtype=torch.float64))
    fk = unit(torch.rand(B, H, N, F, generator=gen, dtype=torch.float64) + 0.05)
    sk = 3 * torch.randn(B, H, N, generator=gen, dtype=torch.float64)
    sk[0, 0, N // 2:] += jump
    v = torch.randn(B, H, N, e, generator=gen, dtype=torch.float64)
    return fq, fk, sk, v


@pytest.mark.parametrize("N", [1, 5, 63, 64, 65, 200, 513])
@pytest.mark.parametrize("jump", [0.0, 400.0])
def test_chunks_together_equal_chunks_in_turn(N, jump):
    fq, fk, sk, v = _split_features(2, 3, N, 6, 4, seed=N, jump=jump)
    sk[1, :, : min(3, N)] = -math.inf           # masked keys, a row that sees none
    want = _causal_loop(fq, fk, sk, v, 1e-4, 64)
    got = _causal_chunked(fq, fk, sk, v, 1e-4, 64)
    assert torch.isfinite(got).all()
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-10 * want.abs().max().item())
    leaves = [x.clone().requires_grad_() for x in (fq, fk, v)]
    g_want = torch.autograd.grad(_causal_loop(leaves[0], leaves[1], sk, leaves[2], 1e-4, 64).sum(), leaves)
    g_got = torch.autograd.grad(_causal_chunked(leaves[0], leaves[1], sk, leaves[2], 1e-4, 64).sum(), leaves)
    for a, b in zip(g_got, g_want):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-9 * b.abs().max().item())


@pytest.mark.parametrize("kind", ["flex_n", "flex_s", "performer", "hedgehog", "taylor"])
def test_torch_backend_matches_the_c_kernels_causal(kind):
    spec = ff.get_attention(kind)
    init = spec.init(2, 8, num_features=8, rng=0)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (0.5 * torch.randn(2, 2, 300, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(2, 300, dtype=torch.bool)
    mask[1, 280:] = False
    params = {n: torch.tensor(p) for n, p in init.items()}
    got = attention(kind, q, k, v, params, causal=True, key_mask=mask, backend="torch")
    want = attention(kind, q, k, v, params, causal=True, key_mask=mask, backend="c")
    assert torch.allclose(got, want, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_keep_float32_sums(dtype):
    init = ff.get_attention("flex_n").init(2, 16, rng=0)
    gen = torch.Generator().manual_seed(0)
    x = [0.5 * torch.randn(1, 2, 1000, 16, generator=gen) for _ in range(3)]
    want = ff.flex_n_attention(*(t.double().numpy() for t in x), *init.values(), causal=True)
    leaves = [t.to(dtype).requires_grad_() for t in x]
    params = {n: torch.tensor(p, dtype=dtype, requires_grad=True) for n, p in init.items()}
    out = attention("flex_n", *leaves, params, causal=True)
    assert out.dtype == dtype and torch.isfinite(out).all()
    # the inputs' own rounding (8 or 11 bits) bounds the error, not the sums over 1,000 keys
    tol = 0.05 if dtype == torch.bfloat16 else 0.01
    assert np.abs(out.double().detach().numpy() - want).max() <= tol * np.abs(want).max()
    out.float().square().sum().backward()
    assert all(torch.isfinite(p.grad.float()).all() for p in (*leaves, *params.values()))


@pytest.mark.parametrize("group", [2, 3, 64])
def test_many_chunks_in_groups_equal_chunks_in_turn(monkeypatch, group):
    """Past ``group`` chunks the carried sums come from groups of chunks and the groups'
    totals (two levels or more): the same values as one chunk after another."""
    fq, fk, sk, v = _split_features(1, 2, 64 * 21 + 5, 6, 4, seed=group, jump=300.0)
    sk[0, 1, :100] = -math.inf
    monkeypatch.setattr(functional, "PREFIX_GROUP", group)
    want = _causal_loop(fq, fk, sk, v, 1e-4, 64)
    got = _causal_chunked(fq, fk, sk, v, 1e-4, 64)
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-10 * want.abs().max().item())


def _grads(form, fq, fk, sk, v, dout, **kw):
    leaves = [x.clone().requires_grad_() for x in (fq, fk, sk, v)]
    out = form(*leaves, 1e-4, 64)
    return (out, *torch.autograd.grad(out, leaves, dout, **kw))


@pytest.mark.parametrize("N, group", [(1, 64), (63, 64), (64, 64), (65, 64), (513, 64), (64 * 21 + 5, 64),
                                      (64 * 21 + 5, 3), (64 * 9, 2)])
@pytest.mark.parametrize("jump", [0.0, 400.0])
def test_gradients_equal_chunks_in_turn(monkeypatch, N, group, jump):
    """Values and gradients of all four inputs against the loop, with masked keys, chunks
    that see no key, padding to whole chunks and scans of two or more levels."""
    monkeypatch.setattr(functional, "PREFIX_GROUP", group)
    fq, fk, sk, v = _split_features(2, 3, N, 6, 4, seed=N + group, jump=jump)
    sk[1, :, : min(3, N)] = -math.inf
    sk[0, 1, : min(N, 150)] = -math.inf                # whole chunks without a key
    dout = torch.randn(2, 3, N, 4, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    got = _grads(_causal_chunked, fq, fk, sk, v, dout)
    want = _grads(_causal_loop, fq, fk, sk, v, dout)
    for name, a, b in zip(("out", "fq", "fk", "sk", "v"), got, want):
        assert torch.isfinite(a).all(), name
        # the scale: sk's gradient is 0 up to rounding where a row sees a single key
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-9 * max(1.0, b.abs().max().item())), name


@pytest.mark.parametrize("N, group", [(64, 64), (200, 64), (64 * 9, 2)])
def test_written_out_backward_equals_autograd_of_the_same_forward(monkeypatch, N, group):
    """The hand-written backward against autograd through the very same forward operations
    (``_causal_parts``): equal to rounding; the saved tensors stay intact, so a second
    backward of a retained graph gives the same gradients; inputs without ``requires_grad``
    get none."""
    monkeypatch.setattr(functional, "PREFIX_GROUP", group)
    fq, fk, sk, v = _split_features(2, 3, N, 6, 4, seed=N, jump=300.0)
    sk[1, :, :5] = -math.inf
    sk[0, 2, :70] = -math.inf
    pad = -N % 64
    dout = torch.randn(2, 3, N, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    leaves = [x.clone().requires_grad_() for x in (fq, fk, sk, v)]
    padded = [torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (leaves[0], leaves[1], leaves[3])]
    composed = _causal_parts(padded[0], padded[1], torch.nn.functional.pad(leaves[2], (0, pad), value=-math.inf),
                             padded[2], 1e-4, 64)[0][:, :, :N]
    want = torch.autograd.grad(composed, leaves, dout)
    out = _causal_chunked(*leaves, 1e-4, 64)
    first = torch.autograd.grad(out, leaves, dout, retain_graph=True)
    second = torch.autograd.grad(out, leaves, dout)
    assert torch.equal(out, composed.detach())
    for name, a, b, c in zip(("fq", "fk", "sk", "v"), first, second, want):
        assert torch.equal(a, b), name
        assert torch.allclose(a, c, rtol=1e-12, atol=1e-12 * max(1.0, c.abs().max().item())), name
    frozen = [leaves[0], fk, sk, leaves[3]]
    got = torch.autograd.grad(_causal_chunked(*frozen, 1e-4, 64), [leaves[0], leaves[3]], dout)
    assert torch.equal(got[0], first[0]) and torch.equal(got[1], first[3])


def test_autograd_form_has_finite_key_gradients_where_rows_precede_every_key():
    """Rows of a chunk before its first visible key: their weights above the diagonal are
    masked before exp, so exp never overflows and the backward never forms 0 * inf."""
    fq, fk, sk, v = _split_features(1, 1, 200, 6, 4, seed=0)
    sk[0, 0, :150] = -math.inf
    _, *grads = _grads(_causal_chunked, fq, fk, sk, v, torch.ones(1, 1, 200, 4, dtype=torch.float64))
    assert all(torch.isfinite(g).all() for g in grads)


def test_chunked_form_gradcheck_and_second_derivatives():
    fq, fk, sk, v = _split_features(1, 2, 150, 3, 2, seed=0)
    sk[0, 1, :70] = -math.inf
    leaves = [x.clone().requires_grad_() for x in (fq, fk, sk, v)]
    assert torch.autograd.gradcheck(lambda *a: _causal_chunked(*a, 1e-4, 64), leaves)
    small = [x[:, :1, :70].detach().clone().requires_grad_() for x in (fq, fk, sk, v)]
    # gradgradcheck draws its output gradients from torch's generator: seeded, so the check is
    # the same on every run (unseeded, seed 5 of 0-14 fails the tolerance, for the
    # autograd-differentiated form of 71f2e60 as for this one)
    torch.manual_seed(0)
    assert torch.autograd.gradgradcheck(lambda *a: _causal_chunked(*a, 1e-4, 64), small)


@pytest.mark.parametrize("pairs", [1, 2, 3])
@pytest.mark.parametrize("B", [1, 3])
def test_fused_fourier_features_against_the_formula(pairs, B):
    """f = (pairs^2 m)^-1/2 [sum cos(W_p x), sum sin(W_p x)]: values from the plain formula,
    gradients by finite differences, second derivatives too."""
    gen = torch.Generator().manual_seed(pairs + B)
    x = torch.randn(B, 3, 7, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    W = torch.randn(3, pairs * 4, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    u = torch.einsum("bhnd,hmd->bhnm", x, W).reshape(B, 3, 7, pairs, 4)
    want = torch.cat([u.cos().sum(-2), u.sin().sum(-2)], -1) / (pairs * 2.0)
    got = fourier_features_torch(torch, x, W, pairs)
    assert torch.allclose(got, want, rtol=1e-14, atol=1e-15)
    assert torch.autograd.gradcheck(lambda a, b: fourier_features_torch(torch, a, b, pairs), (x, W))
    assert torch.autograd.gradgradcheck(lambda a, b: fourier_features_torch(torch, a, b, pairs), (x, W))
