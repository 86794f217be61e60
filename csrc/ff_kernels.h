/* Public C entry points of the flexformer kernels (no Python here).
 * Every array is C-contiguous; sizes are element counts; every function returns an
 * ff_status (ff_common.h): the linear kinds' entries return FF_NONFINITE_OUTPUT, not
 * FF_OK, when a result they wrote holds NaN or inf. Each attention kind of kinds.h has one
 * entry, <kind>_attention_f32 / _f64, taking one ff_attention_args: the forward when dout
 * is NULL, the backward otherwise. `eps` is the linear kinds' denominator guard (see
 * linattn_core.inc); nthreads <= 0 means the OpenMP default. The linear kinds' forward can
 * also write their key_state ((B,H,F*e+F+2), bidirectional only, NULL to skip), which their
 * backward then reads in place of the key pass. The _f32 and _f64 variants are the same
 * source compiled for float and double (kernels_f32.c, kernels_f64.c). */
#ifndef FF_KERNELS_H
#define FF_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kinds.h"

int ff_openmp_enabled(void);
/* x86-64 level of the code paths in use: 2, 3, 4, or 0 without run-time dispatch */
int ff_isa_level(void);
/* Cap the level of the code copies the calling thread (and the teams it starts) runs at
 * cap (2, 3 or 4: no cap); returns the cap it replaces. Speed only: see ff_common.h. */
int ff_cap_thread_level(int cap);
/* the copy that runs the dense products: "avx512", "avx512_4x4", "avx2", "base" or "plain" */
const char *ff_product_copy(int use_double);
/* how that copy treats rows off a 64-byte line: "copy" (to its panel) or "in_place" */
const char *ff_off_line_rows(int use_double);
/* the same two answers for one dtype (dense.inc, compiled per dtype) */
const char *ff_product_copy_name_f32(void);
const char *ff_product_copy_name_f64(void);
const char *ff_off_line_rows_name_f32(void);
const char *ff_off_line_rows_name_f64(void);
int ff_max_threads(void);

/* One attention call in a kind-independent form; arrays are float or double by the
 * entry's suffix, unused fields are NULL / 0. */
typedef struct {
    void *out;                 /* forward: (B,H,Nq,e) */
    int64_t *guard_count;      /* forward, linear kinds: (B,H) */
    void *key_state;           /* linear kinds, bidirectional: written by the forward, read by the backward */
    void *projections;         /* flex_s, flex_n, bidirectional: (B,H,Nq+Nk,r) projections onto
                                * the r = m or 2m frequencies, kept by the forward for the
                                * backward (NULL: the backward computes them again) */
    void *dq, *dk, *dv;        /* backward: like q, k, v */
    void *dparams[3];          /* backward: like the first ngrads params */
    const void *dout;          /* (B,H,Nq,e); NULL: forward */
    const void *q, *k, *v;     /* (B,H,Nq,d), (B,H,Nk,d), (B,H,Nk,e) */
    const void *params[3];     /* the kind's parameters, as kinds.h lists them */
    const uint8_t *key_mask;   /* (B,Nk) or NULL */
    size_t B, H, Nq, Nk, d, e, m, kp, Nmax, nEF;
    int causal, nthreads;
    int check_features;        /* trig kinds' causal continuation of <= FF_STEP_ROWS rows: check
                                * the features instead of the frequencies (FF_NONFINITE_FEATURES) */
    double eps, scale;         /* linear kinds' guard; softmax kinds' logit scale */
} ff_attention_args;

#define FF_DECLARE_ENTRY(name, ...)                                                         \
    int name##_attention_f32(const ff_attention_args *a);                                   \
    int name##_attention_f64(const ff_attention_args *a);
FF_KINDS(FF_DECLARE_ENTRY)
#undef FF_DECLARE_ENTRY

/* The other kernels of the glue (elementwise maps, layer norm, short convolution, checks). */
#define FF_DECLARE_HELPERS(real, sfx)                                                       \
    void ff_sincos_##sfx(real *s, real *c, const real *x, size_t n);                       \
    void ff_exp_##sfx(real *y, const real *x, size_t n);                                    \
    int all_finite_##sfx(const real *p, size_t n);                                          \
    int gelu_forward_##sfx(real *y, real *t, const real *x, size_t n, int nthreads);         \
    int gelu_backward_##sfx(real *dx, const real *dy, const real *x, const real *t,          \
                            size_t n, int nthreads);                                        \
    int layer_norm_forward_##sfx(real *y, real *xhat, real *rstd, const real *x,              \
                                 const real *gamma, const real *beta, real eps, size_t R,     \
                                 size_t C, int nthreads);                                     \
    int layer_norm_backward_##sfx(real *dx, real *dgamma, real *dbeta, const real *dy,        \
                                  const real *xhat, const real *rstd, const real *gamma,      \
                                  size_t R, size_t C, int nthreads);                          \
    int short_conv_forward_##sfx(real *y, const real *x, const real *w, size_t B, size_t N,   \
                                 size_t C, size_t W, int nthreads);                           \
    int short_conv_backward_##sfx(real *dx, real *dw, const real *dy, const real *x,          \
                                  const real *w, size_t B, size_t N, size_t C, size_t W,      \
                                  int nthreads);

FF_DECLARE_HELPERS(float, f32)
FF_DECLARE_HELPERS(double, f64)

#undef FF_DECLARE_HELPERS

#endif /* FF_KERNELS_H */
