/* fx_tracing(active=True): set the calling thread's FX-tracing flag for the
 * duration of a with-block and put back the previous value on exit, also when
 * the block raises.  Each object is one scope: it restores the very record it
 * wrote, so nesting (with fresh objects) unwinds exactly.
 *
 * Without the GIL, two threads could use one object at once (a misuse): the
 * object's critical section makes `entered` a claim that only one of them
 * gets, and guards the fields written with it. */
#include "fxguard.h"

typedef struct {
    PyObject_HEAD
    int active;
    int entered;
    int prev;
    fxg_record *record;      /* written record (own or carried-in); NULL in upstream mode */
    PyObject *upstream_prev; /* previous upstream value; upstream mode only */
    PyObject *upstream_set;  /* the setter used on enter, kept for exit */
} FxTracingObject;

static PyObject *
fx_tracing_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"active", NULL};
    PyObject *arg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:fx_tracing", kwlist, &arg)) {
        return NULL;
    }
    /* A bool or an int (anything with __index__), as threading's
     * acquire(blocking=) takes up to Python 3.11 (3.12's bool parameters take
     * any object by truthiness): fx_tracing("no") must not mean True. */
    int active = 1;
    if (arg != NULL) {
        PyObject *index = PyNumber_Index(arg);
        if (index == NULL) {
            return NULL;
        }
        active = PyObject_IsTrue(index);
        Py_DECREF(index);
    }
    FxTracingObject *self = (FxTracingObject *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->active = active;
    }
    return (PyObject *)self;
}

static int
fx_tracing_traverse(PyObject *self, visitproc visit, void *arg)
{
    FxTracingObject *o = (FxTracingObject *)self;
    Py_VISIT(o->record);
    Py_VISIT(o->upstream_prev);
    Py_VISIT(o->upstream_set);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int
fx_tracing_clear(PyObject *self)
{
    FxTracingObject *o = (FxTracingObject *)self;
    Py_CLEAR(o->record);
    Py_CLEAR(o->upstream_prev);
    Py_CLEAR(o->upstream_set);
    return 0;
}

static void
fx_tracing_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    fx_tracing_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* Claim the object for a with-block (1), or 0 if it is in use (entering)
 * or, for !entering, not entered. */
static int
claim(FxTracingObject *o, int entering)
{
    int ok;
    FXG_BEGIN_CRITICAL_SECTION(o);
    ok = o->entered != entering;
    if (ok) {
        o->entered = entering;
    }
    FXG_END_CRITICAL_SECTION();
    return ok;
}

/* Upstream mode: torch's own setter, with the previous value kept for exit.
 * 1 done, 0 not in upstream mode (any more), -1 error. */
static int
enter_upstream(FxTracingObject *o, fxg_state *st)
{
    if (fxg_config_mode(st) != FXG_MODE_UPSTREAM) {
        return 0;
    }
    PyObject *get = fxg_config_ref(st, &st->config.upstream_get);
    PyObject *set = fxg_config_ref(st, &st->config.upstream_set); /* kept: uninstall() clears st's */
    PyObject *prev = get != NULL && set != NULL ? PyObject_CallNoArgs(get) : NULL;
    PyObject *r = prev != NULL ? PyObject_CallOneArg(set, o->active ? Py_True : Py_False) : NULL;
    int done = get != NULL && set != NULL ? (r != NULL ? 1 : -1) : 0;
    Py_XDECREF(get);
    Py_XDECREF(r);
    if (done == 1) {
        FXG_BEGIN_CRITICAL_SECTION(o);
        o->upstream_prev = prev;
        o->upstream_set = set;
        FXG_END_CRITICAL_SECTION();
        return 1;
    }
    Py_XDECREF(prev);
    Py_XDECREF(set);
    return done;
}

static PyObject *
fx_tracing_enter(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    FxTracingObject *o = (FxTracingObject *)self;
    fxg_state *st = fxg_state_of_type(Py_TYPE(self));
    if (st == NULL) {
        return NULL;
    }
    if (!claim(o, 1)) {
        PyErr_SetString(PyExc_RuntimeError,
                        "fx_tracing() object is already in use; create a new one per with-block");
        return NULL;
    }
    int upstream = enter_upstream(o, st);
    if (upstream == 0) {
        int prev;
        fxg_record *rec = fxg_thread_set_tracing(st, o->active, &prev);
        if (rec != NULL) {
            FXG_BEGIN_CRITICAL_SECTION(o);
            o->record = rec;
            o->prev = prev;
            FXG_END_CRITICAL_SECTION();
        }
        upstream = rec != NULL ? 0 : -1;
    }
    if (upstream < 0) {
        claim(o, 0);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
fx_tracing_exit(PyObject *self, PyObject *const *Py_UNUSED(args), Py_ssize_t Py_UNUSED(nargs))
{
    FxTracingObject *o = (FxTracingObject *)self;
    fxg_state *st = fxg_state_of_type(Py_TYPE(self));
    if (st == NULL) {
        return NULL;
    }
    fxg_record *rec;
    PyObject *prev, *setter;
    int prev_flag, entered;
    FXG_BEGIN_CRITICAL_SECTION(o);
    entered = o->entered;
    o->entered = 0;
    rec = o->record;
    prev_flag = o->prev;
    prev = o->upstream_prev;
    setter = o->upstream_set;
    o->record = NULL;
    o->upstream_prev = o->upstream_set = NULL;
    FXG_END_CRITICAL_SECTION();
    if (!entered) {
        PyErr_SetString(PyExc_RuntimeError, "fx_tracing() exited without being entered");
        return NULL;
    }
    if (rec != NULL) {
        fxg_record_set_flag(st, rec, prev_flag);
        Py_DECREF(rec);
    }
    else if (prev != NULL) {
        PyObject *r = PyObject_CallOneArg(setter, prev);
        Py_DECREF(prev);
        Py_DECREF(setter);
        if (r == NULL) {
            return NULL;
        }
        Py_DECREF(r);
    }
    Py_RETURN_FALSE; /* never swallow the block's exception */
}

static PyObject *
fx_tracing_repr(PyObject *self)
{
    FxTracingObject *o = (FxTracingObject *)self;
    return PyUnicode_FromFormat("fxguard.fx_tracing(active=%s)", o->active ? "True" : "False");
}

static PyMethodDef fx_tracing_methods[] = {
    {"__enter__", fx_tracing_enter, METH_NOARGS,
     "__enter__($self, /)\n--\n\nSet the calling thread's flag; remember the old value."},
    {"__exit__", (PyCFunction)(void (*)(void))fx_tracing_exit, METH_FASTCALL,
     "__exit__($self, /, *exc_info)\n--\n\nRestore the value __enter__ found."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot fx_tracing_slots[] = {
    {Py_tp_new, fx_tracing_new},
    {Py_tp_dealloc, fx_tracing_dealloc},
    {Py_tp_traverse, fx_tracing_traverse},
    {Py_tp_clear, fx_tracing_clear},
    {Py_tp_methods, fx_tracing_methods},
    {Py_tp_repr, fx_tracing_repr},
    {Py_tp_doc,
     "fx_tracing(active=True)\n--\n\n"
     "Context manager: set the calling thread's FX-tracing flag inside the\n"
     "with-block and restore the previous value on exit (also on exceptions).\n"
     "active: a bool or an int (anything else: TypeError)."},
    {0, NULL},
};

PyType_Spec fxg_fx_tracing_spec = {
    .name = "fxguard._core.fx_tracing",
    .basicsize = sizeof(FxTracingObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = fx_tracing_slots,
};
