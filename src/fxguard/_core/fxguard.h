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
 *
 * Files: module.c (the module object and its small functions), config.c
 * (_configure), record.c (the record type; finding the calling thread's
 * record), torch_tls.c (records handed to and carried in by torch's
 * thread-local objects; what torch 2.11 holds), fx_flag.c (the flag's readers
 * and writer), fx_tracing.c (its context manager), slot_view.c, reader.c,
 * dispatch.c, rlock.c, cached_method.c, fork.c (the one after-fork hook),
 * compat.h (every CPython-version shim).
 */
#ifndef FXGUARD_H
#define FXGUARD_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "compat.h"

/* Where the FX-tracing flag comes from. */
typedef enum {
    FXG_MODE_OFF = 0,      /* not installed: own record if set, else torch's module global */
    FXG_MODE_PATCHED = 1,  /* install() rewired torch to read records */
    FXG_MODE_UPSTREAM = 2, /* torch keeps the flag per thread itself: delegate */
} fxg_mode;

/* Slot index meaning "the FX-tracing flag" (kept as a C int, not in the list). */
#define FXG_FLAG_SLOT (-1)

/* One thread's record.  Without the GIL: `flag` is atomic (whoever acts for
 * the record sets it: its thread, a worker running that thread's backward,
 * a scope that exits late); `values` and `context` are read and written
 * under the record's critical section, and `epoch` written there (atomic
 * stores: the own thread's fast path reads its own `epoch` and `context`
 * without the section, `context` having no other writer); `published` and
 * `kept` are written by the own thread only (published atomically: workers
 * read it); `worker` is set once, at creation; `forks` is written only in a
 * fork child, which has one thread. */
typedef struct {
    PyObject_HEAD
    int flag;            /* FX-tracing flag */
    int worker;          /* on a thread Python did not start: carried records come first */
    int published;       /* handed to torch's thread-local objects */
    int kept;            /* in the kept list (torch 2.11 holds it without a reference) */
    uint64_t epoch;      /* the _configure() whose slot layout `values` has */
    unsigned long forks; /* records.forks when made: a record from before a fork in a
                          * child is another thread's, whose flag no longer counts */
    PyObject *values;    /* list: one value per slot */
    PyObject *context;   /* the thread's contextvars.Context, for workers (or NULL) */
} fxg_record;

/* Every name the core looks up, interned once per module object (exec) and
 * not made again per call: X(field, text). */
#define FXG_NAMES(X)                                     \
    X(record_key, "fxguard.thread_record")               \
    X(stash_probe_key, "fxguard.stash_probe")            \
    X(symbolic_trace, "torch.fx._symbolic_trace")        \
    X(fx_flag, "_is_fx_tracing_flag")                    \
    X(torch_compiler, "torch.compiler")                  \
    X(is_compiling, "is_compiling")                      \
    X(threading, "threading")                            \
    X(threading_active, "_active")                       \
    X(dummy_thread, "_DummyThread")

typedef struct {
#define FXG_NAME_FIELD(field, text) PyObject *field;
    FXG_NAMES(FXG_NAME_FIELD)
#undef FXG_NAME_FIELD
} fxg_names;

/* What install() handed the core through _configure() (config.c).  The
 * object fields are NULL when not given (and after uninstall()).  Without
 * the GIL: _configure() writes every field under `mutex`; `mode`, `epoch`
 * and `carry_context` are read with atomic loads, and whether tls_stash is
 * set too; the objects are taken as strong references under `mutex`
 * (fxg_config_ref, fxg_config_layout). */
typedef struct {
    fxg_mutex mutex;
    int mode;                /* an fxg_mode */
    uint64_t epoch;          /* bumped by every _configure() and _extend_layout() */
    uint64_t base_epoch;     /* the last _configure()'s epoch: since then slots were only added;
                              * written and read under `mutex` only (fxg_config_layout) */
    int carry_context;       /* records note their thread's Context (config per thread) */
    PyObject *defaults;      /* tuple: each slot's initial value (NULL: no slots) */
    PyObject *factories;     /* tuple: callable making a fresh initial value, or None */
    PyObject *is_compiling;  /* torch.compiler.is_compiling */
    PyObject *upstream_get;  /* torch.fx._symbolic_trace._get_is_fx_tracing */
    PyObject *upstream_set;  /* torch.fx._symbolic_trace._set_is_fx_tracing */
    PyObject *tls_stash;     /* torch._C._stash_obj_in_tls */
    PyObject *tls_has;       /* torch._C._is_key_in_tls */
    PyObject *tls_get;       /* torch._C._get_obj_in_tls */
    int stash_steals;        /* tls_stash keeps our reference without taking one (2.11) */
} fxg_config;

/* What the core holds for torch's thread-local objects, through which
 * records reach autograd workers (torch_tls.c).  Without the GIL: `kept`
 * and `kept_sweep_at` under `mutex`; `published` atomic. */
typedef struct {
    fxg_mutex mutex;
    Py_ssize_t published;    /* records handed to torch's TLS */
    PyObject *kept;          /* list: what such a torch holds (records, probes), see fxg_keep */
    Py_ssize_t kept_sweep_at; /* sweep `kept` when it grows to this length */
} fxg_torch_tls;

/* The threads' records, as a whole (record.c, fx_flag.c).  Without the GIL:
 * `tracing` atomic; `forks` written only in a fork child. */
typedef struct {
    Py_ssize_t tracing;      /* records whose flag is set */
    unsigned long forks;     /* forks this process is the child of (fxg_records_after_fork) */
#if FXG_RECORD_CACHE
    /* The last thread's own record: a thread-state id is never reused, so
     * one compare replaces the thread-state dict lookup on the hot path.
     * One entry for every thread: only where the GIL serialises them. */
    uint64_t cached_id;
    PyObject *cached;
#endif
} fxg_records;

/* Made at exec, read-only after. */
typedef struct {
    PyTypeObject *record;
    PyTypeObject *slot_view;
    PyTypeObject *fx_tracing;
    PyTypeObject *rlock;
    PyTypeObject *reader;
    PyTypeObject *dispatch;
} fxg_types;

/* The module state: everything mutable of one module object, each part
 * with its protection without the GIL. */
typedef struct {
    fxg_records records;
    fxg_config config;
    fxg_torch_tls tls;
    fxg_names str;           /* made at exec, read-only after */
    fxg_types types;
    PyObject *registry;      /* capsule of the fxg_registry (fork.c): set at exec */
} fxg_state;

struct RLockObject;

/* What must outlive the module object: the live RLocks (each holds the
 * capsule, whatever order the collector tears a module, its type and its
 * locks down in) and the after-fork hook's way to the module state.  One per
 * module object, in a capsule (fork.c).  Without the GIL: `locks` (the list
 * and every lock's prev/next) under `mutex`; `st` written at exec and when
 * the module state is cleared, read by the after-fork hook; the tick set at
 * exec, read-only after. */
typedef struct {
    fxg_mutex mutex;
    fxg_state *st;             /* NULL once the module state is cleared */
    struct RLockObject *locks; /* every live RLock of the module (rlock.c) */
    PyObject *tick;            /* code object of "None", and its globals: */
    PyObject *tick_globals;    /* see rlock.c's deliver_pending() */
} fxg_registry;

static inline fxg_state *
fxg_state_of_type(PyTypeObject *tp)
{
    return (fxg_state *)PyType_GetModuleState(tp);
}

/* A strong reference to one of st->config's objects (NULL if not set):
 * without the GIL, _configure() may replace it at any moment. */
static inline PyObject *
fxg_config_ref(fxg_state *st, PyObject **field)
{
    fxg_mutex_lock(&st->config.mutex);
    PyObject *obj = Py_XNewRef(*field);
    fxg_mutex_unlock(&st->config.mutex);
    return obj;
}

static inline fxg_mode
fxg_config_mode(fxg_state *st)
{
    return (fxg_mode)FXG_LOAD_INT(&st->config.mode);
}

/* -- finding the calling thread's record (record.c) ----------------------------
 *
 * fxg_own_record(): the thread's own record, from the thread-state dict
 * (with the GIL, a one-entry cache first; the lookup fills it).  The dict is
 * changed only by its own thread, so the borrowed record stays valid for the
 * caller.  fxg_record_for(): the record the thread's reads and writes go to:
 * a Python thread's own; on a worker, the record carried in from the thread
 * whose graph task it runs (fxg_carried_record), else its own; made on first
 * use and brought up to date (the three conditions below).
 * fxg_record_ready() is fxg_record_for()'s hot path: the own record when it
 * needs nothing done. */

fxg_record *fxg_own_record_uncached(fxg_state *st);

/* Borrowed; NULL without error if the thread has none yet. */
static inline fxg_record *
fxg_own_record(fxg_state *st)
{
#if FXG_RECORD_CACHE
    fxg_record *cached = (fxg_record *)st->records.cached;
    if (cached != NULL && st->records.cached_id == PyThreadState_Get()->id) {
        return cached;
    }
#endif
    return fxg_own_record_uncached(st);
}

/* What fxg_record_for() brings a Python thread's own record to: this
 * _configure()'s slot layout, handed to torch's TLS (when torch has one),
 * noting the thread's current Context (when config is per thread). */
static inline int
fxg_layout_is_current(fxg_state *st, fxg_record *rec)
{
    return FXG_LOAD_UINT64(&rec->epoch) == FXG_LOAD_UINT64(&st->config.epoch);
}

static inline int
fxg_needs_publishing(fxg_state *st, fxg_record *rec)
{
    return FXG_LOAD_PTR(&st->config.tls_stash) != NULL && !FXG_LOAD_INT(&rec->published) &&
           !rec->worker;
}

static inline PyObject *
fxg_context_to_note(fxg_state *st, PyThreadState *ts)
{
    return FXG_LOAD_INT(&st->config.carry_context) ? ts->context : NULL;
}

/* fxg_record_for()'s answer when the calling Python thread's own record
 * needs nothing done (borrowed; with the GIL, only from the cache).  NULL:
 * call fxg_record_for() (and if an error is set, fail). */
static inline fxg_record *
fxg_record_ready(fxg_state *st)
{
    PyThreadState *ts = PyThreadState_Get();
#if FXG_RECORD_CACHE
    fxg_record *own = (fxg_record *)st->records.cached;
    if (own == NULL || st->records.cached_id != ts->id) {
        return NULL;
    }
#else
    fxg_record *own = fxg_own_record_uncached(st);
    if (own == NULL) {
        return NULL;
    }
#endif
    if (own->worker || !fxg_layout_is_current(st, own) || fxg_needs_publishing(st, own) ||
        own->context != fxg_context_to_note(st, ts)) {
        return NULL;
    }
    return own;
}

/* rec's value of slot `index` (>= 0), a new reference; NULL without error if
 * rec's layout has no such slot. */
static inline PyObject *
fxg_record_value(fxg_record *rec, Py_ssize_t index)
{
    PyObject *value = NULL;
    FXG_BEGIN_CRITICAL_SECTION(rec);
    if (index < PyList_GET_SIZE(rec->values)) {
        value = Py_NewRef(PyList_GET_ITEM(rec->values, index));
    }
    FXG_END_CRITICAL_SECTION();
    return value;
}

/* New reference; NULL with an error set. */
fxg_record *fxg_record_for(fxg_state *st);
/* Whose record the calling thread acts for (new reference), as fxg_record_for
 * but without bringing it up to date; *own_python: the Python thread's own. */
fxg_record *fxg_acting_record(fxg_state *st, int *own_python);
/* A new record for the calling thread, in its thread-state dict (new
 * reference); whether it is a worker is decided here, once. */
fxg_record *fxg_make_own_record(fxg_state *st);
/* Set rec's slot `index` (>= 0) to value: 0, or -1 with RuntimeError if
 * rec's layout has no such slot. */
int fxg_record_set_value(fxg_record *rec, Py_ssize_t index, PyObject *value);
/* A copy of rec's values (new list), NULL with an error. */
PyObject *fxg_record_values(fxg_record *rec);
/* In a forked child: only the forking thread's flag counts.  0, or -1. */
int fxg_records_after_fork(fxg_state *st);
/* Whether obj is held by the record cache (with the GIL), which then holds
 * one reference to it. */
int fxg_record_is_cached(fxg_state *st, PyObject *obj);
extern PyType_Spec fxg_record_spec;

/* torch_tls.c */
/* The record torch's thread-local objects carry into this thread (an
 * autograd worker running another thread's backward), new reference; NULL
 * without error if none. */
fxg_record *fxg_carried_record(fxg_state *st);
/* Hand a Python thread's record to torch's thread-local objects. 0 or -1. */
int fxg_publish(fxg_state *st, fxg_record *rec);
/* On a worker running another thread's graph task: that thread's Context.
 * New reference; Py_None elsewhere or when none is carried; NULL on error. */
PyObject *fxg_carried_context(fxg_state *st);
/* Hold `obj` in the kept list while torch 2.11's stash may still drop a
 * reference to it; freed once that reference is gone.  0, or -1. */
int fxg_keep(fxg_state *st, PyObject *obj);
/* Let go of what torch no longer holds; see fxg_keep.  0, or -1. */
int fxg_sweep_kept(fxg_state *st);
/* Kept records of threads that ended in Python but whose torch thread-locals
 * are not destroyed yet. */
Py_ssize_t fxg_exiting_records(fxg_state *st);
/* Whether stash(key, obj) keeps obj without taking a reference: 1, 0, -1. */
int fxg_stash_steals(fxg_state *st, PyObject *stash);

/* fx_flag.c */
int fxg_thread_is_tracing(fxg_state *st);           /* 1, 0, or -1 with error */
int fxg_thread_is_symbolic_tracing(fxg_state *st);  /* 1, 0, or -1 with error */
/* Set the flag of the calling thread's record; returns that record (new
 * reference) and stores the previous flag in *prev.  NULL with an error. */
fxg_record *fxg_thread_set_tracing(fxg_state *st, int value, int *prev);
/* Set rec's flag, keeping records.tracing in step; returns the old flag. */
int fxg_record_set_flag(fxg_state *st, fxg_record *rec, int value);

/* config.c */
PyObject *fxg_configure(PyObject *module, PyObject *args, PyObject *kwargs);
void fxg_config_clear(fxg_state *st);
PyObject *fxg_extend_layout(PyObject *module, PyObject *args);
/* The slot layout: its epoch, the epoch of the _configure() it grew from,
 * defaults and factories (new references or NULL when there are no slots),
 * read together. */
void fxg_config_layout(fxg_state *st, uint64_t *epoch, uint64_t *base_epoch,
                       PyObject **defaults, PyObject **factories);

/* slot_view.c */
extern PyType_Spec fxg_slot_view_spec;
/* The calling thread's value of a slot (new reference), NULL with an error. */
PyObject *fxg_slot_value(fxg_state *st, Py_ssize_t index);

/* cached_method.c: defs[i] goes into owner's dict as a method that binds
 * once per instance, into the PyObject * slot at offsets[i] (which owner
 * must visit and clear).  defs ends with a NULL name.  0 or -1. */
int fxg_cache_methods(PyObject *module, PyTypeObject *owner, PyMethodDef *defs,
                      const Py_ssize_t *offsets);

/* reader.c */
extern PyType_Spec fxg_reader_spec;
int fxg_reader_module_exec(PyObject *module); /* its functions and constants; 0 or -1 */

/* fx_tracing.c */
extern PyType_Spec fxg_fx_tracing_spec;

/* dispatch.c */
extern PyType_Spec fxg_dispatch_spec;

/* rlock.c */
extern PyType_Spec fxg_rlock_spec;
/* After the type is made: __enter__/__exit__ that bind once per lock. */
int fxg_rlock_type_exec(PyObject *module, PyTypeObject *type);  /* 0 or -1 */
/* The registry's tick (deliver_pending); 0 or -1. */
int fxg_rlock_registry_init(fxg_registry *reg);
void fxg_rlock_registry_free(fxg_registry *reg);
/* In a forked child: every lock of reg free, unless the forking thread holds
 * it.  Sets no error; returns how many locks kept their old semaphore for
 * want of memory for a new one. */
Py_ssize_t fxg_rlocks_after_fork(fxg_registry *reg);

/* fork.c */
/* The module's registry capsule (st->registry) and its after-fork hook. */
int fxg_fork_module_exec(fxg_state *st);  /* 0 or -1 */
#define FXG_REGISTRY_CAPSULE "fxguard._core.registry"
/* The registry behind st->registry, or NULL with an error (torn down).  Here,
 * not in fork.c: rlock.c registers its locks in it. */
static inline fxg_registry *
fxg_registry_of(fxg_state *st)
{
    if (st->registry == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "fxguard._core has been torn down");
        return NULL;
    }
    return (fxg_registry *)PyCapsule_GetPointer(st->registry, FXG_REGISTRY_CAPSULE);
}
/* The module state is going: the after-fork hook, which outlives it, lets it be. */
void fxg_fork_module_clear(fxg_state *st);

#endif
