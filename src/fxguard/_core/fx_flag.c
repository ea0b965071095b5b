/* The FX-tracing flag: its readers (is_fx_tracing, is_fx_symbolic_tracing)
 * and its writer, by mode (fxguard.h's fxg_mode). */
#include "fxguard.h"

/* Without the GIL several threads may set one record's flag (its own, a
 * worker acting for it): the exchange gives each change to one of them,
 * which moves the count. */
int
fxg_record_set_flag(fxg_state *st, fxg_record *rec, int value)
{
    value = value != 0;
    int old = FXG_EXCHANGE_INT(&rec->flag, value);
    if (old != value && rec->forks == st->records.forks) {
        FXG_ADD_SSIZE(&st->records.tracing, value ? 1 : -1);
    }
    return old;
}

fxg_record *
fxg_thread_set_tracing(fxg_state *st, int value, int *prev)
{
    fxg_record *rec = fxg_record_for(st);
    if (rec == NULL) {
        return NULL;
    }
    *prev = fxg_record_set_flag(st, rec, value);
    return rec;
}

/* -- reading it --------------------------------------------------------------- */

static int
call_truth(PyObject *fn)
{
    PyObject *r = PyObject_CallNoArgs(fn);
    if (r == NULL) {
        return -1;
    }
    int t = PyObject_IsTrue(r);
    Py_DECREF(r);
    return t;
}

/* `module.attr` if that module is loaded (never imports it), as a new
 * reference; NULL without error if the module or attribute is missing. */
static PyObject *
loaded_attr(PyObject *module, PyObject *attr)
{
    PyObject *mod = PyImport_GetModule(module);
    if (mod == NULL) {
        return NULL;
    }
    PyObject *value = PyObject_GetAttr(mod, attr);
    Py_DECREF(mod);
    if (value == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
    }
    return value;
}

/* Not installed: a thread inside fxguard.fx_tracing() says so itself;
 * otherwise stock torch's module global tells the truth. */
static int
flag_not_installed(fxg_state *st)
{
    fxg_record *own = fxg_own_record(st);
    if (own == NULL && PyErr_Occurred()) {
        return -1;
    }
    if (own != NULL && FXG_LOAD_INT(&own->flag)) {
        return 1;
    }
    PyObject *flag = loaded_attr(st->str.symbolic_trace, st->str.fx_flag);
    if (flag == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    int r = PyObject_IsTrue(flag);
    Py_DECREF(flag);
    return r;
}

/* Installed, and the calling thread is not a Python thread with its record:
 * it has no record yet, or it is an autograd worker (fxg_acting_record). */
static int
flag_patched_slow(fxg_state *st)
{
    if (FXG_LOAD_SSIZE(&st->records.tracing) == 0) {
        return 0; /* nobody traces: nothing can have been carried here */
    }
    int own_python;
    fxg_record *rec = fxg_acting_record(st, &own_python);
    if (rec == NULL) {
        return -1;
    }
    int r = FXG_LOAD_INT(&rec->flag);
    Py_DECREF(rec);
    return r;
}

/* torch keeps the flag per thread itself.  (Without the GIL, uninstall() may
 * have just cleared the hook: then the flag is as when not installed.) */
static int
flag_upstream(fxg_state *st)
{
    PyObject *get = fxg_config_ref(st, &st->config.upstream_get);
    if (get == NULL) {
        return flag_not_installed(st);
    }
    int r = call_truth(get);
    Py_DECREF(get);
    return r;
}

int
fxg_thread_is_tracing(fxg_state *st)
{
    switch (fxg_config_mode(st)) {
    case FXG_MODE_PATCHED: {
        fxg_record *own = fxg_own_record(st);
        if (own != NULL && !own->worker) {
            return FXG_LOAD_INT(&own->flag); /* the hot path: a Python thread's own record */
        }
        if (own == NULL && PyErr_Occurred()) {
            return -1;
        }
        return flag_patched_slow(st);
    }
    case FXG_MODE_UPSTREAM:
        return flag_upstream(st);
    default:
        return flag_not_installed(st);
    }
}

static int
torch_is_compiling(fxg_state *st)
{
    PyObject *fn = fxg_config_ref(st, &st->config.is_compiling);
    if (fn == NULL) {
        /* Not installed: use torch.compiler.is_compiling if torch is loaded. */
        fn = loaded_attr(st->str.torch_compiler, st->str.is_compiling);
    }
    if (fn == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    int r = call_truth(fn);
    Py_DECREF(fn);
    return r;
}

int
fxg_thread_is_symbolic_tracing(fxg_state *st)
{
    int tracing = fxg_thread_is_tracing(st);
    if (tracing <= 0) {
        return tracing; /* the common case: torch is never called */
    }
    int compiling = torch_is_compiling(st);
    return compiling < 0 ? -1 : !compiling;
}
