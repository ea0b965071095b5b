/* fxguard: shared declarations of the C core.
 *
 * The core keeps one "trace cell" per thread: a tiny object holding that
 * thread's FX-tracing flag.  A thread finds its own cell in its thread-state
 * dict.  Autograd worker threads have no cell of their own; while they run a
 * backward for a tracing thread they find that thread's cell through torch's
 * ThreadLocalPythonObjects, which the autograd engine carries into them
 * (install() hands us torch._C._stash_obj_in_tls and friends for that).
 */
#ifndef FXGUARD_H
#define FXGUARD_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Where the calling thread's answer comes from. */
typedef enum {
    FXG_MODE_OFF = 0,      /* not installed: own cell, else torch's module global */
    FXG_MODE_PATCHED = 1,  /* install() rewired torch to read our cells */
    FXG_MODE_UPSTREAM = 2, /* torch keeps the flag per thread itself: delegate */
} fxg_mode;

typedef struct {
    fxg_mode mode;
    PyObject *cell_key;        /* str: key in thread-state dicts and torch TLS */
    Py_ssize_t tracing_cells;  /* cells whose flag is set (GIL-protected) */

    /* Set by install(), cleared by uninstall(); NULL otherwise. */
    PyObject *is_compiling;    /* torch.compiler.is_compiling */
    PyObject *tls_stash;       /* torch._C._stash_obj_in_tls */
    int tls_stash_steals;      /* it keeps our reference without taking one (torch 2.11) */
    PyObject *kept_cells;      /* list: what such a torch holds (cells, probes); never freed */
    PyObject *tls_has;         /* torch._C._is_key_in_tls */
    PyObject *tls_get;         /* torch._C._get_obj_in_tls */
    PyObject *upstream_get;    /* torch.fx._symbolic_trace._get_is_fx_tracing */
    PyObject *upstream_set;    /* torch.fx._symbolic_trace._set_is_fx_tracing */

    PyTypeObject *cell_type;
    PyTypeObject *fx_tracing_type;
    PyTypeObject *rlock_type;
    PyObject *rlock_registry;  /* capsule: the live RLocks, reset after fork (rlock.c) */
} fxg_state;

/* thread_state.c */
int fxg_thread_is_tracing(fxg_state *st);           /* 1, 0, or -1 with error */
int fxg_thread_is_symbolic_tracing(fxg_state *st);  /* 1, 0, or -1 with error */
/* Set the calling thread's flag.  Returns the cell written (new reference)
 * and stores the previous flag in *prev; NULL with an error set on failure. */
PyObject *fxg_thread_set_tracing(fxg_state *st, int value, int *prev);
/* Write a flag into a cell obtained from fxg_thread_set_tracing. */
void fxg_cell_set(fxg_state *st, PyObject *cell, int value);
int fxg_upstream_set(fxg_state *st, PyObject *value);  /* 0 or -1 */
extern PyType_Spec fxg_cell_spec;

/* fx_tracing.c */
extern PyType_Spec fxg_fx_tracing_spec;

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
