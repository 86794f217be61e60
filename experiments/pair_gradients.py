"""How hard does the task loss pull Flexformer_n's frequency pair apart?

For a run folder written by ``python -m flexformer train --attention flex_n`` this
measures, on ``--batches`` training batches, the loss's directional derivative along
three directions of each layer's kernel parameters, each per unit of *relative* change,
so they can be compared with each other:

* separation: omega1 -> omega1 + t (omega1 - omega2) / 2, omega2 -> omega2 - t (omega1 - omega2) / 2
  (the pair's half-difference grows by the factor 1 + t; the centre stays);
* bandwidth: omega1 -> (1 + t) omega1, omega2 -> (1 + t) omega2 (both frequencies scale);
* tau: tau -> tau + t.

It does so for the run's starting point (the model its configuration builds, with its
seed) and for its saved final checkpoint. A direction the loss does not pull along has a
mean derivative small against its spread over batches; Adam then moves it as a random
walk. Prints one table row per (point, layer, direction): mean, standard deviation over
batches and the mean's t-value (mean / standard error). Then, for the frequencies, tau and
the query and key projections of each layer: how consistent each coordinate's gradient is
across batches (|mean| / rms, median over coordinates; the update Adam makes in a
coordinate is about this fraction of its learning rate), and how far each array moved
from the start to the end of the run, relative to its start.

Last, for the trained model, the held-out loss with the pair's half-difference scaled
(``--scan``; 0 merges the pair, which makes the kernel stationary) and with the pair
merged at its centre rescaled to keep the frequencies' norms: how much the trained model
uses the nonstationary part at all.

    python experiments/pair_gradients.py RUN_DIR [RUN_DIR ...] [--batches 32] [--scan 0,0.5,1,1.5,2]
"""
import argparse
import json
import sys

import numpy as np

from flexformer.training.loop import batch_for, build_data, build_model, evaluate, load_model, loss_and_grad


def kernel_params(model):
    """{layer: (omega1, omega2, tau)} Param objects of every flex_n block."""
    named = dict(model.named_parameters())
    out = {}
    for i in range(len(model.backbone.blocks)):
        pre = f"backbone.blocks.{i}.attn.attn."
        if pre + "omega1" in named:
            out[i] = (named[pre + "omega1"], named[pre + "omega2"], named[pre + "tau"])
    return out


def directional_derivatives(cfg, model, data, batches):
    """({(layer, direction): per-batch derivatives}, {(layer, name): per-coordinate gradient
    consistency |mean_b g| / rms_b g, median over the array's coordinates})."""
    params = kernel_params(model)
    named = dict(model.named_parameters())
    watched = {(layer, name): named[f"backbone.blocks.{layer}.attn.{name}"]
               for layer in params for name in ("attn.omega1", "attn.omega2", "attn.tau", "q.W", "k.W")}
    rows, grads = {}, {key: [] for key in watched}
    for b in range(batches):
        batch = batch_for(cfg, data, 20_000_000 + b)  # training split, steps no run reaches
        model.zero_grad()
        _, dlogits, _, _ = loss_and_grad(cfg, model, batch)
        model.backward(dlogits)
        for key, par in watched.items():
            grads[key].append(par.grad.astype(np.float64).ravel().copy())
        for layer, (a, bb, tau) in params.items():
            ga, gb = a.grad.astype(np.float64), bb.grad.astype(np.float64)
            half = (a.value.astype(np.float64) - bb.value.astype(np.float64)) / 2.0
            rows.setdefault((layer, "separation"), []).append(float((ga * half).sum() - (gb * half).sum()))
            rows.setdefault((layer, "bandwidth"), []).append(
                float((ga * a.value).sum() + (gb * bb.value).sum()))
            rows.setdefault((layer, "tau"), []).append(float(tau.grad.astype(np.float64).sum()))
    consistency = {}
    for key, gs in grads.items():
        g = np.stack(gs)                                     # (batches, coordinates)
        rms = np.sqrt((g * g).mean(0))
        consistency[key] = float(np.median(np.abs(g.mean(0))[rms > 0] / rms[rms > 0]))
    return {k: np.asarray(v) for k, v in rows.items()}, consistency


def movement(start, end):
    """{(layer, name): ||end - start|| / ||start||} for the kernel and q/k projections."""
    a, b = dict(start.named_parameters()), dict(end.named_parameters())
    out = {}
    for layer in kernel_params(end):
        pre = f"backbone.blocks.{layer}.attn."
        for name in ("attn.omega1", "attn.omega2", "attn.tau", "q.W", "k.W"):
            x0, x1 = a[pre + name].value.astype(np.float64), b[pre + name].value.astype(np.float64)
            out[(layer, name)] = float(np.linalg.norm(x1 - x0) / np.linalg.norm(x0))
        d0 = a[pre + "attn.omega1"].value - a[pre + "attn.omega2"].value
        d1 = b[pre + "attn.omega1"].value - b[pre + "attn.omega2"].value
        out[(layer, "omega1 - omega2")] = float(np.linalg.norm(d1 - d0) / np.linalg.norm(d0))
    return out


def scan_separation(cfg, model, data, factors, batches):
    """Held-out loss of a trained model with every layer's pair half-difference scaled by
    each factor (0 merges the pair at its centre: the stationary kernel of the same
    centre), plus "merged, norms kept": the pair replaced by its centre rescaled row by row
    to the root-mean-square norm of the two frequencies, so the bandwidth stays."""
    pairs = kernel_params(model)
    saved = {layer: (a.value.copy(), b.value.copy()) for layer, (a, b, _) in pairs.items()}
    out = []
    try:
        for factor in list(factors) + ["merged, norms kept"]:
            for layer, (a, b, _) in pairs.items():
                a0, b0 = (x.astype(np.float64) for x in saved[layer])
                centre, half = (a0 + b0) / 2.0, (a0 - b0) / 2.0
                if factor == "merged, norms kept":
                    rms = np.sqrt((np.sum(a0 * a0, -1) + np.sum(b0 * b0, -1)) / 2.0)
                    norm = np.linalg.norm(centre, axis=-1)
                    new_a = new_b = centre * (rms / np.where(norm > 0, norm, 1.0))[..., None]
                else:
                    new_a, new_b = centre + factor * half, centre - factor * half
                a.value[...] = new_a
                b.value[...] = new_b
            out.append((factor, evaluate(cfg, model, data, batches)["eval_loss"]))
    finally:
        for layer, (a, b, _) in pairs.items():
            a.value[...], b.value[...] = saved[layer]
    return out


def separation(model):
    return {layer: float(np.linalg.norm(a.value - b.value) / np.linalg.norm(a.value))
            for layer, (a, b, _) in kernel_params(model).items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+")
    p.add_argument("--batches", type=int, default=32)
    p.add_argument("--json", default=None, help="also write the rows as JSON lines here")
    p.add_argument("--scan", default="0,0.5,1,1.5,2",
                   help="factors on the trained pair's half-difference for the held-out loss scan")
    p.add_argument("--eval-batches", type=int, default=16, help="held-out batches per scan point")
    args = p.parse_args(argv)
    out = open(args.json, "a") if args.json else None
    consistency_rows, movement_rows, scan_rows = [], [], []

    def emit(row):
        if out:
            out.write(json.dumps(row) + "\n")

    print("| run | point | layer | separation | direction | mean | std | t |")
    print("|---|---|---|---|---|---|---|---|")
    for run in args.runs:
        final, cfg, _ = load_model(run)
        if cfg.attention != "flex_n":
            sys.exit(f"{run}: attention is {cfg.attention}, not flex_n")
        data = build_data(cfg)
        start = build_model(cfg, data)  # the run's own start: its configuration and seed
        for point, model in (("start", start), ("end", final)):
            sep = separation(model)
            derivs, consistency = directional_derivatives(cfg, model, data, args.batches)
            for (layer, direction), vals in sorted(derivs.items()):
                mean, std = vals.mean(), vals.std(ddof=1)
                t = mean / (std / np.sqrt(len(vals))) if std > 0 else float("inf")
                print(f"| {run} | {point} | {layer} | {sep[layer]:.3f} | {direction} | {mean:+.4g} | {std:.4g} | {t:+.2f} |")
                emit(dict(run=run, point=point, layer=layer, separation=sep[layer], direction=direction,
                          mean=mean, std=std, t=t, batches=len(vals)))
            for (layer, name), c in sorted(consistency.items()):
                emit(dict(run=run, point=point, layer=layer, consistency=c, name=name, batches=args.batches))
                consistency_rows.append((run, point, layer, name, c))
        for factor, loss in scan_separation(cfg, final, data, [float(f) for f in args.scan.split(",")],
                                            args.eval_batches):
            emit(dict(run=run, scan=factor, eval_loss=loss, batches=args.eval_batches))
            scan_rows.append((run, factor, loss))
        for (layer, name), moved in sorted(movement(start, final).items()):
            emit(dict(run=run, layer=layer, name=name, moved=moved))
            movement_rows.append((run, layer, name, moved))
    print(f"\nPer-coordinate gradient consistency |mean g| / rms g over {args.batches} batches, median over "
          f"coordinates (pure noise gives about {np.sqrt(2 / np.pi / args.batches):.3f}):")
    print("| run | point | layer | parameter | consistency |\n|---|---|---|---|---|")
    for run, point, layer, name, c in consistency_rows:
        print(f"| {run} | {point} | {layer} | {name} | {c:.3f} |")
    print("\nRelative movement from start to end, ||end - start|| / ||start||:")
    print("| run | layer | parameter | moved |\n|---|---|---|---|")
    for run, layer, name, moved in movement_rows:
        print(f"| {run} | {layer} | {name} | {moved:.3f} |")
    print(f"\nHeld-out loss ({args.eval_batches} batches) of the trained model with the pair's half-difference "
          "scaled in every layer (1 = as trained, 0 = merged at the centre):")
    print("| run | factor | eval loss |\n|---|---|---|")
    for run, factor, loss in scan_rows:
        print(f"| {run} | {factor} | {loss:.4f} |")
    if out:
        out.close()


if __name__ == "__main__":
    main()
