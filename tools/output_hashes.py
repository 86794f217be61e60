"""Digests of every attention kind's outputs: the bit-for-bit check of a change that must
not move a number (a restructuring, a new dispatch).

    python tools/output_hashes.py > before.json      # on the old checkout
    python tools/output_hashes.py > after.json       # on the new one, same machine
    cmp before.json after.json

For every kind, dtype, mode (bidirectional, causal) and key mask: the first 16 hex digits of
the sha256 of the forward's output and every gradient the backward returns, and of the
feature map's NumPy twin where the kind has one. Digests differ between machines whose
kernels take other instruction-set paths (AVX2 and AVX-512 sum in other orders); compare on
one machine.
"""
import hashlib
import json

import numpy as np

import flexformer as ff


def digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
    return h.hexdigest()[:16]

def output_hashes() -> dict:
    """{'<kind> <dtype> <mode> <mask>[ features]': digest} for every case."""
    out = {}
    for name in ff.attention_kinds():
        kind = ff.get_attention(name)
        for dtype in (np.float32, np.float64):
            for causal in (False, True):
                if causal and not kind.causal:
                    continue
                for masked in (False, True):
                    rng = np.random.default_rng(7)
                    B, H, N, d = 2, 3, 150, 8
                    q, k, v = (rng.standard_normal((B, H, N, d)).astype(dtype) * 0.7 for _ in range(3))
                    dout = rng.standard_normal((B, H, N, d)).astype(dtype)
                    mask = rng.random((B, N)) > 0.2 if masked else None
                    params = kind.init(H, d, num_features=12, max_len=N, rng=3, dtype=dtype)
                    o = kind.forward(q, k, v, params, causal=causal, key_mask=mask)
                    dq, dk, dv, dp = kind.backward(dout, q, k, v, params, causal=causal, key_mask=mask)
                    mode = "causal" if causal else "bidir"
                    key = f"{name} {np.dtype(dtype).name} {mode} {'mask' if masked else 'nomask'}"
                    out[key] = digest([o, dq, dk, dv] + [dp[n] for n in sorted(dp)])
                    if kind.feature_map is not None:
                        f, s = kind.feature_map(q, params)
                        out[key + " features"] = digest([f, s])
    return out


if __name__ == "__main__":
    print(json.dumps(output_hashes(), indent=0, sort_keys=True))
