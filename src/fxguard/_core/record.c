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
     * "someone is tracing" count up forever. */
    if (((fxg_record *)self)->flag) {
        fxg_state *st = fxg_state_of_type(tp);
        if (st != NULL && ((fxg_record *)self)->forks == st->records.forks) {
            st->records.tracing--;
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
    return PyUnicode_FromFormat("<fxguard thread record tracing=%s worker=%d values=%R>",
                                r->flag ? "True" : "False", r->worker,
                                r->values ? r->values : Py_None);
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

/* A list of fresh initial values for the slots of the current _configure(). */
static PyObject *
initial_values(fxg_state *st)
{
    PyObject *defaults = st->config.defaults, *factories = st->config.factories;
    Py_ssize_t n = defaults ? PyTuple_GET_SIZE(defaults) : 0;
    PyObject *values = PyList_New(n);
    if (values == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *factory = PyTuple_GET_ITEM(factories, i);
        PyObject *v = factory == Py_None ? Py_NewRef(PyTuple_GET_ITEM(defaults, i))
                                         : PyObject_CallNoArgs(factory);
        if (v == NULL) {
            Py_DECREF(values);
            return NULL;
        }
        PyList_SET_ITEM(values, i, v);
    }
    return values;
}

/* Bring a record made under an earlier _configure() to this one's layout. */
static int
refresh_layout(fxg_state *st, fxg_record *rec)
{
    if (fxg_layout_is_current(st, rec)) {
        return 0;
    }
    PyObject *values = initial_values(st);
    if (values == NULL) {
        return -1;
    }
    Py_XSETREF(rec->values, values);
    rec->epoch = st->config.epoch;
    return 0;
}

/* A Python thread's record notes the thread's current Context, where torch
 * (2.12+) keeps config overrides: a worker running this thread's backward
 * reads them there.  A pointer compare unless the thread switched contexts. */
static void
note_context(fxg_state *st, fxg_record *rec)
{
    PyObject *context = fxg_context_to_note(st, PyThreadState_Get());
    if (context != rec->context) {
        Py_XSETREF(rec->context, Py_XNewRef(context));
    }
}

/* -- finding the calling thread's record ------------------------------------ */

fxg_record *
fxg_own_record_uncached(fxg_state *st)
{
    uint64_t id = PyThreadState_Get()->id; /* the field: one call less per read */
    PyObject *tsdict = PyThreadState_GetDict();
    if (tsdict == NULL) {
        return NULL;
    }
    PyObject *rec = PyDict_GetItemWithError(tsdict, st->str.record_key);
    if (rec != NULL) {
        Py_XSETREF(st->records.cached, Py_NewRef(rec));
        st->records.cached_id = id;
    }
    return (fxg_record *)rec;
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
        PyObject *thread = PyDict_Check(active) ? PyDict_GetItemWithError(active, ident) : NULL;
        if (thread != NULL) {
            int is_dummy = PyObject_IsInstance(thread, dummy);
            result = is_dummy < 0 ? -1 : !is_dummy;
        }
        else {
            result = PyErr_Occurred() ? -1 : 0;
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
    rec->epoch = st->config.epoch;
    rec->forks = st->records.forks;
    rec->values = initial_values(st);
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
 * runs, and with none carried in, for itself.  *own_python: it is the
 * calling Python thread's own. */
static fxg_record *
acting_record(fxg_state *st, int *own_python)
{
    fxg_record *own = fxg_own_record(st);
    if (own == NULL && PyErr_Occurred()) {
        return NULL;
    }
    *own_python = own != NULL && !own->worker;
    if (*own_python) {
        return (fxg_record *)Py_NewRef(own);
    }
    fxg_record *carried = fxg_carried_record(st);
    if (carried != NULL || PyErr_Occurred()) {
        return carried;
    }
    if (own != NULL) {
        return (fxg_record *)Py_NewRef(own);
    }
    own = fxg_make_own_record(st);
    *own_python = own != NULL && !own->worker;
    return own;
}

fxg_record *
fxg_record_for(fxg_state *st)
{
    int own_python;
    fxg_record *rec = acting_record(st, &own_python);
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
    Py_CLEAR(st->records.cached);
    st->records.tracing = 0;
    fxg_record *own = fxg_own_record(st);
    if (own == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    own->forks = st->records.forks;
    st->records.tracing = own->flag;
    return 0;
}
