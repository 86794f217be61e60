"""The C kernels as torch custom operators (torch.compile traces them with no graph break)
and the torch.nn layers' conventions: device and dtype factory arguments, cross-attention
with torch's padding mask, torch's weight layout, reset_parameters, and NumPy checkpoints
that cross bit for bit."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flexformer as ff  # noqa: E402
from flexformer.torch import MultiHeadAttention, attention  # noqa: E402
from flexformer.torch.nn import (CausalLM, EncoderClassifier, load_numpy_parameters, numpy_names,  # noqa: E402
                                 numpy_parameters)


def _inputs(kind, dtype=torch.float32, N=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    spec = ff.get_attention(kind)
    init = spec.init(2, 8, num_features=8, rng=seed, **({"max_len": N} if kind == "linformer" else {}))
    params = {n: torch.tensor(v, dtype=dtype, requires_grad=n in spec.learnable) for n, v in init.items()}
    q, k, v = (0.5 * torch.randn(2, 2, N, 8, generator=gen, dtype=dtype) for _ in range(3))
    mask = torch.ones(2, N, dtype=torch.bool)
    mask[1, N - 7:] = False
    return spec, q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), params, mask


@pytest.mark.parametrize("kind", ff.attention_kinds())
def test_every_kind_traces_without_a_graph_break(kind):
    spec, q, k, v, params, mask = _inputs(kind)
    for causal in ([False, True] if spec.causal else [False]):
        def f(q, k, v, params):
            return attention(kind, q, k, v, params, causal=causal, key_mask=mask, backend="c")
        explained = torch._dynamo.explain(f)(q, k, v, params)
        assert explained.graph_break_count == 0, explained.break_reasons
        assert explained.graph_count == 1


@pytest.mark.parametrize("causal", [False, True])
def test_compiled_fullgraph_equals_eager_with_gradients(causal):
    torch._dynamo.reset()
    spec, q, k, v, params, mask = _inputs("flex_n")
    leaves = [q, k, v, *params.values()]

    def f(q, k, v, params):
        return attention("flex_n", q, k, v, params, causal=causal, key_mask=mask)

    compiled = torch.compile(f, fullgraph=True)
    got, want = compiled(q, k, v, params), f(q, k, v, params)
    assert torch.equal(got, want)
    g_got = torch.autograd.grad(got.square().sum(), leaves)
    g_want = torch.autograd.grad(want.square().sum(), leaves)
    for a, b in zip(g_got, g_want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kind", ["flex_n", "flex_s", "hedgehog"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_torch_backend_compiles_fullgraph(kind, causal):
    """The pure-PyTorch backend (a GPU's or bfloat16's path), compiled with fullgraph: no
    graph break, and the same outputs and gradients as eager to float32 rounding (the
    compiler fuses and reorders the elementwise work)."""
    torch._dynamo.reset()
    spec, q, k, v, params, mask = _inputs(kind, N=150)
    leaves = [q, k, v, *(p for p in params.values() if p.requires_grad)]

    def f(q, k, v, params):
        return attention(kind, q, k, v, params, causal=causal, key_mask=mask, backend="torch")

    explained = torch._dynamo.explain(f)(q, k, v, params)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    got, want = torch.compile(f, fullgraph=True)(q, k, v, params), f(q, k, v, params)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6 * want.abs().max().item())
    g_got = torch.autograd.grad(got.square().sum(), leaves)
    g_want = torch.autograd.grad(want.square().sum(), leaves)
    for a, b in zip(g_got, g_want):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * b.abs().max().item())


def test_a_compiled_model_of_the_bridge_has_no_graph_break():
    torch._dynamo.reset()
    model = EncoderClassifier(16, 3, dim=16, depth=2, heads=2, max_len=24, attention="flex_s")
    ids = torch.randint(0, 16, (3, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 24, dtype=torch.bool)
    mask[2, 20:] = False
    explained = torch._dynamo.explain(model)(ids, mask)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(model, fullgraph=True)
    got, want = compiled(ids, mask), model(ids, mask)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    got.sum().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if p.requires_grad)


@pytest.mark.parametrize("eps", [None, 0.5])
@pytest.mark.parametrize("keep", [False, True])
def test_the_operators_pass_torch_opcheck(keep, eps):
    spec, q, k, v, params, mask = _inputs("flex_n", dtype=torch.float64, N=12)
    args = ("flex_n", q, k, v, [params[n] for n in spec.params], False, mask, eps, keep)
    torch.library.opcheck(torch.ops.flexformer.attention_forward.default, args)


def test_double_backward_names_the_limitation():
    spec, q, k, v, params, mask = _inputs("hedgehog", dtype=torch.float64)
    out = attention("hedgehog", q, k, v, params, backend="c")
    (gq,) = torch.autograd.grad(out.sum(), [q], create_graph=True)
    with pytest.raises(RuntimeError, match="C kernels of 'hedgehog' have no second derivative.*backend='torch'"):
        torch.autograd.grad(gq.sum(), [q])


# ------------------------------------------------------------------ torch.nn conventions

def test_factory_arguments_device_and_dtype():
    mha = MultiHeadAttention(16, 2, "flex_n", device="meta", dtype=torch.float64)
    assert all(p.device.type == "meta" and p.dtype == torch.float64 for p in mha.parameters())
    lm = CausalLM(32, dim=16, depth=1, heads=2, max_len=16, device="cpu", dtype=torch.bfloat16)
    assert {p.dtype for p in lm.parameters()} == {torch.bfloat16}
    logits = lm(torch.randint(0, 32, (2, 16)))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()


def test_linear_layers_use_torchs_weight_layout():
    mha = MultiHeadAttention(16, 4, "flex_s")
    assert isinstance(mha.q, torch.nn.Linear) and tuple(mha.q.weight.shape) == (16, 16)
    lm = CausalLM(40, dim=16, depth=1, heads=2, max_len=8)
    assert tuple(lm.head.weight.shape) == (40, 16)           # (out, in)
    assert numpy_names(lm)["head.weight"] == ("head.W", True)


@pytest.mark.parametrize("kind", ["flex_n", "softmax", "linformer"])
def test_cross_attention_with_torchs_padding_mask(kind):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, kind, max_len=30, dtype=torch.float64)
    query = torch.randn(2, 9, 16, dtype=torch.float64)
    memory = torch.randn(2, 30, 16, dtype=torch.float64)
    pad = torch.zeros(2, 30, dtype=torch.bool)
    pad[0, 25:] = True
    out = mha(query, memory, memory, key_padding_mask=pad)
    assert out.shape == (2, 9, 16)
    # the same computation written out: projections, the kind's attention, the output projection
    split = lambda x: x.reshape(2, -1, 2, 8).transpose(1, 2)  # noqa: E731
    heads = attention(kind, split(mha.q(query)), split(mha.k(memory)), split(mha.v(memory)), mha.attn.values(),
                      key_mask=~pad)
    want = mha.o(heads.transpose(1, 2).reshape(2, 9, 16))
    assert torch.allclose(out, want, rtol=1e-12, atol=1e-12)
    # padded keys are never read: changing them changes nothing
    memory2 = memory.clone()
    memory2[0, 25:] = 1e3
    assert torch.equal(mha(query, memory2, memory2, key_padding_mask=pad), out)
    assert torch.equal(mha(query, memory, memory, key_mask=~pad), out)
    with pytest.raises(ValueError, match="not both"):
        mha(query, memory, memory, key_padding_mask=pad, key_mask=~pad)


def test_reset_parameters_draws_a_new_models_values():
    fresh = EncoderClassifier(16, 3, dim=16, depth=1, heads=2, max_len=8, attention="flex_n")
    model = EncoderClassifier(16, 3, dim=16, depth=1, heads=2, max_len=8, attention="flex_n")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    model.reset_parameters()
    # the kinds' parameters come from their seeds: equal to a new model's; the rest are redrawn
    for (name, a), (_, b) in zip(model.named_parameters(), fresh.named_parameters()):
        if ".attn.attn." in name or name.endswith("bias") or ".ln" in name or "norm" in name:
            assert torch.equal(a, b), name
        else:
            assert a.shape == b.shape and not torch.equal(a, b + 1.0), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_numpy_parameters_cross_bit_for_bit(dtype):
    from flexformer.nn import CausalLM as NumpyLM

    np_model = NumpyLM(48, dim=16, depth=2, heads=2, max_len=12, short_conv=3, rng=5,
                       dtype=np.float64 if dtype == torch.float64 else np.float32)
    params = np_model.parameters()
    model = CausalLM(48, dim=16, depth=2, heads=2, max_len=12, short_conv=3, dtype=dtype)
    load_numpy_parameters(model, params)
    back = numpy_parameters(model)
    assert set(back) == set(params)
    for name, value in params.items():
        assert back[name].dtype == value.dtype and np.array_equal(back[name], value), name
    ids = np.random.default_rng(0).integers(0, 48, (2, 12))
    with torch.no_grad():
        got = model(torch.from_numpy(ids)).numpy()
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    assert np.abs(got - np_model.forward(ids)).max() <= tol * np.abs(got).max()
    with pytest.raises(ValueError, match="missing"):
        load_numpy_parameters(model, {n: v for n, v in params.items() if n != "head.W"})
