/* Records and torch's thread-local objects (ThreadLocalPythonObjects), which
 * the autograd engine carries from the thread that starts a backward into
 * the worker threads that run it: publishing a record there, finding the
 * record carried in, and holding what torch 2.11's stash keeps without a
 * reference of its own. */
#include "fxguard.h"

/* -- what torch 2.11's stash holds ------------------------------------------- */

/* torch 2.11's _stash_obj_in_tls keeps an object without taking a reference
 * and drops one later: when the key is stashed again, or when the thread's
 * C++ thread-locals are destroyed at thread exit (and graph tasks that copied
 * them are gone).  fxguard gives it that reference (publish) and holds the
 * object in the kept list as well, so torch's drop is never the last one and
 * never runs a dealloc from C++ thread-exit code.  Once torch has dropped it,
 * the list's is the only reference left (refcount 1): nothing, torch
 * included, can reach the object, and the list lets it go.  Swept when the
 * list has doubled since the last sweep: amortised O(1) per keep, and the
 * list stays within twice what torch still holds (live threads, pending
 * graph tasks). */
#define KEPT_SWEEP_MIN 64

/* With tls.mutex held: the kept list without what only it holds; the old
 * list goes to *old, for the caller to let go of after unlocking (freeing a
 * record frees its slot values, whose finalizers may run any code, this
 * module's included).  0, or -1 with an error (nothing changed).
 * Refcounts read without the GIL: torch's reference and the list's are both
 * held across the read, so an object torch still holds reads above 1. */
static int
sweep_locked(fxg_state *st, PyObject **old)
{
    PyObject *kept = st->tls.kept;
    PyObject *survivors = PyList_New(0);
    if (survivors == NULL) {
        return -1;
    }
    /* The loop runs no Python code (appends only resize). */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(kept); i++) {
        PyObject *obj = PyList_GET_ITEM(kept, i);
        if (Py_REFCNT(obj) > 1 && PyList_Append(survivors, obj) < 0) {
            Py_DECREF(survivors);
            return -1;
        }
    }
    st->tls.kept = survivors;
    st->tls.kept_sweep_at = 2 * PyList_GET_SIZE(survivors);
    if (st->tls.kept_sweep_at < KEPT_SWEEP_MIN) {
        st->tls.kept_sweep_at = KEPT_SWEEP_MIN;
    }
    *old = kept;
    return 0;
}

int
fxg_sweep_kept(fxg_state *st)
{
    PyObject *old = NULL;
    fxg_mutex_lock(&st->tls.mutex);
    int r = PyList_GET_SIZE(st->tls.kept) > 0 ? sweep_locked(st, &old) : 0;
    fxg_mutex_unlock(&st->tls.mutex);
    Py_XDECREF(old);
    return r;
}

int
fxg_keep(fxg_state *st, PyObject *obj)
{
    PyObject *old = NULL;
    fxg_mutex_lock(&st->tls.mutex);
    int r = PyList_Append(st->tls.kept, obj);
    if (r == 0 && PyList_GET_SIZE(st->tls.kept) >= st->tls.kept_sweep_at) {
        r = sweep_locked(st, &old);
    }
    fxg_mutex_unlock(&st->tls.mutex);
    Py_XDECREF(old);
    return r;
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
    fxg_mutex_lock(&st->tls.mutex);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(st->tls.kept); i++) {
        PyObject *obj = PyList_GET_ITEM(st->tls.kept, i);
        if (Py_IS_TYPE(obj, st->types.record) && FXG_LOAD_INT(&((fxg_record *)obj)->published) &&
            Py_REFCNT(obj) - 1 - fxg_record_is_cached(st, obj) == 1) {
            n++;
        }
    }
    fxg_mutex_unlock(&st->tls.mutex);
    return n;
}

/* Whether stash(key, obj) keeps obj without taking a reference of its own.
 * torch 2.11 does (it later drops a reference it never took, which freed our
 * objects under us); 2.13 does not.  Measured, not guessed from the version. */
int
fxg_stash_steals(fxg_state *st, PyObject *stash)
{
    /* A fresh probe each time (a probe already stashed would be released by
     * the stash itself and spoil the count), held in the kept list (fxg_keep)
     * so that whatever torch later does with it is harmless. */
    PyObject *probe = PyList_New(0);
    if (probe == NULL || fxg_keep(st, probe) < 0) {
        Py_XDECREF(probe);
        return -1;
    }
    Py_ssize_t before = Py_REFCNT(probe);
    PyObject *r = PyObject_CallFunctionObjArgs(stash, st->str.stash_probe_key, probe, NULL);
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

/* -- records in and out ---------------------------------------------------------- */

/* Hand a Python thread's record to torch's thread-local objects, so graph
 * tasks started from this thread carry it into autograd workers. */
int
fxg_publish(fxg_state *st, fxg_record *rec)
{
    if (!fxg_needs_publishing(st, rec)) {
        return 0;
    }
    fxg_mutex_lock(&st->config.mutex);
    PyObject *stash = Py_XNewRef(st->config.tls_stash);
    int steals = st->config.stash_steals;
    fxg_mutex_unlock(&st->config.mutex);
    if (stash == NULL) {
        return 0; /* uninstalled meanwhile */
    }
    PyObject *r = PyObject_CallFunctionObjArgs(stash, st->str.record_key, (PyObject *)rec, NULL);
    Py_DECREF(stash);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    FXG_STORE_INT(&rec->published, 1);
    if (steals) {
        Py_INCREF(rec); /* torch 2.11: give it the reference it will drop */
    }
    /* Kept on every torch: on 2.11 so torch's drop is never the last (see
     * fxg_keep), everywhere so the exit handler finds records whose thread
     * ended while torch's thread-locals still hold them (fxg_exiting_records). */
    if (!rec->kept && fxg_keep(st, (PyObject *)rec) == 0) {
        rec->kept = 1;
    }
    PyErr_Clear(); /* a failed keep only costs the safety margin */
    FXG_ADD_SSIZE(&st->tls.published, 1);
    return 0;
}

/* has(key) and then get(key): the record, a new reference, or NULL. */
static fxg_record *
carried_by(fxg_state *st, PyObject *has, PyObject *get)
{
    PyObject *r = PyObject_CallOneArg(has, st->str.record_key);
    if (r == NULL) {
        return NULL;
    }
    int present = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (present <= 0) {
        return NULL;
    }
    PyObject *rec = PyObject_CallOneArg(get, st->str.record_key);
    if (rec != NULL && !Py_IS_TYPE(rec, st->types.record)) {
        Py_CLEAR(rec); /* someone else's object under our key: ignore it */
    }
    return (fxg_record *)rec;
}

fxg_record *
fxg_carried_record(fxg_state *st)
{
    if (FXG_LOAD_SSIZE(&st->tls.published) == 0) {
        return NULL;
    }
    fxg_mutex_lock(&st->config.mutex);
    PyObject *has = Py_XNewRef(st->config.tls_has), *get = Py_XNewRef(st->config.tls_get);
    fxg_mutex_unlock(&st->config.mutex);
    fxg_record *rec = has != NULL && get != NULL ? carried_by(st, has, get) : NULL;
    Py_XDECREF(has);
    Py_XDECREF(get);
    return rec;
}

PyObject *
fxg_carried_context(fxg_state *st)
{
    fxg_record *own = fxg_own_record(st);
    if (own != NULL && !own->worker) {
        Py_RETURN_NONE; /* a Python thread runs its own backward */
    }
    if (own == NULL && PyErr_Occurred()) {
        return NULL;
    }
    fxg_record *carried = fxg_carried_record(st);
    if (carried == NULL) {
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    }
    PyObject *context;
    FXG_BEGIN_CRITICAL_SECTION(carried); /* its own thread may note another meanwhile */
    context = Py_NewRef(carried->context != NULL ? carried->context : Py_None);
    FXG_END_CRITICAL_SECTION();
    Py_DECREF(carried);
    return context;
}
