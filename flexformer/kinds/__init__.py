"""One module per attention kind: its feature map's NumPy twin, gradient, size and torch twin,
its initialiser, its diagnostics hooks and its record (:class:`~flexformer.kinds.base.AttentionKind`),
whose parameter names, layouts and causal support come from the kind's row of csrc/kinds.h.

Adding a kind: its module here, its line in :data:`ORDER`, and its C feature map
(docs/architecture.md). Every other list of kinds (the registry, recurrent decoding,
distillation, the torch bridge, the command line, the diagnostics) is derived from
:data:`flexformer.kinds.base.TABLE`.
"""
from . import elu, flex_n, flex_s, hedgehog, linformer, performer, rebased, softmax, taylor
from .base import TABLE, AttentionKind

#: the kinds in the order the registry holds them
ORDER = (softmax.SOFTMAX, flex_s.FLEX_S, flex_n.FLEX_N, flex_s.RFA, performer.PERFORMER, hedgehog.HEDGEHOG,
         taylor.TAYLOR, rebased.REBASED, linformer.LINFORMER, elu.ELU)
TABLE.update((kind.name, kind) for kind in ORDER)

__all__ = ["AttentionKind", "TABLE"]
