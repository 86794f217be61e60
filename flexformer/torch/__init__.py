"""PyTorch bridge (optional: ``pip install 'flexformer[torch]'``; the core never imports torch).

* :func:`attention` — any registered kind on torch tensors, differentiable: the C kernels
  as custom operators (:mod:`flexformer.torch.ops`, which ``torch.compile`` traces without
  a graph break) for CPU float32/float64 tensors, the identical math in PyTorch operations
  on any other device or dtype (GPU, bfloat16 and float16 with float32 sums).
* :mod:`flexformer.torch.nn` — torch.nn layers and models in torch's conventions
  (:class:`MultiHeadAttention` in the spirit of ``torch.nn.MultiheadAttention``, with
  cross-attention; ``device=``/``dtype=``; ``reset_parameters()``);
  :func:`from_numpy_checkpoint` / :func:`save_numpy_checkpoint` move a
  ``flexformer train`` checkpoint into torch and back, bit for bit.
* ``python -m flexformer.torch.train`` — data-parallel training (DistributedDataParallel,
  gloo on CPU, nccl on GPUs) on the NumPy trainer's tasks; run it under ``torchrun``.

docs/guide/torch.md ("Using flexformer from PyTorch") shows each in use.
"""
try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("flexformer.torch needs PyTorch: pip install 'flexformer[torch]' "
                      "(or pip install torch)") from exc

from .functional import attention, linear_core, torch_attention
from .nn import (CausalLM, EncoderClassifier, MultiHeadAttention, from_numpy_checkpoint, load_numpy_parameters,
                 numpy_parameters, save_numpy_checkpoint)

__all__ = ["CausalLM", "EncoderClassifier", "MultiHeadAttention", "attention", "from_numpy_checkpoint",
           "linear_core", "load_numpy_parameters", "numpy_parameters", "save_numpy_checkpoint", "torch_attention"]
