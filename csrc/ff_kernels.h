/* Public C entry points of the flexformer kernels (no Python here).
 * Every array is C-contiguous; sizes are element counts; every function returns an
 * ff_status (ff_common.h): the linear kinds' forward and backward return
 * FF_NONFINITE_OUTPUT, not FF_OK, when a result they wrote holds NaN or inf. `eps` is
 * the denominator guard (see linattn_core.inc); nthreads <= 0 means the OpenMP
 * default. Each attention kind has a forward and a backward; the linear kinds' forward
 * can also write their key_state ((B,H,F*e+F+2), bidirectional only, NULL to skip),
 * which their backward then reads in place of the key pass. Each kind also has a
 * uniform adapter name_attention_call (one ff_attention_args, forward when dout is
 * NULL) through which the glue dispatches (kinds.h). The _f32 and _f64 variants are the
 * same source compiled for float and double (kernels.c). */
#ifndef FF_KERNELS_H
#define FF_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kinds.h"

int ff_openmp_enabled(void);
/* x86-64 level of the code paths in use: 2, 3, 4, or 0 without run-time dispatch */
int ff_isa_level(void);
int ff_wide_copies(int use_double);
int ff_max_threads(void);

/* One attention call in a kind-independent form; arrays are float or double by the
 * adapter's suffix, unused fields are NULL / 0. */
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

#define FF_DECLARE_CALL(name, ...)                                                          \
    int name##_attention_call_f32(const ff_attention_args *a);                              \
    int name##_attention_call_f64(const ff_attention_args *a);
FF_KINDS(FF_DECLARE_CALL)
#undef FF_DECLARE_CALL

#define FF_DECLARE_FLEX(real, sfx)                                                          \
    int flex_s_attention_forward_##sfx(                                                     \
        real *out, int64_t *guard_count, real *key_state, const real *q, const real *k,     \
        const real *v, const real *omega, const uint8_t *key_mask, size_t B, size_t H,      \
        size_t Nq, size_t Nk, size_t d, size_t e, size_t m, int causal, real eps,           \
        int nthreads);                                                                      \
    int flex_s_attention_backward_##sfx(                                                    \
        real *dq, real *dk, real *dv, real *domega, const real *dout, const real *q,        \
        const real *k, const real *v, const real *omega, const real *key_state,             \
        const uint8_t *key_mask, size_t B, size_t H, size_t Nq, size_t Nk, size_t d,        \
        size_t e, size_t m, int causal, real eps, int nthreads);                            \
    int flex_n_attention_forward_##sfx(                                                     \
        real *out, int64_t *guard_count, real *key_state, const real *q, const real *k,     \
        const real *v, const real *omega1, const real *omega2, const real *tau,             \
        const uint8_t *key_mask, size_t B, size_t H, size_t Nq, size_t Nk, size_t d,        \
        size_t e, size_t m, int causal, real eps, int nthreads);                            \
    int flex_n_attention_backward_##sfx(                                                    \
        real *dq, real *dk, real *dv, real *domega1, real *domega2, real *dtau,             \
        const real *dout, const real *q, const real *k, const real *v, const real *omega1,  \
        const real *omega2, const real *tau, const real *key_state,                         \
        const uint8_t *key_mask, size_t B, size_t H, size_t Nq, size_t Nk, size_t d,        \
        size_t e, size_t m, int causal, real eps, int nthreads);                            \
    int performer_attention_forward_##sfx(                                                  \
        real *out, int64_t *guard_count, real *key_state, const real *q, const real *k,     \
        const real *v, const real *omega, const uint8_t *key_mask, size_t B, size_t H,      \
        size_t Nq, size_t Nk, size_t d, size_t e, size_t m, int causal, real eps,           \
        int nthreads);                                                                      \
    int performer_attention_backward_##sfx(                                                 \
        real *dq, real *dk, real *dv, const real *dout, const real *q, const real *k,       \
        const real *v, const real *omega, const real *key_state, const uint8_t *key_mask,   \
        size_t B, size_t H, size_t Nq, size_t Nk, size_t d, size_t e, size_t m, int causal, \
        real eps, int nthreads);                                                            \
    int hedgehog_attention_forward_##sfx(                                                   \
        real *out, int64_t *guard_count, real *key_state, const real *q, const real *k,     \
        const real *v, const real *W, const uint8_t *key_mask, size_t B, size_t H,          \
        size_t Nq, size_t Nk, size_t d, size_t e, size_t m, int causal, real eps,           \
        int nthreads);                                                                      \
    int hedgehog_attention_backward_##sfx(                                                  \
        real *dq, real *dk, real *dv, real *dW, const real *dout, const real *q,            \
        const real *k, const real *v, const real *W, const real *key_state,                 \
        const uint8_t *key_mask, size_t B, size_t H, size_t Nq, size_t Nk, size_t d,        \
        size_t e, size_t m, int causal, real eps, int nthreads);                            \
    int taylor_attention_forward_##sfx(                                                     \
        real *out, int64_t *guard_count, real *key_state, const real *q, const real *k,     \
        const real *v, const uint8_t *key_mask, size_t B, size_t H, size_t Nq, size_t Nk,   \
        size_t d, size_t e, int causal, real eps, int nthreads);                            \
    int taylor_attention_backward_##sfx(                                                    \
        real *dq, real *dk, real *dv, const real *dout, const real *q, const real *k,       \
        const real *v, const real *key_state, const uint8_t *key_mask, size_t B, size_t H,  \
        size_t Nq, size_t Nk, size_t d, size_t e, int causal, real eps, int nthreads);      \
    int linear_attention_forward_##sfx(                                                     \
        real *out, int64_t *guard_count, real *key_state, const real *phi_q,                \
        const real *phi_k, const real *v, const uint8_t *key_mask, size_t B, size_t H,      \
        size_t Nq, size_t Nk, size_t F, size_t e, int causal, real eps, int nthreads);      \
    int linear_attention_backward_##sfx(                                                    \
        real *dphi_q, real *dphi_k, real *dv, const real *dout, const real *phi_q,          \
        const real *phi_k, const real *v, const real *key_state, const uint8_t *key_mask,   \
        size_t B, size_t H, size_t Nq, size_t Nk, size_t F, size_t e, int causal, real eps, \
        int nthreads);                                                                      \
    int softmax_attention_forward_##sfx(                                                    \
        real *out, const real *q, const real *k, const real *v, const uint8_t *key_mask,    \
        size_t B, size_t H, size_t Nq, size_t Nk, size_t d, size_t e, real scale,           \
        int causal, int nthreads);                                                          \
    int softmax_attention_backward_##sfx(                                                   \
        real *dq, real *dk, real *dv, const real *dout, const real *q, const real *k,       \
        const real *v, const uint8_t *key_mask, size_t B, size_t H, size_t Nq, size_t Nk,   \
        size_t d, size_t e, real scale, int causal, int nthreads);                          \
    int linformer_attention_forward_##sfx(                                                  \
        real *out, const real *q, const real *k, const real *v, const real *E,              \
        const real *Fm, const uint8_t *key_mask, size_t B, size_t H, size_t Nq, size_t Nk,  \
        size_t d, size_t e, size_t kp, size_t Nmax, size_t nEF, real scale, int nthreads);  \
    int linformer_attention_backward_##sfx(                                                 \
        real *dq, real *dk, real *dv, real *dE, real *dF, const real *dout, const real *q,  \
        const real *k, const real *v, const real *E, const real *Fm,                        \
        const uint8_t *key_mask, size_t B, size_t H, size_t Nq, size_t Nk, size_t d,        \
        size_t e, size_t kp, size_t Nmax, size_t nEF, real scale, int nthreads);            \
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

FF_DECLARE_FLEX(float, f32)
FF_DECLARE_FLEX(double, f64)

#undef FF_DECLARE_FLEX

#endif /* FF_KERNELS_H */
