/* Thread records: the type, and finding the calling thread's record (the
 * lookup fxguard.h describes). */
#include "fxguard.h"

/* -- the record type -------------------------------------------------------- */

static int
record_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(((fxg_record *)self)->values);
    Py_VISIT(((fxg_record *)self)->context);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int
record_clear(PyObject *self)
{
    Py_CLEAR(((fxg_record *)self)->values);
    Py_CLEAR(((fxg_record *)self)->context);
    return 0;
}

static void
record_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    /* A record that dies set (its thread ended mid-trace) must not keep the
     * "someone is tracing" count up forever.  (No other thread has it now.) */
    if (((fxg_record *)self)->flag) {
        fxg_state *st = fxg_state_of_type(tp);
        if (st != NULL && ((fxg_record *)self)->forks == st->records.forks) {
            FXG_ADD_SSIZE(&st->records.tracing, -1);
        }
    }
    record_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyObject *
record_repr(PyObject *self)
{
    fxg_record *r = (fxg_record *)self;
    PyObject *values = fxg_record_values(r);
    if (values == NULL) {
        return NULL;
    }
    PyObject *repr = PyUnicode_FromFormat("<fxguard thread record tracing=%s worker=%d values=%R>",
                                          FXG_LOAD_INT(&r->flag) ? "True" : "False", r->worker,
                                          values);
    Py_DECREF(values);
    return repr;
}

static PyType_Slot record_slots[] = {
    {Py_tp_dealloc, record_dealloc},
    {Py_tp_traverse, record_traverse},
    {Py_tp_clear, record_clear},
    {Py_tp_repr, record_repr},
    {Py_tp_doc, "One thread's trace state (internal)."},
    {0, NULL},
};

PyType_Spec fxg_record_spec = {
    .name = "fxguard._core.ThreadRecord",
    .basicsize = sizeof(fxg_record),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = record_slots,
};

/* -- slot values --------------------------------------------------------------- */

/* Fresh initial values for slots [start, len(defaults)) (a new list). */
static PyObject *
initial_values(PyObject *defaults, PyObject *factories, Py_ssize_t start)
{
    Py_ssize_t n = defaults ? PyTuple_GET_SIZE(defaults) : 0;
    PyObject *values = PyList_New(n > start ? n - start : 0);
    for (Py_ssize_t i = start; values != NULL && i < n; i++) {
        PyObject *factory = PyTuple_GET_ITEM(factories, i);
        PyObject *v = factory == Py_None ? Py_NewRef(PyTuple_GET_ITEM(defaults, i))
                                         : PyObject_CallNoArgs(factory);
        if (v == NULL) {
            Py_CLEAR(values);
            break;
        }
        PyList_SET_ITEM(values, i - start, v);
    }
    return values;
}

/* How many of rec's values the layout of `epoch` keeps: all of them when rec
 * has a layout of the same _configure() (slots were only added since). */
static Py_ssize_t
kept_values(fxg_record *rec, uint64_t base_epoch)
{
    return rec->epoch >= base_epoch && rec->values != NULL ? PyList_GET_SIZE(rec->values) : 0;
}

/* Bring a record made under an earlier layout to the current one. */
static int
refresh_layout(fxg_state *st, fxg_record *rec)
{
    if (fxg_layout_is_current(st, rec)) {
        return 0;
    }
    uint64_t epoch, base;
    PyObject *defaults, *factories;
    fxg_config_layout(st, &epoch, &base, &defaults, &factories);
    Py_ssize_t keep;
    FXG_BEGIN_CRITICAL_SECTION(rec);
    keep = kept_values(rec, base);
    FXG_END_CRITICAL_SECTION();
    PyObject *fresh = initial_values(defaults, factories, keep); /* factories run any code */
    Py_XDECREF(defaults);
    Py_XDECREF(factories);
    if (fresh == NULL) {
        return -1;
    }
    PyObject *old = NULL;
    int r = 0;
    FXG_BEGIN_CRITICAL_SECTION(rec);
    /* another thread acting for rec may have been first */
    if (rec->epoch < epoch && kept_values(rec, base) == keep) {
        if (keep > 0) { /* appended: nothing let go of inside the section */
            r = PyList_SetSlice(rec->values, keep, keep, fresh);
        }
        else {
            old = rec->values;
            rec->values = Py_NewRef(fresh);
        }
        if (r == 0) {
            FXG_STORE_UINT64(&rec->epoch, epoch);
        }
    }
    FXG_END_CRITICAL_SECTION();
    Py_DECREF(fresh); /* outside the section: finalizers may run any code */
    Py_XDECREF(old);
    return r;
}

int
fxg_record_set_value(fxg_record *rec, Py_ssize_t index, PyObject *value)
{
    PyObject *old = NULL;
    int r = 0;
    FXG_BEGIN_CRITICAL_SECTION(rec);
    if (index < PyList_GET_SIZE(rec->values)) {
        old = PyList_GET_ITEM(rec->values, index);
        PyList_SET_ITEM(rec->values, index, Py_NewRef(value));
    }
    else {
        r = -1;
    }
    FXG_END_CRITICAL_SECTION();
    Py_XDECREF(old);
    if (r < 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "fxguard: a SlotView from an earlier install() was used");
    }
    return r;
}

PyObject *
fxg_record_values(fxg_record *rec)
{
    PyObject *copy;
    FXG_BEGIN_CRITICAL_SECTION(rec);
    copy = rec->values != NULL ? PyList_GetSlice(rec->values, 0, PyList_GET_SIZE(rec->values))
                               : PyList_New(0);
    FXG_END_CRITICAL_SECTION();
    return copy;
}

/* A Python thread's record notes the thread's current Context, where torch
 * (2.12+) keeps config overrides: a worker running this thread's backward
 * reads them there.  A pointer compare unless the thread switched contexts
 * (only this thread writes rec->context: it reads it without the section). */
static void
note_context(fxg_state *st, fxg_record *rec)
{
    PyObject *context = fxg_context_to_note(st, PyThreadState_Get());
    if (context == rec->context) {
        return;
    }
    PyObject *old;
    FXG_BEGIN_CRITICAL_SECTION(rec);
    old = rec->context;
    rec->context = Py_XNewRef(context);
    FXG_END_CRITICAL_SECTION();
    Py_XDECREF(old);
}

/* -- finding the calling thread's record ------------------------------------ */

fxg_record *
fxg_own_record_uncached(fxg_state *st)
{
    PyObject *tsdict = PyThreadState_GetDict();
    if (tsdict == NULL) {
        return NULL;
    }
    /* Borrowed: only this thread changes its thread-state dict. */
    PyObject *rec = PyDict_GetItemWithError(tsdict, st->str.record_key);
#if FXG_RECORD_CACHE
    if (rec != NULL) {
        Py_XSETREF(st->records.cached, Py_NewRef(rec));
        st->records.cached_id = PyThreadState_Get()->id; /* the field: one call less per read */
    }
#endif
    return (fxg_record *)rec;
}

int
fxg_record_is_cached(fxg_state *st, PyObject *obj)
{
#if FXG_RECORD_CACHE
    return obj == st->records.cached;
#else
    (void)st;
    (void)obj;
    return 0;
#endif
}

/* Whether Python started this thread (threading.Thread or the main thread)
 * rather than torch (an autograd worker: C++, or a _DummyThread). */
static int
started_by_python(fxg_state *st)
{
    PyObject *threading = PyImport_Import(st->str.threading);
    if (threading == NULL) {
        return -1;
    }
    PyObject *active = PyObject_GetAttr(threading, st->str.threading_active);
    PyObject *dummy = PyObject_GetAttr(threading, st->str.dummy_thread);
    Py_DECREF(threading);
    PyObject *ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    int result = -1;
    if (active != NULL && dummy != NULL && ident != NULL) {
        PyObject *thread = NULL; /* a strong reference: other threads change _active */
        int found = PyDict_Check(active) ? fxg_dict_get_ref(active, ident, &thread) : 0;
        if (found > 0) {
            int is_dummy = PyObject_IsInstance(thread, dummy);
            result = is_dummy < 0 ? -1 : !is_dummy;
            Py_DECREF(thread);
        }
        else {
            result = found;
        }
    }
    Py_XDECREF(active);
    Py_XDECREF(dummy);
    Py_XDECREF(ident);
    return result;
}

fxg_record *
fxg_make_own_record(fxg_state *st)
{
    PyObject *tsdict = PyThreadState_GetDict();
    if (tsdict == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "fxguard: no thread state dict");
        return NULL;
    }
    int python_thread = started_by_python(st);
    if (python_thread < 0) {
        return NULL;
    }
    fxg_record *rec = PyObject_GC_New(fxg_record, st->types.record);
    if (rec == NULL) {
        return NULL;
    }
    rec->flag = rec->kept = rec->published = 0;
    rec->worker = !python_thread;
    rec->forks = st->records.forks;
    uint64_t base;
    PyObject *defaults, *factories;
    fxg_config_layout(st, &rec->epoch, &base, &defaults, &factories);
    rec->values = initial_values(defaults, factories, 0);
    Py_XDECREF(defaults);
    Py_XDECREF(factories);
    rec->context = NULL;
    PyObject_GC_Track((PyObject *)rec);
    if (rec->values == NULL ||
        PyDict_SetItem(tsdict, st->str.record_key, (PyObject *)rec) < 0) {
        Py_DECREF(rec);
        return NULL;
    }
    return rec;
}

/* Whose record the calling thread's reads and writes go to (new reference):
 * a Python thread's own; a worker acts for the thread whose graph task it
 * runs, and with none carried in, for itself.  A thread without a record gets
 * one first (worker or not is decided once), so that a Python thread's later
 * calls find it at once.  *own_python: it is the calling Python thread's own. */
fxg_record *
fxg_acting_record(fxg_state *st, int *own_python)
{
    fxg_record *own = fxg_own_record(st);
    if (own != NULL) {
        Py_INCREF(own);
    }
    else if (PyErr_Occurred() || (own = fxg_make_own_record(st)) == NULL) {
        return NULL;
    }
    *own_python = !own->worker;
    if (*own_python) {
        return own;
    }
    fxg_record *carried = fxg_carried_record(st);
    if (carried != NULL || PyErr_Occurred()) {
        Py_DECREF(own);
        return carried;
    }
    return own;
}

fxg_record *
fxg_record_for(fxg_state *st)
{
    int own_python;
    fxg_record *rec = fxg_acting_record(st, &own_python);
    if (rec == NULL) {
        return NULL;
    }
    if (own_python) {
        note_context(st, rec);
    }
    /* A record made before install() is published on its first use after. */
    if (refresh_layout(st, rec) < 0 || fxg_publish(st, rec) < 0) {
        Py_DECREF(rec);
        return NULL;
    }
    return rec;
}

/* A child of fork() has one thread.  The others' records may live on (in
 * their leaked frames, in torch's thread-locals), but their flags must not
 * keep counting as traces in progress: uninstall() would refuse for good.
 * Records made before this fork stop counting; the forking thread's own is
 * moved to the new count. */
int
fxg_records_after_fork(fxg_state *st)
{
    st->records.forks++;
#if FXG_RECORD_CACHE
    Py_CLEAR(st->records.cached);
#endif
    st->records.tracing = 0;
    fxg_record *own = fxg_own_record(st);
    if (own == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    own->forks = st->records.forks;
    st->records.tracing = own->flag;
    return 0;
}
