"""Exact softmax attention: online softmax in C (csrc/softmax.inc), O(N) memory, the
reference every kernel kind estimates."""
from __future__ import annotations

from .. import softmax as sm
from .base import register

SOFTMAX = register(
    "softmax", "exact softmax attention (online softmax, O(N) memory)", table="softmax", masks=True,
    complexity="O(N^2 (d + e))", _init=lambda H, d, m, L, rng, dt: {},
    _forward=lambda q, k, v, p, c, mk: sm.softmax_attention(q, k, v, causal=c, key_mask=mk),
    _backward=lambda do, q, k, v, p, c, mk: sm.softmax_attention_backward(do, q, k, v, causal=c, key_mask=mk),
    recurrent=True)
