/* The one list of attention kinds the C core serves. The glue (module.c) derives its
 * kind enum, argument specs, dispatch table, Python entry points and method table from
 * it; ff_kernels.h derives the declarations of the kinds' C entries. Adding a kind
 * to the core is one line here plus its feature map and entry points (featmap_*.inc,
 * ops_*.inc; see docs/architecture.md).
 *
 * X(name, qname, kname, ngrads, linear, F, R, grads_doc, refusal, params)
 *   name      the Python entry points are name_forward / name_backward, the C entry
 *             name_attention_f32 / _f64 (ops_*.inc, softmax.inc, linformer.inc)
 *   qname, kname  names of the query and key arguments (the generic core takes features)
 *   ngrads    parameter gradients the backward returns (the first ngrads params)
 *   linear    1: runs on the normalised linear-attention core (eps, guard count, key
 *             state); 0: a softmax-family kernel (scale)
 *   F         feature size in terms of d (last axis of q) and m (bound by a parameter);
 *             sizes the key state of the linear kinds
 *   R         width of a row's projection onto the frequencies, which a bidirectional
 *             forward can keep for its backward (return_projections / projections);
 *             0: the kind keeps none
 *   grads_doc what the backward returns, for the method's docstring
 *   refusal   NULL, or why causal=True is refused
 *   params    up to three P(name, axes) / PA(name, axes, alt_axes) / PT(name, axes) entries
 *             in parentheses; axis letters: H heads, d head size, m features, p projected
 *             length, L maximum length (module.c, prepare_param). PT marks the frequencies
 *             of a trig map: a NaN or inf in them makes a feature NaN (sin and cos of a
 *             non-finite angle), so a recurrent step checks its features instead
 *             (FF_STEP_ROWS) */
#ifndef FF_KINDS_H
#define FF_KINDS_H

#define FF_KINDS(X)                                                                          \
    X(flex_s, "q", "k", 1, 1, 2 * m, m, "(dq, dk, dv, domega)", NULL, (PT("omega", "Hmd"))) \
    X(flex_n, "q", "k", 3, 1, 2 * m, 2 * m, "(dq, dk, dv, domega1, domega2, dtau)", NULL,   \
      (PT("omega1", "Hmd") PT("omega2", "Hmd") P("tau", "H")))                              \
    X(performer, "q", "k", 0, 1, m, 0, "(dq, dk, dv)", NULL, (P("omega", "Hmd")))           \
    X(hedgehog, "q", "k", 1, 1, 2 * m, 0, "(dq, dk, dv, dW)", NULL, (P("W", "Hdm")))        \
    X(taylor, "q", "k", 0, 1, 1 + d + d * d, 0, "(dq, dk, dv)", NULL, ())                   \
    X(rebased, "q", "k", 2, 1, d * d, 0, "(dq, dk, dv, dgamma, dbeta)", NULL,                 \
      (P("gamma", "Hd") P("beta", "Hd")))                                                  \
    X(linear, "phi_q", "phi_k", 0, 1, d, 0, "(dphi_q, dphi_k, dv)", NULL, ())               \
    X(softmax, "q", "k", 0, 0, 0, 0, "(dq, dk, dv)", NULL, ())                              \
    X(linformer, "q", "k", 2, 0, 0, 0, "(dq, dk, dv, dE, dF)",                              \
      "causal=True is not available for Linformer: its projection E k mixes keys from "     \
      "every position, so an output row would depend on future keys",                       \
      (PA("E", "HpL", "pL") PA("F", "HpL", "pL")))

#endif /* FF_KINDS_H */
