"""How fast the dense-product tile runs on this core, against the core's own peak.

Most of a Flexformer forward + backward is small dense products on 64-row blocks
(``benchmarks/phases.py``: about three quarters of the time). This measures the register
tile that runs them (csrc/gemm_tile.inc) on exactly those shapes, one thread, each
instruction-set copy this CPU can run (baseline SSE2, AVX2 + FMA, AVX-512 with its 8 x 2
and 4 x 4 tiles of vectors, each of those two either copying rows that sit off a cache line
to its aligned panel first or reading them in place), beside a loop
of independent fused multiply-adds that only touches registers: the core's float32 peak for
that vector width. A tile far below its peak points at the tile (its loads, stores,
bookkeeping); a tile near its peak, in a forward + backward that is still far from NumPy's
matmul rate, points at the work around the products (sin/cos, row passes, memory).

    python benchmarks/tile_rate.py [--offset BYTES] [--out FILE.json]

The operands start --offset bytes into a 64-byte cache line: 16 by default, where malloc
(and so NumPy) puts a large array, so a caller's rows are read across line boundaries; 0
puts them on a line, as the kernels' own workspaces are (and the AVX-512 columns "copy" and
"in place" then run the same code). The kernels time the two AVX-512 ways once per process
and keep the faster (``flexformer.dense_paths()["off_line_rows"]``).

Compiles a small C program against csrc/ (the kernels' own sources and flags: -O3,
-ffp-contract=fast; needs a C compiler, as the build does) and prints GFLOP/s per shape and
copy, and the share of the peak. x86-64 only; elsewhere it says so and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from attention import _cpu_name as cpu_model  # noqa: E402  (the sweep's machine line)

#: (name, M, N, K, a_rs, a_cs, b_rs, accumulate): the products of a bidirectional
#: Flexformer forward + backward at d = e = m = 64 (F = 2m = 128 features), per 64-row block
SHAPES = [
    ("projection x W^T (64x64 . 64x128)", 64, 128, 64, 64, 1, 128, 0),
    ("key sum S += f(k)^T v (128x64 . 64x64)", 128, 64, 64, 1, 128, 64, 1),
    ("read-out f(q) S (64x128 . 128x64)", 64, 64, 128, 128, 1, 64, 0),
    ("feature gradient do S^T (64x64 . 64x128)", 64, 128, 64, 64, 1, 128, 0),
    ("input gradient dx += du W (64x128 . 128x64)", 64, 64, 128, 128, 1, 64, 1),
    ("frequency gradient dW += du^T x (128x64 . 64x64)", 128, 64, 64, 1, 128, 64, 1),
]

PROGRAM = r"""
#define _POSIX_C_SOURCE 200112L /* clock_gettime, posix_memalign */
#include "kernels_f32.c" /* the kernels' three sources as one unit: main reaches static copies */
#include "kernels_f64.c"
#include "kernels.c"
#include "buffer_cache.c"
#include <stdio.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

typedef void (*gemm_fn)(float *, const float *, size_t, size_t, const float *, size_t, size_t,
                        size_t, size_t, size_t, int, int);

/* best of 5 timed runs of about 0.2 GFLOP each, in GFLOP/s (main keeps the best of its rounds) */
static double rate(gemm_fn g, int copy_off_line, size_t M, size_t N, size_t K, size_t a_rs,
                   size_t a_cs, size_t b_rs, int acc, float *a, float *b, float *c)
{
    const long reps = (long)(2e8 / (2.0 * M * N * K)) + 1;
    double best = 1e30;
    for (int r = 0; r < 5; ++r) {
        const double t0 = now();
        for (long i = 0; i < reps; ++i)
            g(c, a, a_rs, a_cs, b, b_rs, 1, M, N, K, acc, copy_off_line);
        const double t = now() - t0;
        if (t < best)
            best = t;
    }
    return 2.0 * M * N * K * reps / best * 1e-9;
}

/* 12 independent chains of fused multiply-adds in registers (AVX2 has 16 registers; two
 * ports of 4-cycle latency need 8 chains): the core's peak */
#define PEAK(NAME, BYTES, TARGET)                                                            \
    TARGET static double NAME(void)                                                          \
    {                                                                                        \
        typedef float v __attribute__((vector_size(BYTES)));                                 \
        v acc[12], x = {0}, y = {0};                                                         \
        x += 0.9999f;                                                                        \
        y += 1e-7f;                                                                          \
        for (int j = 0; j < 12; ++j)                                                         \
            acc[j] = (v){0} + (float)j;                                                      \
        const long n = 20000000;                                                             \
        double best = 1e30;                                                                  \
        for (int r = 0; r < 3; ++r) {                                                        \
            const double t0 = now();                                                         \
            for (long i = 0; i < n; ++i) {                                                   \
                _Pragma("GCC unroll 12") for (int j = 0; j < 12; ++j) acc[j] = acc[j] * x + y; \
                __asm__ volatile("" : "+x"(x));                                              \
            }                                                                                \
            const double t = now() - t0;                                                     \
            if (t < best)                                                                    \
                best = t;                                                                    \
        }                                                                                    \
        float s = 0;                                                                         \
        for (int j = 0; j < 12; ++j)                                                         \
            s += acc[j][0];                                                                  \
        __asm__ volatile("" ::"x"(s));                                                       \
        return 2.0 * 12 * (BYTES / 4) * n / best * 1e-9;                                    \
    }
PEAK(peak_avx2, 32, __attribute__((target("arch=x86-64-v3"))))
PEAK(peak_avx512, 64, __attribute__((target("arch=x86-64-v4"))))

int main(int argc, char **argv)
{
    static const struct { size_t M, N, K, a_rs, a_cs, b_rs; int acc; } shapes[] = {SHAPES};
    const int level = ff_cpu_level();
    /* the operands start `offset` bytes into a 64-byte line (argv[1]) */
    const size_t offset = argc > 1 ? (size_t)atoi(argv[1]) : 0, bytes = (sizeof(float) << 16) + 64;
    char *blocks[3];
    for (int i = 0; i < 3; ++i)
        if (posix_memalign((void **)&blocks[i], 64, bytes))
            return 1;
    float *a = (float *)(blocks[0] + offset), *b = (float *)(blocks[1] + offset),
          *c = (float *)(blocks[2] + offset);
    for (int i = 0; i < 1 << 16; ++i) {
        a[i] = (float)(i % 13) / 13 - 0.5f;
        b[i] = (float)(i % 7) / 7 - 0.5f;
        c[i] = 0;
    }
    enum { NC = 6 }; /* the columns: a copy, and for AVX-512 how it takes rows off a line */
    const gemm_fn copies[NC] = {gemm_base_f32, gemm_avx2_f32, gemm_avx512_f32, gemm_avx512_f32,
                                gemm_avx512_4x4_f32, gemm_avx512_4x4_f32};
    const int copy_off_line[NC] = {0, 0, 1, 0, 1, 0};
    const int needs[NC] = {2, 3, 4, 4, 4, 4}; /* the kernel ISA level each copy needs */
    enum { NS = sizeof shapes / sizeof shapes[0], ROUNDS = 3 };
    /* every (shape, copy) cell once per round, the best round kept: a slow spell of the host
     * then costs one round of many cells, not every run of the cell it falls on */
    double best[NS][NC] = {{0}}, peak2 = 0, peak4 = 0;
    for (int round = 0; round < ROUNDS; ++round) {
        /* the peaks are timed in every round too, so that a cell and its peak share the host's
         * quieter spells */
        const double p2 = level >= 3 ? peak_avx2() : 0.0, p4 = level >= 4 ? peak_avx512() : 0.0;
        peak2 = p2 > peak2 ? p2 : peak2;
        peak4 = p4 > peak4 ? p4 : peak4;
        for (size_t s = 0; s < NS; ++s)
            for (int k = 0; k < NC; ++k) {
                const double r = needs[k] <= level
                                     ? rate(copies[k], copy_off_line[k], shapes[s].M, shapes[s].N,
                                            shapes[s].K, shapes[s].a_rs, shapes[s].a_cs,
                                            shapes[s].b_rs, shapes[s].acc, a, b, c)
                                     : 0.0;
                if (r > best[s][k])
                    best[s][k] = r;
            }
    }
    printf("{\"level\": %d, \"peak\": {\"avx2\": %.2f", level, peak2);
    printf(", \"avx512\": %.2f}, \"rates\": [", peak4);
    for (size_t s = 0; s < NS; ++s) {
        printf(s ? ", [" : "[");
        for (int k = 0; k < NC; ++k)
            printf(k ? ", %.2f" : "%.2f", best[s][k]);
        printf("]");
    }
    printf("]}\n");
    return 0;
}
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--offset", type=int, default=16, choices=range(0, 64, 4), metavar="BYTES",
                   help="bytes into a 64-byte line where the operands start (default 16: where "
                        "malloc, and so NumPy, places a large array; the kernels' own workspaces "
                        "start on a line, 0)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "latest", "tile_rate.json"))
    args = p.parse_args(argv)
    if platform.machine() not in ("x86_64", "AMD64"):
        print(f"the tile's instruction-set copies are x86-64 only (this is {platform.machine()})")
        return 0
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        print(f"no C compiler ({cc})", file=sys.stderr)
        return 2
    shapes = ", ".join("{%d, %d, %d, %d, %d, %d, %d}" % s[1:] for s in SHAPES)
    with tempfile.TemporaryDirectory(prefix="flexformer-tile-") as tmp:
        src, exe = os.path.join(tmp, "tile_rate.c"), os.path.join(tmp, "tile_rate")
        with open(src, "w") as fh:
            fh.write(PROGRAM.replace("{SHAPES}", "{" + shapes + "}"))
        build = subprocess.run([cc, "-O3", "-std=c99", "-fno-math-errno", "-ffp-contract=fast", "-fopenmp",
                                "-I", os.path.join(ROOT, "csrc"), src, "-o", exe, "-lm"],
                               capture_output=True, text=True)
        if build.returncode != 0:
            print(build.stderr, file=sys.stderr)
            return 2
        run = subprocess.run([exe, str(args.offset)], capture_output=True, text=True,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
        if run.returncode != 0:
            print(run.stderr, file=sys.stderr)
            return 2
    res = json.loads(run.stdout)
    model = cpu_model()
    peak = res["peak"]
    print(f"{model}, kernel ISA level {res['level']}, one thread, operands {args.offset} bytes into a "
          f"64-byte line; float32 FMA peak in registers: "
          f"AVX2 {peak['avx2']:.1f}, AVX-512 {peak['avx512']:.1f} GFLOP/s")
    # the columns of the C program's rates, in its order: (JSON key, heading, peak)
    columns = [("avx2", "AVX2", "avx2"), ("avx512", "8x2 copy", "avx512"),
               ("avx512_in_place", "8x2 in place", "avx512"), ("avx512_4x4", "4x4 copy", "avx512"),
               ("avx512_4x4_in_place", "4x4 in place", "avx512")]
    print(f"{'product (per 64-row block)':52s} {'base':>7s} "
          + " ".join(f"{heading:>13s}" for _, heading, _ in columns)
          + "   (AVX-512 rows off a line: copied to the panel or read in place)")
    rows = []
    for (name, *_), (base, *rates) in zip(SHAPES, res["rates"]):
        def cell(r, pk):
            return f"{r:6.1f} ({100 * r / pk:3.0f}%)" if r and pk else f"{'-':>13s}"
        print(f"{name:52s} {base:7.1f} "
              + " ".join(cell(r, peak[pk]) for r, (_, _, pk) in zip(rates, columns)))
        rows.append({"product": name, "base": base, **{key: r for r, (key, _, _) in zip(rates, columns)}})
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"cpu": model, "level": res["level"], "offset_bytes": args.offset, "peak_gflops": peak,
                   "gflops": rows}, fh, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
