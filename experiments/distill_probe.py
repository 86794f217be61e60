"""Distillation levers on a few MiniLM layers: held-out KL(softmax || kernel) per variant.

    python experiments/distill_probe.py 1,5 '[{"kind": "hedgehog"}, {"kind": "flex_n", "scale": 0.15}]' 300 \
        ../shared/data/austen

Each variant is a kind with optional "m" (features), "lr", "soft_floor" (the training
loss's smooth floor; absent: the hard one), "decay" (true: a cosine to lr/10) and the
kind's init options;
the layers are fitted as ``flexformer.distill.experiment.distill_layers`` fits them (same
splits and sentence counts), one JSON line per variant on stdout (needs the distill extra).
"""
import json, sys, time
import numpy as np
from flexformer import get_attention
from flexformer.distill import fit_kernels, teacher_entropy, evaluate
from flexformer.distill.experiment import TeacherData, novel_splits, _sample
from flexformer.distill.bert import load_minilm, read_sentences

layers = [int(x) for x in sys.argv[1].split(",")]
variants = json.loads(sys.argv[2])
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 300
data_dir = sys.argv[4] if len(sys.argv) > 4 else "../shared/data/austen"
weights, tok = load_minilm()[:2]
rng = np.random.default_rng(0)
splits = novel_splits(data_dir)
counts = {"train": 512, "val": 128, "test": 256}
data = {}
for split in ("train", "val"):
    data[split] = TeacherData(weights, tok, _sample(read_sentences(splits[split]), counts[split], rng), 64)
for v in variants:
    kind = v.pop("kind"); m = v.pop("m", 32); lr = v.pop("lr", 1e-2); soft_floor = v.pop("soft_floor", None)
    decay = v.pop("decay", False)
    spec = get_attention(kind)
    kls = []
    t0 = time.time()
    for i in layers:
        q, k, mk = data["val"].layer(i)
        H, d = q.shape[1], q.shape[3]
        init = spec.init(H, d, num_features=m, rng=i, dtype=np.float32, **v)
        res = fit_kernels(kind, data["train"].layer(i), data["val"].layer(i), init, steps=steps, lr=lr, seed=i,
                          soft_floor=soft_floor, decay=decay)
        ent = teacher_entropy(q.astype(np.float64), k.astype(np.float64), mk)
        kls.append(float(np.mean(res.best_val - ent)))
    print(json.dumps({"kind": kind, "m": m, "lr": lr, "soft_floor": soft_floor, "decay": decay, **v, "layers": layers, "kl": kls, "mean": float(np.mean(kls)),
                      "s": round(time.time() - t0)}), flush=True)
