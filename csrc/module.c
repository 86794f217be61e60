/* The one file that speaks the CPython / NumPy C API: it parses arguments, converts
 * and checks every array (naming the argument and the expected shape or dtype in the
 * error), allocates outputs, releases the GIL around the pure C kernels and maps
 * their status codes to Python exceptions.
 * The kernels themselves live in kernels_f32.c / kernels_f64.c (one source, two dtypes). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
/* The oldest NumPy we run with (pyproject.toml: numpy>=1.23): its C API has the memory
 * handler functions used below (PyDataMem_SetHandler, NumPy 1.22). Without a target, NumPy's
 * headers choose their own oldest, which before NumPy 2.1 (Python 3.9's last) left those out. */
#define NPY_TARGET_VERSION NPY_1_23_API_VERSION
#include <numpy/arrayobject.h>

#include <math.h>
#include "ff_common.h"
#include "ff_kernels.h"

static int requested_threads = 0; /* 0: the OpenMP default */

/* GNU OpenMP's thread pool does not survive fork(): a child forked after the kernels ran
 * (multiprocessing's default start method on Linux) would wait forever for pool threads
 * that no longer exist. Children therefore run the kernels on one thread. The block
 * cache's lock is held across fork() so that a child gets a consistent, unlocked table. */
#if !defined(_WIN32)
#include <pthread.h>
static volatile int forked_child = 0;
static void after_fork_in_child(void)
{
    forked_child = 1;
    ff_buffer_cache_unlock();
}
#endif
#if defined(_OPENMP) && !defined(_WIN32)
#define KERNEL_THREADS() (forked_child ? 1 : requested_threads)
#else
#define KERNEL_THREADS() requested_threads
#endif

/* ------------------------------------------------------------------ helpers */

/* "(2, 4, 8, 16)" for an array's shape, as a new str. */
static PyObject *shape_str(PyArrayObject *a)
{
    PyObject *t = PyTuple_New(PyArray_NDIM(a));
    if (!t)
        return NULL;
    for (int i = 0; i < PyArray_NDIM(a); ++i)
        PyTuple_SET_ITEM(t, i, PyLong_FromSsize_t(PyArray_DIM(a, i)));
    PyObject *s = PyObject_Str(t);
    Py_DECREF(t);
    return s;
}

static int shape_error(PyArrayObject *a, const char *name, const char *expected)
{
    PyObject *s = shape_str(a);
    if (s) {
        PyErr_Format(PyExc_ValueError, "%s must have shape %s, got %U", name, expected, s);
        Py_DECREF(s);
    }
    return -1;
}

/* Any array-like as an ndarray of its own dtype (new reference), TypeError if it is not one. */
static PyArrayObject *as_ndarray(PyObject *obj, const char *name)
{
    if (PyArray_Check(obj)) {
        Py_INCREF(obj);
        return (PyArrayObject *)obj;
    }
    PyArrayObject *a = (PyArrayObject *)PyArray_FROM_O(obj);
    if (!a) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be an array of real numbers (a numpy array, or a %s NumPy "
                     "can convert), but NumPy could not convert it", name, Py_TYPE(obj)->tp_name);
    }
    return a;
}

/* A Python list, tuple or number carries no dtype of its own (NumPy would guess float64
 * or int64), so it takes the call's dtype, as NumPy functions convert such arguments. */
static int is_untyped(PyObject *obj)
{
    return PyList_Check(obj) || PyTuple_Check(obj) || PyFloat_Check(obj) || PyLong_Check(obj);
}

/* A Python list, tuple or number as an ndarray of dtype typenum (new reference); TypeError
 * naming the argument when NumPy cannot convert it (ragged, strings, complex). */
static PyArrayObject *untyped_as(PyObject *obj, const char *name, int typenum)
{
    PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(obj, typenum, 0, 0, NPY_ARRAY_IN_ARRAY);
    if (!a) {
        PyArray_Descr *want = PyArray_DescrFromType(typenum);
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be an array of real numbers (a numpy array, or a %s NumPy "
                     "can convert to %S), but NumPy could not convert it", name, Py_TYPE(obj)->tp_name,
                     (PyObject *)want);
        Py_XDECREF(want);
    }
    return a;
}

/* 1 for a finite eps > 0; else 0 with a ValueError saying what it got. (PyErr_Format has
 * no %g: Python 3.11 printed it literally, 3.12 raises SystemError; snprintf does it.) */
static int eps_is_valid(double eps)
{
    if (eps > 0 && isfinite(eps))
        return 1;
    char got[64];
    snprintf(got, sizeof got, "%g", eps);
    PyErr_Format(PyExc_ValueError, "eps must be a finite number > 0, got %s", got);
    return 0;
}

/* Convert obj to a C-contiguous, aligned, native array of dtype typenum and ndim dims.
 * A Python list, tuple or number is converted to typenum; an array of another dtype is a
 * TypeError naming the argument, a wrong ndim a ValueError. */
static PyArrayObject *to_array(PyObject *obj, const char *name, int typenum, int ndim,
                               const char *shape_doc)
{
    PyArrayObject *a = is_untyped(obj) ? untyped_as(obj, name, typenum) : as_ndarray(obj, name);
    if (!a)
        return NULL;
    if (PyArray_TYPE(a) != typenum) {
        PyArray_Descr *want = PyArray_DescrFromType(typenum);
        PyErr_Format(PyExc_TypeError, "%s must have dtype %S, got %S", name, (PyObject *)want,
                     (PyObject *)PyArray_DESCR(a));
        Py_XDECREF(want);
        Py_DECREF(a);
        return NULL;
    }
    if (PyArray_NDIM(a) != ndim) {
        PyErr_Format(PyExc_ValueError, "%s must be a %d-d array of shape %s, got %d-d", name,
                     ndim, shape_doc, PyArray_NDIM(a));
        Py_DECREF(a);
        return NULL;
    }
    /* already what the kernels read (the usual case): PyArray_FROMANY would return it too,
     * after a dtype discovery that a one-token step's call would pay for each of its seven
     * arrays */
    if (PyArray_IS_C_CONTIGUOUS(a) && PyArray_ISALIGNED(a) && PyArray_ISNOTSWAPPED(a))
        return a;
    PyArrayObject *c = (PyArrayObject *)PyArray_FROMANY((PyObject *)a, typenum, ndim, ndim,
                                                        NPY_ARRAY_IN_ARRAY);
    Py_DECREF(a);
    return c;
}

/* The kernels' finiteness pass over a C-contiguous float32/float64 array. */
static int array_all_finite(PyArrayObject *a)
{
    const npy_intp n = PyArray_SIZE(a);
    return PyArray_TYPE(a) == NPY_FLOAT ? all_finite_f32((const float *)PyArray_DATA(a), (size_t)n)
                                        : all_finite_f64((const double *)PyArray_DATA(a), (size_t)n);
}

static int check_finite(PyArrayObject *a, const char *name)
{
    if (array_all_finite(a))
        return 0;
    PyErr_Format(PyExc_ValueError, "%s must be finite, but it contains NaN or inf", name);
    return -1;
}

static int status_to_exception(int status)
{
    switch (status) {
    case FF_OK:
        return 0;
    case FF_ERR_NOMEM:
        PyErr_SetString(PyExc_MemoryError, "flexformer: could not allocate the kernel workspace");
        return -1;
    case FF_ERR_SIZE:
        PyErr_SetString(PyExc_MemoryError,
                        "flexformer: the kernel workspace size overflows the address space");
        return -1;
    default:
        PyErr_Format(PyExc_RuntimeError, "flexformer: kernel rejected its arguments (status %d)",
                     status);
        return -1;
    }
}

/* ------------------------------------------------------------ attention calls */

/* The attention kinds the glue knows. Each has q/k/v-shaped inputs, up to three
 * parameter arrays described by axis letters, and a set of keywords. Axis letters:
 * H heads and d head size (both from q), m features and p projected length (bound by
 * the first array that has them), L the projection's maximum length (>= Nk). */
enum op_id {
#define X(name, ...) OP_##name,
    FF_KINDS(X)
#undef X
    OP_COUNT
};

typedef struct {
    const char *name;
    const char *axes;     /* e.g. "Hmd"; */
    const char *alt_axes; /* another accepted layout, or NULL */
    int finite;           /* must hold only finite values */
    int trig;             /* a trig map's frequencies (kinds.h, PT) */
} param_spec;

typedef struct {
    const char *qname, *kname;
    int nparams;
    param_spec params[4]; /* up to three, then an entry with a NULL name */
    int ngrads;           /* parameter gradients the backward returns (first ngrads) */
    int linear;           /* takes eps and returns a guard count */
    int keeps_projections; /* return_projections / projections (kinds.h, R; set at import) */
    const char *causal_refusal; /* NULL: causal=True is supported */
    int (*call[2])(const ff_attention_args *); /* the float and the double entry */
} op_spec;

/* Each kind's row, from kinds.h; nparams is counted at import (count_params). */
#define P(name, axes) {name, axes, NULL, 1, 0},
#define PA(name, axes, alt) {name, axes, alt, 1, 0},
#define PT(name, axes) {name, axes, NULL, 1, 1},
#define FF_UNPAREN(...) __VA_ARGS__
#define X(name, qn, kn, ngrads, linear, F, R, grads_doc, refusal, params)                   \
    [OP_##name] = {qn, kn, 0, {FF_UNPAREN params{NULL, NULL, NULL, 0}}, ngrads, linear,    \
                   0, refusal, {name##_attention_f32, name##_attention_f64}},
static op_spec OPS[] = {FF_KINDS(X)};
#undef X
#undef P
#undef PA
#undef PT

static void count_params(void)
{
    for (int op = 0; op < OP_COUNT; ++op)
        while (OPS[op].params[OPS[op].nparams].name)
            ++OPS[op].nparams;
}

typedef struct {
    enum op_id op;
    const op_spec *spec;
    int backward, typenum, causal;
    double eps, scale;
    PyArrayObject *dout, *q, *k, *v, *mask, *params[3];
    PyArrayObject *key_state; /* backward: the forward's key state; causal forward: the
                               * carried state, updated in place; or NULL */
    int want_key_state;       /* forward: also return the key state */
    PyArrayObject *projections; /* backward: the forward's kept projections, or NULL */
    int want_projections;     /* forward: also return the projections */
    int step;                 /* a causal forward given state= (a recurrent continuation) */
    unsigned deferred;        /* bit i: parameter i's finiteness is left to the kernel's
                               * check of the features (a step; see prepare_param) */
    int report_finite;        /* append whether every floating result is finite (the linear
                               * kinds' kernels check theirs as they make them) */
    npy_intp B, H, Nq, Nk, d, e, m, kp, L;
} attn_call;

static void attn_call_release(attn_call *c)
{
    Py_XDECREF(c->dout);
    Py_XDECREF(c->q);
    Py_XDECREF(c->k);
    Py_XDECREF(c->v);
    Py_XDECREF(c->mask);
    Py_XDECREF(c->key_state);
    Py_XDECREF(c->projections);
    for (int i = 0; i < 3; ++i)
        Py_XDECREF(c->params[i]);
}

/* "(H, m, d) = (4, 16, 32)" for a parameter's expected layout, as far as it is known. */
static void describe_axes(char *buf, size_t size, const char *axes, const attn_call *c)
{
    char names[64] = "", values[96] = "";
    for (const char *a = axes; *a; ++a) {
        const char *sep = a == axes ? "" : ", ";
        const char *label = *a == 'H' ? "H" : *a == 'd' ? "d" : *a == 'm' ? "m" : *a == 'p' ? "kp" : "Nmax";
        npy_intp val = *a == 'H' ? c->H : *a == 'd' ? c->d : *a == 'm' ? c->m : *a == 'p' ? c->kp : -1;
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", sep, label);
        if (val >= 0)
            snprintf(values + strlen(values), sizeof values - strlen(values), "%s%zd", sep, (Py_ssize_t)val);
        else if (*a == 'L')
            snprintf(values + strlen(values), sizeof values - strlen(values), "%s>= %zd", sep, (Py_ssize_t)c->Nk);
        else
            snprintf(values + strlen(values), sizeof values - strlen(values), "%s%s", sep, label);
    }
    snprintf(buf, size, "(%s) = (%s)", names, values);
}

/* Convert parameter i and check its axes against (and bind them into) the call. */
static int prepare_param(attn_call *c, int i, PyObject *obj)
{
    const param_spec *ps = &c->spec->params[i];
    const int nd_main = (int)strlen(ps->axes), nd_alt = ps->alt_axes ? (int)strlen(ps->alt_axes) : -1;
    PyArrayObject *a0 = as_ndarray(obj, ps->name);
    if (!a0)
        return -1;
    const char *axes = ps->axes;
    if (PyArray_NDIM(a0) == nd_alt)
        axes = ps->alt_axes;
    else if (PyArray_NDIM(a0) != nd_main && nd_alt >= 0) {
        char want[192], alt[96];
        describe_axes(want, sizeof want, ps->axes, c);
        describe_axes(alt, sizeof alt, ps->alt_axes, c);
        PyErr_Format(PyExc_ValueError, "%s must be a %d-d array of shape %s or a %d-d array of shape %s, got %d-d",
                     ps->name, nd_main, want, nd_alt, alt, PyArray_NDIM(a0));
        Py_DECREF(a0);
        return -1;
    }
    char shape_doc[192] = "";
    if (PyArray_NDIM(a0) != (int)strlen(axes)) /* only the message needs it: a step is short */
        describe_axes(shape_doc, sizeof shape_doc, axes, c);
    PyObject *src = is_untyped(obj) ? obj : (PyObject *)a0;
    if (PyArray_NDIM(a0) == 0 && strcmp(axes, "H") == 0) {
        /* one number for a per-head parameter (tau = 1.0): every head's, as NumPy broadcasts */
        PyArrayObject *one = to_array(src, ps->name, c->typenum, 0, shape_doc);
        npy_intp H = c->H;
        c->params[i] = one ? (PyArrayObject *)PyArray_EMPTY(1, &H, c->typenum, 0) : NULL;
        if (c->params[i] && PyArray_CopyInto(c->params[i], one) < 0)
            Py_CLEAR(c->params[i]);
        Py_XDECREF(one);
    } else
        c->params[i] = to_array(src, ps->name, c->typenum, (int)strlen(axes), shape_doc);
    Py_DECREF(a0);
    if (!c->params[i])
        return -1;
    PyArrayObject *a = c->params[i];
    int bad = 0;
    for (int ax = 0; axes[ax]; ++ax) {
        const npy_intp n = PyArray_DIM(a, ax);
        switch (axes[ax]) {
        case 'H': bad |= n != c->H; break;
        case 'd': bad |= n != c->d; break;
        case 'm': if (c->m < 0) c->m = n; else bad |= n != c->m; break;
        case 'p': if (c->kp < 0) c->kp = n; else bad |= n != c->kp; break;
        case 'L': if (c->L < 0) c->L = n; else bad |= n != c->L; bad |= n < c->Nk; break;
        }
    }
    if (bad) {
        char want[192];
        describe_axes(want, sizeof want, axes, c);
        return shape_error(a, ps->name, want);
    }
    if ((c->m == 0 && strchr(axes, 'm')) || (c->kp == 0 && strchr(axes, 'p'))) {
        PyErr_Format(PyExc_ValueError, "%s must have at least one %s, got 0", ps->name,
                     strchr(axes, 'm') ? "feature (m >= 1)" : "projected row (kp >= 1)");
        return -1;
    }
    /* A recurrent step's cost would be mostly this pass over every frequency (256 KiB for
     * flex_n at H = 8, d = m = 64). A non-finite frequency makes some feature of every call
     * NaN (sin and cos of a non-finite angle), so a step of a trig kind asks the kernel to
     * check its features before its state moves, and looks here only if they are not
     * finite (attn_call_execute). */
    if (ps->finite && ps->trig && c->step && c->causal && !c->backward && c->B >= 1 && c->Nq >= 1 &&
        c->Nq <= FF_STEP_ROWS) {
        c->deferred |= 1u << i;
        return 0;
    }
    if (ps->finite && check_finite(a, ps->name) < 0)
        return -1;
    return 0;
}

static int attn_call_prepare(attn_call *c, PyObject *dout, PyObject *q, PyObject *k, PyObject *v,
                             PyObject *const *params, PyObject *mask)
{
    const op_spec *sp = c->spec;
    const char *qn = sp->qname, *kn = sp->kname;
    const char *dsym = c->op == OP_linear ? "F" : "d";
    const char *qdoc = c->op == OP_linear ? "(B, H, Nq, F)" : "(B, H, Nq, d)";
    const char *kdoc = c->op == OP_linear ? "(B, H, Nk, F)" : "(B, H, Nk, d)";
    c->m = c->kp = c->L = -1;
    /* the call's dtype: that of the first of q, k, v, dout that has one of its own (an
     * array, not a Python list, tuple or number); float64 when none has */
    PyObject *const order[4] = {q, k, v, dout};
    const char *const order_names[4] = {qn, kn, "v", "dout"};
    c->typenum = NPY_DOUBLE;
    for (int i = 0; i < 4; ++i) {
        if (!order[i] || is_untyped(order[i]))
            continue;
        PyArrayObject *a = as_ndarray(order[i], order_names[i]);
        if (!a)
            return -1;
        c->typenum = PyArray_TYPE(a);
        if (c->typenum != NPY_FLOAT && c->typenum != NPY_DOUBLE) {
            PyErr_Format(PyExc_TypeError, "%s must have dtype float32 or float64, got %S", order_names[i],
                         (PyObject *)PyArray_DESCR(a));
            Py_DECREF(a);
            return -1;
        }
        Py_DECREF(a);
        break;
    }
    if (!(c->q = to_array(q, qn, c->typenum, 4, qdoc)))
        return -1;
    c->B = PyArray_DIM(c->q, 0);
    c->H = PyArray_DIM(c->q, 1);
    c->Nq = PyArray_DIM(c->q, 2);
    c->d = PyArray_DIM(c->q, 3);
    if (c->d == 0) {
        PyErr_Format(PyExc_ValueError, "%s must have a %s >= 1 (last axis), got 0", qn,
                     c->op == OP_linear ? "feature size F" : "head size d");
        return -1;
    }
    if (!(c->k = to_array(k, kn, c->typenum, 4, kdoc)))
        return -1;
    c->Nk = PyArray_DIM(c->k, 2);
    if (PyArray_DIM(c->k, 0) != c->B || PyArray_DIM(c->k, 1) != c->H || PyArray_DIM(c->k, 3) != c->d) {
        char want[160];
        snprintf(want, sizeof want, "(B, H, Nk, %s) = (%zd, %zd, Nk, %zd) to match %s", dsym,
                 (Py_ssize_t)c->B, (Py_ssize_t)c->H, (Py_ssize_t)c->d, qn);
        return shape_error(c->k, kn, want);
    }
    if (!(c->v = to_array(v, "v", c->typenum, 4, "(B, H, Nk, e)")))
        return -1;
    c->e = PyArray_DIM(c->v, 3);
    if (PyArray_DIM(c->v, 0) != c->B || PyArray_DIM(c->v, 1) != c->H || PyArray_DIM(c->v, 2) != c->Nk) {
        char want[160];
        snprintf(want, sizeof want, "(B, H, Nk, e) = (%zd, %zd, %zd, e) to match %s and %s",
                 (Py_ssize_t)c->B, (Py_ssize_t)c->H, (Py_ssize_t)c->Nk, qn, kn);
        return shape_error(c->v, "v", want);
    }
    for (int i = 0; i < sp->nparams; ++i)
        if (prepare_param(c, i, params[i]) < 0)
            return -1;
    if (c->op == OP_linformer && PyArray_NDIM(c->params[0]) != PyArray_NDIM(c->params[1])) {
        PyErr_Format(PyExc_ValueError,
                     "E and F must both be shared by all heads (kp, Nmax) or both per head "
                     "(H, kp, Nmax), got %d-d E and %d-d F",
                     PyArray_NDIM(c->params[0]), PyArray_NDIM(c->params[1]));
        return -1;
    }
    if (mask != Py_None) {
        if (!(c->mask = to_array(mask, "key_mask", NPY_BOOL, 2, "(B, Nk)")))
            return -1;
        if (PyArray_DIM(c->mask, 0) != c->B || PyArray_DIM(c->mask, 1) != c->Nk) {
            char want[96];
            snprintf(want, sizeof want, "(B, Nk) = (%zd, %zd) to match %s", (Py_ssize_t)c->B,
                     (Py_ssize_t)c->Nk, kn);
            return shape_error(c->mask, "key_mask", want);
        }
    }
    if (c->causal && sp->causal_refusal) {
        PyErr_SetString(PyExc_ValueError, sp->causal_refusal);
        return -1;
    }
    if (c->causal && c->Nq != c->Nk) {
        PyErr_Format(PyExc_ValueError,
                     "causal=True needs as many queries as keys, got Nq = %zd (%s) and Nk = %zd (%s)",
                     (Py_ssize_t)c->Nq, qn, (Py_ssize_t)c->Nk, kn);
        return -1;
    }
    if (sp->linear && !eps_is_valid(c->eps))
        return -1;
    if (c->backward) {
        if (!(c->dout = to_array(dout, "dout", c->typenum, 4, "(B, H, Nq, e)")))
            return -1;
        if (PyArray_DIM(c->dout, 0) != c->B || PyArray_DIM(c->dout, 1) != c->H ||
            PyArray_DIM(c->dout, 2) != c->Nq || PyArray_DIM(c->dout, 3) != c->e) {
            char want[160];
            snprintf(want, sizeof want, "(B, H, Nq, e) = (%zd, %zd, %zd, %zd), the output's shape",
                     (Py_ssize_t)c->B, (Py_ssize_t)c->H, (Py_ssize_t)c->Nq, (Py_ssize_t)c->e);
            return shape_error(c->dout, "dout", want);
        }
    }
    return 0;
}

/* The kind's feature size F and kept-projection width R for this call's d and m (kinds.h). */
static void kind_widths(const attn_call *c, npy_intp *F, npy_intp *R)
{
    const npy_intp d = c->d, m = c->m;
    (void)d;
    (void)m;
    *F = *R = 0;
    switch (c->op) {
#define X(name, qn, kn, ngrads, linear, Fexpr, Rexpr, ...)                                   \
    case OP_##name:                                                                          \
        *F = (Fexpr);                                                                        \
        *R = (Rexpr);                                                                        \
        break;
        FF_KINDS(X)
#undef X
    default:
        break;
    }
}

/* Length of one (b,h)'s packed key state [S (F,e), z (F), R, M, padding] for this call. */
static npy_intp key_state_size(const attn_call *c)
{
    npy_intp F, R;
    kind_widths(c, &F, &R);
    return (npy_intp)ff_packed_state_len((size_t)F, (size_t)c->e);
}

/* Width of a row's kept projection for this call (kinds.h, R; 0: none kept). */
static npy_intp projection_width(const attn_call *c)
{
    npy_intp F, R;
    kind_widths(c, &F, &R);
    return R;
}

/* At import: the kinds whose R is not 0 take return_projections / projections. */
static void mark_projection_kinds(void)
{
    for (int op = 0; op < OP_COUNT; ++op) {
        attn_call c;
        memset(&c, 0, sizeof c);
        c.op = (enum op_id)op;
        c.m = 1;
        OPS[op].keeps_projections = projection_width(&c) != 0;
    }
}

/* An array a bidirectional forward keeps for its backward (the key state, the kept
 * projections): the forward's return_<name> or the backward's <name> (obj, NULL for the
 * forward). Refused with causal=True (`exists` says what, for the message); otherwise
 * converted to the call's dtype into *slot and checked against `dims` (ndim of them,
 * named by `axes`). */
static int prepare_saved(attn_call *c, PyObject *obj, PyArrayObject **slot, const char *name,
                         const char *exists, const char *axes, int ndim, const npy_intp *dims)
{
    if (c->causal) {
        PyErr_Format(PyExc_ValueError, "%s for bidirectional attention only: %s / return_%s need "
                     "causal=False", exists, name, name);
        return -1;
    }
    if (!obj)
        return 0;
    char doc[160];
    int used = snprintf(doc, sizeof doc, "%s = (", axes);
    for (int i = 0; i < ndim && used > 0 && (size_t)used < sizeof doc; ++i)
        used += snprintf(doc + used, sizeof doc - (size_t)used, "%s%zd", i ? ", " : "",
                         (Py_ssize_t)dims[i]);
    if (used > 0 && (size_t)used < sizeof doc)
        snprintf(doc + used, sizeof doc - (size_t)used, ")");
    if (!(*slot = to_array(obj, name, c->typenum, ndim, doc)))
        return -1;
    for (int i = 0; i < ndim; ++i)
        if (PyArray_DIM(*slot, i) != dims[i]) {
            char want[224];
            snprintf(want, sizeof want, "%s, as the forward returned it for these inputs", doc);
            return shape_error(*slot, name, want);
        }
    return 0;
}

/* key_state / return_key_state: (B, H, key_state_size) per call */
static int prepare_key_state(attn_call *c, PyObject *obj)
{
    const npy_intp dims[3] = {c->B, c->H, key_state_size(c)};
    return prepare_saved(c, obj, &c->key_state, "key_state", "the key state exists", "(B, H, S)",
                         3, dims);
}

/* projections / return_projections: (B, H, Nq + Nk, R) per call */
static int prepare_projections(attn_call *c, PyObject *obj)
{
    const npy_intp dims[4] = {c->B, c->H, c->Nq + c->Nk, projection_width(c)};
    return prepare_saved(c, obj, &c->projections, "projections", "kept projections exist",
                         "(B, H, Nq + Nk, R)", 4, dims);
}

/* state= (causal forward of a linear kind): the recurrent state of the keys before these,
 * (B, H, key_state_size) [S, z, R, M, padding] per (b,h), updated in place, so it must be an ndarray
 * of the call's dtype, C-contiguous, aligned, writeable, and not share memory with q, k,
 * v or key_mask (the kernel writes it while other pairs still read them). */
static int prepare_carry(attn_call *c, PyObject *obj)
{
    if (!c->causal) {
        PyErr_SetString(PyExc_ValueError, "state (the recurrent state of earlier keys) needs causal=True; "
                        "bidirectional calls use return_key_state");
        return -1;
    }
    char doc[96]; /* written only for a message */
#define FF_CARRY_DOC() snprintf(doc, sizeof doc, "(B, H, S) = (%zd, %zd, %zd)", (Py_ssize_t)c->B, \
                                (Py_ssize_t)c->H, (Py_ssize_t)key_state_size(c))
    if (!PyArray_Check(obj)) {
        FF_CARRY_DOC();
        PyErr_Format(PyExc_TypeError, "state must be a numpy array %s, updated in place; got %s", doc,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    if (PyArray_TYPE(a) != c->typenum) {
        PyErr_Format(PyExc_TypeError, "state must be %s like q, k, v (it is updated in place, so it is "
                     "never converted); got %s", c->typenum == NPY_FLOAT ? "float32" : "float64",
                     PyArray_DESCR(a)->typeobj->tp_name);
        return -1;
    }
    if (PyArray_NDIM(a) != 3 || PyArray_DIM(a, 0) != c->B || PyArray_DIM(a, 1) != c->H ||
        PyArray_DIM(a, 2) != key_state_size(c)) {
        FF_CARRY_DOC();
        return shape_error(a, "state", doc);
    }
#undef FF_CARRY_DOC
    if (!PyArray_ISCARRAY(a)) {
        PyErr_SetString(PyExc_ValueError, "state must be C-contiguous, aligned and writeable (it is updated "
                        "in place)");
        return -1;
    }
    const char *lo = (const char *)PyArray_DATA(a), *hi = lo + PyArray_NBYTES(a);
    PyArrayObject *inputs[4] = {c->q, c->k, c->v, c->mask};
    const char *names[4] = {"q", "k", "v", "key_mask"};
    for (int i = 0; i < 4; ++i) {
        if (!inputs[i])
            continue;
        const char *b0 = (const char *)PyArray_DATA(inputs[i]), *b1 = b0 + PyArray_NBYTES(inputs[i]);
        if (b0 < hi && lo < b1) {
            PyErr_Format(PyExc_ValueError, "state shares memory with %s; pass a separate array", names[i]);
            return -1;
        }
    }
    Py_INCREF(obj);
    c->key_state = a;
    return 0;
}

/* ------------------------------------------------------------------ output buffers */

/* Output arrays take their memory from the kernels' block cache (buffer_cache.h) through a
 * NumPy memory handler: a training loop's next call gets back the pages of the arrays it
 * dropped instead of fresh ones (faulting in and clearing fresh pages cost about a tenth
 * of a flex_n forward + backward at N = 4096). NumPy calls `free` with the size it
 * allocated, which is what the cache matches on. Such arrays start on a 64-byte line;
 * a call whose outputs are all small (SMALL_OUTPUT_BYTES below) leaves NumPy's own
 * allocator in place. */
static void *handler_malloc(void *ctx, size_t size)
{
    (void)ctx;
    return ff_buffer_malloc(size);
}

static void *handler_calloc(void *ctx, size_t n, size_t size)
{
    (void)ctx;
    return ff_buffer_calloc(n, size);
}

static void *handler_realloc(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    return ff_buffer_realloc(ptr, size);
}

static void handler_free(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    ff_buffer_free(ptr, size);
}

static PyDataMem_Handler buffer_handler = {
    "flexformer_buffer_cache", 1,
    {NULL, handler_malloc, handler_calloc, handler_realloc, handler_free}};
static PyObject *buffer_handler_capsule = NULL; /* set at import */

/* New arrays made between these two calls use the block cache; the previous handler (a
 * new reference, or NULL when setting failed: then nothing changes) is restored after. */
static PyObject *use_buffer_handler(void)
{
    PyObject *old = PyDataMem_SetHandler(buffer_handler_capsule); /* made at import */
    if (!old)
        PyErr_Clear();
    return old;
}

static void restore_handler(PyObject *old)
{
    if (!old)
        return;
    PyObject *type, *value, *traceback; /* an allocation error may be pending: keep it */
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *ours = PyDataMem_SetHandler(old);
    if (!ours)
        PyErr_Clear();
    Py_XDECREF(ours);
    Py_DECREF(old);
    PyErr_Restore(type, value, traceback);
}

/* Outputs all under this many bytes (a decoding step's few rows) take NumPy's own
 * allocator: setting and restoring the block cache's handler (a context variable each
 * way) and an aligned allocation cost 3-5% of a one-token step (model 106, loaded host),
 * and such blocks are below the cache's floor (FF_BUFFER_CACHE_MIN_BYTES) anyway. */
#define SMALL_OUTPUT_BYTES ((double)(64 << 10))

/* Whether one of this call's outputs reaches SMALL_OUTPUT_BYTES (products in double: only
 * compared with it). */
/* The arrays whose shapes the backward's gradients take, in output order (q, k, v, then
 * the kind's parameters); returns how many there are. */
static int gradient_shapes(const attn_call *c, PyArrayObject *like[6])
{
    PyArrayObject *const all[6] = {c->q, c->k, c->v, c->params[0], c->params[1], c->params[2]};
    memcpy(like, all, sizeof all);
    return 3 + c->spec->ngrads;
}

static int outputs_are_large(const attn_call *c)
{
    double most;
    if (!c->backward) {
        most = (double)c->B * c->H * c->Nq * c->e;
        if (c->want_key_state)
            most = fmax(most, (double)c->B * c->H * key_state_size(c));
        if (c->want_projections)
            most = fmax(most, (double)c->B * c->H * (c->Nq + c->Nk) * projection_width(c));
    } else {
        PyArrayObject *like[6];
        const int n = gradient_shapes(c, like);
        most = 0;
        for (int i = 0; i < n; ++i)
            most = fmax(most, (double)PyArray_SIZE(like[i]));
    }
    return most * (c->typenum == NPY_FLOAT ? sizeof(float) : sizeof(double)) >=
           SMALL_OUTPUT_BYTES;
}

#define DATA(a) ((a) ? PyArray_DATA(a) : NULL)
/* Run the kernel through the kind's entry; outputs: out (forward) or g[0..2] = dq, dk,
 * dv and g[3..] the parameter gradients (backward). The GIL is released by the caller. */
static int attn_call_run(const attn_call *c, void *out, int64_t *guard, void *ks, void *kept,
                         void **g)
{
    ff_attention_args a;
    memset(&a, 0, sizeof a);
    a.out = out;
    a.guard_count = guard;
    a.key_state = ks;
    a.projections = kept;
    a.dq = g[0];
    a.dk = g[1];
    a.dv = g[2];
    for (int i = 0; i < 3; ++i) {
        a.dparams[i] = g[3 + i];
        a.params[i] = DATA(c->params[i]);
    }
    a.dout = DATA(c->dout);
    a.q = PyArray_DATA(c->q);
    a.k = PyArray_DATA(c->k);
    a.v = PyArray_DATA(c->v);
    a.key_mask = (const uint8_t *)DATA(c->mask);
    a.B = (size_t)c->B;
    a.H = (size_t)c->H;
    a.Nq = (size_t)c->Nq;
    a.Nk = (size_t)c->Nk;
    a.d = (size_t)c->d;
    a.e = (size_t)c->e;
    a.m = c->m > 0 ? (size_t)c->m : 0;
    a.kp = c->kp > 0 ? (size_t)c->kp : 0;
    a.Nmax = c->L > 0 ? (size_t)c->L : 0;
    a.nEF = c->params[0] && PyArray_NDIM(c->params[0]) == 3 ? a.H : 1;
    a.causal = c->causal;
    a.check_features = c->deferred != 0;
    a.nthreads = KERNEL_THREADS();
    a.eps = c->eps;
    a.scale = c->scale;
    /* one causal query row (a recurrent step): AVX2 code at most (ff_common.h, FF_LEVEL_CAP) */
    const int step = !c->backward && c->causal && c->Nq == 1;
    const int cap = step ? ff_cap_thread_level(3) : 0;
    const int status = c->spec->call[c->typenum == NPY_FLOAT ? 0 : 1](&a);
    if (step)
        ff_cap_thread_level(cap);
    return status;
}

static PyObject *attn_call_execute(attn_call *c)
{
    PyObject *result = NULL;
    PyArrayObject *outs[8] = {NULL};
    int nouts = 0, status = FF_OK;
    const int t = c->typenum;
    void *out = NULL, *g[6] = {NULL}, *ks = DATA(c->key_state), *kept = DATA(c->projections);
    int64_t *guard = NULL;
    PyObject *handler = outputs_are_large(c) ? use_buffer_handler() : NULL;
    if (!c->backward) {
        npy_intp shape[4] = {c->B, c->H, c->Nq, c->e};
        /* the linear core writes every output row; the others start from zeros */
        outs[nouts++] = (PyArrayObject *)(c->spec->linear ? PyArray_EMPTY(4, shape, t, 0)
                                                          : PyArray_ZEROS(4, shape, t, 0));
        if (!outs[0])
            goto cleanup;
        out = PyArray_DATA(outs[0]);
        if (c->spec->linear) {
            npy_intp bh[2] = {c->B, c->H};
            if (!(outs[nouts++] = (PyArrayObject *)PyArray_ZEROS(2, bh, NPY_INT64, 0)))
                goto cleanup;
            guard = (int64_t *)PyArray_DATA(outs[1]);
        }
        if (c->want_key_state) {
            npy_intp kshape[3] = {c->B, c->H, key_state_size(c)};
            if (!(outs[nouts++] = (PyArrayObject *)PyArray_ZEROS(3, kshape, t, 0)))
                goto cleanup;
            ks = PyArray_DATA(outs[nouts - 1]);
        }
        if (c->want_projections) {
            npy_intp pshape[4] = {c->B, c->H, c->Nq + c->Nk, projection_width(c)};
            /* the kernel writes every row unless there is no query row to run */
            const int every = c->B * c->H > 0 && c->Nq > 0;
            if (!(outs[nouts++] = (PyArrayObject *)(every ? PyArray_EMPTY(4, pshape, t, 0)
                                                          : PyArray_ZEROS(4, pshape, t, 0))))
                goto cleanup;
            kept = PyArray_DATA(outs[nouts - 1]);
        }
    } else {
        PyArrayObject *like[6];
        const int n = gradient_shapes(c, like);
        for (int i = 0; i < n; ++i) {
            /* the linear core writes dq, dk, dv in full, zeroing them on the owning thread
             * (linattn_run.inc); everything else starts from zeros */
            const int fresh = c->spec->linear && i < 3;
            const int nd = PyArray_NDIM(like[i]);
            npy_intp *dims = PyArray_DIMS(like[i]);
            outs[nouts++] = (PyArrayObject *)(fresh ? PyArray_EMPTY(nd, dims, t, 0)
                                                    : PyArray_ZEROS(nd, dims, t, 0));
            if (!outs[nouts - 1])
                goto cleanup;
            g[i] = PyArray_DATA(outs[i]);
        }
    }
    restore_handler(handler);
    handler = NULL;
    Py_BEGIN_ALLOW_THREADS
    status = attn_call_run(c, out, guard, ks, kept, g);
    Py_END_ALLOW_THREADS
    if (status == FF_NONFINITE_FEATURES) {
        /* the state has not moved: a non-finite frequency is named as always; otherwise the
         * inputs (or an overflow) made the features non-finite, which runs as before */
        for (int i = 0; i < c->spec->nparams; ++i)
            if (((c->deferred >> i) & 1u) && check_finite(c->params[i], c->spec->params[i].name) < 0)
                goto cleanup;
        c->deferred = 0;
        Py_BEGIN_ALLOW_THREADS
        status = attn_call_run(c, out, guard, ks, kept, g);
        Py_END_ALLOW_THREADS
    }
    int finite = status != FF_NONFINITE_OUTPUT; /* the linear kinds' own check */
    if (!finite)
        status = FF_OK;
    if (status_to_exception(status) < 0)
        goto cleanup;
    if (c->report_finite && !c->spec->linear) /* a pass here for the other kinds */
        for (int i = 0; i < (c->backward ? nouts : 1); ++i)
            finite = finite && array_all_finite(outs[i]);
    if (!c->backward && !c->spec->linear && !c->report_finite) {
        result = (PyObject *)outs[0];
        Py_INCREF(result);
    } else {
        const int nforward = !c->backward && !c->spec->linear ? 1 : nouts; /* out alone */
        result = PyTuple_New(nforward + c->report_finite);
        if (result) {
            for (int i = 0; i < nforward; ++i) {
                Py_INCREF(outs[i]);
                PyTuple_SET_ITEM(result, i, (PyObject *)outs[i]);
            }
            if (c->report_finite)
                PyTuple_SET_ITEM(result, nforward, PyBool_FromLong(finite));
        }
    }
cleanup:
    restore_handler(handler);
    for (int i = 0; i < nouts; ++i)
        Py_XDECREF(outs[i]);
    return result;
}

/* *flag = (val is True) for a keyword that must be a bool; a TypeError naming it else. */
static int bool_keyword(PyObject *val, const char *name, int *flag)
{
    if (!PyBool_Check(val)) {
        PyErr_Format(PyExc_TypeError, "%s must be a bool, got %s", name, Py_TYPE(val)->tp_name);
        return -1;
    }
    *flag = val == Py_True;
    return 0;
}

/* The keyword-only options of the attention entries; which ones an entry takes depends on
 * its kind (linear or not, keeps projections or not) and direction (entry_signature). */
enum entry_option {
    OPT_KEY_MASK,
    OPT_CAUSAL,
    OPT_EPS,
    OPT_KEY_STATE,
    OPT_RETURN_KEY_STATE,
    OPT_PROJECTIONS,
    OPT_RETURN_PROJECTIONS,
    OPT_STATE,
    OPT_SCALE,
    OPT_REPORT_FINITE,
    OPT_COUNT
};
static const char *const OPTION_NAMES[OPT_COUNT] = {
    "key_mask", "causal", "eps", "key_state", "return_key_state", "projections", "return_projections",
    "state", "scale", "report_finite"};

enum { MAX_ARRAYS = 7, MAX_SLOTS = MAX_ARRAYS + OPT_COUNT };
_Static_assert(MAX_SLOTS == 17, "parse_slow hands the parser 17 slots");

/* An entry's arguments for PyArg_ParseTupleAndKeywords, built once at import from OPS: the
 * arrays ([dout,] q, k, v, parameters: positional or by name), then the options it takes
 * (by name only), and the format "OOOO|$OO...:<kind>_<direction>". */
typedef struct {
    char *kwlist[MAX_SLOTS + 1];
    PyObject *names[MAX_SLOTS]; /* kwlist as interned str, for parse_fast (never freed) */
    enum entry_option options[OPT_COUNT];
    int narrays, noptions;
    char format[MAX_SLOTS + 48];
} entry_signature;
static entry_signature SIGNATURES[OP_COUNT][2];

static int build_signatures(void)
{
    static const char *const kind_names[] = {
#define X(name, ...) #name,
        FF_KINDS(X)
#undef X
    };
    for (int op = 0; op < OP_COUNT; ++op)
        for (int backward = 0; backward < 2; ++backward) {
            const op_spec *sp = &OPS[op];
            entry_signature *sig = &SIGNATURES[op][backward];
            int n = 0, k = 0;
            if (backward)
                sig->kwlist[n++] = (char *)"dout";
            sig->kwlist[n++] = (char *)sp->qname;
            sig->kwlist[n++] = (char *)sp->kname;
            sig->kwlist[n++] = (char *)"v";
            for (int i = 0; i < sp->nparams; ++i)
                sig->kwlist[n++] = (char *)sp->params[i].name;
            sig->narrays = n;
            const int takes[OPT_COUNT] = {
                [OPT_KEY_MASK] = 1,
                [OPT_CAUSAL] = 1,
                [OPT_EPS] = sp->linear,
                [OPT_KEY_STATE] = sp->linear && backward,
                [OPT_RETURN_KEY_STATE] = sp->linear && !backward,
                [OPT_PROJECTIONS] = sp->keeps_projections && backward,
                [OPT_RETURN_PROJECTIONS] = sp->keeps_projections && !backward,
                [OPT_STATE] = sp->linear && !backward,
                [OPT_SCALE] = !sp->linear,
                [OPT_REPORT_FINITE] = 1,
            };
            for (int o = 0; o < OPT_COUNT; ++o)
                if (takes[o]) {
                    sig->options[k++] = (enum entry_option)o;
                    sig->kwlist[n++] = (char *)OPTION_NAMES[o];
                }
            sig->noptions = k;
            sig->kwlist[n] = NULL;
            char *f = sig->format;
            for (int i = 0; i < sig->narrays; ++i)
                *f++ = 'O';
            *f++ = '|';
            *f++ = '$';
            for (int i = 0; i < k; ++i)
                *f++ = 'O';
            snprintf(f, sizeof sig->format - (size_t)(f - sig->format), ":%s_%s", kind_names[op],
                     backward ? "backward" : "forward");
            for (int i = 0; i < n; ++i)
                if (!(sig->names[i] = PyUnicode_InternFromString(sig->kwlist[i])))
                    return -1;
        }
    return 0;
}

/* The usual call, a decoding step's included: at most the arrays by position, then names
 * the caller's code spelled out (interned, so one pointer comparison each) for slots not
 * yet filled, every array given. 1 when slot[] is filled so; 0 for anything else (an
 * unknown or repeated name, a str built at run time, too many or too few arguments), which
 * parse_slow then decides, with CPython's own messages. A step's arguments cost about a
 * microsecond through parse_slow alone (a dict of the keywords, then a str made and hashed
 * per name looked up). */
static int parse_fast(const entry_signature *sig, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames, PyObject **slot)
{
    const int nslots = sig->narrays + sig->noptions;
    if (nargs > sig->narrays)
        return 0;
    for (Py_ssize_t i = 0; i < nargs; ++i)
        slot[i] = args[i];
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t j = 0; j < nkw; ++j) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, j);
        int s = (int)nargs;
        while (s < nslots && sig->names[s] != key)
            ++s;
        if (s == nslots || slot[s])
            return 0;
        slot[s] = args[nargs + j];
    }
    for (int i = 0; i < sig->narrays; ++i)
        if (!slot[i])
            return 0;
    return 1;
}

/* The arguments as a tuple and a dict through PyArg_ParseTupleAndKeywords (its messages
 * for every mistake); slot[] then borrows from *tuple and *dict, which the caller releases
 * after the call. 0, or -1 with the exception set. */
static int parse_slow(const entry_signature *sig, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames, PyObject **slot, PyObject **tuple, PyObject **dict)
{
    if (!(*tuple = PyTuple_New(nargs)))
        return -1;
    for (Py_ssize_t i = 0; i < nargs; ++i) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(*tuple, i, args[i]);
    }
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nkw) {
        if (!(*dict = PyDict_New()))
            return -1;
        for (Py_ssize_t j = 0; j < nkw; ++j)
            if (PyDict_SetItem(*dict, PyTuple_GET_ITEM(kwnames, j), args[nargs + j]) < 0)
                return -1;
    }
    for (int i = 0; i < MAX_SLOTS; ++i)
        slot[i] = NULL;
    return PyArg_ParseTupleAndKeywords(*tuple, *dict, sig->format, (char **)sig->kwlist, &slot[0],
                                       &slot[1], &slot[2], &slot[3], &slot[4], &slot[5], &slot[6],
                                       &slot[7], &slot[8], &slot[9], &slot[10], &slot[11], &slot[12],
                                       &slot[13], &slot[14], &slot[15], &slot[16])
               ? 0
               : -1;
}

/* Parse ([dout,] q, k, v, params...) by position or name and the entry's options by name
 * (SIGNATURES), then check and run. */
static PyObject *attn_run(enum op_id op, int backward, PyObject *const *slot);

static PyObject *attn_entry(enum op_id op, int backward, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames)
{
    const entry_signature *sig = &SIGNATURES[op][backward];
    PyObject *slot[MAX_SLOTS] = {NULL};
    if (parse_fast(sig, args, nargs, kwnames, slot))
        return attn_run(op, backward, slot);
    PyObject *tuple = NULL, *dict = NULL, *result = NULL;
    if (parse_slow(sig, args, nargs, kwnames, slot, &tuple, &dict) == 0)
        result = attn_run(op, backward, slot);
    Py_XDECREF(tuple);
    Py_XDECREF(dict);
    return result;
}

/* Check and run one call from its parsed slots (SIGNATURES' order: arrays, then options). */
static PyObject *attn_run(enum op_id op, int backward, PyObject *const *slot)
{
    const op_spec *sp = &OPS[op];
    const entry_signature *sig = &SIGNATURES[op][backward];
    PyObject *const *values = slot;
    PyObject *opt[OPT_COUNT] = {NULL};
    for (int i = 0; i < sig->noptions; ++i)
        opt[sig->options[i]] = slot[sig->narrays + i];
    PyObject *mask = opt[OPT_KEY_MASK] ? opt[OPT_KEY_MASK] : Py_None;
    PyObject *causal = opt[OPT_CAUSAL] ? opt[OPT_CAUSAL] : Py_False;
    PyObject *eps = opt[OPT_EPS];
    PyObject *scale = opt[OPT_SCALE] ? opt[OPT_SCALE] : Py_None;
    PyObject *key_state = opt[OPT_KEY_STATE] ? opt[OPT_KEY_STATE] : Py_None;
    PyObject *want_key_state = opt[OPT_RETURN_KEY_STATE] ? opt[OPT_RETURN_KEY_STATE] : Py_False;
    PyObject *carry = opt[OPT_STATE] ? opt[OPT_STATE] : Py_None;
    PyObject *projections = opt[OPT_PROJECTIONS] ? opt[OPT_PROJECTIONS] : Py_None;
    PyObject *want_projections = opt[OPT_RETURN_PROJECTIONS] ? opt[OPT_RETURN_PROJECTIONS] : Py_False;
    PyObject *report_finite = opt[OPT_REPORT_FINITE] ? opt[OPT_REPORT_FINITE] : Py_False;
    attn_call c;
    memset(&c, 0, sizeof c);
    c.op = op;
    c.spec = sp;
    c.backward = backward;
    if (bool_keyword(causal, "causal", &c.causal) < 0 ||
        bool_keyword(want_key_state, "return_key_state", &c.want_key_state) < 0 ||
        bool_keyword(want_projections, "return_projections", &c.want_projections) < 0 ||
        bool_keyword(report_finite, "report_finite", &c.report_finite) < 0)
        return NULL;
    c.step = carry != Py_None;
    c.eps = 1e-4;
    if (eps) {
        c.eps = PyFloat_AsDouble(eps);
        if (c.eps == -1.0 && PyErr_Occurred())
            return NULL;
    }
    const int b = backward ? 1 : 0;
    PyObject *params[3] = {NULL, NULL, NULL};
    for (int i = 0; i < sp->nparams; ++i)
        params[i] = values[b + 3 + i];
    PyObject *result = NULL;
    if (attn_call_prepare(&c, backward ? values[0] : NULL, values[b], values[b + 1], values[b + 2],
                          params, mask) == 0 &&
        (!(c.want_key_state || key_state != Py_None) ||
         prepare_key_state(&c, key_state == Py_None ? NULL : key_state) == 0) &&
        (!(c.want_projections || projections != Py_None) ||
         prepare_projections(&c, projections == Py_None ? NULL : projections) == 0) &&
        (carry == Py_None || prepare_carry(&c, carry) == 0)) {
        c.scale = 1.0 / sqrt((double)c.d);
        if (scale != Py_None) {
            c.scale = PyFloat_AsDouble(scale);
            if (c.scale == -1.0 && PyErr_Occurred())
                goto done;
            if (!(c.scale > 0) || !isfinite(c.scale)) {
                PyErr_SetString(PyExc_ValueError, "scale must be a finite number > 0");
                goto done;
            }
        }
        result = attn_call_execute(&c);
    }
done:
    attn_call_release(&c);
    return result;
}

#define ENTRY(name, ...)                                                                 \
    static PyObject *py_##name##_forward(PyObject *self, PyObject *const *args,          \
                                         Py_ssize_t nargs, PyObject *kwnames)            \
    {                                                                                    \
        (void)self;                                                                      \
        return attn_entry(OP_##name, 0, args, nargs, kwnames);                           \
    }                                                                                    \
    static PyObject *py_##name##_backward(PyObject *self, PyObject *const *args,         \
                                          Py_ssize_t nargs, PyObject *kwnames)           \
    {                                                                                    \
        (void)self;                                                                      \
        return attn_entry(OP_##name, 1, args, nargs, kwnames);                           \
    }
FF_KINDS(ENTRY)
#undef ENTRY

/* --------------------------------------------------------------- activation */

/* obj as a C-contiguous ndim-d float32 or float64 array (its own dtype, reported through
 * *typenum); TypeError or ValueError naming `name` otherwise. */
static PyArrayObject *real_array(PyObject *obj, const char *name, int ndim, const char *shape_doc,
                                 int *typenum)
{
    PyArrayObject *a = as_ndarray(obj, name), *v = NULL;
    if (!a)
        return NULL;
    *typenum = PyArray_TYPE(a);
    if (*typenum != NPY_FLOAT && *typenum != NPY_DOUBLE)
        PyErr_Format(PyExc_TypeError, "%s must have dtype float32 or float64, got %S", name,
                     (PyObject *)PyArray_DESCR(a));
    else
        v = to_array((PyObject *)a, name, *typenum, ndim, shape_doc);
    Py_DECREF(a);
    return v;
}

static PyArrayObject *real_vector(PyObject *obj, const char *name, int *typenum)
{
    return real_array(obj, name, 1, "(n,)", typenum);
}

/* gelu_forward(x) -> (y, w), w = 1 - |tanh u| for the backward: x 1-d float32/64 (the
 * Python layer passes a flat view) */
static PyObject *py_gelu_forward(PyObject *self, PyObject *arg)
{
    (void)self;
    PyObject *result = NULL;
    PyArrayObject *y = NULL, *w = NULL;
    int typenum;
    PyArrayObject *x = real_vector(arg, "x", &typenum);
    if (!x)
        return NULL;
    npy_intp n = PyArray_DIM(x, 0);
    y = (PyArrayObject *)PyArray_EMPTY(1, &n, typenum, 0);
    w = (PyArrayObject *)PyArray_EMPTY(1, &n, typenum, 0);
    if (!y || !w)
        goto cleanup;
    const int nt = KERNEL_THREADS();
    Py_BEGIN_ALLOW_THREADS
    if (typenum == NPY_FLOAT)
        gelu_forward_f32(PyArray_DATA(y), PyArray_DATA(w), PyArray_DATA(x), (size_t)n, nt);
    else
        gelu_forward_f64(PyArray_DATA(y), PyArray_DATA(w), PyArray_DATA(x), (size_t)n, nt);
    Py_END_ALLOW_THREADS
    result = PyTuple_Pack(2, y, w);
cleanup:
    Py_XDECREF(x);
    Py_XDECREF(y);
    Py_XDECREF(w);
    return result;
}

/* gelu_backward(dy, x, w) -> dx: three 1-d arrays of one dtype and length */
static PyObject *py_gelu_backward(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *dy_obj, *x_obj, *w_obj, *result = NULL;
    PyArrayObject *dy = NULL, *x = NULL, *w = NULL, *dx = NULL;
    int typenum;
    if (!PyArg_ParseTuple(args, "OOO:gelu_backward", &dy_obj, &x_obj, &w_obj))
        return NULL;
    if (!(x = real_vector(x_obj, "x", &typenum)) || !(dy = to_array(dy_obj, "dy", typenum, 1, "(n,)")) ||
        !(w = to_array(w_obj, "w", typenum, 1, "(n,)")))
        goto cleanup;
    npy_intp n = PyArray_DIM(x, 0);
    if (PyArray_DIM(dy, 0) != n || PyArray_DIM(w, 0) != n) {
        PyErr_Format(PyExc_ValueError, "dy and w must have x's length %zd, got %zd and %zd",
                     (Py_ssize_t)n, (Py_ssize_t)PyArray_DIM(dy, 0), (Py_ssize_t)PyArray_DIM(w, 0));
        goto cleanup;
    }
    if (!(dx = (PyArrayObject *)PyArray_EMPTY(1, &n, typenum, 0)))
        goto cleanup;
    const int nt = KERNEL_THREADS();
    Py_BEGIN_ALLOW_THREADS
    if (typenum == NPY_FLOAT)
        gelu_backward_f32(PyArray_DATA(dx), PyArray_DATA(dy), PyArray_DATA(x), PyArray_DATA(w),
                          (size_t)n, nt);
    else
        gelu_backward_f64(PyArray_DATA(dx), PyArray_DATA(dy), PyArray_DATA(x), PyArray_DATA(w),
                          (size_t)n, nt);
    Py_END_ALLOW_THREADS
    result = (PyObject *)dx;
    dx = NULL;
cleanup:
    Py_XDECREF(x);
    Py_XDECREF(dy);
    Py_XDECREF(w);
    Py_XDECREF(dx);
    return result;
}

/* layer_norm_forward(x (R,C), gamma (C), beta (C), eps) -> (y, xhat, rstd) */
static PyObject *py_layer_norm_forward(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *x_obj, *g_obj, *b_obj, *result = NULL;
    double eps;
    PyArrayObject *x = NULL, *gamma = NULL, *beta = NULL, *y = NULL, *xhat = NULL, *rstd = NULL;
    int typenum;
    if (!PyArg_ParseTuple(args, "OOOd:layer_norm_forward", &x_obj, &g_obj, &b_obj, &eps))
        return NULL;
    if (!eps_is_valid(eps))
        return NULL;
    if (!(x = real_array(x_obj, "x", 2, "(R, C)", &typenum)) ||
        !(gamma = to_array(g_obj, "gamma", typenum, 1, "(C,)")) ||
        !(beta = to_array(b_obj, "beta", typenum, 1, "(C,)")))
        goto cleanup;
    npy_intp R = PyArray_DIM(x, 0), C = PyArray_DIM(x, 1);
    if (PyArray_DIM(gamma, 0) != C || PyArray_DIM(beta, 0) != C) {
        PyErr_Format(PyExc_ValueError, "gamma and beta must have x's %zd columns, got %zd and %zd",
                     (Py_ssize_t)C, (Py_ssize_t)PyArray_DIM(gamma, 0), (Py_ssize_t)PyArray_DIM(beta, 0));
        goto cleanup;
    }
    npy_intp dims[2] = {R, C};
    y = (PyArrayObject *)PyArray_EMPTY(2, dims, typenum, 0);
    xhat = (PyArrayObject *)PyArray_EMPTY(2, dims, typenum, 0);
    rstd = (PyArrayObject *)PyArray_EMPTY(1, &R, typenum, 0);
    if (!y || !xhat || !rstd)
        goto cleanup;
    const int nt = KERNEL_THREADS();
    Py_BEGIN_ALLOW_THREADS
    if (typenum == NPY_FLOAT)
        layer_norm_forward_f32(PyArray_DATA(y), PyArray_DATA(xhat), PyArray_DATA(rstd), PyArray_DATA(x),
                               PyArray_DATA(gamma), PyArray_DATA(beta), (float)eps, (size_t)R, (size_t)C, nt);
    else
        layer_norm_forward_f64(PyArray_DATA(y), PyArray_DATA(xhat), PyArray_DATA(rstd), PyArray_DATA(x),
                               PyArray_DATA(gamma), PyArray_DATA(beta), eps, (size_t)R, (size_t)C, nt);
    Py_END_ALLOW_THREADS
    result = PyTuple_Pack(3, y, xhat, rstd);
cleanup:
    Py_XDECREF(x);
    Py_XDECREF(gamma);
    Py_XDECREF(beta);
    Py_XDECREF(y);
    Py_XDECREF(xhat);
    Py_XDECREF(rstd);
    return result;
}

/* layer_norm_backward(dy (R,C), xhat (R,C), rstd (R), gamma (C)) -> (dx, dgamma, dbeta) */
static PyObject *py_layer_norm_backward(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *dy_obj, *h_obj, *r_obj, *g_obj, *result = NULL;
    PyArrayObject *dy = NULL, *xhat = NULL, *rstd = NULL, *gamma = NULL;
    PyArrayObject *dx = NULL, *dgamma = NULL, *dbeta = NULL;
    int status = FF_OK, typenum;
    if (!PyArg_ParseTuple(args, "OOOO:layer_norm_backward", &dy_obj, &h_obj, &r_obj, &g_obj))
        return NULL;
    if (!(xhat = real_array(h_obj, "xhat", 2, "(R, C)", &typenum)) ||
        !(dy = to_array(dy_obj, "dy", typenum, 2, "(R, C)")) ||
        !(rstd = to_array(r_obj, "rstd", typenum, 1, "(R,)")) ||
        !(gamma = to_array(g_obj, "gamma", typenum, 1, "(C,)")))
        goto cleanup;
    npy_intp R = PyArray_DIM(xhat, 0), C = PyArray_DIM(xhat, 1);
    if (PyArray_DIM(dy, 0) != R || PyArray_DIM(dy, 1) != C || PyArray_DIM(rstd, 0) != R ||
        PyArray_DIM(gamma, 0) != C) {
        PyErr_Format(PyExc_ValueError, "dy must have xhat's shape (%zd, %zd), rstd %zd rows and gamma %zd "
                     "columns", (Py_ssize_t)R, (Py_ssize_t)C, (Py_ssize_t)R, (Py_ssize_t)C);
        goto cleanup;
    }
    npy_intp dims[2] = {R, C};
    dx = (PyArrayObject *)PyArray_EMPTY(2, dims, typenum, 0);
    dgamma = (PyArrayObject *)PyArray_EMPTY(1, &C, typenum, 0);
    dbeta = (PyArrayObject *)PyArray_EMPTY(1, &C, typenum, 0);
    if (!dx || !dgamma || !dbeta)
        goto cleanup;
    const int nt = KERNEL_THREADS();
    Py_BEGIN_ALLOW_THREADS
    if (typenum == NPY_FLOAT)
        status = layer_norm_backward_f32(PyArray_DATA(dx), PyArray_DATA(dgamma), PyArray_DATA(dbeta),
                                         PyArray_DATA(dy), PyArray_DATA(xhat), PyArray_DATA(rstd),
                                         PyArray_DATA(gamma), (size_t)R, (size_t)C, nt);
    else
        status = layer_norm_backward_f64(PyArray_DATA(dx), PyArray_DATA(dgamma), PyArray_DATA(dbeta),
                                         PyArray_DATA(dy), PyArray_DATA(xhat), PyArray_DATA(rstd),
                                         PyArray_DATA(gamma), (size_t)R, (size_t)C, nt);
    Py_END_ALLOW_THREADS
    if (status_to_exception(status) < 0)
        goto cleanup;
    result = PyTuple_Pack(3, dx, dgamma, dbeta);
cleanup:
    Py_XDECREF(xhat);
    Py_XDECREF(dy);
    Py_XDECREF(rstd);
    Py_XDECREF(gamma);
    Py_XDECREF(dx);
    Py_XDECREF(dgamma);
    Py_XDECREF(dbeta);
    return result;
}

/* Checks x (B,N,C) and w (W,C) of one real dtype for the short convolution; dy, when
 * given, must have x's shape. Returns 0, or -1 with an exception set. */
static int short_conv_shapes(PyArrayObject *x, PyArrayObject *w, PyArrayObject *dy)
{
    const npy_intp C = PyArray_DIM(x, 2);
    if (PyArray_DIM(w, 0) < 1 || PyArray_DIM(w, 1) != C) {
        PyErr_Format(PyExc_ValueError, "w must have shape (W, C) with W >= 1 and x's C = %zd channels, "
                     "got (%zd, %zd)", (Py_ssize_t)C, (Py_ssize_t)PyArray_DIM(w, 0),
                     (Py_ssize_t)PyArray_DIM(w, 1));
        return -1;
    }
    if (dy && !PyArray_SAMESHAPE(dy, x)) {
        PyErr_Format(PyExc_ValueError, "dy must have x's shape (%zd, %zd, %zd)", (Py_ssize_t)PyArray_DIM(x, 0),
                     (Py_ssize_t)PyArray_DIM(x, 1), (Py_ssize_t)C);
        return -1;
    }
    return 0;
}

/* short_conv_forward(x (B,N,C), w (W,C)) -> y (B,N,C), and with `backward`
 * short_conv_backward(dy (B,N,C), x (B,N,C), w (W,C)) -> (dx, dw): one path for both. */
static PyObject *short_conv_entry(PyObject *args, int backward)
{
    PyObject *dy_obj = NULL, *x_obj, *w_obj, *result = NULL;
    PyArrayObject *dy = NULL, *x = NULL, *w = NULL, *out = NULL, *dw = NULL;
    int status = FF_OK, typenum;
    if (backward ? !PyArg_ParseTuple(args, "OOO:short_conv_backward", &dy_obj, &x_obj, &w_obj)
                 : !PyArg_ParseTuple(args, "OO:short_conv_forward", &x_obj, &w_obj))
        return NULL;
    if (!(x = real_array(x_obj, "x", 3, "(B, N, C)", &typenum)) ||
        (backward && !(dy = to_array(dy_obj, "dy", typenum, 3, "(B, N, C)"))) ||
        !(w = to_array(w_obj, "w", typenum, 2, "(W, C)")) || short_conv_shapes(x, w, dy) < 0)
        goto cleanup;
    out = (PyArrayObject *)PyArray_EMPTY(3, PyArray_DIMS(x), typenum, 0); /* y or dx */
    if (backward)
        dw = (PyArrayObject *)PyArray_EMPTY(2, PyArray_DIMS(w), typenum, 0);
    if (!out || (backward && !dw))
        goto cleanup;
    const size_t B = (size_t)PyArray_DIM(x, 0), N = (size_t)PyArray_DIM(x, 1), C = (size_t)PyArray_DIM(x, 2),
                 W = (size_t)PyArray_DIM(w, 0);
    const int nt = KERNEL_THREADS();
    Py_BEGIN_ALLOW_THREADS
    if (typenum == NPY_FLOAT)
        status = backward ? short_conv_backward_f32(PyArray_DATA(out), PyArray_DATA(dw), PyArray_DATA(dy),
                                                    PyArray_DATA(x), PyArray_DATA(w), B, N, C, W, nt)
                          : short_conv_forward_f32(PyArray_DATA(out), PyArray_DATA(x), PyArray_DATA(w), B, N, C,
                                                   W, nt);
    else
        status = backward ? short_conv_backward_f64(PyArray_DATA(out), PyArray_DATA(dw), PyArray_DATA(dy),
                                                    PyArray_DATA(x), PyArray_DATA(w), B, N, C, W, nt)
                          : short_conv_forward_f64(PyArray_DATA(out), PyArray_DATA(x), PyArray_DATA(w), B, N, C,
                                                   W, nt);
    Py_END_ALLOW_THREADS
    if (status_to_exception(status) < 0)
        goto cleanup;
    if (backward) {
        result = PyTuple_Pack(2, out, dw);
    } else {
        result = (PyObject *)out;
        out = NULL;
    }
cleanup:
    Py_XDECREF(dy);
    Py_XDECREF(x);
    Py_XDECREF(w);
    Py_XDECREF(out);
    Py_XDECREF(dw);
    return result;
}

static PyObject *py_short_conv_forward(PyObject *self, PyObject *args)
{
    (void)self;
    return short_conv_entry(args, 0);
}

static PyObject *py_short_conv_backward(PyObject *self, PyObject *args)
{
    (void)self;
    return short_conv_entry(args, 1);
}

/* ------------------------------------------------------------- test hooks */

/* _sincos(x) -> (sin(x), cos(x)) through the kernels' vectorised trig, x 1-d float32/64 */
static PyObject *py_sincos(PyObject *self, PyObject *arg)
{
    (void)self;
    PyObject *result = NULL;
    PyArrayObject *s = NULL, *c = NULL;
    int t;
    PyArrayObject *x = real_vector(arg, "x", &t);
    if (!x)
        return NULL;
    npy_intp n = PyArray_DIM(x, 0);
    s = (PyArrayObject *)PyArray_EMPTY(1, &n, t, 0);
    c = (PyArrayObject *)PyArray_EMPTY(1, &n, t, 0);
    if (!s || !c)
        goto cleanup;
    if (t == NPY_FLOAT)
        ff_sincos_f32(PyArray_DATA(s), PyArray_DATA(c), PyArray_DATA(x), (size_t)n);
    else
        ff_sincos_f64(PyArray_DATA(s), PyArray_DATA(c), PyArray_DATA(x), (size_t)n);
    result = PyTuple_Pack(2, s, c);
cleanup:
    Py_XDECREF(x);
    Py_XDECREF(s);
    Py_XDECREF(c);
    return result;
}

/* _exp(x) -> e^x through the kernels' exponential (exp.inc), x 1-d float32/64 */
static PyObject *py_exp(PyObject *self, PyObject *arg)
{
    (void)self;
    int t;
    PyArrayObject *x = real_vector(arg, "x", &t);
    if (!x)
        return NULL;
    npy_intp n = PyArray_DIM(x, 0);
    PyArrayObject *y = (PyArrayObject *)PyArray_EMPTY(1, &n, t, 0);
    if (y) {
        if (t == NPY_FLOAT)
            ff_exp_f32(PyArray_DATA(y), PyArray_DATA(x), (size_t)n);
        else
            ff_exp_f64(PyArray_DATA(y), PyArray_DATA(x), (size_t)n);
    }
    Py_DECREF(x);
    return (PyObject *)y;
}

/* ------------------------------------------------------------------ threads */

static PyObject *py_openmp_enabled(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyBool_FromLong(ff_openmp_enabled());
}

static PyObject *py_set_num_threads(PyObject *self, PyObject *arg)
{
    (void)self;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0 || n > 4096) {
        PyErr_Format(PyExc_ValueError, "n must be 0 (the OpenMP default) or 1..4096, got %ld", n);
        return NULL;
    }
    requested_threads = (int)n;
    Py_RETURN_NONE;
}

/* packed_state_length(F, e): elements of one (b,h)'s packed state (ff_packed_state_len) */
static PyObject *py_packed_state_length(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t F, e;
    if (!PyArg_ParseTuple(args, "nn:packed_state_length", &F, &e))
        return NULL;
    if (F < 0 || e < 0 || (F > 0 && e > (PY_SSIZE_T_MAX / 2 - F - 2) / F)) {
        PyErr_Format(PyExc_ValueError, "packed_state_length needs F >= 0 and e >= 0 of a state that fits "
                     "in memory, got F = %zd, e = %zd", F, e);
        return NULL;
    }
    return PyLong_FromSize_t(ff_packed_state_len((size_t)F, (size_t)e));
}

static PyObject *py_get_num_threads(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    const int n = KERNEL_THREADS();
    return PyLong_FromLong(n > 0 && ff_openmp_enabled() ? n : ff_max_threads());
}

/* A memory budget given in MiB (0 to 1048576) as bytes; -1 with ValueError otherwise. */
static int mib_to_bytes(PyObject *arg, size_t *bytes)
{
    const double mib = PyFloat_AsDouble(arg);
    if (mib == -1.0 && PyErr_Occurred())
        return -1;
    if (!(mib >= 0) || !(mib <= 1048576)) {
        PyErr_Format(PyExc_ValueError, "mib must be a number from 0 to 1048576, got %R", arg);
        return -1;
    }
    const double b = mib * 1048576.0;
    *bytes = b >= (double)SIZE_MAX ? SIZE_MAX : (size_t)b;
    return 0;
}

static PyObject *py_set_buffer_cache(PyObject *self, PyObject *arg)
{
    (void)self;
    size_t bytes;
    if (mib_to_bytes(arg, &bytes) < 0)
        return NULL;
    ff_buffer_cache_set_limit(bytes);
    Py_RETURN_NONE;
}

static PyObject *py_set_causal_cache(PyObject *self, PyObject *arg)
{
    (void)self;
    size_t bytes;
    if (mib_to_bytes(arg, &bytes) < 0)
        return NULL;
    ff_set_causal_cache_bytes(bytes);
    Py_RETURN_NONE;
}

static PyObject *py_causal_cache_limit(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyLong_FromSize_t(ff_causal_cache_bytes());
}

/* dense_copies(use_double): (the name of the products' copy, how it treats rows off a
 * cache line); times the copies on first use */
static PyObject *py_dense_copies(PyObject *self, PyObject *arg)
{
    (void)self;
    const int use_double = PyObject_IsTrue(arg);
    if (use_double < 0)
        return NULL;
    const char *name, *rows;
    Py_BEGIN_ALLOW_THREADS name = ff_product_copy(use_double);
    rows = ff_off_line_rows(use_double);
    Py_END_ALLOW_THREADS return Py_BuildValue("(ss)", name, rows);
}

static PyObject *py_isa_level(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyLong_FromLong(ff_isa_level());
}

/* all_finite(a): True or False for a C-contiguous float32/float64 array (the kernels'
 * finiteness pass, as the argument checks use it), None for anything else (the caller asks
 * NumPy instead) */
static PyObject *py_all_finite(PyObject *self, PyObject *obj)
{
    (void)self;
    if (!PyArray_Check(obj))
        Py_RETURN_NONE;
    PyArrayObject *a = (PyArrayObject *)obj;
    const int t = PyArray_TYPE(a);
    if ((t != NPY_FLOAT && t != NPY_DOUBLE) || !PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a))
        Py_RETURN_NONE;
    return PyBool_FromLong(array_all_finite(a));
}

static PyObject *py_buffer_cache_info(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    const ff_buffer_cache_info i = ff_buffer_cache_stats();
    return Py_BuildValue("{s:n,s:n,s:n,s:K,s:K}", "blocks", (Py_ssize_t)i.blocks, "bytes",
                         (Py_ssize_t)i.bytes, "limit", (Py_ssize_t)i.limit, "hits",
                         (unsigned long long)i.hits, "misses", (unsigned long long)i.misses);
}

#define KERNEL(name, doc)                                                                  \
    {#name, (PyCFunction)(void (*)(void))py_##name, METH_FASTCALL | METH_KEYWORDS, doc}
static PyMethodDef methods[] = {
#define X(name, qn, kn, ngrads, linear, F, R, grads_doc, ...)                              \
    KERNEL(name##_forward, linear ? "-> (out, guard_count[, key_state][, projections][, finite])" \
                                  : "-> out, or (out, finite)"),                             \
    KERNEL(name##_backward, "-> " grads_doc ", then finite with report_finite=True"),
    FF_KINDS(X)
#undef X
    {"layer_norm_forward", py_layer_norm_forward, METH_VARARGS,
     "layer_norm_forward(x (R,C), gamma, beta, eps) -> (y, xhat, rstd)"},
    {"layer_norm_backward", py_layer_norm_backward, METH_VARARGS,
     "layer_norm_backward(dy, xhat, rstd, gamma) -> (dx, dgamma, dbeta)"},
    {"short_conv_forward", py_short_conv_forward, METH_VARARGS,
     "short_conv_forward(x (B,N,C), w (W,C)) -> y: causal depthwise convolution along N"},
    {"short_conv_backward", py_short_conv_backward, METH_VARARGS,
     "short_conv_backward(dy, x, w) -> (dx, dw)"},
    {"gelu_forward", py_gelu_forward, METH_O, "gelu_forward(x) -> (y, w = 1 - |tanh u|); x 1-d"},
    {"gelu_backward", py_gelu_backward, METH_VARARGS, "gelu_backward(dy, x, w) -> dx; all 1-d"},
    {"_sincos", py_sincos, METH_O, "test hook: (sin(x), cos(x)) through the kernels' trig"},
    {"_exp", py_exp, METH_O, "test hook: e^x through the kernels' exponential"},
    {"openmp_enabled", py_openmp_enabled, METH_NOARGS, "True when built with OpenMP"},
    {"set_num_threads", py_set_num_threads, METH_O, "threads for later kernel calls (0 = default)"},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, "threads kernel calls will use"},
    {"packed_state_length", py_packed_state_length, METH_VARARGS,
     "packed_state_length(F, e) -> elements of one (b,h)'s packed state [S, z, R, M, padding]"},
    {"set_buffer_cache", py_set_buffer_cache, METH_O, "bound on the block cache in MiB (0: off)"},
    {"buffer_cache_info", py_buffer_cache_info, METH_NOARGS, "the block cache's counters"},
    {"set_causal_cache", py_set_causal_cache, METH_O, "the causal backward's chunk-cache budget in MiB (0: off)"},
    {"dense_copies", py_dense_copies, METH_O, "dense_copies(use_double): (the name of the copy that runs the "
     "dense products (avx512, avx512_4x4, avx2, base or plain; timed on first use at level 4), "
     "copy or in_place for rows off a cache line)"},
    {"isa_level", py_isa_level, METH_NOARGS, "x86-64 level of the code paths in use (0: no dispatch)"},
    {"all_finite", py_all_finite, METH_O, "all_finite(a): whether a C-contiguous float array is all finite "
     "(None for other arrays)"},
    {"causal_cache_limit", py_causal_cache_limit, METH_NOARGS, "the causal backward's chunk-cache budget in bytes"},
    {NULL, NULL, 0, NULL}};
#undef KERNEL

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_C",
                                       "flexformer C kernels (private; use flexformer.*)", -1,
                                       methods, NULL, NULL, NULL, NULL};

/* _C.kinds: each kind's row of kinds.h as Python reads it (the registry derives its
 * parameter names, layouts and capabilities from it), and _C.projection_kinds, the kinds
 * whose bidirectional forward can keep its projections. -1 with an exception set. */
static PyObject *kind_row(const op_spec *spec)
{
    PyObject *params = PyTuple_New(spec->nparams);
    for (int i = 0; params && i < spec->nparams; ++i) {
        const param_spec *ps = &spec->params[i];
        PyObject *item = Py_BuildValue("(ssz)", ps->name, ps->axes, ps->alt_axes);
        if (!item) {
            Py_CLEAR(params);
            break;
        }
        PyTuple_SET_ITEM(params, i, item);
    }
    if (!params)
        return NULL;
    return Py_BuildValue("{s:s,s:s,s:N,s:i,s:O,s:O,s:O}", "query", spec->qname, "key", spec->kname, "params",
                         params, "gradients", spec->ngrads, "linear", spec->linear ? Py_True : Py_False,
                         "causal", spec->causal_refusal ? Py_False : Py_True, "keeps_projections",
                         spec->keeps_projections ? Py_True : Py_False);
}

static int add_kind_table(PyObject *mod)
{
    static const char *const kind_names[] = {
#define X(name, ...) #name,
        FF_KINDS(X)
#undef X
    };
    PyObject *table = PyDict_New(), *keeping = PyList_New(0), *keeping_tuple = NULL;
    int failed = !table || !keeping;
    for (int op = 0; !failed && op < OP_COUNT; ++op) {
        PyObject *row = kind_row(&OPS[op]);
        failed = !row || PyDict_SetItemString(table, kind_names[op], row) < 0;
        Py_XDECREF(row);
        if (!failed && OPS[op].keeps_projections) {
            PyObject *name = PyUnicode_FromString(kind_names[op]);
            failed = !name || PyList_Append(keeping, name) < 0;
            Py_XDECREF(name);
        }
    }
    if (!failed)
        failed = !(keeping_tuple = PyList_AsTuple(keeping));
    Py_XDECREF(keeping);
    /* PyModule_AddObject steals a reference only when it succeeds (3.9 has no AddObjectRef) */
    if (!failed && !(failed = PyModule_AddObject(mod, "kinds", table) < 0))
        table = NULL;
    if (!failed && !(failed = PyModule_AddObject(mod, "projection_kinds", keeping_tuple) < 0))
        keeping_tuple = NULL;
    Py_XDECREF(table);
    Py_XDECREF(keeping_tuple);
    return failed ? -1 : 0;
}

PyMODINIT_FUNC PyInit__C(void)
{
    import_array();
    count_params();
    mark_projection_kinds();
    if (build_signatures() < 0) /* after mark_projection_kinds: it reads keeps_projections */
        return NULL;
#if !defined(_WIN32)
    pthread_atfork(ff_buffer_cache_lock, ff_buffer_cache_unlock, after_fork_in_child);
#endif
    /* never freed: arrays made with the handler keep a reference to it */
    buffer_handler_capsule = PyCapsule_New(&buffer_handler, "mem_handler", NULL);
    if (!buffer_handler_capsule)
        return NULL;
    PyObject *mod = PyModule_Create(&moduledef);
    if (!mod)
        return NULL;
    if (add_kind_table(mod) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
