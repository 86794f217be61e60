"""flexformer: learnable-kernel linear attention (Flexformer) with C kernels and a NumPy API.

Quick start::

    import numpy as np, flexformer as ff
    q = k = v = np.random.default_rng(0).standard_normal((1, 2, 128, 16))
    omega = ff.init.flex_s_omega(2, 32, 16, rng=0)
    out = ff.flex_s_attention(q, k, v, omega, causal=True)
"""
from .runtime import (  # first: loads the C extension
    KERNEL_THREAD_SPIN,
    buffer_cache_info,
    causal_cache_limit,
    dense_paths,
    get_num_threads,
    isa_level,
    openmp_enabled,
    set_buffer_cache,
    set_causal_cache,
    set_num_threads,
)
from . import data, init, nn, recurrent, reference, testing, training
from .functional import DEFAULT_EPS, linear_attention, linear_attention_backward
# <kind>_attention and <kind>_attention_backward for every linear kind, generated from the registry
from .named import *  # noqa: F401,F403
from .named import __all__ as _named_functions
from .recurrent import KVCacheState, LinearAttentionState, RecurrentAttention
from .registry import AttentionKind, attention, attention_backward, attention_kinds, get_attention
from .softmax import (
    linformer_attention,
    linformer_attention_backward,
    softmax_attention,
    softmax_attention_backward,
)

from ._version import __version__


__all__ = [
    "AttentionKind",
    "KVCacheState",
    "LinearAttentionState",
    "RecurrentAttention",
    "DEFAULT_EPS",
    "attention",
    "attention_backward",
    "attention_kinds",
    "get_attention",
    "linear_attention",
    "linear_attention_backward",
    "linformer_attention",
    "linformer_attention_backward",
    "softmax_attention",
    "softmax_attention_backward",
    "get_num_threads",
    "buffer_cache_info",
    "set_buffer_cache",
    "causal_cache_limit",
    "isa_level",
    "dense_paths",
    "set_causal_cache",
    "data",
    "init",
    "nn",
    "openmp_enabled",
    "recurrent",
    "reference",
    "set_num_threads",
    "testing",
    "training",
    *_named_functions,
]

del _named_functions
