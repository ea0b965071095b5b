/* Dispatch: one function slot that each thread may fill with its own value.
 *
 * torch's FX tracer patches nn.Module.__call__ (and wrapped module globals)
 * for the whole process while one thread traces.  install() puts one Dispatch
 * where such a function lives (a class attribute or a module global), once;
 * the patcher's writes then set only the calling thread's override, and a
 * call runs the caller's override, or `callee` (the original) if it has none.
 *
 * The hot path is a thread that overrides nothing while no thread does: one
 * size check.  While some thread overrides, others pay one dict lookup keyed
 * by their thread-state id (never reused, so a thread that died mid-trace
 * can leave an entry behind but never hand it to another thread).
 *
 * In a class, a Dispatch is a method descriptor: `obj(...)` calls it
 * unbound with obj first (no bound-method allocation), `cls.name` and
 * `obj.name` bind the caller's value as the value itself would bind.
 *
 * Without the GIL: original, callee and method never change after __new__;
 * `overrides` is a dict, whose own lock guards it; each thread writes only
 * its own key, and lookups take strong references (another thread's insert
 * may resize the dict, a racing reset() may drop the value). */
#include "fxguard.h"
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *original;  /* what the class or dict held (for Python's bookkeeping) */
    PyObject *callee;    /* what a thread without an override runs */
    PyObject *overrides; /* dict: thread-state id (int) -> that thread's value */
    int method;          /* lives in a class: calls come unbound, self first */
    vectorcallfunc vectorcall;
} DispatchObject;

static PyObject *
thread_key(void)
{
    return PyLong_FromUnsignedLongLong(PyThreadState_GetID(PyThreadState_Get()));
}

/* The calling thread's override, else `fallback`, as a new reference; NULL
 * with an error set. */
static PyObject *
override_or(DispatchObject *d, PyObject *fallback)
{
    PyObject *key = thread_key();
    if (key == NULL) {
        return NULL;
    }
    PyObject *value;
    int found = fxg_dict_get_ref(d->overrides, key, &value);
    Py_DECREF(key);
    if (found <= 0) {
        return found < 0 ? NULL : Py_NewRef(fallback);
    }
    return value;
}

/* The calling thread's value, as a new reference; NULL with an error set. */
static PyObject *
current(DispatchObject *d)
{
    if (PyDict_GET_SIZE(d->overrides) == 0) {
        return Py_NewRef(d->callee); /* nobody overrides: the common case */
    }
    return override_or(d, d->callee);
}

/* Whether calling `fn(self, *args)` is the same as calling `fn` bound to self. */
static int
calls_unbound(PyObject *fn)
{
    return PyFunction_Check(fn) ||
           PyType_HasFeature(Py_TYPE(fn), Py_TPFLAGS_METHOD_DESCRIPTOR);
}

static PyObject *
dispatch_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    DispatchObject *d = (DispatchObject *)self;
    PyObject *target = current(d);
    if (target == NULL) {
        return NULL;
    }
    PyObject *result;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    descrgetfunc bind = Py_TYPE(target)->tp_descr_get;
    if (!d->method || nargs == 0 || bind == NULL || calls_unbound(target)) {
        result = PyObject_Vectorcall(target, args, nargsf, kwnames);
    }
    else {
        /* A value that binds differently (a staticmethod, a partial with
         * __get__): bind it to self as attribute lookup would. */
        PyObject *bound = bind(target, args[0], (PyObject *)Py_TYPE(args[0]));
        result = bound == NULL ? NULL : PyObject_Vectorcall(bound, args + 1, nargs - 1, kwnames);
        Py_XDECREF(bound);
    }
    Py_DECREF(target);
    return result;
}

static PyObject *
dispatch_descr_get(PyObject *self, PyObject *obj, PyObject *type)
{
    PyObject *target = current((DispatchObject *)self);
    if (target == NULL) {
        return NULL;
    }
    descrgetfunc bind = Py_TYPE(target)->tp_descr_get;
    if (bind == NULL) {
        return target;
    }
    PyObject *bound = bind(target, obj, type);
    Py_DECREF(target);
    return bound;
}

static PyObject *
dispatch_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"original", "callee", "method", NULL};
    PyObject *original, *callee;
    int method = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$p:Dispatch", kwlist, &original, &callee,
                                     &method)) {
        return NULL;
    }
    if (!PyCallable_Check(callee)) {
        PyErr_Format(PyExc_TypeError, "Dispatch: callee must be callable, not %.100s",
                     Py_TYPE(callee)->tp_name);
        return NULL;
    }
    DispatchObject *d = (DispatchObject *)type->tp_alloc(type, 0);
    if (d == NULL) {
        return NULL;
    }
    d->overrides = PyDict_New();
    if (d->overrides == NULL) {
        Py_DECREF(d);
        return NULL;
    }
    d->original = Py_NewRef(original);
    d->callee = Py_NewRef(callee);
    d->method = method;
    d->vectorcall = dispatch_vectorcall;
    return (PyObject *)d;
}

static int
dispatch_traverse(PyObject *self, visitproc visit, void *arg)
{
    DispatchObject *d = (DispatchObject *)self;
    Py_VISIT(d->original);
    Py_VISIT(d->callee);
    Py_VISIT(d->overrides);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int
dispatch_clear(PyObject *self)
{
    DispatchObject *d = (DispatchObject *)self;
    Py_CLEAR(d->original);
    Py_CLEAR(d->callee);
    Py_CLEAR(d->overrides);
    return 0;
}

static void
dispatch_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    dispatch_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* -- what the Python layer uses ---------------------------------------------- */

static PyObject *
dispatch_override(PyObject *self, PyObject *default_value)
{
    return override_or((DispatchObject *)self, default_value);
}

/* The calling thread's override set to value, or removed (value NULL). */
static PyObject *
set_override(PyObject *self, PyObject *value)
{
    PyObject *key = thread_key();
    if (key == NULL) {
        return NULL;
    }
    PyObject *overrides = ((DispatchObject *)self)->overrides;
    int r;
    if (value != NULL) {
        r = PyDict_SetItem(overrides, key, value);
    }
    else if ((r = PyDict_Contains(overrides, key)) > 0) {
        r = PyDict_DelItem(overrides, key);
    }
    Py_DECREF(key);
    if (r < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
dispatch_set(PyObject *self, PyObject *value)
{
    if (value == self) { /* every call and attribute read would loop forever */
        PyErr_SetString(PyExc_ValueError, "Dispatch.set: a Dispatch cannot run itself");
        return NULL;
    }
    return set_override(self, value);
}

static PyObject *
dispatch_reset(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    return set_override(self, NULL);
}

static PyObject *
dispatch_overriding(PyObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(PyDict_GET_SIZE(((DispatchObject *)self)->overrides));
}

/* Attributes the Dispatch answers itself; any other public name (and the
 * few dunders that describe a function) is the caller's value's, so that
 * `__name__`, `__doc__`, `__wrapped__` and friends read as before. */
static int
own_attribute(PyObject *name)
{
    static const char *forwarded[] = {"__name__", "__qualname__", "__module__", "__doc__",
                                      "__wrapped__", "__signature__", NULL};
    for (int i = 0; forwarded[i] != NULL; i++) {
        if (PyUnicode_CompareWithASCIIString(name, forwarded[i]) == 0) {
            return 0;
        }
    }
    static const char *own[] = {"original", "callee", "overriding", "override", "set", "reset",
                                NULL};
    for (int i = 0; own[i] != NULL; i++) {
        if (PyUnicode_CompareWithASCIIString(name, own[i]) == 0) {
            return 1;
        }
    }
    return PyUnicode_GetLength(name) >= 2 && PyUnicode_READ_CHAR(name, 0) == '_' &&
           PyUnicode_READ_CHAR(name, 1) == '_';
}

static PyObject *
dispatch_getattro(PyObject *self, PyObject *name)
{
    if (!PyUnicode_Check(name) || own_attribute(name)) {
        return PyObject_GenericGetAttr(self, name);
    }
    PyObject *target = current((DispatchObject *)self);
    if (target == NULL) {
        return NULL;
    }
    /* Dispatches that run each other must end in RecursionError, not a crash. */
    PyObject *value = NULL;
    if (Py_EnterRecursiveCall(" reading an attribute through a Dispatch") == 0) {
        value = PyObject_GetAttr(target, name);
        Py_LeaveRecursiveCall();
    }
    Py_DECREF(target);
    return value;
}

static PyObject *
dispatch_repr(PyObject *self)
{
    DispatchObject *d = (DispatchObject *)self;
    return PyUnicode_FromFormat("<fxguard per-thread dispatch of %R, %zd thread(s) overriding>",
                                d->original, PyDict_GET_SIZE(d->overrides));
}

static PyMethodDef dispatch_methods[] = {
    {"override", dispatch_override, METH_O,
     "override($self, default, /)\n--\n\n"
     "The calling thread's value, or default if it has none."},
    {"set", dispatch_set, METH_O,
     "set($self, value, /)\n--\n\nThe calling thread runs value from now on."},
    {"reset", dispatch_reset, METH_NOARGS,
     "reset($self, /)\n--\n\nThe calling thread runs callee again."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef dispatch_members[] = {
    {"original", T_OBJECT, offsetof(DispatchObject, original), READONLY,
     "What the class or dict held before."},
    {"callee", T_OBJECT, offsetof(DispatchObject, callee), READONLY,
     "What a thread without an override runs."},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(DispatchObject, vectorcall), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef dispatch_getset[] = {
    {"overriding", dispatch_overriding, NULL, "How many threads have an override.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot dispatch_slots[] = {
    {Py_tp_new, dispatch_new},
    {Py_tp_dealloc, dispatch_dealloc},
    {Py_tp_traverse, dispatch_traverse},
    {Py_tp_clear, dispatch_clear},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_descr_get, dispatch_descr_get},
    {Py_tp_getattro, dispatch_getattro},
    {Py_tp_repr, dispatch_repr},
    {Py_tp_methods, dispatch_methods},
    {Py_tp_members, dispatch_members},
    {Py_tp_getset, dispatch_getset},
    {Py_tp_doc, "Dispatch(original, callee, *, method=False)\n--\n\n"
                "Calls the calling thread's override, or callee if it has none."},
    {0, NULL},
};

PyType_Spec fxg_dispatch_spec = {
    .name = "fxguard._core.Dispatch",
    .basicsize = sizeof(DispatchObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .slots = dispatch_slots,
};
