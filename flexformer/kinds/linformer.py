"""Linformer (Wang et al., 2020): keys and values projected along the sequence to kp rows by
E and F (kp, Nmax) per head or shared; softmax attention over the kp rows. No causal form:
E k mixes keys from every position. The C kernel is csrc/linformer.inc."""
from __future__ import annotations

from .. import init as initialisers
from .. import softmax as sm
from .base import register


def init(H, d, m, L, rng, dtype):
    if L is None:
        raise ValueError("linformer needs max_len (the longest sequence, Nmax) to size E and F")
    gen = initialisers.as_generator(rng)
    kp = 64 if m is None else m
    return {"E": initialisers.linformer_projections(kp, L, H, rng=gen, dtype=dtype),
            "F": initialisers.linformer_projections(kp, L, H, rng=gen, dtype=dtype)}


LINFORMER = register(
    "linformer", "Linformer: keys and values projected along the sequence to kp rows", table="linformer",
    masks=True, complexity="O(N kp (d + e))", _init=init,
    _forward=lambda q, k, v, p, c, mk: sm.linformer_attention(q, k, v, p["E"], p["F"], causal=c, key_mask=mk),
    _backward=lambda do, q, k, v, p, c, mk: sm.linformer_attention_backward(do, q, k, v, p["E"], p["F"],
                                                                           causal=c, key_mask=mk))
