"""Model layers with NumPy backward passes; attention runs through the C kernels.

``EncoderClassifier``, ``TwoTowerClassifier`` and ``CausalLM`` are built from :class:`Embedding`,
:class:`PositionalEncoding`, pre-LN :class:`Block` s (LayerNorm, :class:`MultiHeadAttention`
over any registered kind, optionally with :class:`ShortConv` s on queries,
keys and values, GELU :class:`MLP`) and a :class:`Linear` head. Parameters and
gradients are NumPy arrays by dotted name: ``model.parameters()``, ``model.gradients()``.
"""
from .attention import LINFORMER_SHARING, Block, ConvDecodeState, MultiHeadAttention
from .core import (GELU, MLP, Embedding, LayerNorm, Linear, Module, Parameter, PositionalEncoding, ShortConv,
                   cross_entropy)
from .models import CausalLM, DecodeCache, EncoderClassifier, TwoTowerClassifier, sample_token

__all__ = ["Block", "CausalLM", "ConvDecodeState", "DecodeCache", "EncoderClassifier", "Embedding", "GELU", "LINFORMER_SHARING", "LayerNorm",
           "Linear", "MLP", "Module", "MultiHeadAttention", "Parameter", "PositionalEncoding", "ShortConv", "cross_entropy",
           "TwoTowerClassifier", "sample_token"]
