/* Instantiates every kernel body twice, once per dtype: the bodies (*.inc) are
 * written against `real` and name their functions through FF(), which expands its
 * argument first (so FF_ISA_FN(name) can name a per-instruction-set copy). */
#include "ff_common.h"
#include "ff_kernels.h"

#define FF(name) FF_PASTE(name, _f32)
#define real float
#define R_EXP expf
#define R_SIN sinf
#define R_COS cosf
#define R_FABS fabsf
#define R_SQRT sqrtf
#define R_LOG logf
#define FF_DOUBLE 0
#include "kernels_dtype.inc"
#undef FF
#undef real
#undef R_EXP
#undef R_SIN
#undef R_COS
#undef R_FABS
#undef R_SQRT
#undef R_LOG
#undef FF_DOUBLE

#define FF(name) FF_PASTE(name, _f64)
#define real double
#define R_EXP exp
#define R_SIN sin
#define R_COS cos
#define R_FABS fabs
#define R_SQRT sqrt
#define R_LOG log
#define FF_DOUBLE 1
#include "kernels_dtype.inc"

size_t ff_causal_cache_limit = (size_t)256 << 20;

#if FF_X86_DISPATCH
__thread int ff_level_cap __attribute__((tls_model("initial-exec"))) = 4;
#endif

int ff_cap_thread_level(int cap)
{
    int previous;
    FF_LEVEL_CAP_PUSH(cap < 2 ? 2 : cap > 4 ? 4 : cap, previous);
    return previous;
}

/* The x86-64 level whose code paths the kernels run (2, 3 or 4; FLEXFORMER_CPU_LEVEL may
 * cap it), or 0 for a build without run-time dispatch. */
int ff_isa_level(void)
{
#if FF_X86_DISPATCH
    return ff_cpu_level();
#else
    return 0;
#endif
}

/* The name of the copy that runs the dense products for a dtype (dense.inc): at level 4 one
 * of ff_products_names (timed once on first use, or FLEXFORMER_TILES), else "avx2" or
 * "base" as the level implies; "plain" for the plain loops (FF_PLAIN_DENSE), "base" without
 * run-time dispatch. */
const char *ff_product_copy(int use_double)
{
    (void)use_double;
#if !defined(__GNUC__) || defined(FF_PLAIN_DENSE)
    return "plain";
#elif FF_X86_DISPATCH
    if (ff_cpu_level() < 3)
        return "base";
    return ff_products_names[use_double ? wide_copies_f64() : wide_copies_f32()];
#else
    return "base";
#endif
}

/* How the dense products treat rows of B that sit off a 64-byte line: "copy" (to the AVX-512
 * tile's line-aligned panel) or "in_place" (timed with the copy on first use, or
 * FLEXFORMER_OFF_LINE_ROWS); "in_place" wherever no AVX-512 copy runs them. */
const char *ff_off_line_rows(int use_double)
{
    (void)use_double;
#if defined(__GNUC__) && !defined(FF_PLAIN_DENSE) && FF_X86_DISPATCH
    return ff_off_line_names[use_double ? copies_off_line_f64() : copies_off_line_f32()];
#else
    return "in_place";
#endif
}

void ff_set_causal_cache_bytes(size_t bytes)
{
    ff_causal_cache_limit = bytes;
}

int ff_openmp_enabled(void)
{
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

int ff_max_threads(void)
{
    return ff_threads(0);
}
