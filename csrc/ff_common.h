/* Shared definitions for the flexformer C kernels: status codes, size helpers
 * and the OpenMP shims that let the same sources build serially.
 * No Python here: the kernels are plain C99 and can be linked anywhere. */
#ifndef FF_COMMON_H
#define FF_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "buffer_cache.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Status codes returned by every kernel entry point. */
enum ff_status {
    FF_OK = 0,
    FF_ERR_NOMEM = 1,    /* a workspace allocation failed */
    FF_ERR_SIZE = 2,     /* a size product overflows size_t */
    FF_ERR_ARG = 3,      /* an argument the caller should have validated */
    FF_NONFINITE_FEATURES = 4, /* a checked continuation (FF_STEP_ROWS) met features that are
                                * not finite and left its state as it was */
    FF_NONFINITE_OUTPUT = 5    /* done, every output written, but one holds NaN or inf (the
                                * linear kinds check their results where they are made, so
                                * that the caller need not read them all again) */
};

/* A causal forward that continues a carried state over at most this many rows (a recurrent
 * step) may be asked to check that its rows' features are finite before the state moves,
 * in place of the glue's pass over every frequency of the trig kinds (see
 * linattn_run.inc). */
#define FF_STEP_ROWS 8

/* a * b, or report overflow through *ok (left untouched when fine). */
static inline size_t ff_mul(size_t a, size_t b, int *ok)
{
    if (a != 0 && b > SIZE_MAX / a) {
        *ok = 0;
        return 0;
    }
    return a * b;
}

static inline size_t ff_add(size_t a, size_t b, int *ok)
{
    if (b > SIZE_MAX - a) {
        *ok = 0;
        return 0;
    }
    return a + b;
}

/* n elements of `size` bytes rounded up to whole cache lines (FF_CACHE_LINE bytes), so
 * that a buffer carved after them from an aligned block starts on a line too (n itself
 * with *ok cleared on overflow) */
static inline size_t ff_round_to_line(size_t n, size_t size, int *ok)
{
    const size_t per = FF_CACHE_LINE / size;
    const size_t up = ff_add(n, per - 1, ok);
    return *ok ? up / per * per : n;
}

/* The rows a loop over 64-row blocks will read next, asked for a few cache lines at a time
 * while the current block is worked on. A block's first touch of the caller's arrays (and
 * of the projections the forward kept, which the backward reads from memory) otherwise
 * waits on memory; asking for all of the next block's lines at once (about a thousand)
 * gained at most 2% on a Zen 4 (experiments/journal/performance-log.md), spread through the
 * block the bidirectional forward + backward took 6-7% less time (docs/performance.md's
 * table of kernel choices). Addresses are kept as integers, aligned down to a line: a
 * prefetch never faults, so a range may begin before or end past an array. */
#define FF_PREFETCH_RANGES 4
typedef struct {
    uintptr_t next[FF_PREFETCH_RANGES]; /* the next line to ask for, per range */
    size_t left[FF_PREFETCH_RANGES];    /* bytes from it not yet asked for, per range */
    int n, cur;                         /* ranges held; the first with bytes left */
} ff_prefetch_plan;

/* Add `bytes` from p to the plan (p NULL or no room: ignored). */
static inline void ff_plan_add(ff_prefetch_plan *plan, const void *p, size_t bytes)
{
    if (p && bytes && plan->n < FF_PREFETCH_RANGES) {
        const uintptr_t offset = (uintptr_t)p % FF_CACHE_LINE;
        plan->next[plan->n] = (uintptr_t)p - offset;
        plan->left[plan->n++] = bytes + offset;
    }
}

/* Cache lines the plan has not asked for yet */
static inline size_t ff_plan_lines(const ff_prefetch_plan *plan)
{
    size_t lines = 0;
    for (int i = plan->cur; i < plan->n; ++i)
        lines += (plan->left[i] + FF_CACHE_LINE - 1) / FF_CACHE_LINE;
    return lines;
}

/* Ask for the plan's next `lines` cache lines (SIZE_MAX: all that are left), into the
 * caches short of L1 */
static inline void ff_plan_issue(ff_prefetch_plan *plan, size_t lines)
{
    while (lines && plan->cur < plan->n) {
        uintptr_t line = plan->next[plan->cur];
        size_t left = plan->left[plan->cur];
        for (; lines && left; --lines) {
            __builtin_prefetch((const void *)line, 0, 2);
            line += FF_CACHE_LINE;
            left = left > FF_CACHE_LINE ? left - FF_CACHE_LINE : 0;
        }
        plan->next[plan->cur] = line;
        plan->left[plan->cur] = left;
        if (!left)
            plan->cur++;
    }
}

/* Copy `bytes` to dst with stores that bypass the caches (SSE2's streaming stores, the
 * x86-64 baseline; memcpy elsewhere), for large outputs that are read again only after
 * much other work: a plain store first reads each line it writes into the cache (twice
 * the memory traffic) and evicts data the caller is still using. */
static inline void ff_stream_copy(void *dst, const void *src, size_t bytes)
{
#if defined(__SSE2__)
    char *d = (char *)dst;
    const char *s = (const char *)src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15; /* to the first 16-byte boundary */
    if (head > bytes)
        head = bytes;
    memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    for (; bytes >= 16; bytes -= 16, d += 16, s += 16)
        _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
    memcpy(d, s, bytes);
    _mm_sfence(); /* ordered before any later store of this thread (and the region's end) */
#else
    memcpy(dst, src, bytes);
#endif
}

/* Number of threads a parallel region should use: 0 means the OpenMP default. */
static inline int ff_threads(int requested)
{
#ifdef _OPENMP
    return requested > 0 ? requested : omp_get_max_threads();
#else
    (void)requested;
    return 1;
#endif
}

/* Run-time choice between code compiled for x86-64 levels 2 (baseline), 3 (AVX2, FMA)
 * and 4 (AVX-512): isa_copies.inc compiles a tile once for each. FF_NO_CLONES builds the
 * baseline only. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && (__GNUC__ >= 11) && \
    !defined(FF_NO_CLONES)
#define FF_X86_DISPATCH 1
#else
#define FF_X86_DISPATCH 0
#endif

/* A cap on the x86-64 level of the code copies run by the calling thread (4: none), and
 * by the teams it starts (FF_TEAM). A one-token recurrent step runs under a cap of 3
 * (module.c): on an Intel Xeon (family 6 model 106) a few microseconds of AVX-512
 * arithmetic per call lower the core's clock for everything around them, and the AVX2
 * copies ran the step faster there (docs/performance.md). The copies a step runs give the
 * same bits at levels 3 and 4 (tests/test_isa_paths.py), so the cap changes the speed only. */
#if FF_X86_DISPATCH
extern __thread int ff_level_cap __attribute__((tls_model("initial-exec")));
#define FF_LEVEL_CAP() ff_level_cap
#define FF_LEVEL_CAP_PUSH(cap, saved)                                                      \
    do {                                                                                   \
        (saved) = ff_level_cap;                                                            \
        ff_level_cap = (cap);                                                              \
    } while (0)
#define FF_LEVEL_CAP_POP(saved) (ff_level_cap = (saved))
#else
#define FF_LEVEL_CAP() 4
#define FF_LEVEL_CAP_PUSH(cap, saved) ((void)(cap), (saved) = 4)
#define FF_LEVEL_CAP_POP(saved) ((void)(saved))
#endif

/* Run `call` on a team of `T` threads, or on the calling thread alone when T is 1. The
 * loops inside `call` are orphaned `omp for`s: in a team they share the work, alone they
 * run serially. A team of one is avoided because libgomp ends each of its barriers with a
 * futex system call all the same (a one-token recurrent step paid three, more than half
 * of the call at tiny sizes). */
#ifdef _OPENMP
#define FF_TEAM(T, call)                                                                   \
    do {                                                                                   \
        const int ff_team_ = (int)(T);                                                     \
        if (ff_team_ > 1) {                                                                \
            const int ff_cap_ = FF_LEVEL_CAP(); /* every thread of the team runs under */   \
            _Pragma("omp parallel num_threads(ff_team_)")                                  \
            {                                                                              \
                int ff_saved_;                                                             \
                FF_LEVEL_CAP_PUSH(ff_cap_, ff_saved_);                                     \
                call;                                                                      \
                FF_LEVEL_CAP_POP(ff_saved_);                                               \
            }                                                                              \
        } else {                                                                           \
            call;                                                                          \
        }                                                                                  \
    } while (0)
#else
#define FF_TEAM(T, call)                                                                   \
    do {                                                                                   \
        (void)(T);                                                                         \
        call;                                                                              \
    } while (0)
#endif

static inline int ff_thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* The CPU's level (FLEXFORMER_CPU_LEVEL may cap it for the whole process) */
#if FF_X86_DISPATCH
static inline int ff_cpu_level(void)
{
    static int level = 0; /* written once with the same value by any thread: benign */
    if (!level) {
        __builtin_cpu_init();
        int found = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                            __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq")
                        ? 4
                    : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 3
                                                                                       : 2;
        /* FLEXFORMER_CPU_LEVEL=2 or 3 caps the level (tests run every path this way) */
        const char *cap = getenv("FLEXFORMER_CPU_LEVEL");
        if (cap && cap[0] >= '2' && cap[0] <= '4' && cap[1] == 0 && cap[0] - '0' < found)
            found = cap[0] - '0';
        level = found;
    }
    return level;
}
#endif

/* Bytes the causal backward may spend on caching each chunk's features and weights
 * between its two sweeps (a few KiB per row; beyond the budget it recomputes them).
 * Default 256 MiB; 0 turns the cache off. Set through ff_set_causal_cache_bytes (the
 * Python layer's set_causal_cache, which also reads FLEXFORMER_CAUSAL_CACHE_MIB once at
 * import); defined in kernels.c. */
extern size_t ff_causal_cache_limit;

static inline size_t ff_causal_cache_bytes(void)
{
    return ff_causal_cache_limit;
}

void ff_set_causal_cache_bytes(size_t bytes);

#define FF_PASTE_(a, b) a##b
#define FF_PASTE(a, b) FF_PASTE_(a, b)

/* Per-instruction-set copies have one mechanism: a tile file (*_tile.inc) written once,
 * included by isa_copies.inc once per instruction set with FF_ISA_SFX (base, avx2,
 * avx512), FF_ISA_COPY (2, 3, 4: the x86-64 level it is compiled for) and FF_ISA_TARGET
 * (GCC's target attribute) defined; FF_ISA_FN(name) names that copy, FF(name_<sfx>). */
#define FF_ISA_FN(name) FF(FF_PASTE(FF_PASTE(name, _), FF_ISA_SFX))
/* the vector bytes of that copy: SSE2's 16, AVX2's 32, AVX-512's 64 */
#define FF_ISA_VBYTES (FF_ISA_COPY == 4 ? 64 : FF_ISA_COPY == 3 ? 32 : 16)

/* The copy of FF(name) for an instruction-set level (FF_ISA_LEVEL(), read once per call
 * and passed in): name_avx512 at 4, name_avx2 at 3, name_base below, and name_base alone
 * in a build without the copies (FF_X86_DISPATCH 0). For the hot loops compiled once per
 * instruction set (GCC target attributes). */
#if FF_X86_DISPATCH
/* the CPU's level under this thread's cap (FF_LEVEL_CAP) */
static inline int ff_call_level(void)
{
    const int level = ff_cpu_level();
    return level < ff_level_cap ? level : ff_level_cap;
}
#define FF_ISA_LEVEL() ff_call_level()
#define FF_ISA_CALL(name, level, ...)                                                      \
    ((level) >= 4   ? FF(name##_avx512)(__VA_ARGS__)                                       \
     : (level) >= 3 ? FF(name##_avx2)(__VA_ARGS__)                                         \
                    : FF(name##_base)(__VA_ARGS__))
/* The same for routines with a base and an AVX2 copy only (level 4 runs the AVX2 one). */
#define FF_ISA_CALL_AVX2(name, level, ...)                                                 \
    ((level) >= 3 ? FF(name##_avx2)(__VA_ARGS__) : FF(name##_base)(__VA_ARGS__))
#else
#define FF_ISA_LEVEL() 2
#define FF_ISA_CALL(name, level, ...) ((void)(level), FF(name##_base)(__VA_ARGS__))
#define FF_ISA_CALL_AVX2(name, level, ...) ((void)(level), FF(name##_base)(__VA_ARGS__))
#endif
/* The call for a tile compiled with FF_TILE_COPIES = copies (a literal 1, 2 or 3):
 * the baseline copy alone, FF_ISA_CALL_AVX2, FF_ISA_CALL. */
#define FF_ISA_CALL_1(name, level, ...) ((void)(level), FF(name##_base)(__VA_ARGS__))
#define FF_ISA_CALL_2 FF_ISA_CALL_AVX2
#define FF_ISA_CALL_3 FF_ISA_CALL
#define FF_ISA_CALL_COPIES(copies, ...) FF_PASTE(FF_ISA_CALL_, copies)(__VA_ARGS__)

/* Elements in one (b,h)'s packed state [S (F,e), z (F), R, M] (key_state=, state=):
 * F e + F + 2 padded to a multiple of FF_STATE_ALIGN, so that in an array starting on a
 * cache line every pair's S starts on one too. A decoding step reads and rewrites all of
 * S, a vector at a time: unpadded, the pairs after the first sat 8 bytes further along
 * each, and half of the AVX2 loads and stores of those split across two lines (model 106:
 * a one-token step 3-6% slower, docs/performance.md). The padding is zero and never read. */
#define FF_STATE_ALIGN 16
static inline size_t ff_packed_state_len(size_t F, size_t e)
{
    return (F * e + F + 2 + (FF_STATE_ALIGN - 1)) / FF_STATE_ALIGN * FF_STATE_ALIGN;
}

/* Rows per block: features are computed for this many rows at a time, and the
 * causal kernels use it as the chunk length of the intra-chunk masked product. */
#define FF_BLOCK 64

#endif /* FF_COMMON_H */
