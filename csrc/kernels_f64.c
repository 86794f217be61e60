/* Every kernel body for `double` (functions named *_f64): the bodies (*.inc, listed in
 * kernels_dtype.inc) are written against `real` and name their functions through FF(),
 * which expands its argument first (so FF_ISA_FN(name) can name a per-instruction-set
 * copy). kernels_f32.c compiles the same bodies for the other dtype; the two are
 * translation units of their own so that a build compiles them at the same time. */
#include "ff_common.h"
#include "ff_kernels.h"

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
