/* The one file that speaks the CPython / NumPy C API: it parses arguments, converts
 * and checks every array (naming the argument and the expected shape or dtype in the
 * error), allocates outputs, releases the GIL around the pure C kernels and maps
 * their status codes to Python exceptions. The kernels themselves live in kernels.c. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <math.h>
#include "ff_common.h"
#include "ff_kernels.h"

static int requested_threads = 0; /* 0: the OpenMP default */

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
        PyErr_Format(PyExc_TypeError, "%s must be a numpy array, got %s", name,
                     Py_TYPE(obj)->tp_name);
    }
    return a;
}

/* Convert obj to a C-contiguous, aligned, native array of dtype typenum and ndim dims.
 * TypeError names the argument on a dtype mismatch, ValueError on a wrong ndim. */
static PyArrayObject *to_array(PyObject *obj, const char *name, int typenum, int ndim,
                               const char *shape_doc)
{
    PyArrayObject *a = as_ndarray(obj, name);
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
    PyArrayObject *c = (PyArrayObject *)PyArray_FROMANY((PyObject *)a, typenum, ndim, ndim,
                                                        NPY_ARRAY_IN_ARRAY);
    Py_DECREF(a);
    return c;
}

static int check_finite(PyArrayObject *a, const char *name)
{
    const npy_intp n = PyArray_SIZE(a);
    if (PyArray_TYPE(a) == NPY_FLOAT) {
        const float *p = (const float *)PyArray_DATA(a);
        for (npy_intp i = 0; i < n; ++i)
            if (!isfinite(p[i]))
                goto bad;
    } else {
        const double *p = (const double *)PyArray_DATA(a);
        for (npy_intp i = 0; i < n; ++i)
            if (!isfinite(p[i]))
                goto bad;
    }
    return 0;
bad:
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

/* ---------------------------------------------------- Flexformer attention calls */

typedef struct {
    int nonstationary; /* 0: flex_s (omega), 1: flex_n (omega1, omega2, tau) */
    int backward;
    int typenum;
    PyArrayObject *dout, *q, *k, *v, *omega1, *omega2, *tau, *mask;
    npy_intp B, H, Nq, Nk, d, e, m;
    int causal;
    double eps;
} flex_call;

static void flex_call_release(flex_call *c)
{
    Py_XDECREF(c->dout);
    Py_XDECREF(c->q);
    Py_XDECREF(c->k);
    Py_XDECREF(c->v);
    Py_XDECREF(c->omega1);
    Py_XDECREF(c->omega2);
    Py_XDECREF(c->tau);
    Py_XDECREF(c->mask);
}

/* Convert and check every argument; on failure set an exception and return -1
 * (the caller releases what was converted). */
static int flex_call_prepare(flex_call *c, PyObject *dout, PyObject *q, PyObject *k,
                             PyObject *v, PyObject *om1, PyObject *om2, PyObject *tau,
                             PyObject *mask)
{
    const char *om1_name = c->nonstationary ? "omega1" : "omega";
    PyArrayObject *q0 = as_ndarray(q, "q");
    if (!q0)
        return -1;
    c->typenum = PyArray_TYPE(q0);
    if (c->typenum != NPY_FLOAT && c->typenum != NPY_DOUBLE) {
        PyErr_Format(PyExc_TypeError, "q must have dtype float32 or float64, got %S",
                     (PyObject *)PyArray_DESCR(q0));
        Py_DECREF(q0);
        return -1;
    }
    c->q = to_array((PyObject *)q0, "q", c->typenum, 4, "(B, H, Nq, d)");
    Py_DECREF(q0);
    if (!c->q)
        return -1;
    c->B = PyArray_DIM(c->q, 0);
    c->H = PyArray_DIM(c->q, 1);
    c->Nq = PyArray_DIM(c->q, 2);
    c->d = PyArray_DIM(c->q, 3);
    if (c->d == 0) {
        PyErr_SetString(PyExc_ValueError, "q must have a head size d >= 1 (last axis), got 0");
        return -1;
    }
    if (!(c->k = to_array(k, "k", c->typenum, 4, "(B, H, Nk, d)")))
        return -1;
    c->Nk = PyArray_DIM(c->k, 2);
    if (PyArray_DIM(c->k, 0) != c->B || PyArray_DIM(c->k, 1) != c->H ||
        PyArray_DIM(c->k, 3) != c->d) {
        char want[160];
        snprintf(want, sizeof want, "(B, H, Nk, d) = (%zd, %zd, Nk, %zd) to match q",
                 (Py_ssize_t)c->B, (Py_ssize_t)c->H, (Py_ssize_t)c->d);
        return shape_error(c->k, "k", want);
    }
    if (!(c->v = to_array(v, "v", c->typenum, 4, "(B, H, Nk, e)")))
        return -1;
    c->e = PyArray_DIM(c->v, 3);
    if (PyArray_DIM(c->v, 0) != c->B || PyArray_DIM(c->v, 1) != c->H ||
        PyArray_DIM(c->v, 2) != c->Nk) {
        char want[160];
        snprintf(want, sizeof want, "(B, H, Nk, e) = (%zd, %zd, %zd, e) to match q and k",
                 (Py_ssize_t)c->B, (Py_ssize_t)c->H, (Py_ssize_t)c->Nk);
        return shape_error(c->v, "v", want);
    }
    if (!(c->omega1 = to_array(om1, om1_name, c->typenum, 3, "(H, m, d)")))
        return -1;
    c->m = PyArray_DIM(c->omega1, 1);
    if (PyArray_DIM(c->omega1, 0) != c->H || PyArray_DIM(c->omega1, 2) != c->d) {
        char want[160];
        snprintf(want, sizeof want, "(H, m, d) = (%zd, m, %zd) to match q",
                 (Py_ssize_t)c->H, (Py_ssize_t)c->d);
        return shape_error(c->omega1, om1_name, want);
    }
    if (c->m == 0) {
        PyErr_Format(PyExc_ValueError,
                     "%s must hold at least one frequency per head (m >= 1), got m = 0",
                     om1_name);
        return -1;
    }
    if (check_finite(c->omega1, om1_name) < 0)
        return -1;
    if (c->nonstationary) {
        if (!(c->omega2 = to_array(om2, "omega2", c->typenum, 3, "(H, m, d)")))
            return -1;
        if (!PyArray_SAMESHAPE(c->omega1, c->omega2)) {
            char want[160];
            snprintf(want, sizeof want, "(H, m, d) = (%zd, %zd, %zd) like omega1",
                     (Py_ssize_t)c->H, (Py_ssize_t)c->m, (Py_ssize_t)c->d);
            return shape_error(c->omega2, "omega2", want);
        }
        if (check_finite(c->omega2, "omega2") < 0)
            return -1;
        if (!(c->tau = to_array(tau, "tau", c->typenum, 1, "(H,)")))
            return -1;
        if (PyArray_DIM(c->tau, 0) != c->H) {
            char want[64];
            snprintf(want, sizeof want, "(H,) = (%zd,) to match q", (Py_ssize_t)c->H);
            return shape_error(c->tau, "tau", want);
        }
        if (check_finite(c->tau, "tau") < 0)
            return -1;
    }
    if (mask != Py_None) {
        if (!(c->mask = to_array(mask, "key_mask", NPY_BOOL, 2, "(B, Nk)")))
            return -1;
        if (PyArray_DIM(c->mask, 0) != c->B || PyArray_DIM(c->mask, 1) != c->Nk) {
            char want[96];
            snprintf(want, sizeof want, "(B, Nk) = (%zd, %zd) to match k", (Py_ssize_t)c->B,
                     (Py_ssize_t)c->Nk);
            return shape_error(c->mask, "key_mask", want);
        }
    }
    if (c->causal && c->Nq != c->Nk) {
        PyErr_Format(PyExc_ValueError,
                     "causal=True needs as many queries as keys, got Nq = %zd (q) and Nk = %zd (k)",
                     (Py_ssize_t)c->Nq, (Py_ssize_t)c->Nk);
        return -1;
    }
    if (!(c->eps > 0) || !isfinite(c->eps)) {
        char got[64];
        snprintf(got, sizeof got, "%g", c->eps);
        PyErr_Format(PyExc_ValueError, "eps must be a finite number > 0, got %s", got);
        return -1;
    }
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

#define DATA(a) ((a) ? PyArray_DATA(a) : NULL)

static PyObject *flex_forward(flex_call *c)
{
    PyObject *result = NULL;
    npy_intp out_shape[4] = {c->B, c->H, c->Nq, c->e};
    npy_intp bh_shape[2] = {c->B, c->H};
    PyArrayObject *out = (PyArrayObject *)PyArray_ZEROS(4, out_shape, c->typenum, 0);
    PyArrayObject *guard = (PyArrayObject *)PyArray_ZEROS(2, bh_shape, NPY_INT64, 0);
    int status = FF_OK;
    if (!out || !guard)
        goto cleanup;
    const uint8_t *mask = (const uint8_t *)DATA(c->mask);
    int64_t *gc = (int64_t *)PyArray_DATA(guard);
    const size_t B = (size_t)c->B, H = (size_t)c->H, Nq = (size_t)c->Nq, Nk = (size_t)c->Nk,
                 d = (size_t)c->d, e = (size_t)c->e, m = (size_t)c->m;
    Py_BEGIN_ALLOW_THREADS
    if (c->typenum == NPY_FLOAT) {
        if (c->nonstationary)
            status = flex_n_attention_forward_f32(
                PyArray_DATA(out), gc, PyArray_DATA(c->q), PyArray_DATA(c->k), PyArray_DATA(c->v),
                PyArray_DATA(c->omega1), PyArray_DATA(c->omega2), PyArray_DATA(c->tau), mask, B, H,
                Nq, Nk, d, e, m, c->causal, (float)c->eps, requested_threads);
        else
            status = flex_s_attention_forward_f32(
                PyArray_DATA(out), gc, PyArray_DATA(c->q), PyArray_DATA(c->k), PyArray_DATA(c->v),
                PyArray_DATA(c->omega1), mask, B, H, Nq, Nk, d, e, m, c->causal, (float)c->eps,
                requested_threads);
    } else {
        if (c->nonstationary)
            status = flex_n_attention_forward_f64(
                PyArray_DATA(out), gc, PyArray_DATA(c->q), PyArray_DATA(c->k), PyArray_DATA(c->v),
                PyArray_DATA(c->omega1), PyArray_DATA(c->omega2), PyArray_DATA(c->tau), mask, B, H,
                Nq, Nk, d, e, m, c->causal, c->eps, requested_threads);
        else
            status = flex_s_attention_forward_f64(
                PyArray_DATA(out), gc, PyArray_DATA(c->q), PyArray_DATA(c->k), PyArray_DATA(c->v),
                PyArray_DATA(c->omega1), mask, B, H, Nq, Nk, d, e, m, c->causal, c->eps,
                requested_threads);
    }
    Py_END_ALLOW_THREADS
    if (status_to_exception(status) < 0)
        goto cleanup;
    result = PyTuple_Pack(2, (PyObject *)out, (PyObject *)guard);
cleanup:
    Py_XDECREF(out);
    Py_XDECREF(guard);
    return result;
}

static PyObject *flex_backward(flex_call *c)
{
    PyObject *result = NULL;
    npy_intp q_shape[4] = {c->B, c->H, c->Nq, c->d};
    npy_intp k_shape[4] = {c->B, c->H, c->Nk, c->d};
    npy_intp v_shape[4] = {c->B, c->H, c->Nk, c->e};
    npy_intp om_shape[3] = {c->H, c->m, c->d};
    npy_intp tau_shape[1] = {c->H};
    const int t = c->typenum;
    PyArrayObject *dq = (PyArrayObject *)PyArray_ZEROS(4, q_shape, t, 0);
    PyArrayObject *dk = (PyArrayObject *)PyArray_ZEROS(4, k_shape, t, 0);
    PyArrayObject *dv = (PyArrayObject *)PyArray_ZEROS(4, v_shape, t, 0);
    PyArrayObject *dom1 = (PyArrayObject *)PyArray_ZEROS(3, om_shape, t, 0);
    PyArrayObject *dom2 = NULL, *dtau = NULL;
    int status = FF_OK;
    if (c->nonstationary) {
        dom2 = (PyArrayObject *)PyArray_ZEROS(3, om_shape, t, 0);
        dtau = (PyArrayObject *)PyArray_ZEROS(1, tau_shape, t, 0);
        if (!dom2 || !dtau)
            goto cleanup;
    }
    if (!dq || !dk || !dv || !dom1)
        goto cleanup;
    const uint8_t *mask = (const uint8_t *)DATA(c->mask);
    const size_t B = (size_t)c->B, H = (size_t)c->H, Nq = (size_t)c->Nq, Nk = (size_t)c->Nk,
                 d = (size_t)c->d, e = (size_t)c->e, m = (size_t)c->m;
    Py_BEGIN_ALLOW_THREADS
    if (t == NPY_FLOAT) {
        if (c->nonstationary)
            status = flex_n_attention_backward_f32(
                PyArray_DATA(dq), PyArray_DATA(dk), PyArray_DATA(dv), PyArray_DATA(dom1),
                PyArray_DATA(dom2), PyArray_DATA(dtau), NULL, NULL, PyArray_DATA(c->dout),
                PyArray_DATA(c->q), PyArray_DATA(c->k), PyArray_DATA(c->v),
                PyArray_DATA(c->omega1), PyArray_DATA(c->omega2), PyArray_DATA(c->tau), mask, B,
                H, Nq, Nk, d, e, m, c->causal, (float)c->eps, requested_threads);
        else
            status = flex_s_attention_backward_f32(
                PyArray_DATA(dq), PyArray_DATA(dk), PyArray_DATA(dv), PyArray_DATA(dom1), NULL,
                NULL, PyArray_DATA(c->dout), PyArray_DATA(c->q), PyArray_DATA(c->k),
                PyArray_DATA(c->v), PyArray_DATA(c->omega1), mask, B, H, Nq, Nk, d, e, m,
                c->causal, (float)c->eps, requested_threads);
    } else {
        if (c->nonstationary)
            status = flex_n_attention_backward_f64(
                PyArray_DATA(dq), PyArray_DATA(dk), PyArray_DATA(dv), PyArray_DATA(dom1),
                PyArray_DATA(dom2), PyArray_DATA(dtau), NULL, NULL, PyArray_DATA(c->dout),
                PyArray_DATA(c->q), PyArray_DATA(c->k), PyArray_DATA(c->v),
                PyArray_DATA(c->omega1), PyArray_DATA(c->omega2), PyArray_DATA(c->tau), mask, B,
                H, Nq, Nk, d, e, m, c->causal, c->eps, requested_threads);
        else
            status = flex_s_attention_backward_f64(
                PyArray_DATA(dq), PyArray_DATA(dk), PyArray_DATA(dv), PyArray_DATA(dom1), NULL,
                NULL, PyArray_DATA(c->dout), PyArray_DATA(c->q), PyArray_DATA(c->k),
                PyArray_DATA(c->v), PyArray_DATA(c->omega1), mask, B, H, Nq, Nk, d, e, m,
                c->causal, c->eps, requested_threads);
    }
    Py_END_ALLOW_THREADS
    if (status_to_exception(status) < 0)
        goto cleanup;
    if (c->nonstationary)
        result = PyTuple_Pack(6, dq, dk, dv, dom1, dom2, dtau);
    else
        result = PyTuple_Pack(4, dq, dk, dv, dom1);
cleanup:
    Py_XDECREF(dq);
    Py_XDECREF(dk);
    Py_XDECREF(dv);
    Py_XDECREF(dom1);
    Py_XDECREF(dom2);
    Py_XDECREF(dtau);
    return result;
}

/* One entry for all four Python-level calls. */
static PyObject *flex_entry(PyObject *args, PyObject *kwargs, int nonstationary, int backward)
{
    static char *kw_s_fwd[] = {"q", "k", "v", "omega", "key_mask", "causal", "eps", NULL};
    static char *kw_s_bwd[] = {"dout", "q", "k", "v", "omega", "key_mask", "causal", "eps", NULL};
    static char *kw_n_fwd[] = {"q", "k", "v", "omega1", "omega2", "tau", "key_mask",
                               "causal", "eps", NULL};
    static char *kw_n_bwd[] = {"dout", "q", "k", "v", "omega1", "omega2", "tau", "key_mask",
                               "causal", "eps", NULL};
    PyObject *dout = NULL, *q, *k, *v, *om1, *om2 = NULL, *tau = NULL, *mask = Py_None;
    flex_call c;
    memset(&c, 0, sizeof c);
    c.nonstationary = nonstationary;
    c.backward = backward;
    c.eps = 1e-4;
    int ok;
    if (!nonstationary && !backward)
        ok = PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO|$Opd", kw_s_fwd, &q, &k, &v, &om1,
                                         &mask, &c.causal, &c.eps);
    else if (!nonstationary)
        ok = PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO|$Opd", kw_s_bwd, &dout, &q, &k,
                                         &v, &om1, &mask, &c.causal, &c.eps);
    else if (!backward)
        ok = PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO|$Opd", kw_n_fwd, &q, &k, &v,
                                         &om1, &om2, &tau, &mask, &c.causal, &c.eps);
    else
        ok = PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOO|$Opd", kw_n_bwd, &dout, &q, &k,
                                         &v, &om1, &om2, &tau, &mask, &c.causal, &c.eps);
    if (!ok)
        return NULL;
    PyObject *result = NULL;
    if (flex_call_prepare(&c, dout, q, k, v, om1, om2, tau, mask) == 0)
        result = backward ? flex_backward(&c) : flex_forward(&c);
    flex_call_release(&c);
    return result;
}

static PyObject *py_flex_s_forward(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    return flex_entry(args, kw, 0, 0);
}
static PyObject *py_flex_s_backward(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    return flex_entry(args, kw, 0, 1);
}
static PyObject *py_flex_n_forward(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    return flex_entry(args, kw, 1, 0);
}
static PyObject *py_flex_n_backward(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    return flex_entry(args, kw, 1, 1);
}

/* ------------------------------------------------------------- test hooks */

/* _sincos(x) -> (sin(x), cos(x)) through the kernels' vectorised trig, x 1-d float32/64 */
static PyObject *py_sincos(PyObject *self, PyObject *arg)
{
    (void)self;
    PyObject *result = NULL;
    PyArrayObject *x0 = as_ndarray(arg, "x"), *x = NULL, *s = NULL, *c = NULL;
    if (!x0)
        return NULL;
    const int t = PyArray_TYPE(x0);
    if (t != NPY_FLOAT && t != NPY_DOUBLE) {
        PyErr_SetString(PyExc_TypeError, "x must have dtype float32 or float64");
        goto cleanup;
    }
    if (!(x = to_array((PyObject *)x0, "x", t, 1, "(n,)")))
        goto cleanup;
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
    Py_XDECREF(x0);
    Py_XDECREF(x);
    Py_XDECREF(s);
    Py_XDECREF(c);
    return result;
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

static PyObject *py_get_num_threads(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyLong_FromLong(requested_threads > 0 && ff_openmp_enabled() ? requested_threads
                                                                          : ff_max_threads());
}

static PyMethodDef methods[] = {
    {"flex_s_forward", (PyCFunction)(void (*)(void))py_flex_s_forward,
     METH_VARARGS | METH_KEYWORDS, "flex_s attention forward -> (out, guard_count)"},
    {"flex_s_backward", (PyCFunction)(void (*)(void))py_flex_s_backward,
     METH_VARARGS | METH_KEYWORDS, "flex_s attention backward -> (dq, dk, dv, domega)"},
    {"flex_n_forward", (PyCFunction)(void (*)(void))py_flex_n_forward,
     METH_VARARGS | METH_KEYWORDS, "flex_n attention forward -> (out, guard_count)"},
    {"flex_n_backward", (PyCFunction)(void (*)(void))py_flex_n_backward,
     METH_VARARGS | METH_KEYWORDS,
     "flex_n attention backward -> (dq, dk, dv, domega1, domega2, dtau)"},
    {"_sincos", py_sincos, METH_O, "test hook: (sin(x), cos(x)) through the kernels' trig"},
    {"openmp_enabled", py_openmp_enabled, METH_NOARGS, "True when built with OpenMP"},
    {"set_num_threads", py_set_num_threads, METH_O, "threads for later kernel calls (0 = default)"},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, "threads kernel calls will use"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_C",
                                       "flexformer C kernels (private; use flexformer.*)", -1,
                                       methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__C(void)
{
    import_array();
    return PyModule_Create(&moduledef);
}
