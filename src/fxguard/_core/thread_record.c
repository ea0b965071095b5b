/* Per-thread records of torch's trace state, and the FX-flag readers on them. */
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
        if (st != NULL && ((fxg_record *)self)->forks == st->forks) {
            st->tracing_records--;
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

void
fxg_record_set_flag(fxg_state *st, fxg_record *rec, int value)
{
    value = value != 0;
    if (rec->flag != value) {
        if (rec->forks == st->forks) {
            st->tracing_records += value ? 1 : -1;
        }
        rec->flag = value;
    }
}

/* -- slot values --------------------------------------------------------------- */

/* A list of fresh initial values for the slots of the current install(). */
static PyObject *
initial_values(fxg_state *st)
{
    Py_ssize_t n = st->defaults ? PyTuple_GET_SIZE(st->defaults) : 0;
    PyObject *values = PyList_New(n);
    if (values == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *factory = PyTuple_GET_ITEM(st->factories, i);
        PyObject *v = factory == Py_None ? Py_NewRef(PyTuple_GET_ITEM(st->defaults, i))
                                         : PyObject_CallNoArgs(factory);
        if (v == NULL) {
            Py_DECREF(values);
            return NULL;
        }
        PyList_SET_ITEM(values, i, v);
    }
    return values;
}

/* Bring a record made under an earlier install() to this one's layout. */
static int
refresh(fxg_state *st, fxg_record *rec)
{
    if (rec->epoch == st->epoch) {
        return 0;
    }
    PyObject *values = initial_values(st);
    if (values == NULL) {
        return -1;
    }
    Py_XSETREF(rec->values, values);
    rec->epoch = st->epoch;
    return 0;
}

/* -- finding the calling thread's record ------------------------------------ */

/* The thread's own record, borrowed; NULL without error if it has none. */
static fxg_record *
own_record(fxg_state *st)
{
    uint64_t id = PyThreadState_Get()->id; /* the field: one call less per read */
    if (st->cached_record != NULL && st->cached_id == id) {
        return (fxg_record *)st->cached_record;
    }
    PyObject *tsdict = PyThreadState_GetDict();
    if (tsdict == NULL) {
        return NULL;
    }
    PyObject *rec = PyDict_GetItemWithError(tsdict, st->record_key);
    if (rec != NULL) {
        Py_XSETREF(st->cached_record, Py_NewRef(rec));
        st->cached_id = id;
    }
    return (fxg_record *)rec;
}

/* The record torch's thread-local state carries into this thread (an
 * autograd worker running another thread's backward), as a new reference;
 * NULL without error if none. */
static fxg_record *
carried_record(fxg_state *st)
{
    if (st->tls_has == NULL || st->tls_get == NULL || st->published == 0) {
        return NULL;
    }
    PyObject *has = PyObject_CallOneArg(st->tls_has, st->record_key);
    if (has == NULL) {
        return NULL;
    }
    int present = PyObject_IsTrue(has);
    Py_DECREF(has);
    if (present <= 0) {
        return NULL;
    }
    PyObject *rec = PyObject_CallOneArg(st->tls_get, st->record_key);
    if (rec != NULL && !Py_IS_TYPE(rec, st->record_type)) {
        Py_CLEAR(rec); /* someone else's object under our key: ignore it */
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

/* -- what torch 2.11's stash holds ------------------------------------------- */

/* torch 2.11's _stash_obj_in_tls keeps an object without taking a reference
 * and drops one later: when the key is stashed again, or when the thread's
 * C++ thread-locals are destroyed at thread exit (and graph tasks that copied
 * them are gone).  fxguard gives it that reference (publish) and holds the
 * object in st->kept as well, so torch's drop is never the last one and never
 * runs a dealloc from C++ thread-exit code.  Once torch has dropped it, the
 * list's is the only reference left (refcount 1): nothing, torch included,
 * can reach the object, and the list lets it go.  Swept when the list has
 * doubled since the last sweep: amortised O(1) per keep, and the list stays
 * within twice what torch still holds (live threads, pending graph tasks). */
#define KEPT_SWEEP_MIN 64

int
fxg_sweep_kept(fxg_state *st)
{
    PyObject *old = st->kept;
    PyObject *survivors = PyList_New(0);
    if (survivors == NULL) {
        return -1;
    }
    /* The loop runs no Python code (appends only resize), so `old` stays st->kept. */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(old); i++) {
        PyObject *obj = PyList_GET_ITEM(old, i);
        if (Py_REFCNT(obj) > 1 && PyList_Append(survivors, obj) < 0) {
            Py_DECREF(survivors);
            return -1;
        }
    }
    st->kept = survivors;
    st->kept_sweep_at = 2 * PyList_GET_SIZE(survivors);
    if (st->kept_sweep_at < KEPT_SWEEP_MIN) {
        st->kept_sweep_at = KEPT_SWEEP_MIN;
    }
    /* Last, with st consistent: freeing a record frees its slot values,
     * whose finalizers may run any code, this module's included. */
    Py_DECREF(old);
    return 0;
}

int
fxg_keep(fxg_state *st, PyObject *obj)
{
    if (PyList_Append(st->kept, obj) < 0) {
        return -1;
    }
    return PyList_GET_SIZE(st->kept) >= st->kept_sweep_at ? fxg_sweep_kept(st) : 0;
}

/* Records whose thread has ended in Python while torch's C++
 * thread-locals still hold them: only `kept` and torch have a reference (one
 * more if it is the cached record).  Those thread-locals are destroyed when the
 * OS thread finishes exiting; if the interpreter is finalizing by then, torch's
 * decref takes the GIL, CPython ends the thread inside that destructor, and
 * std::terminate aborts the process.  Exit handlers wait for them instead. */
Py_ssize_t
fxg_exiting_records(fxg_state *st)
{
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(st->kept); i++) {
        PyObject *obj = PyList_GET_ITEM(st->kept, i);
        if (Py_IS_TYPE(obj, st->record_type) && ((fxg_record *)obj)->published &&
            Py_REFCNT(obj) - 1 - (obj == st->cached_record) == 1) {
            n++;
        }
    }
    return n;
}

/* Hand a Python thread's record to torch's thread-local objects, so graph
 * tasks started from this thread carry it into autograd workers. */
static int
publish(fxg_state *st, fxg_record *rec)
{
    if (st->tls_stash == NULL || rec->published || rec->worker) {
        return 0;
    }
    PyObject *r = PyObject_CallFunctionObjArgs(st->tls_stash, st->record_key, (PyObject *)rec, NULL);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    rec->published = 1;
    if (st->tls_stash_steals) {
        Py_INCREF(rec); /* torch 2.11: give it the reference it will drop */
    }
    /* Kept on every torch: on 2.11 so torch's drop is never the last (see
     * fxg_keep), everywhere so the exit handler finds records whose thread
     * ended while torch's thread-locals still hold them (fxg_exiting_records). */
    if (!rec->kept && fxg_keep(st, (PyObject *)rec) == 0) {
        rec->kept = 1;
    }
    PyErr_Clear(); /* a failed keep only costs the safety margin */
    st->published++;
    return 0;
}

static fxg_record *
new_own_record(fxg_state *st)
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
    fxg_record *rec = PyObject_GC_New(fxg_record, st->record_type);
    if (rec == NULL) {
        return NULL;
    }
    rec->flag = rec->kept = rec->published = 0;
    rec->worker = !python_thread;
    rec->epoch = st->epoch;
    rec->forks = st->forks;
    rec->values = initial_values(st);
    rec->context = NULL;
    PyObject_GC_Track((PyObject *)rec);
    if (rec->values == NULL || PyDict_SetItem(tsdict, st->record_key, (PyObject *)rec) < 0) {
        Py_DECREF(rec);
        return NULL;
    }
    return rec;
}

/* A Python thread's record notes the thread's current Context, where torch
 * (2.12+) keeps config overrides: a worker running this thread's backward
 * reads them there.  A pointer compare unless the thread switched contexts. */
static void
note_context(fxg_state *st, fxg_record *rec)
{
    PyObject *context = st->carry_context ? PyThreadState_Get()->context : NULL;
    if (context != rec->context) {
        Py_XSETREF(rec->context, Py_XNewRef(context));
    }
}

/* A child of fork() has one thread.  The others' records may live on (in
 * their leaked frames, in torch's thread-locals), but their flags must not
 * keep counting as traces in progress: uninstall() would refuse for good.
 * Records made before this fork stop counting; the forking thread's own is
 * moved to the new count. */
int
fxg_records_after_fork(fxg_state *st)
{
    st->forks++;
    Py_CLEAR(st->cached_record);
    st->tracing_records = 0;
    fxg_record *own = own_record(st);
    if (own == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    own->forks = st->forks;
    st->tracing_records = own->flag;
    return 0;
}

fxg_record *
fxg_record_for(fxg_state *st)
{
    fxg_record *own = own_record(st);
    if (own == NULL && PyErr_Occurred()) {
        return NULL;
    }
    if (own != NULL && !own->worker) {
        /* The common case: a Python thread with its record. */
        Py_INCREF(own);
        note_context(st, own);
    }
    else {
        /* A worker acts for the thread whose graph task it runs; with none
         * carried in, for itself. */
        fxg_record *carried = carried_record(st);
        if (carried != NULL) {
            own = carried;
        }
        else if (PyErr_Occurred()) {
            return NULL;
        }
        else if (own != NULL) {
            Py_INCREF(own);
        }
        else if ((own = new_own_record(st)) == NULL) {
            return NULL;
        }
        else if (!own->worker) {
            note_context(st, own);
        }
    }
    /* A record made before install() is published on its first use after. */
    if (refresh(st, own) < 0 || publish(st, own) < 0) {
        Py_DECREF(own);
        return NULL;
    }
    return own;
}

PyObject *
fxg_carried_context(fxg_state *st)
{
    fxg_record *own = own_record(st);
    if (own != NULL && !own->worker) {
        Py_RETURN_NONE; /* a Python thread runs its own backward */
    }
    if (own == NULL && PyErr_Occurred()) {
        return NULL;
    }
    fxg_record *carried = carried_record(st);
    if (carried == NULL) {
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    }
    PyObject *context = carried->context != NULL ? carried->context : Py_None;
    Py_INCREF(context);
    Py_DECREF(carried);
    return context;
}

/* -- the FX flag ---------------------------------------------------------------- */

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

/* Stock torch's module global, read when fxguard is not installed so that
 * fxguard.is_fx_tracing() still tells the truth. */
static int
torch_global_flag(fxg_state *st)
{
    PyObject *flag = loaded_attr(st->str.symbolic_trace, st->str.fx_flag);
    if (flag == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    int r = PyObject_IsTrue(flag);
    Py_DECREF(flag);
    return r;
}

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

int
fxg_thread_is_tracing(fxg_state *st)
{
    fxg_record *cached = fxg_cached_record(st);
    if (cached != NULL && !cached->worker && st->mode == FXG_MODE_PATCHED) {
        return cached->flag; /* the hot path: a Python thread's own record */
    }
    if (st->mode == FXG_MODE_UPSTREAM) {
        return call_truth(st->upstream_get);
    }
    fxg_record *own = own_record(st);
    if (own != NULL && !own->worker) {
        /* A Python thread answers from its own record: no torch call. */
        if (own->flag || st->mode == FXG_MODE_PATCHED) {
            return own->flag;
        }
    }
    else if (own == NULL && PyErr_Occurred()) {
        return -1;
    }
    if (st->mode == FXG_MODE_OFF) {
        return own != NULL && own->flag ? 1 : torch_global_flag(st);
    }
    if (st->tracing_records == 0) {
        return 0; /* nobody traces: nothing can have been carried here */
    }
    if (own == NULL) {
        /* A thread's first read while another traces: give it its record
         * (worker or not is decided once), so that a Python thread's later
         * reads take the hot path instead of two torch TLS calls each. */
        if ((own = new_own_record(st)) == NULL) {
            return -1;
        }
        Py_DECREF(own); /* its thread state dict holds it */
        if (!own->worker) {
            return 0;
        }
    }
    fxg_record *carried = carried_record(st);
    if (carried == NULL) {
        return PyErr_Occurred() ? -1 : own->flag;
    }
    int r = carried->flag;
    Py_DECREF(carried);
    return r;
}

static int
torch_is_compiling(fxg_state *st)
{
    if (st->is_compiling != NULL) {
        return call_truth(st->is_compiling);
    }
    /* Not installed: use torch.compiler.is_compiling if torch is loaded. */
    PyObject *fn = loaded_attr(st->str.torch_compiler, st->str.is_compiling);
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

fxg_record *
fxg_thread_set_tracing(fxg_state *st, int value, int *prev)
{
    fxg_record *rec = fxg_record_for(st);
    if (rec == NULL) {
        return NULL;
    }
    *prev = rec->flag;
    fxg_record_set_flag(st, rec, value);
    return rec;
}

int
fxg_upstream_set(fxg_state *st, PyObject *value)
{
    PyObject *r = PyObject_CallOneArg(st->upstream_set, value);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}
