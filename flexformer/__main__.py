"""The command line: ``flexformer {train,compare,demo,generate,distill}`` (or ``python -m flexformer``).

``train`` trains a small model on a task (default: flex_n attention on generated ListOps)
and writes a checkpoint and metrics.json; ``compare`` runs several attention kinds under
the same budget and prints a markdown table; ``demo`` times Flexformer_n attention and
shows how close the freshly initialised kernel is to exact softmax attention;
``generate`` samples text from a text-lm checkpoint with recurrent (constant cost per
token) decoding, streaming it as it is produced; ``distill`` distils the attention of
all-MiniLM-L6-v2 into Flexformer, Hedgehog and the fixed kernels on real sentences
(needs ``pip install 'flexformer[distill]'``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

import numpy as np

from . import init, reference
from ._version import __version__
from .named import flex_n_attention, flex_n_attention_backward
from .runtime import get_num_threads, openmp_enabled, set_num_threads
from ._timing import median_seconds
from .distill import DISTILL_KINDS
from .distill.experiment import DISTILL_DECAY, DISTILL_INIT
from .registry import attention_kinds
from .suite import LRA_KINDS


def demo(args: argparse.Namespace) -> int:
    if args.threads is not None:
        set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    B, H, N, d = 1, args.heads, args.seq_len, args.head_dim
    dtype = np.float32
    print(f"flexformer {__version__}: OpenMP {'on' if openmp_enabled() else 'off'}, "
          f"{get_num_threads()} thread(s)")

    # accuracy of the initial kernel against exact softmax, on a small problem
    n_small = min(N, 256)
    q = rng.standard_normal((1, H, n_small, d)) * 0.3
    k = rng.standard_normal((1, H, n_small, d)) * 0.3
    v = rng.standard_normal((1, H, n_small, d))
    exact = reference.softmax_attention(q, k, v, causal=True)
    # the default start estimates its own kernel (init.flex_n_expected_kernel), not softmax
    weights = np.tril(init.flex_n_expected_kernel(q, k))
    expected = (weights / weights.sum(-1, keepdims=True)) @ v
    print(f"\ninitial Flexformer_n vs the attention it estimates (causal, N={n_small}, d={d}), relative error:")
    print(f"  {'':16s} unbiased start (scale 1, A = B)   default start (scale {init.DEFAULT_SCALE}, spread "
          f"{init.DEFAULT_SPREAD})")
    print(f"  {'':16s} vs softmax at 1/sqrt(d)           vs init.flex_n_expected_kernel")
    for m in (16, 64, 256):
        row = []
        for options, target in (({"symmetric": True}, exact), ({}, expected)):
            omega1, omega2, tau = init.flex_n_params(H, m, d, rng=rng, orthogonal=True, **options)
            approx = flex_n_attention(q, k, v, omega1, omega2, tau, causal=True)
            row.append(np.linalg.norm(approx - target) / np.linalg.norm(target))
        print(f"  m = {m:4d} features {row[0]:10.4f} {row[1]:36.4f}")

    # timing at the requested size
    m = args.features
    q = rng.standard_normal((B, H, N, d)).astype(dtype) * 0.3
    k = rng.standard_normal((B, H, N, d)).astype(dtype) * 0.3
    v = rng.standard_normal((B, H, N, d)).astype(dtype)
    dout = rng.standard_normal((B, H, N, d)).astype(dtype)
    omega1, omega2, tau = init.flex_n_params(H, m, d, rng=rng, dtype=dtype)
    print(f"\nFlexformer_n timing, float32, B={B} H={H} N={N} d=e={d} m={m} "
          f"(median of {args.repeats}):")

    def training_pair(causal: bool) -> None:
        # as the layers run it: a bidirectional forward keeps its key state and projections
        # for the backward, which then need not compute them again
        keep = {} if causal else {"return_key_state": True, "return_projections": True}
        result = flex_n_attention(q, k, v, omega1, omega2, tau, causal=causal, **keep)
        kept = {} if causal else {"key_state": result[1], "projections": result[2]}
        flex_n_attention_backward(dout, q, k, v, omega1, omega2, tau, causal=causal, **kept)

    for causal in (False, True):
        fwd = median_seconds(lambda: flex_n_attention(q, k, v, omega1, omega2, tau, causal=causal),
                              args.repeats)
        both = median_seconds(lambda: training_pair(causal), args.repeats)
        label = "causal" if causal else "bidirectional"
        print(f"  {label:13s}  forward {fwd * 1e3:8.1f} ms   forward+backward {both * 1e3:8.1f} ms")
    print("  (forward+backward as a training step runs it: the bidirectional forward keeps its key "
          "state and projections for the backward)")
    return 0


def _train_args(p: argparse.ArgumentParser) -> None:
    """``flexformer train``'s configuration options, one per TrainConfig field (gradient
    clipping and the dtype stay at their defaults here)."""
    from .training.options import add_train_options

    add_train_options(p, exclude=("clip", "dtype"))


#: train flags that may differ from a resumed run's saved configuration (runtime only, or
#: the new total); any other flag given with --resume must repeat the saved value
RESUME_MAY_CHANGE = ("steps", "threads", "quiet", "resume")


def _given_options(parser: argparse.ArgumentParser, argv: List[str]) -> List[argparse.Action]:
    """The actions of ``parser`` whose option strings appear in ``argv``."""
    given = []
    for action in parser._actions:
        if any(tok == o or tok.startswith(o + "=") for o in action.option_strings for tok in argv):
            given.append(action)
    return given


def check_resume_flags(args, argv: List[str], parser: argparse.ArgumentParser, saved: "TrainConfig") -> None:
    """ValueError when a flag given with --resume contradicts the saved configuration."""
    for action in _given_options(parser, argv):
        dest = action.dest
        if dest in RESUME_MAY_CHANGE or dest == "help":
            continue
        if dest == "out":
            if os.path.abspath(args.out) != os.path.abspath(args.resume):
                raise ValueError(f"--out {args.out} contradicts --resume {args.resume} (a resumed run stays in its "
                                 f"folder)")
            continue
        value = getattr(args, dest)
        have = getattr(saved, dest)   # each train option's dest is its TrainConfig field
        if value != have:
            flag = action.option_strings[0]
            raise ValueError(f"{flag} {value} contradicts the resumed run's saved {dest} {have!r}; "
                             f"drop the flag (a resumed run keeps its configuration; --steps and --threads may change)")


def train_command(args, argv: Optional[List[str]] = None, parser: Optional[argparse.ArgumentParser] = None) -> int:
    from .training import TrainConfig, train
    from .training.options import config_from_options
    from .training.checkpoint import load_meta as load_checkpoint_meta

    cfg = config_from_options(args)
    if args.resume:
        out = args.resume
        ckpt = os.path.join(out, "checkpoint.npz")
        if not os.path.isfile(ckpt):
            raise FileNotFoundError(f"--resume {out}: no checkpoint.npz there")
        meta = load_checkpoint_meta(ckpt)
        try:
            saved = TrainConfig.from_saved(meta.get("config"))
        except TypeError as exc:
            raise ValueError(f"{ckpt} does not hold a resumable run ({exc})") from None
        if parser is not None and argv is not None:
            check_resume_flags(args, argv, parser, saved)
        cfg = saved
    else:
        out = args.out or os.path.join("runs", f"{cfg.task}-{cfg.attention}-{time.strftime('%Y%m%d-%H%M%S')}")
        cfg.validate()
    print(f"flexformer train: task {cfg.task}, attention {cfg.attention}, writing to {out}", file=sys.stderr)
    metrics = train(cfg, out, resume=bool(args.resume), progress=not args.quiet,
                    steps=args.steps if args.resume else None, overwrite=args.overwrite,
                    threads=args.threads if args.resume and args.threads else None)
    shown = {k: v for k, v in metrics.items() if k != "config"}
    print(json.dumps(shown, indent=2))
    if metrics.get("interrupted"):
        print(f"interrupted: checkpoint written; continue with --resume {out}", file=sys.stderr)
    return 0


#: the train options compare sets itself for every run (their dests in the train parser)
COMPARE_SETS = {"attention": "--attention", "seed": "--seed", "out": "--out", "resume": "--resume", "quiet": "--quiet"}


def check_train_args(train_parser, train_args: List[str]) -> None:
    """The arguments compare passes on to every train run, refused before any run starts
    when train would refuse them (each run would fail alike) or when compare sets them."""
    unset = object()
    given = argparse.Namespace(**{dest: unset for dest in COMPARE_SETS})
    given, unknown = train_parser.parse_known_args(train_args, namespace=given)
    clash = [flag for dest, flag in COMPARE_SETS.items() if getattr(given, dest) is not unset]
    if clash:
        raise ValueError(f"{', '.join(clash)} cannot go to the train runs: compare sets them for each run "
                         f"(the kinds with --attentions, the seeds with --seeds)")
    if unknown:
        raise ValueError(f"unrecognized arguments: {' '.join(unknown)} (compare passes the arguments it does "
                         f"not take to every train run, and train does not take these either)")


def compare_command(args) -> int:
    """Each attention kind x seed in its own process (peak memory per run), same budget; or
    a whole suite of tasks (``--suite``)."""
    from .registry import get_attention

    if args.suite is not None:
        from . import suite

        suite.check_suite(args.suite)
    attentions = args.attentions or (",".join(suite.LRA_KINDS) if args.suite else ",".join(attention_kinds()))
    kinds = [k.strip() for k in attentions.split(",") if k.strip()]
    if args.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
    if not kinds:
        raise ValueError("--attentions must name at least one attention kind")
    for k in kinds:
        get_attention(k)
    if args.suite is not None:
        out = args.out or os.path.join("runs", f"suite-{args.suite}{'-quick' if args.quick else ''}")
        columns = None if args.columns is None else [c.strip() for c in args.columns.split(",") if c.strip()]
        return suite.run_suite(args.suite, kinds, args.seeds, out, data_dir=args.data_dir,
                               fmnist_dir=args.fmnist_dir, quick=args.quick, extra=args.train_args, jobs=args.jobs,
                               columns=columns)
    for flag, value in (("--quick", args.quick), ("--out", args.out), ("--fmnist-dir", args.fmnist_dir),
                        ("--jobs", args.jobs != 1), ("--columns", args.columns)):
        if value:
            raise ValueError(f"{flag} belongs to --suite runs")
    if args.data_dir is not None:
        args.train_args += ["--data-dir", args.data_dir]
    rows = []
    for kind in kinds:
        results = []
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory(prefix="flexformer-compare-") as tmp:
                cmd = [sys.executable, "-m", "flexformer", "train", "--quiet", "--out", tmp,
                       "--attention", kind, "--seed", str(seed)] + args.train_args
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                        env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
                _, status, usage = os.wait4(proc.pid, 0)
                err = proc.stderr.read()
                proc.stderr.close()
                proc.returncode = os.waitstatus_to_exitcode(status)
                if proc.returncode != 0:
                    print(f"{kind} seed {seed} failed: {err.strip().splitlines()[-1] if err.strip() else proc.returncode}",
                          file=sys.stderr)
                    continue
                with open(os.path.join(tmp, "metrics.json")) as fh:
                    m = json.load(fh)
                m["peak_mib"] = usage.ru_maxrss / 1024.0
                results.append(m)
                print(f"{kind} seed {seed}: " + ", ".join(f"{k} {m[k]:.4g}" for k in
                      ("eval_accuracy", "eval_bits_per_char", "eval_loss", "tokens_per_s") if k in m),
                      file=sys.stderr)
        rows.append((kind, results))
    metric = None
    for _, res in rows:
        for m in res:
            metric = "eval_bits_per_char" if "eval_bits_per_char" in m else "eval_accuracy"
    print(f"| attention | {metric} (mean ± std over seeds) | eval loss | tokens/s | peak memory (MiB) | runs |")
    print("|---|---|---|---|---|---|")
    for kind, res in rows:
        if not res:
            print(f"| {kind} | failed | | | | 0 |")
            continue
        vals = np.array([m[metric] for m in res])
        print(f"| {kind} | {vals.mean():.4f} ± {vals.std():.4f} | {np.mean([m['eval_loss'] for m in res]):.4f} | "
              f"{np.mean([m['tokens_per_s'] for m in res]):,.0f} | {np.max([m['peak_mib'] for m in res]):.0f} | "
              f"{len(res)} |")
    failed = [kind for kind, res in rows if len(res) < args.seeds]
    if failed:
        print(f"error: runs failed for {', '.join(failed)} (see above)", file=sys.stderr)
        return 1
    return 0


def generate_command(args) -> int:
    from .training import load_model

    if args.threads is not None:
        set_num_threads(args.threads)
    if args.tokens < 0:
        raise ValueError(f"--tokens must be >= 0, got {args.tokens}")
    if not (np.isfinite(args.temperature) and args.temperature >= 0):
        raise ValueError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    if args.seed is not None and args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    model, cfg, meta = load_model(args.checkpoint)
    if cfg.task != "text-lm":
        raise ValueError(f"{args.checkpoint} is a {cfg.task} model; generate needs a text-lm checkpoint "
                         f"(python -m flexformer train --task text-lm --data-dir ...)")
    vocab = model.head.W.value.shape[1]
    if args.top_k is not None and args.top_k > vocab:
        raise ValueError(f"--top-k must be at most the model's vocabulary, {vocab}, got {args.top_k}")
    prompt = np.frombuffer(args.prompt.encode("utf-8"), dtype=np.uint8).astype(np.int64)
    if prompt.size == 0:
        raise ValueError("--prompt must not be empty")
    pos = model.backbone.pos
    if pos.learned and prompt.size + args.tokens > pos.max_len:
        raise ValueError(f"this model has learned positions for {pos.max_len} bytes; the prompt ({prompt.size}) "
                         f"plus --tokens ({args.tokens}) is longer. Use fewer tokens, or train with "
                         f"--positional sinusoidal (positions without a limit)")
    print(f"flexformer generate: {cfg.attention} model, step {meta.get('step')}, {args.tokens} bytes after a "
          f"{prompt.size}-byte prompt", file=sys.stderr)
    out = sys.stdout.buffer
    out.write(args.prompt.encode("utf-8"))
    out.flush()
    t0 = time.perf_counter()

    def emit(token: int) -> None:
        out.write(bytes([token]))
        out.flush()

    model.generate(prompt, args.tokens, temperature=args.temperature, top_k=args.top_k, rng=args.seed,
                   on_token=emit)
    out.write(b"\n")
    out.flush()
    took = time.perf_counter() - t0
    if args.tokens:
        print(f"{args.tokens} tokens in {took:.2f} s ({took / args.tokens * 1e3:.2f} ms per token, prompt "
              f"included)", file=sys.stderr)
    return 0


def distill_command(args) -> int:
    from .distill import experiment

    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    for k in kinds:
        if k not in experiment.DEFAULT_KINDS:
            raise ValueError(f"--kinds: {k!r} is not one of {', '.join(experiment.DEFAULT_KINDS)}")
    for name in ("features", "steps", "train_sentences", "val_sentences", "test_sentences", "max_len",
                 "batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    init.check_scale(args.kernel_init_scale)
    init.check_spread(args.kernel_init_spread)
    soft_floor = experiment.DISTILL_SOFT_FLOOR if args.soft_floor is None else args.soft_floor
    if not (np.isfinite(soft_floor) and soft_floor >= 0):
        raise ValueError(f"--soft-floor must be a finite number >= 0 (0: the hard floor), got {soft_floor}")
    if not os.path.isdir(args.data_dir):
        raise FileNotFoundError(f"--data-dir {args.data_dir} is not a folder of .txt files "
                                f"(e.g. ../shared/data/austen)")
    if args.transfer_dir is not None and not os.path.isdir(args.transfer_dir):
        raise FileNotFoundError(f"--transfer-dir {args.transfer_dir} is not a folder")
    if args.threads is not None:
        set_num_threads(args.threads)
    results = experiment.run(args.data_dir, transfer_dir=args.transfer_dir, kinds=kinds,
                             num_features=args.features, steps=args.steps, lr=args.lr,
                             batch_size=args.batch_size, train_sentences=args.train_sentences,
                             val_sentences=args.val_sentences, test_sentences=args.test_sentences,
                             max_len=args.max_len, seed=args.seed, progress=not args.quiet,
                             kernel_init={"scale": args.kernel_init_scale, "spread": args.kernel_init_spread,
                                          "match_tau": args.kernel_init_match_tau},
                             soft_floor=soft_floor or None, decay=args.lr_schedule == "cosine")
    print(experiment.markdown(results))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=2)
        print(f"results written to {args.out}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .training.options import kernel_init_args

    # no abbreviated options (allow_abbrev=False): compare hands the options it does not take
    # to every train run, and an abbreviation (--att for --attentions, --seed for --seeds)
    # would be taken by the wrong parser, or override what compare sets for each run
    parser = argparse.ArgumentParser(prog="flexformer", description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="`flexformer COMMAND --help` lists a command's options; "
                                            "`python -m flexformer` is the same program.")
    parser.add_argument("--version", action="version", version=f"flexformer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    t = sub.add_parser("train", allow_abbrev=False, help="train and evaluate a model (default: flex_n on ListOps)")
    parser.train_parser = t  # train_command reads which flags were given (for --resume)
    _train_args(t)
    t.add_argument("--out", default=None, help="run folder (default: a new one under runs/)")
    t.add_argument("--resume", default=None, metavar="DIR", help="continue the run saved in DIR (only --steps, "
                   "a new total, and --threads may differ from its saved configuration)")
    t.add_argument("--overwrite", action="store_true", help="replace the run already in --out (without it, "
                   "a folder that holds a run is refused)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    c = sub.add_parser("compare", allow_abbrev=False, help="several attention kinds under one budget: a markdown table")
    c.add_argument("--attentions", default=None,
                   help="comma-separated kinds (default: every registered kind; with --suite lra: "
                        f"{', '.join(LRA_KINDS)})")
    c.add_argument("--suite", default=None, help="a suite of tasks instead of one: lra (the five Long Range "
                   "Arena analogues, one table)")
    c.add_argument("--quick", action="store_true", help="with --suite: minutes-long budgets (for CI, notebooks)")
    c.add_argument("--columns", default=None, help="with --suite: comma-separated columns to run (e.g. Retrieval; "
                   "default: all of the suite's)")
    c.add_argument("--out", default=None, help="with --suite: the folder of its runs (default runs/suite-NAME); "
                   "finished runs are kept and not repeated")
    c.add_argument("--data-dir", default=None, help="plain-text folder for the text tasks (passed to train)")
    c.add_argument("--fmnist-dir", default=None, help="with --suite: the Fashion-MNIST folder of the image task "
                   "(default /usr/share/datasets/fashion-mnist)")
    c.add_argument("--seeds", type=int, default=3, help="seeds per kind, 0 to N-1 (default 3)")
    c.add_argument("--jobs", type=int, default=1, help="with --suite: runs at once (default 1); each gets "
                   "--threads cpus/jobs unless you pass --threads")
    c.epilog = "Any other arguments (e.g. --task listops --steps 300) go to every train run."
    p = sub.add_parser("demo", allow_abbrev=False, help="time Flexformer_n attention and compare it with softmax")
    p.add_argument("--seq-len", type=int, default=4096, help="sequence length N (default 4096)")
    p.add_argument("--heads", type=int, default=8, help="heads H (default 8)")
    p.add_argument("--head-dim", type=int, default=64, help="head size d = e (default 64)")
    p.add_argument("--features", type=int, default=64, help="frequencies m (default 64)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats (default 5)")
    p.add_argument("--threads", type=int, default=None, help="kernel threads (default: OpenMP's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs and frequencies (default 0)")
    g = sub.add_parser("generate", allow_abbrev=False, help="sample text from a text-lm checkpoint (recurrent decoding)")
    g.add_argument("--checkpoint", required=True, metavar="DIR", help="run folder or checkpoint.npz of a "
                   "text-lm model")
    g.add_argument("--prompt", required=True, help="text to continue")
    g.add_argument("--tokens", type=int, default=200, help="bytes to generate (default 200)")
    g.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1.0)")
    g.add_argument("--top-k", type=int, default=None, help="sample among the k most likely bytes")
    g.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    g.add_argument("--threads", type=int, default=None, help="kernel threads (default: OpenMP's)")
    s = sub.add_parser("distill", allow_abbrev=False, help="distil all-MiniLM-L6-v2's attention into each kernel kind "
                       "(needs the distill extra)")
    s.add_argument("--data-dir", required=True, help="folder of novels (.txt): the last is the test novel, the "
                   "one before it validation")
    s.add_argument("--transfer-dir", default=None, help="a second corpus (folder of text files) for the "
                   "transfer table, e.g. /usr/share/common-licenses")
    s.add_argument("--kinds", default=",".join(DISTILL_KINDS),
                   help=f"comma-separated kinds (default: the distillable ones, {','.join(DISTILL_KINDS)})")
    s.add_argument("--features", type=int, default=32, help="m per head (default 32)")
    s.add_argument("--steps", type=int, default=300, help="Adam steps per layer (default 300)")
    s.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate (default 0.01)")
    s.add_argument("--lr-schedule", choices=("cosine", "constant"),
                   default="cosine" if DISTILL_DECAY else "constant",
                   help="cosine: the rate falls from --lr to --lr/10 over --steps; constant: it stays --lr "
                   "(default: %(default)s, flexformer.distill.experiment.DISTILL_DECAY)")
    s.add_argument("--batch-size", type=int, default=32, help="sentences per step (default 32)")
    s.add_argument("--train-sentences", type=int, default=512, help="training sentences (default 512)")
    s.add_argument("--val-sentences", type=int, default=128,
                   help="validation sentences, for early stopping (default 128)")
    s.add_argument("--test-sentences", type=int, default=256, help="test sentences (default 256)")
    s.add_argument("--max-len", type=int, default=64, help="tokens per sentence at most (default 64)")
    s.add_argument("--seed", type=int, default=0, help="seed of the sentence draw and the initialisation "
                   "(default 0)")
    s.add_argument("--threads", type=int, default=None, help="kernel threads (default: OpenMP's)")
    s.add_argument("--out", default=None, help="also write the results as JSON")
    s.add_argument("--soft-floor", type=float, default=None, metavar="EPS",
                   help="the trig kinds' training loss takes log of a smooth positive g(f(q).f(k)) instead of "
                   "max(f(q).f(k), 1e-6), so entries below zero still get a gradient; 0 = the hard floor "
                   "(default: flexformer.distill.experiment.DISTILL_SOFT_FLOOR; reported figures always use "
                   "the hard floor)")
    # distillation fits rows: the matched, narrower start measured better (docs/results.md 7b, 17)
    kernel_init_args(s, match_tau=DISTILL_INIT["match_tau"], scale=DISTILL_INIT["scale"])
    s.add_argument("--quiet", action="store_true", help="no progress line")
    return parser


def _single_threaded_blas() -> None:
    """Re-run this command with NumPy's BLAS on one thread, unless the user chose.

    The model's dense layers are small matrix products; OpenBLAS threads spinning beside
    the kernels' OpenMP threads on the same cores cost throughput (measured on 2 cores,
    ListOps defaults: 6,200 tokens/s with BLAS threads, 7,350 without; about 3x when a
    second process shares the cores). The variable only works before NumPy loads, hence
    the re-exec; set OPENBLAS_NUM_THREADS yourself to choose otherwise."""
    if "OPENBLAS_NUM_THREADS" in os.environ or os.environ.get("FLEXFORMER_NO_REEXEC"):
        return
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", FLEXFORMER_NO_REEXEC="1")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "flexformer"] + sys.argv[1:], env)


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if extra and args.command != "compare":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    threads = getattr(args, "threads", None)
    if threads is not None and not 0 <= threads <= 4096:
        print(f"error: --threads must be 0 (OpenMP's default) or 1..4096, got {threads}", file=sys.stderr)
        return 2
    try:
        if args.command == "train":
            return train_command(args, argv, parser.train_parser)
        if args.command == "compare":
            args.train_args = [a for a in extra if a != "--"]
            check_train_args(parser.train_parser, args.train_args)
            return compare_command(args)
        if args.command == "generate":
            return generate_command(args)
        if args.command == "distill":
            return distill_command(args)
        for name in ("seq_len", "heads", "head_dim", "features", "repeats"):
            if getattr(args, name) < 1:
                print(f"error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
                return 2
        return demo(args)
    except (ValueError, FileNotFoundError, FloatingPointError, ImportError) as exc:
        sys.stdout.flush()
        print(f"error: {exc}", file=sys.stderr)
        return 2


def console_main() -> None:
    """The ``flexformer`` program (and ``python -m flexformer``)."""
    # demo too: its timing follows NumPy products, whose OpenBLAS threads keep polling
    # (about 100 ms) and held its N = 512 forward + backward at 8 ms instead of 2.5
    if sys.argv[1:2] in (["train"], ["compare"], ["distill"], ["demo"]):
        _single_threaded_blas()
    sys.exit(main())


if __name__ == "__main__":
    console_main()
