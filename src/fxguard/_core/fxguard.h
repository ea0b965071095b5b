/* fxguard: shared declarations of the C core.
 *
 * Each thread has one *record* of torch's trace state: the FX-tracing flag
 * (a C int, read on every compiled call) and a list of slots, one per module
 * global that install() made per-thread (is_compiling, node meta, ...).  A
 * thread finds its own record in its thread-state dict.  Autograd worker
 * threads (started by torch, not by Python) run backward for other threads:
 * there, the record of the thread whose graph task runs is found through
 * torch's ThreadLocalPythonObjects, which the engine carries into the worker
 * (install() hands us torch._C._stash_obj_in_tls and friends for that).
 */
#ifndef FXGUARD_H
#define FXGUARD_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Where the FX-tracing flag comes from. */
typedef enum {
    FXG_MODE_OFF = 0,      /* not installed: own record if set, else torch's module global */
    FXG_MODE_PATCHED = 1,  /* install() rewired torch to read records */
    FXG_MODE_UPSTREAM = 2, /* torch keeps the flag per thread itself: delegate */
} fxg_mode;

/* Slot index meaning "the FX-tracing flag" (kept as a C int, not in the list). */
#define FXG_FLAG_SLOT (-1)

typedef struct {
    PyObject_HEAD
    int flag;            /* FX-tracing flag */
    int worker;          /* on a thread Python did not start: carried records come first */
    int published;       /* handed to torch's thread-local objects */
    int kept;            /* in st->kept (torch 2.11 holds it without a reference) */
    unsigned long epoch; /* the install() whose slot layout `values` has */
    PyObject *values;    /* list: one value per slot */
} fxg_record;

typedef struct {
    fxg_mode mode;
    PyObject *record_key;        /* str: key in thread-state dicts and torch TLS */
    Py_ssize_t tracing_records;  /* records whose flag is set (GIL-protected) */
    Py_ssize_t published;        /* records handed to torch's TLS */
    unsigned long epoch;         /* bumped by every _configure() */
    /* The last thread's own record: a thread-state id is never reused, so
     * one compare replaces the thread-state dict lookup on the hot path. */
    uint64_t cached_id;
    PyObject *cached_record;

    /* Set by install(), cleared by uninstall(); NULL otherwise. */
    PyObject *defaults;          /* tuple: each slot's initial value */
    PyObject *factories;         /* tuple: callable making a fresh initial value, or None */
    PyObject *is_compiling;      /* torch.compiler.is_compiling */
    PyObject *tls_stash;         /* torch._C._stash_obj_in_tls */
    int tls_stash_steals;        /* it keeps our reference without taking one (torch 2.11) */
    PyObject *kept;              /* list: what such a torch holds (records, probes); never freed */
    PyObject *tls_has;           /* torch._C._is_key_in_tls */
    PyObject *tls_get;           /* torch._C._get_obj_in_tls */
    PyObject *upstream_get;      /* torch.fx._symbolic_trace._get_is_fx_tracing */
    PyObject *upstream_set;      /* torch.fx._symbolic_trace._set_is_fx_tracing */

    PyTypeObject *record_type;
    PyTypeObject *slot_view_type;
    PyTypeObject *fx_tracing_type;
    PyTypeObject *rlock_type;
    PyTypeObject *dispatch_type;
    PyObject *rlock_registry;  /* capsule: the live RLocks, reset after fork (rlock.c) */
} fxg_state;

/* thread_record.c */
/* The record reads and writes on this thread go to, as a new reference;
 * created on first use.  NULL with an error set on failure. */
fxg_record *fxg_record_for(fxg_state *st);
int fxg_thread_is_tracing(fxg_state *st);           /* 1, 0, or -1 with error */
int fxg_thread_is_symbolic_tracing(fxg_state *st);  /* 1, 0, or -1 with error */
/* Set the flag of the calling thread's record; returns that record (new
 * reference) and stores the previous flag in *prev.  NULL with an error. */
fxg_record *fxg_thread_set_tracing(fxg_state *st, int value, int *prev);
void fxg_record_set_flag(fxg_state *st, fxg_record *rec, int value);
int fxg_upstream_set(fxg_state *st, PyObject *value);  /* 0 or -1 */
extern PyType_Spec fxg_record_spec;

/* slot_view.c */
extern PyType_Spec fxg_slot_view_spec;

/* fx_tracing.c */
extern PyType_Spec fxg_fx_tracing_spec;

/* dispatch.c */
extern PyType_Spec fxg_dispatch_spec;

/* rlock.c */
extern PyType_Spec fxg_rlock_spec;
/* Before the first RLock is made: its registry, and the after-fork hook. */
int fxg_rlock_module_exec(fxg_state *st);  /* 0 or -1 */

static inline fxg_state *
fxg_state_of_type(PyTypeObject *tp)
{
    return (fxg_state *)PyType_GetModuleState(tp);
}

#endif
