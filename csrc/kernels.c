/* What the kernels share across both dtypes: the settings read by every kernel (the causal
 * cache's budget, the calling thread's instruction-set cap) and the questions the module
 * asks about the build. The kernels themselves are in kernels_f32.c and kernels_f64.c. */
#include "ff_common.h"
#include "ff_kernels.h"

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
    return use_double ? ff_product_copy_name_f64() : ff_product_copy_name_f32();
}

/* How the dense products treat rows of B that sit off a 64-byte line: "copy" (to the AVX-512
 * tile's line-aligned panel) or "in_place" (timed with the copy on first use, or
 * FLEXFORMER_OFF_LINE_ROWS); "in_place" wherever no AVX-512 copy runs them. */
const char *ff_off_line_rows(int use_double)
{
    return use_double ? ff_off_line_rows_name_f64() : ff_off_line_rows_name_f32();
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
