"""Data-parallel training with PyTorch's DistributedDataParallel on the NumPy trainer's tasks.

    python -m flexformer.torch.train --task listops --steps 200              # one process
    torchrun --standalone --nproc_per_node=2 -m flexformer.torch.train ...  # two on this machine
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 \\
             --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 -m flexformer.torch.train ...   # per machine

Every process builds the same model (the NumPy model's initial parameters for the seed,
copied into :mod:`flexformer.torch.nn`), draws the same global batch for each step (batches
depend only on (seed, step), as in the NumPy trainer) and trains on its own slice of it;
DDP averages the gradients, so the parameters follow the one-process run on the whole
batch. gloo on CPU, nccl when CUDA is available. Rank 0 evaluates and writes a NumPy
checkpoint (``checkpoint.npz``, readable by ``flexformer.training.load_model`` and
``python -m flexformer generate``) and ``metrics.json``.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import sys
import time
from typing import List, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..runtime import set_num_threads
from .._progress import ProgressLine
from ..training import TrainConfig
from ..training.loop import batch_for, batch_tokens, build_data, build_model, prepare_run_folder
from ..training.optim import lr_at
from ..training.options import add_train_options, config_from_options
from .nn import load_numpy_parameters, model_for_config, numpy_names, save_numpy_checkpoint


#: the TrainConfig fields this trainer takes as options (flexformer.training.options)
OPTIONS = ("task", "attention", "dim", "depth", "heads", "num_features", "positional", "seq_len", "steps",
           "batch_size", "lr", "weight_decay", "warmup", "clip", "seed", "dtype", "data_dir", "eval_batches",
           "threads", "kernel_init_scale", "kernel_init_spread", "kernel_init_match_tau", "short_conv",
           "attention_eps", "qk_norm", "learn_scale", "linformer_sharing")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m flexformer.torch.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_options(p, include=OPTIONS, help={
        "batch_size": "global batch, split over processes",
        "threads": "threads per process; 0 = cores / processes"})
    p.add_argument("--backend", default="auto", help="attention backend: auto, c or torch")
    p.add_argument("--out", default=None, help="run folder (default runs/torch-TASK-ATTENTION-TIME)")
    p.add_argument("--overwrite", action="store_true", help="replace the run already in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def _loss(cfg: TrainConfig, model, batch, device):
    if cfg.task == "text-lm":
        x, y = (torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in batch)
        logits = model(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)), None
    ids, mask, labels = batch
    logits = model(torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device))
    labels_t = torch.from_numpy(np.asarray(labels)).to(device)
    return F.cross_entropy(logits, labels_t), int((logits.argmax(-1) == labels_t).sum())


def _slice(batch, lo: int, hi: int):
    return tuple(a[lo:hi] for a in batch)


def _param_groups(model, weight_decay: float):
    """Decay like the NumPy AdamW: not on biases, norms or attention-kernel parameters."""
    decay, rest = [], []
    names = numpy_names(model)
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        np_name = names[name][0]
        skip = np_name.endswith((".b", ".gamma", ".beta")) or ".attn.attn." in np_name
        (rest if skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    cuda = torch.cuda.is_available()
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    threads = args.threads or max(1, (os.cpu_count() or 1) // local_world)
    torch.set_num_threads(threads)
    set_num_threads(threads)
    cfg = config_from_options(args, threads=threads)
    out = args.out or os.path.join("runs", f"torch-{cfg.task}-{cfg.attention}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        cfg.validate()
        # as the NumPy trainer: a folder holding a run is never replaced without --overwrite
        prepare_run_folder(out, resume=False, overwrite=args.overwrite)
        if cfg.batch_size % world:
            raise ValueError(f"--batch-size {cfg.batch_size} must be divisible by the {world} processes")
        data = build_data(cfg)
        start = build_model(cfg, data).parameters()       # the NumPy trainer's initial parameters
        model = model_for_config(cfg, data.vocab_size, getattr(data, "num_classes", None),
                                 data.seq_len if cfg.task == "fmnist" else cfg.seq_len, backend=args.backend)
        load_numpy_parameters(model, start)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        if world > 1:
            dist.destroy_process_group()
        return 2
    model.to(device)
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8)
    per = cfg.batch_size // world
    t0 = time.perf_counter()
    bar = ProgressLine(cfg.steps, sys.stderr) if rank == 0 and not args.quiet else None
    loss_value = float("nan")
    tokens = 0  # counted as the NumPy trainer counts them: real (unmasked) tokens of the global batch
    for step in range(cfg.steps):  # step numbering, batches and schedule as in the NumPy trainer
        full = batch_for(cfg, data, step)
        tokens += batch_tokens(cfg, full)
        batch = _slice(full, rank * per, (rank + 1) * per)
        loss, _ = _loss(cfg, net, batch, device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, base_lr=cfg.lr, warmup=cfg.warmup, total=cfg.steps)
        opt.step()
        shown = loss.detach().clone()
        if world > 1:  # the global batch's loss, for display
            dist.all_reduce(shown)
            shown /= world
        loss_value = float(shown)
        if not math.isfinite(loss_value):
            print(f"error: loss became {loss_value} at step {step}", file=sys.stderr)
            return 1
        if bar is not None:
            bar.show(step + 1, f"step {step + 1}/{cfg.steps} loss {loss_value:.4f} "
                               f"({world} process{'es' if world > 1 else ''})")
    if rank == 0:
        if bar is not None:
            bar.close()
        wall = time.perf_counter() - t0
        metrics = {"task": cfg.task, "attention": cfg.attention, "steps": cfg.steps, "processes": world,
                   "train_loss": loss_value, "wall_s": wall, "tokens_per_s": tokens / wall if wall > 0 else None}
        model.eval()
        with torch.no_grad():
            losses, right, count = [], 0, 0
            for i in range(cfg.eval_batches):
                batch = batch_for(cfg, data, 10_000_000 + i, "test")
                loss, correct = _loss(cfg, model, batch, device)
                losses.append(float(loss))
                if correct is not None:
                    right, count = right + correct, count + len(batch[-1])
        metrics["eval_loss"] = float(np.mean(losses))
        if count:
            metrics["eval_accuracy"] = right / count
        os.makedirs(out, exist_ok=True)
        save_numpy_checkpoint(model.cpu(), cfg, os.path.join(out, "checkpoint.npz"), step=cfg.steps)
        with open(os.path.join(out, "metrics.json"), "w") as fh:
            json.dump({**metrics, "config": dataclasses.asdict(cfg)}, fh, indent=2)
        print(json.dumps(metrics, indent=2))
    if world > 1:
        # DDP's reducer holds the process group: drop it first so the group is torn down
        # here, while the interpreter is whole, and not by a destructor during exit (where
        # gloo's threads have aborted a process with "terminate called without an active
        # exception" after a finished run)
        del net, opt
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
