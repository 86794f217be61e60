"""Model layers with NumPy backward passes; attention runs through the C kernels.

``EncoderClassifier``, ``TwoTowerClassifier`` and ``CausalLM`` are built from :class:`Embedding`,
:class:`PositionalEncoding`, pre-LN :class:`Block` s (LayerNorm, :class:`MultiHeadAttention`
over any registered kind, GELU :class:`MLP`) and a :class:`Linear` head. Parameters and
gradients are NumPy arrays by dotted name: ``model.parameters()``, ``model.gradients()``.
"""
from .attention import LINFORMER_SHARING, Block, MultiHeadAttention
from .core import GELU, MLP, Embedding, LayerNorm, Linear, Module, Parameter, PositionalEncoding, cross_entropy
from .models import CausalLM, DecodeCache, EncoderClassifier, TwoTowerClassifier, sample_token

__all__ = ["Block", "CausalLM", "DecodeCache", "EncoderClassifier", "Embedding", "GELU", "LINFORMER_SHARING", "LayerNorm",
           "Linear", "MLP", "Module", "MultiHeadAttention", "Parameter", "PositionalEncoding", "cross_entropy",
           "TwoTowerClassifier", "sample_token"]
