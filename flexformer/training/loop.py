"""The reference training loop: build a model for a task, train with AdamW, evaluate,
checkpoint, resume exactly, stop cleanly on Ctrl-C."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .._progress import ProgressLine
from ..runtime import set_num_threads
from ..init import DEFAULT_MATCH_TAU, DEFAULT_SCALE, DEFAULT_SPREAD, check_scale, check_spread
from ..nn import CausalLM, EncoderClassifier, TwoTowerClassifier, cross_entropy
from ..nn.core import check_short_conv
from ..registry import get_attention
from . import checkpoint
from .optim import AdamW, clip_global_norm, lr_at

#: every task the trainer runs, with what a run starts from when the option is not given:
#: ``lr``, the peak learning rate, 1e-3 unless measured otherwise (text-lm: 3e-3,
#: experiments/journal/results-log.md section 13; ListOps, text-cls and fmnist were measured at 3e-3 too and
#: kept 1e-3, sections 13 and 14); ``short_conv``, the width of the short convolutions on
#: queries, keys and values, 0 (none) unless measured otherwise (text-lm: 4, section 15)
TASK_DEFAULTS = {
    "listops": {"lr": 1e-3, "short_conv": 0},
    "fmnist": {"lr": 1e-3, "short_conv": 0},
    "pathfinder": {"lr": 1e-3, "short_conv": 0},
    "text-lm": {"lr": 3e-3, "short_conv": 4},
    "text-cls": {"lr": 1e-3, "short_conv": 0},
    "retrieval": {"lr": 1e-3, "short_conv": 0, "pair_training": "all"},
}
TASKS = tuple(TASK_DEFAULTS)
#: the peak learning rate per task (from TASK_DEFAULTS)
TASK_DEFAULT_LR = {task: defaults["lr"] for task, defaults in TASK_DEFAULTS.items()}
#: the tasks that read plain-text files from --data-dir
TEXT_TASKS = ("text-lm", "text-cls", "retrieval")
#: how retrieval trains (TrainConfig.pair_training): every pair of a batch of windows with a
#: cosine head, or the drawn pairs with the LRA head
PAIR_TRAINING = ("all", "designated")


def _option(default, help: str, **cli):
    """A TrainConfig field with its command-line help (and ``flag`` or ``metavar`` where the
    option differs from the field's name): :mod:`flexformer.training.options` builds the
    options from these."""
    return dataclasses.field(default=default, metadata={"help": help, **cli})


#: what each field annotation of TrainConfig admits, and how a message names it
_FIELD_TYPES = {"int": ((int,), "an int"), "float": ((int, float), "a number"), "bool": ((bool,), "a bool"),
                "str": ((str,), "a string")}


def _fits(annotation: str, value) -> bool:
    """Whether ``value`` fits a TrainConfig field annotated ``annotation`` ("int",
    "Optional[float]", ...) as JSON keeps it: a bool may be saved as 0 or 1 and a float as
    an int; an Optional field may hold None."""
    optional = annotation.startswith("Optional[")
    base = annotation[len("Optional["):-1] if optional else annotation
    if value is None:
        return optional
    if base == "bool":
        return isinstance(value, bool) or (isinstance(value, int) and value in (0, 1))
    return not isinstance(value, bool) and isinstance(value, _FIELD_TYPES[base][0])


def _kind(annotation: str) -> str:
    optional = annotation.startswith("Optional[")
    base = _FIELD_TYPES[annotation[len("Optional["):-1] if optional else annotation][1]
    return f"{base} or None" if optional else base


@dataclass
class TrainConfig:
    """Everything that defines a run (saved in the checkpoint; ``--resume`` reuses it);
    :meth:`validate` checks it.

    Parameters
    ----------
    **fields
        Each field carries its help text, from which :mod:`flexformer.training.options`
        builds the options of ``flexformer train`` (the field's name with dashes:
        ``--seq-len``; ``--features`` is ``num_features``) and of
        ``python -m flexformer.torch.train``. ``lr`` and ``short_conv`` left as None take
        the task's defaults (``TASK_DEFAULTS``).

    Examples
    --------
    >>> from flexformer.training import TrainConfig
    >>> cfg = TrainConfig(task="listops", attention="flex_s", steps=10)
    >>> cfg.validate()
    >>> cfg.dim, cfg.heads
    (64, 4)
    """

    task: str = _option("listops", "one of " + ", ".join(TASKS))
    attention: str = _option("flex_n", "attention kind; see flexformer.attention_kinds()")
    dim: int = _option(64, "model width")
    depth: int = _option(2, "blocks")
    heads: int = _option(4, "attention heads")
    num_features: Optional[int] = _option(None, "m for feature-map kinds, kp for linformer (default: the "
                                          "kind's)", flag="--features", metavar="M")
    linformer_sharing: str = _option("none", "none, headwise, key-value or layerwise")
    positional: str = _option("learned", "learned or sinusoidal positions (sinusoidal ones extend past "
                              "--seq-len when generating)")
    seq_len: int = _option(128, "sequence length; pathfinder: the image's pixels, 256 (16 x 16) or "
                           "1024 (32 x 32)")
    steps: int = _option(600, "training steps; with --resume, a new total")
    batch_size: int = _option(16, "sequences per step")
    #: None = the task's default (TASK_DEFAULTS), set on construction
    lr: Optional[float] = _option(None, "peak learning rate")
    weight_decay: float = _option(0.01, "AdamW weight decay")
    warmup: int = _option(50, "warmup steps")
    clip: float = _option(1.0, "global gradient-norm clipping; 0 = none")
    seed: int = _option(0, "seed of the initialisation and the data order")
    threads: int = _option(0, "kernel threads; 0 = OpenMP's")
    data_dir: Optional[str] = _option(None, "data folder (fmnist, text-lm, text-cls, retrieval)")
    eval_batches: int = _option(64, "held-out batches in each evaluation")
    eval_every: int = _option(0, "steps between held-out evaluations during training, written to evals.jsonl "
                              "with the training seconds so far (a learning curve against time); 0 = only "
                              "the final one")
    checkpoint_every: int = _option(100, "steps between checkpoints")
    dtype: str = _option("float32", "float32 or float64")
    kernel_init_scale: float = _option(DEFAULT_SCALE, "bandwidth scale s of the initial frequencies of "
                                       "flex_s, flex_n and rfa: rows ~ N(0, s^2 I / sqrt d); 1 = the unbiased "
                                       "softmax estimate")
    kernel_init_spread: float = _option(DEFAULT_SPREAD, "spread r in [0, 1] between flex_n's initial omega1 "
                                        "and omega2; 0 = equal")
    kernel_init_match_tau: bool = _option(DEFAULT_MATCH_TAU, "flex_n's initial tau follows the scale "
                                          "(log(2 sqrt d / s^2)) or stays log(2 sqrt d)")
    diagnostics_every: int = _option(50, "steps between per-layer kernel diagnostics in diagnostics.jsonl; "
                                     "0 = off")
    kernel_lr_scale: float = _option(1.0, "learning-rate multiplier for the attention-kernel parameters")
    attention_eps: Optional[float] = _option(None, "denominator guard of the linear kinds (default "
                                             "flexformer.DEFAULT_EPS = 1e-4)")
    qk_norm: bool = _option(False, "scale queries and keys to a learned length per head before the kernel")
    learn_scale: bool = _option(False, "multiply queries and keys by a learned factor per head before the "
                                "kernel (for flex_s: a learned bandwidth, as tau is for flex_n)")
    #: None = the task's default (TASK_DEFAULTS), set on construction
    short_conv: Optional[int] = _option(None, "width of a causal depthwise convolution on queries, keys and "
                                        "values after their projections (a local window for the linear "
                                        "kinds); 0 = none", metavar="WIDTH")
    #: None = the task's default (TASK_DEFAULTS), set on construction; retrieval only
    pair_training: Optional[str] = _option(None, "retrieval: 'all' trains a cosine head on every pair among "
                                           "2 x batch-size windows per step (same and different weighted "
                                           "equally); 'designated' trains the LRA head [u, v, u v, u - v] on "
                                           "batch-size drawn pairs. Both evaluate on drawn held-out pairs",
                                           metavar="HOW")

    #: what a configuration saved before a field existed meant (checkpoints of earlier
    #: versions load with the initialisation they were trained with)
    LEGACY = {"kernel_init_scale": 1.0, "kernel_init_spread": 0.0, "kernel_init_match_tau": True,
              "diagnostics_every": 0, "short_conv": 0, "pair_training": "designated"}

    def __post_init__(self) -> None:
        # an unknown task is refused by validate()
        defaults = TASK_DEFAULTS.get(self.task, TASK_DEFAULTS["listops"])
        for name, value in defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if isinstance(self.data_dir, os.PathLike):  # kept as a string: the configuration is saved as JSON
            self.data_dir = os.fspath(self.data_dir)

    @classmethod
    def from_saved(cls, saved: dict) -> "TrainConfig":
        """The configuration stored in a checkpoint, with the earlier meaning of fields it lacks."""
        if not isinstance(saved, dict):
            raise TypeError(f"the saved configuration must be a dict, got {type(saved).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(saved) - set(fields))
        if unknown:
            raise TypeError(f"the saved configuration has unknown field(s) {', '.join(unknown)}")
        for name, value in saved.items():
            if not _fits(fields[name].type, value):
                raise TypeError(f"the saved configuration's {name} is {value!r}, expected a value like "
                                f"{fields[name].default!r}")
        return cls(**{**cls.LEGACY, **saved})

    def kernel_init(self) -> dict:
        """The attention kinds' initialisation options this configuration asks for."""
        return {"scale": self.kernel_init_scale, "spread": self.kernel_init_spread,
                "match_tau": bool(self.kernel_init_match_tau)}

    def validate(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name not in ("lr", "short_conv") and not _fits(field.type, value):  # those two: below
                raise TypeError(f"{field.name} must be {_kind(field.type)}, got {value!r}")
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose one of: {', '.join(TASKS)}")
        get_attention(self.attention)  # lists the choices when unknown
        for name in ("dim", "depth", "heads", "seq_len", "steps", "batch_size", "eval_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (isinstance(self.lr, (int, float)) and not isinstance(self.lr, bool) and math.isfinite(self.lr)
                and self.lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {self.lr}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay}")
        if not (math.isfinite(self.clip) and self.clip >= 0):
            raise ValueError(f"clip must be a finite number >= 0 (0 = no clipping), got {self.clip}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if not 0 <= self.threads <= 4096:
            raise ValueError(f"threads must be 0 (OpenMP's default) or 1..4096, got {self.threads}")
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype!r}")
        try:
            check_scale(self.kernel_init_scale)
            check_spread(self.kernel_init_spread)
        except ValueError as exc:
            raise ValueError(f"kernel_init_{str(exc)}") from None
        if not (math.isfinite(self.kernel_lr_scale) and self.kernel_lr_scale > 0):
            raise ValueError(f"kernel_lr_scale must be a finite number > 0, got {self.kernel_lr_scale}")
        if self.attention_eps is not None and not (math.isfinite(self.attention_eps) and self.attention_eps > 0):
            raise ValueError(f"attention_eps must be a finite number > 0, got {self.attention_eps}")
        if self.qk_norm and self.learn_scale:
            raise ValueError("qk_norm and learn_scale are alternatives (qk_norm learns a length of its own); "
                             "choose one")
        check_short_conv(self.short_conv, integer_types=int)  # a plain int: the configuration is saved as JSON
        for name in ("diagnostics_every", "eval_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.task == "pathfinder":
            pathfinder_size(self.seq_len)
        if self.pair_training not in PAIR_TRAINING + ((None,) if self.task != "retrieval" else ()):
            raise ValueError(f"pair_training must be one of {', '.join(PAIR_TRAINING)}, got {self.pair_training!r}")


def pathfinder_size(seq_len: int) -> int:
    """The image side of a Pathfinder run: --seq-len is the number of pixels, size^2."""
    from ..data.pathfinder import MIN_SIZE

    size = math.isqrt(seq_len)
    if size * size != seq_len or size < MIN_SIZE:
        raise ValueError(f"task pathfinder reads a size x size image as a sequence: --seq-len must be size^2 with "
                         f"size >= {MIN_SIZE} (256 for 16 x 16, 1024 for LRA's 32 x 32), got {seq_len}")
    return size


def build_data(cfg: TrainConfig):
    from ..data import FashionMNIST, ListOps, Pathfinder, TextClassification, TextLM, TextRetrieval
    from ..data.fmnist import DEFAULT_DIR

    if cfg.task == "listops":
        return ListOps(cfg.seq_len)
    if cfg.task == "fmnist":
        return FashionMNIST(cfg.data_dir or DEFAULT_DIR)
    if cfg.task == "pathfinder":
        return Pathfinder(pathfinder_size(cfg.seq_len))
    if cfg.data_dir is None:
        raise ValueError(f"task {cfg.task} reads plain-text files: pass --data-dir (e.g. ../shared/data/austen)")
    if cfg.task == "text-lm":
        return TextLM(cfg.data_dir, cfg.seq_len)
    if cfg.task == "retrieval":
        return TextRetrieval(cfg.data_dir, cfg.seq_len)
    return TextClassification(cfg.data_dir, cfg.seq_len)


def build_model(cfg: TrainConfig, data):
    return model_for_config(cfg, data.vocab_size, getattr(data, "num_classes", None),
                            data.seq_len if cfg.task == "fmnist" else cfg.seq_len)


def model_for_config(cfg: TrainConfig, vocab: int, num_classes: Optional[int], max_len: int):
    """The model a run with ``cfg`` trains, given the data's sizes (no data is read)."""
    common = dict(dim=cfg.dim, depth=cfg.depth, heads=cfg.heads, max_len=max_len, attention=cfg.attention,
                  positional=cfg.positional, num_features=cfg.num_features, kernel_init=cfg.kernel_init(),
                  eps=cfg.attention_eps, qk_norm=bool(cfg.qk_norm),
                  learn_scale=bool(cfg.learn_scale), short_conv=cfg.short_conv, rng=cfg.seed, dtype=np.dtype(cfg.dtype))
    if cfg.task == "text-lm":
        return CausalLM(vocab, **common)
    if cfg.task == "retrieval":
        head = "cosine" if cfg.pair_training == "all" else "concat"
        return TwoTowerClassifier(vocab, num_classes, head=head, linformer_sharing=cfg.linformer_sharing, **common)
    return EncoderClassifier(vocab, num_classes, linformer_sharing=cfg.linformer_sharing, **common)


def check_saved_sizes(cfg: TrainConfig, params: dict, where: str) -> None:
    """The sizes a saved configuration claims (width, depth, features) against the saved
    arrays, before a model of that size is built: a small file cannot make us allocate a
    large model. ValueError naming the first disagreement."""
    def fail(what):
        raise ValueError(f"{where} does not match its saved configuration: {what}")

    try:
        cfg.validate()
    except ValueError as exc:
        fail(exc)
    for name, value in params.items():
        if not isinstance(value, np.ndarray) or value.dtype.kind != "f":
            fail(f"parameter {name} is not a floating-point array")
    for name in ("backbone.embed.W", "head.W"):
        if name not in params:
            fail(f"missing parameter {name!r}")
        if params[name].ndim != 2:
            fail(f"{name} must be 2-d, got shape {params[name].shape}")
    embed = params["backbone.embed.W"]
    if embed.shape[1] != cfg.dim:
        fail(f"backbone.embed.W has shape {embed.shape}, the configuration's dim is {cfg.dim}")
    blocks = {int(n.split(".")[2]) for n in params if n.startswith("backbone.blocks.") and n.split(".")[2].isdigit()}
    if blocks != set(range(cfg.depth)):
        fail(f"the parameters hold blocks {sorted(blocks)}, the configuration's depth is {cfg.depth}")
    if cfg.dim % cfg.heads:
        fail(f"dim {cfg.dim} is not a multiple of heads {cfg.heads}")
    kernel = [v for n, v in params.items() if ".attn.attn." in n and v.ndim >= 2]
    if cfg.num_features is not None and kernel and not any(cfg.num_features in v.shape for v in kernel):
        fail(f"no attention-kernel array has the configuration's {cfg.num_features} features")


def load_model(path: str):
    """(model, cfg, meta) from a run folder or a checkpoint.npz written by :func:`train`.

    The sizes (vocabulary, classes, positions) come from the saved arrays, so no data
    is needed; ValueError when the file is not a usable checkpoint.

    Parameters
    ----------
    path : str
        A run folder or its ``checkpoint.npz``.

    Returns
    -------
    model, cfg : the model and its TrainConfig
    meta : dict

    Raises
    ------
    ValueError
        Not a usable checkpoint.

    Examples
    --------
    >>> import tempfile
    >>> from flexformer.training import TrainConfig, load_model, train
    >>> run = tempfile.mkdtemp() + "/run"
    >>> _ = train(TrainConfig(steps=2, seq_len=32, batch_size=4, dim=16, heads=2, depth=1, eval_batches=1), run,
    ...           progress=False)
    >>> model, cfg, meta = load_model(run)
    >>> cfg.steps, meta["step"]
    (2, 2)
    """
    ckpt = os.path.join(path, "checkpoint.npz") if os.path.isdir(path) else path
    params, _, meta = checkpoint.load(ckpt)
    try:
        cfg = TrainConfig.from_saved(meta["config"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{ckpt} does not hold a flexformer model ({exc.__class__.__name__}: {exc})") from None
    check_saved_sizes(cfg, params, ckpt)
    vocab = params["backbone.embed.W"].shape[0]
    # retrieval scores two classes, same or different (its cosine head's W is a projection)
    classes = 2 if cfg.task == "retrieval" else params["head.W"].shape[1]
    max_len = params["backbone.pos.P"].shape[0] if "backbone.pos.P" in params else (
        784 if cfg.task == "fmnist" else cfg.seq_len)
    model = model_for_config(cfg, vocab, None if cfg.task == "text-lm" else classes, max_len)
    try:
        model.load_parameters(params)
    except KeyError as exc:
        raise ValueError(f"{ckpt} does not match its saved configuration: {exc}") from None
    return model, cfg, meta


def batch_for(cfg: TrainConfig, data, step: int, split: str = "train"):
    """The batch of a step depends only on (seed, step): a resumed run sees the same data."""
    rng = np.random.default_rng([cfg.seed, step, 0 if split == "train" else 1])
    if cfg.task == "listops":
        return data.batch(rng, cfg.batch_size)
    if cfg.task == "retrieval" and cfg.pair_training == "all" and split == "train":
        return data.windows(rng, 2 * cfg.batch_size, split)
    return data.batch(rng, cfg.batch_size, split)


def batch_tokens(cfg: TrainConfig, batch) -> int:
    """Tokens a batch trains on, as tokens/s counts them (both trainers): every position
    for text-lm, the unmasked ones for the classification tasks."""
    if cfg.task == "text-lm":
        return int(np.asarray(batch[0]).size)
    return int(np.asarray(batch[1]).sum())


def loss_and_grad(cfg: TrainConfig, model, batch):
    """(loss, correct, count, tokens) for a batch; gradients are left in the model."""
    if cfg.task == "text-lm":
        x, y = batch
        logits = model.forward(x)
        loss, dlogits = cross_entropy(logits, y)
        return loss, dlogits, None, batch_tokens(cfg, batch)
    ids, mask, labels = batch
    if cfg.task == "retrieval" and np.ndim(ids) == 2:  # windows and their books: every pair
        first, second = np.triu_indices(len(ids), 1)
        labels = (labels[first] == labels[second]).astype(np.int64)
        same = labels.sum()
        # each class weighs half, whatever its share of the pairs (about 1 in 6 are related)
        weights = np.where(labels == 1, 1 / max(same, 1), 1 / max(len(labels) - same, 1))
        logits = model.forward_pairs(ids, mask, first, second)
        loss, dlogits = cross_entropy(logits, labels, weights)
    else:
        logits = model.forward(ids, mask)
        loss, dlogits = cross_entropy(logits, labels)
    return loss, dlogits, int((logits.argmax(-1) == labels).sum()), batch_tokens(cfg, batch)


def attention_diagnostics(model, *, rows: int = 32) -> list:
    """Per-layer kernel diagnostics of the model's last forward call, one dict per block
    (:func:`flexformer.diagnostics.layer_diagnostics`)."""
    return [dict(layer=i, **block.attn.diagnostics(rows=rows)) for i, block in enumerate(model.backbone.blocks)]


def summarise_diagnostics(layers: list) -> dict:
    """Means over layers and heads of each per-head diagnostic."""
    out = {}
    for key in ("guard_fraction", "kernel_tv", "separation", "tau", "omega_row_norm", "omega1_row_norm"):
        vals = [v for layer in layers for v in layer.get(key, [])]
        if vals:
            out[key] = float(np.mean(vals))
    return out


def evaluate(cfg: TrainConfig, model, data, batches: Optional[int] = None) -> dict:
    """Evaluation loss and accuracy (bits per character for text-lm) on the first
    ``batches`` (default ``cfg.eval_batches``) held-out batches.

    Parameters
    ----------
    cfg : TrainConfig
    model : the model :func:`train` built
    data : the task's data
    batches : int, optional

    Returns
    -------
    dict
        ``eval_loss`` and ``eval_accuracy`` or ``eval_bits_per_char``.

    Examples
    --------
    >>> import tempfile
    >>> from flexformer.training import TrainConfig, evaluate, load_model, train
    >>> cfg = TrainConfig(steps=2, seq_len=32, batch_size=4, dim=16, heads=2, depth=1, eval_batches=1)
    >>> run = tempfile.mkdtemp() + "/run"
    >>> _ = train(cfg, run, progress=False)
    >>> from flexformer.training.loop import build_data
    >>> model, cfg, meta = load_model(run)
    >>> sorted(evaluate(cfg, model, build_data(cfg), batches=1))
    ['eval_accuracy', 'eval_loss']
    """
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg must be a TrainConfig, got {type(cfg).__name__}")
    losses, correct, count = [], 0, 0
    for i in range(cfg.eval_batches if batches is None else batches):
        batch = batch_for(cfg, data, 10_000_000 + i, "test")
        loss, _, right, _ = loss_and_grad(cfg, model, batch)
        losses.append(loss)
        if right is not None:
            correct += right
            count += len(batch[-1])
    out = {"eval_loss": float(np.mean(losses))}
    if cfg.task == "text-lm":
        out["eval_bits_per_char"] = out["eval_loss"] / math.log(2)
    else:
        out["eval_accuracy"] = correct / count
    return out


class _StopFlag:
    """SIGINT sets a flag that the loop reads between steps (a step is never cut short)."""

    def __init__(self):
        self.stop = False
        self._old = None

    def __enter__(self):
        def handler(signum, frame):
            if self.stop:  # second Ctrl-C: give up waiting
                raise KeyboardInterrupt
            self.stop = True
        try:
            self._old = signal.signal(signal.SIGINT, handler)
        except ValueError:  # not the main thread: no handler
            self._old = None
        return self

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def _progress_message(step, total, loss, tok_s, start):
    width = 24
    done = int(width * step / total)
    eta = (time.perf_counter() - start) / max(step, 1) * (total - step)
    return (f"[{'#' * done}{'.' * (width - done)}] {step}/{total} loss {loss:.4f} "
            f"{tok_s:,.0f} tok/s eta {eta:5.0f}s")


RUN_FILES = ("checkpoint.npz", "metrics.json", "diagnostics.jsonl", "evals.jsonl")


def prepare_run_folder(out_dir: str, *, resume: bool, overwrite: bool) -> bool:
    """Check ``out_dir`` before any work: a new run never replaces a finished one unless
    ``overwrite``; a resumed one needs its checkpoint. Creates the folder, checks that it
    is writable, and removes temporary checkpoint files a killed run left. Returns True
    when the folder was created here."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"the run folder {out_dir} is a file, not a folder")
    if resume:
        if not os.path.isfile(os.path.join(out_dir, "checkpoint.npz")):
            raise FileNotFoundError(f"no checkpoint.npz in {out_dir} to resume")
    elif not overwrite and os.path.isdir(out_dir):
        held = [f for f in RUN_FILES if os.path.exists(os.path.join(out_dir, f))]
        if held:
            raise ValueError(f"{out_dir} already holds a run ({', '.join(held)}); continue it with --resume "
                             f"{out_dir}, choose another --out, or pass --overwrite to replace it")
    created = not os.path.isdir(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".write-probe-"):
            pass
    except OSError as exc:
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise ValueError(f"cannot write to the run folder {out_dir} ({exc.strerror or exc})") from None
    checkpoint.remove_stale_temporaries(out_dir)
    return created


def train(cfg: Optional[TrainConfig], out_dir: str, *, resume: bool = False, progress: bool = True,
          stop_at: Optional[int] = None, steps: Optional[int] = None, stream=sys.stderr,
          overwrite: bool = False, threads: Optional[int] = None) -> dict:
    """Train, evaluate and write ``checkpoint.npz`` and ``metrics.json`` into ``out_dir``.

    A folder that already holds a run is refused unless ``overwrite`` (then its files are
    replaced). With ``resume`` the run continues from ``out_dir/checkpoint.npz`` with its saved
    configuration (``cfg`` is ignored; ``steps`` sets a new total, which must be past the
    saved step) and, unless the total changed, ends with the same parameters an
    uninterrupted run would have. ``stop_at`` ends the session after that step with a
    checkpoint, as Ctrl-C does (for time-sliced jobs). A checkpoint is written only when
    every parameter is finite. ``threads`` (kernel threads for this session) overrides the
    configuration's without changing the results. Returns the metrics.

    Parameters
    ----------
    cfg : TrainConfig or None
        None only with ``resume``.
    out_dir : str
        The run folder.
    resume, progress, stop_at, steps, stream, overwrite, threads
        As above.

    Returns
    -------
    dict
        The metrics also written to ``metrics.json``.

    Raises
    ------
    ValueError
        A bad configuration, or a run folder that holds a run (without ``overwrite``).
    FloatingPointError
        The loss, a gradient or a parameter became non-finite (the last good checkpoint
        is kept).

    Examples
    --------
    >>> import tempfile
    >>> from flexformer.training import TrainConfig, train
    >>> cfg = TrainConfig(steps=5, seq_len=32, batch_size=4, dim=16, heads=2, depth=1, eval_batches=1)
    >>> metrics = train(cfg, tempfile.mkdtemp() + "/run", progress=False)
    >>> metrics["steps"], 0.0 <= metrics["eval_accuracy"] <= 1.0
    (5, True)
    """
    if not resume:
        if not isinstance(cfg, TrainConfig):
            raise TypeError(f"cfg must be a TrainConfig (None only with resume=True), got {type(cfg).__name__}")
        cfg.validate()  # before the folder is touched
    created = prepare_run_folder(out_dir, resume=resume, overwrite=overwrite)
    try:
        return _train(cfg, out_dir, resume=resume, progress=progress, stop_at=stop_at, steps=steps,
                      stream=stream, threads=threads)
    except BaseException:
        if created and not os.listdir(out_dir):  # a failed start leaves no empty folder behind
            os.rmdir(out_dir)
        raise


def _train(cfg, out_dir, *, resume, progress, stop_at, steps, stream, threads) -> dict:
    ckpt_path = os.path.join(out_dir, "checkpoint.npz")
    start_step, saved = 0, None
    if resume:
        params, opt_state, meta = checkpoint.load(ckpt_path)
        try:
            cfg = TrainConfig.from_saved(meta["config"])
            start_step = meta["step"]
            if not isinstance(start_step, int) or isinstance(start_step, bool) or start_step < 0:
                raise TypeError(f"step must be an integer >= 0, got {start_step!r}")
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{ckpt_path} does not hold a resumable run ({exc.__class__.__name__}: {exc})") from None
        check_saved_sizes(cfg, params, ckpt_path)
        saved = (params, opt_state)
    if steps is not None:
        cfg.steps = steps
    cfg.validate()
    if resume and start_step >= cfg.steps:
        raise ValueError(f"the run in {out_dir} is finished ({start_step} of {cfg.steps} steps); give a new "
                         f"total with --steps N, N > {start_step}, to train it further")
    if threads is not None:
        cfg.threads = threads
    if cfg.threads:
        set_num_threads(cfg.threads)
    data = build_data(cfg)
    model = build_model(cfg, data)
    named = model.named_parameters()
    opt = AdamW(named, lr=cfg.lr, weight_decay=cfg.weight_decay, kernel_lr_scale=cfg.kernel_lr_scale)
    if saved:
        try:
            model.load_parameters(saved[0])
            opt.load_state(saved[1])
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{ckpt_path} does not match its saved configuration: {exc}") from None

    def write_checkpoint(step):
        checkpoint.save(ckpt_path, model.parameters(), opt.state(),
                        {"step": step, "config": dataclasses.asdict(cfg), "train_seconds": train_seconds()})

    diag_path = os.path.join(out_dir, "diagnostics.jsonl")
    if not resume:  # overwrite: the replaced run's files go before this one writes any
        for name in RUN_FILES:
            if os.path.exists(os.path.join(out_dir, name)):
                os.remove(os.path.join(out_dir, name))
    last_diag = None

    def record_diagnostics(step, loss):
        # the layers still hold this step's queries and keys: read them before the backward
        nonlocal last_diag
        layers = attention_diagnostics(model)
        last_diag = {"step": step, "loss": float(loss), "summary": summarise_diagnostics(layers),
                     "layers": layers}

    def write_diagnostics():
        # after the step's update: a quick evaluation on a few held-out batches (the
        # forward passes change no parameter and draw from no training stream)
        quick = evaluate(cfg, model, data, batches=min(4, cfg.eval_batches))
        last_diag["eval_loss_after"] = quick["eval_loss"]
        with open(diag_path, "a") as fh:
            fh.write(json.dumps(last_diag) + "\n")

    # training seconds: the wall time of the steps, carried across resumes, without the
    # evaluations and diagnostics (their time goes into `paused`)
    earlier_seconds = float(meta.get("train_seconds", 0.0)) if resume else 0.0
    paused = 0.0

    def train_seconds() -> float:
        return earlier_seconds + time.perf_counter() - start - paused

    @contextlib.contextmanager
    def off_the_clock():
        nonlocal paused
        began = time.perf_counter()
        try:
            yield
        finally:
            paused += time.perf_counter() - began

    def write_eval(step, result=None, seconds=None):
        with off_the_clock():
            row = {"step": step, "train_seconds": round(train_seconds() if seconds is None else seconds, 3),
                   **(result if result is not None else evaluate(cfg, model, data))}
            with open(os.path.join(out_dir, "evals.jsonl"), "a") as fh:
                fh.write(json.dumps(row) + "\n")

    losses, tokens, start, step = [], 0, time.perf_counter(), start_step
    if cfg.eval_every and start_step == 0:
        write_eval(0)
    bar = ProgressLine(cfg.steps, stream) if progress else None
    stopped, reason = False, None
    with _StopFlag() as flag:
        while step < cfg.steps:
            batch = batch_for(cfg, data, step)
            model.zero_grad()
            loss, dlogits, _, ntok = loss_and_grad(cfg, model, batch)
            if not math.isfinite(loss):
                reason = f"loss became {loss} at step {step}; stopped with the last good checkpoint kept"
                break
            diag_due = cfg.diagnostics_every and (step % cfg.diagnostics_every == 0 or step == cfg.steps - 1)
            if diag_due:
                with off_the_clock():
                    record_diagnostics(step, loss)  # of this step's forward, before its update
            model.backward(dlogits)
            norm = clip_global_norm(named, cfg.clip)
            if not math.isfinite(norm):
                reason = f"gradient norm became {norm} at step {step}; stopped with the last good checkpoint kept"
                break
            opt.step(lr_at(step, base_lr=cfg.lr, warmup=cfg.warmup, total=cfg.steps))
            bad = next((name for name, p in named if not np.isfinite(p.value).all()), None)
            if bad is not None:
                reason = (f"parameter {bad} became non-finite at step {step}; stopped with the last good "
                          f"checkpoint kept")
                break
            if diag_due:
                with off_the_clock():
                    write_diagnostics()
            step += 1
            if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
                write_eval(step)
            losses.append(loss)
            tokens += ntok
            now = time.perf_counter()
            if bar is not None:
                bar.show(step, _progress_message(step, cfg.steps, np.mean(losses[-20:]), tokens / (now - start),
                                                 start))
            if step % cfg.checkpoint_every == 0 or step == cfg.steps:
                write_checkpoint(step)
            if flag.stop or (stop_at is not None and step >= stop_at and step < cfg.steps):
                write_checkpoint(step)
                stopped = True
                break
    wall = time.perf_counter() - start
    seconds = train_seconds()
    if bar is not None:
        bar.close()
    if reason:
        stream.write(reason + "\n")
        raise FloatingPointError(reason)
    metrics = {"task": cfg.task, "attention": cfg.attention, "steps": step,
               "train_loss": float(np.mean(losses[-max(1, len(losses) // 10):])) if losses else None,
               "tokens_per_s": tokens / (wall - paused) if wall > paused else None, "wall_s": wall,
               "train_seconds": seconds,
               "params": model.num_parameters(), "seed": cfg.seed, "interrupted": stopped,
               "config": dataclasses.asdict(cfg)}
    if last_diag is not None:
        metrics["diagnostics"] = {"step": last_diag["step"], **last_diag["summary"]}
    if not stopped:
        metrics.update(evaluate(cfg, model, data))
        if cfg.eval_every:
            write_eval(step, {k: metrics[k] for k in metrics if k.startswith("eval_")}, seconds)
    with open(os.path.join(out_dir, "metrics.json"), "w") as fh:
        json.dump(metrics, fh, indent=2)
    return metrics
