/* Every kernel body for `float` (functions named *_f32): the bodies (*.inc, listed in
 * kernels_dtype.inc) are written against `real` and name their functions through FF(),
 * which expands its argument first (so FF_ISA_FN(name) can name a per-instruction-set
 * copy). kernels_f64.c compiles the same bodies for the other dtype; the two are
 * translation units of their own so that a build compiles them at the same time. */
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
