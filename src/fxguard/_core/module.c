/* fxguard._core: module object, its per-interpreter state, and the functions
 * the Python layer calls.  Everything mutable lives in the module state, so
 * each interpreter that imports fxguard gets its own. */
#include "fxguard.h"

static fxg_state *
state_of(PyObject *module)
{
    return (fxg_state *)PyModule_GetState(module);
}

static PyObject *
is_fx_tracing(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    int r = fxg_thread_is_tracing(state_of(module));
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *
is_fx_symbolic_tracing(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    int r = fxg_thread_is_symbolic_tracing(state_of(module));
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *
tracing_cells(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSsize_t(state_of(module)->tracing_cells);
}

static PyObject *
stash_steals_flag(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(state_of(module)->tls_stash_steals);
}

static PyObject *
get_mode(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLong(state_of(module)->mode);
}

static void
clear_hooks(fxg_state *st)
{
    Py_CLEAR(st->is_compiling);
    Py_CLEAR(st->tls_stash);
    Py_CLEAR(st->tls_has);
    Py_CLEAR(st->tls_get);
    Py_CLEAR(st->upstream_get);
    Py_CLEAR(st->upstream_set);
}

/* Whether stash(key, obj) keeps obj without taking a reference of its own.
 * torch 2.11 does (it later drops a reference it never took, which freed our
 * objects under us); 2.13 does not.  Measured, not guessed from the version. */
static int
stash_steals(fxg_state *st, PyObject *stash)
{
    /* A fresh probe each time (a probe already stashed would be released by
     * the stash itself and spoil the count), kept alive for good in
     * st->kept_cells so that whatever torch later does with it is harmless. */
    PyObject *key = PyUnicode_FromString("fxguard.stash_probe");
    PyObject *probe = PyList_New(0);
    if (key == NULL || probe == NULL || PyList_Append(st->kept_cells, probe) < 0) {
        Py_XDECREF(key);
        Py_XDECREF(probe);
        return -1;
    }
    Py_ssize_t before = Py_REFCNT(probe);
    PyObject *r = PyObject_CallFunctionObjArgs(stash, key, probe, NULL);
    Py_DECREF(key);
    if (r == NULL) {
        Py_DECREF(probe);
        return -1;
    }
    Py_DECREF(r);
    int steals = Py_REFCNT(probe) == before;
    if (steals) {
        Py_INCREF(probe); /* the reference torch will drop when the probe is replaced */
    }
    Py_DECREF(probe);
    return steals;
}

/* _configure(mode, is_compiling=None, tls_stash=None, tls_has=None,
 *            tls_get=None, upstream_get=None, upstream_set=None)
 * Called by install()/uninstall(): which torch functions the core may use. */
static PyObject *
configure(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"mode", "is_compiling", "tls_stash", "tls_has", "tls_get",
                             "upstream_get", "upstream_set", NULL};
    int mode;
    PyObject *hooks[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "i|$OOOOOO:_configure", kwlist, &mode,
                                     &hooks[0], &hooks[1], &hooks[2], &hooks[3], &hooks[4],
                                     &hooks[5])) {
        return NULL;
    }
    if (mode < FXG_MODE_OFF || mode > FXG_MODE_UPSTREAM) {
        PyErr_Format(PyExc_ValueError, "unknown mode %d", mode);
        return NULL;
    }
    for (int i = 0; i < 6; i++) {
        if (hooks[i] == Py_None) {
            hooks[i] = NULL;
        }
        if (hooks[i] != NULL && !PyCallable_Check(hooks[i])) {
            PyErr_SetString(PyExc_TypeError, "_configure: hooks must be callables or None");
            return NULL;
        }
    }
    if (mode == FXG_MODE_UPSTREAM && (hooks[4] == NULL || hooks[5] == NULL)) {
        PyErr_SetString(PyExc_ValueError, "upstream mode needs upstream_get and upstream_set");
        return NULL;
    }
    fxg_state *st = state_of(module);
    int steals = 0;
    if (hooks[1] != NULL && (steals = stash_steals(st, hooks[1])) < 0) {
        return NULL;
    }
    clear_hooks(st);
    st->tls_stash_steals = steals;
    st->is_compiling = Py_XNewRef(hooks[0]);
    st->tls_stash = Py_XNewRef(hooks[1]);
    st->tls_has = Py_XNewRef(hooks[2]);
    st->tls_get = Py_XNewRef(hooks[3]);
    st->upstream_get = Py_XNewRef(hooks[4]);
    st->upstream_set = Py_XNewRef(hooks[5]);
    st->mode = (fxg_mode)mode;
    Py_RETURN_NONE;
}

static PyMethodDef core_methods[] = {
    {"is_fx_tracing", is_fx_tracing, METH_NOARGS,
     "is_fx_tracing() -> bool\n\nWhether the calling thread is FX tracing."},
    {"is_fx_symbolic_tracing", is_fx_symbolic_tracing, METH_NOARGS,
     "is_fx_symbolic_tracing() -> bool\n\nWhether the calling thread is FX tracing and not being\n"
     "compiled by dynamo.  Does not call into torch unless the thread is tracing."},
    {"_tracing_cells", tracing_cells, METH_NOARGS, "Number of threads whose flag is set."},
    {"_stash_steals", stash_steals_flag, METH_NOARGS,
     "Whether torch's _stash_obj_in_tls needed a compensating reference (torch 2.11)."},
    {"_mode", get_mode, METH_NOARGS, "0 off, 1 patched, 2 upstream."},
    {"_configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS, NULL},
    {NULL, NULL, 0, NULL},
};

static int
add_type(PyObject *module, PyType_Spec *spec, PyTypeObject **slot, const char *public_name)
{
    *slot = (PyTypeObject *)PyType_FromModuleAndSpec(module, spec, NULL);
    if (*slot == NULL) {
        return -1;
    }
    if (public_name != NULL) {
        return PyModule_AddObjectRef(module, public_name, (PyObject *)*slot);
    }
    return 0;
}

static int
core_exec(PyObject *module)
{
    fxg_state *st = state_of(module);
    st->mode = FXG_MODE_OFF;
    st->tracing_cells = 0;
    st->cell_key = PyUnicode_InternFromString("fxguard.trace_cell");
    st->kept_cells = PyList_New(0);
    if (st->cell_key == NULL || st->kept_cells == NULL) {
        return -1;
    }
    if (fxg_rlock_module_exec(st) < 0 ||
        add_type(module, &fxg_cell_spec, &st->cell_type, NULL) < 0 ||
        add_type(module, &fxg_fx_tracing_spec, &st->fx_tracing_type, "fx_tracing") < 0 ||
        add_type(module, &fxg_rlock_spec, &st->rlock_type, "RLock") < 0) {
        return -1;
    }
    /* The one process-wide lock around block-mask creation (meant to be shared). */
    PyObject *lock = PyObject_CallNoArgs((PyObject *)st->rlock_type);
    if (lock == NULL) {
        return -1;
    }
    int r = PyModule_AddObjectRef(module, "block_mask_lock", lock);
    Py_DECREF(lock);
    return r;
}

static int
core_traverse(PyObject *module, visitproc visit, void *arg)
{
    fxg_state *st = state_of(module);
    Py_VISIT(st->is_compiling);
    Py_VISIT(st->tls_stash);
    Py_VISIT(st->tls_has);
    Py_VISIT(st->tls_get);
    Py_VISIT(st->upstream_get);
    Py_VISIT(st->upstream_set);
    Py_VISIT(st->kept_cells);
    Py_VISIT(st->cell_type);
    Py_VISIT(st->fx_tracing_type);
    Py_VISIT(st->rlock_type);
    Py_VISIT(st->rlock_registry);
    return 0;
}

static int
core_clear(PyObject *module)
{
    fxg_state *st = state_of(module);
    clear_hooks(st);
    Py_CLEAR(st->cell_key);
    Py_CLEAR(st->kept_cells);
    Py_CLEAR(st->cell_type);
    Py_CLEAR(st->fx_tracing_type);
    Py_CLEAR(st->rlock_type);
    Py_CLEAR(st->rlock_registry);
    return 0;
}

static void
core_free(void *module)
{
    core_clear((PyObject *)module);
}

static PyModuleDef_Slot core_slots[] = {
    {Py_mod_exec, core_exec},
    {0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fxguard._core",
    .m_doc = "C core of fxguard: per-thread FX-tracing state and a GIL-releasing RLock.",
    .m_size = sizeof(fxg_state),
    .m_methods = core_methods,
    .m_slots = core_slots,
    .m_traverse = core_traverse,
    .m_clear = core_clear,
    .m_free = core_free,
};

PyMODINIT_FUNC
PyInit__core(void)
{
    return PyModuleDef_Init(&core_module);
}
