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

int
fxg_sweep_kept(fxg_state *st)
{
    PyObject *old = st->tls.kept;
    PyObject *survivors = PyList_New(0);
    if (survivors == NULL) {
        return -1;
    }
    /* The loop runs no Python code (appends only resize), so `old` stays the kept list. */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(old); i++) {
        PyObject *obj = PyList_GET_ITEM(old, i);
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
    /* Last, with st consistent: freeing a record frees its slot values,
     * whose finalizers may run any code, this module's included. */
    Py_DECREF(old);
    return 0;
}

int
fxg_keep(fxg_state *st, PyObject *obj)
{
    if (PyList_Append(st->tls.kept, obj) < 0) {
        return -1;
    }
    return PyList_GET_SIZE(st->tls.kept) >= st->tls.kept_sweep_at ? fxg_sweep_kept(st) : 0;
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
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(st->tls.kept); i++) {
        PyObject *obj = PyList_GET_ITEM(st->tls.kept, i);
        if (Py_IS_TYPE(obj, st->types.record) && ((fxg_record *)obj)->published &&
            Py_REFCNT(obj) - 1 - (obj == st->records.cached) == 1) {
            n++;
        }
    }
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
    PyObject *r = PyObject_CallFunctionObjArgs(st->tls.stash, st->str.record_key,
                                               (PyObject *)rec, NULL);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    rec->published = 1;
    if (st->tls.stash_steals) {
        Py_INCREF(rec); /* torch 2.11: give it the reference it will drop */
    }
    /* Kept on every torch: on 2.11 so torch's drop is never the last (see
     * fxg_keep), everywhere so the exit handler finds records whose thread
     * ended while torch's thread-locals still hold them (fxg_exiting_records). */
    if (!rec->kept && fxg_keep(st, (PyObject *)rec) == 0) {
        rec->kept = 1;
    }
    PyErr_Clear(); /* a failed keep only costs the safety margin */
    st->tls.published++;
    return 0;
}

fxg_record *
fxg_carried_record(fxg_state *st)
{
    if (st->tls.has == NULL || st->tls.get == NULL || st->tls.published == 0) {
        return NULL;
    }
    PyObject *has = PyObject_CallOneArg(st->tls.has, st->str.record_key);
    if (has == NULL) {
        return NULL;
    }
    int present = PyObject_IsTrue(has);
    Py_DECREF(has);
    if (present <= 0) {
        return NULL;
    }
    PyObject *rec = PyObject_CallOneArg(st->tls.get, st->str.record_key);
    if (rec != NULL && !Py_IS_TYPE(rec, st->types.record)) {
        Py_CLEAR(rec); /* someone else's object under our key: ignore it */
    }
    return (fxg_record *)rec;
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
    PyObject *context = carried->context != NULL ? carried->context : Py_None;
    Py_INCREF(context);
    Py_DECREF(carried);
    return context;
}
