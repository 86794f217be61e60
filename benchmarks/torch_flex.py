"""The Flexformer math written in plain PyTorch, as a competent PyTorch user would:
autograd for the backward, the same stabilisation and guard as the C core, and causal
attention in the chunked form (masked matmul inside a chunk, a (2m, e) state carried
between chunks), not an (N, 2m, e) cumulative sum. Used by benchmarks/attention.py as
the peer; never imported by the package.
"""
from __future__ import annotations

import math

import torch

CHUNK = 64


def flex_s_features(x, omega):
    """f(x) (B,H,N,2m) and s(x) (B,H,N) of Flexformer_s."""
    m, d = omega.shape[1], x.shape[-1]
    proj = torch.einsum("bhnd,hmd->bhnm", x, omega)
    f = torch.cat([proj.cos(), proj.sin()], dim=-1) / math.sqrt(m)
    return f, (x * x).sum(-1) / (2.0 * math.sqrt(d))


def flex_n_features(x, omega1, omega2, tau):
    """f(x) and s(x) of Flexformer_n (sum form)."""
    m = omega1.shape[1]
    pa = torch.einsum("bhnd,hmd->bhnm", x, omega1)
    pb = torch.einsum("bhnd,hmd->bhnm", x, omega2)
    f = torch.cat([pa.cos() + pb.cos(), pa.sin() + pb.sin()], dim=-1) / (2.0 * math.sqrt(m))
    return f, (x * x).sum(-1) * torch.exp(-tau)[None, :, None]


def linear_attention_bidirectional(fq, fk, sk, v, eps=1e-4):
    M = sk.amax(-1, keepdim=True).detach()           # the shift cancels; no gradient needed
    w = torch.exp(sk - M)                             # (B,H,N)
    fkw = fk * w.unsqueeze(-1)
    S = fkw.transpose(-1, -2) @ v                     # (B,H,F,e)
    z = fkw.sum(-2)                                   # (B,H,F)
    R = w.sum(-1, keepdim=True)                       # (B,H,1)
    num = fq @ S
    den = fq @ z.unsqueeze(-1)                        # (B,H,N,1)
    g = torch.maximum(den, eps * R.unsqueeze(-1))
    return num / g


def linear_attention_causal(fq, fk, sk, v, eps=1e-4, chunk=CHUNK):
    B, H, N, F = fq.shape
    e = v.shape[-1]
    nc = (N + chunk - 1) // chunk
    pad = nc * chunk - N
    if pad:
        fq = torch.nn.functional.pad(fq, (0, 0, 0, pad))
        fk = torch.nn.functional.pad(fk, (0, 0, 0, pad))
        v = torch.nn.functional.pad(v, (0, 0, 0, pad))
        sk = torch.nn.functional.pad(sk, (0, pad), value=-float("inf"))
    fq = fq.view(B, H, nc, chunk, F)
    fk = fk.view(B, H, nc, chunk, F)
    v = v.view(B, H, nc, chunk, e)
    sk = sk.view(B, H, nc, chunk)
    with torch.no_grad():                             # stabilisers: prefix maxima, no gradient
        Mi = torch.cummax(sk.reshape(B, H, -1), dim=-1).values.view(B, H, nc, chunk)
        Mend = Mi[..., -1]                            # max over keys up to each chunk's end
    # chunk states at the scale of each chunk's end, then prefix states by a scan
    wl = torch.exp(sk - Mend.unsqueeze(-1))           # (B,H,nc,C)
    Sc = torch.einsum("bhcjf,bhcje->bhcfe", fk * wl.unsqueeze(-1), v)
    zc = (fk * wl.unsqueeze(-1)).sum(-2)
    Rc = wl.sum(-1)
    prefix_S, prefix_z, prefix_R = [torch.zeros_like(Sc[:, :, 0])], [torch.zeros_like(zc[:, :, 0])], [torch.zeros_like(Rc[:, :, 0])]
    for c in range(1, nc):
        f = torch.exp(Mend[:, :, c - 2] - Mend[:, :, c - 1]) if c > 1 else torch.zeros_like(Mend[:, :, 0])
        prefix_S.append(prefix_S[-1] * f[..., None, None] + Sc[:, :, c - 1])
        prefix_z.append(prefix_z[-1] * f[..., None] + zc[:, :, c - 1])
        prefix_R.append(prefix_R[-1] * f + Rc[:, :, c - 1])
    Sp, zp, Rp = torch.stack(prefix_S, 2), torch.stack(prefix_z, 2), torch.stack(prefix_R, 2)
    Mprev = torch.cat([torch.full_like(Mend[:, :, :1], -float("inf")), Mend[:, :, :-1]], dim=2)
    alpha = torch.exp(Mprev.unsqueeze(-1) - Mi)       # (B,H,nc,C): prefix state -> row scale
    # intra-chunk: E_ij = exp(s_j - M_i) for j <= i
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=fq.device).tril()
    E = torch.exp(sk.unsqueeze(-2) - Mi.unsqueeze(-1)).masked_fill(~causal, 0.0)
    A = (fq @ fk.transpose(-1, -2)) * E
    num = A @ v + alpha.unsqueeze(-1) * (fq @ Sp)
    den = A.sum(-1) + alpha * (fq * zp.unsqueeze(-2)).sum(-1)
    R = E.sum(-1) + alpha * Rp.unsqueeze(-1)
    g = torch.maximum(den, eps * R)
    out = (num / g.unsqueeze(-1)).reshape(B, H, nc * chunk, e)
    return out[:, :, :N]


def flex_s_attention(q, k, v, omega, causal=False, eps=1e-4):
    fq, _ = flex_s_features(q, omega)
    fk, sk = flex_s_features(k, omega)
    run = linear_attention_causal if causal else linear_attention_bidirectional
    return run(fq, fk, sk, v, eps)


def flex_n_attention(q, k, v, omega1, omega2, tau, causal=False, eps=1e-4):
    fq, _ = flex_n_features(q, omega1, omega2, tau)
    fk, sk = flex_n_features(k, omega1, omega2, tau)
    run = linear_attention_causal if causal else linear_attention_bidirectional
    return run(fq, fk, sk, v, eps)
