/* Fork: the one after-fork hook of each module object, and the registry it
 * works from.
 *
 * A child has one thread, the one that forked.  In it, first the records:
 * only the forking thread's FX flag counts as a trace in progress
 * (fxg_records_after_fork; uninstall() would refuse for good otherwise);
 * then the locks: every RLock is free unless the forking thread holds it
 * (fxg_rlocks_after_fork).
 *
 * The hook is registered with os.register_at_fork(after_in_child=...) when
 * the module executes.  os keeps it for good, so it holds the registry's
 * capsule, not the module: a module object can still be collected, and then
 * the registry's `st` is NULL and only its surviving locks are reset. */
#include "fxguard.h"

void
fxg_fork_module_clear(fxg_state *st)
{
    if (st->registry != NULL && PyCapsule_IsValid(st->registry, FXG_REGISTRY_CAPSULE)) {
        ((fxg_registry *)PyCapsule_GetPointer(st->registry, FXG_REGISTRY_CAPSULE))->st = NULL;
    }
}

static void
registry_free(PyObject *capsule)
{
    fxg_registry *reg = PyCapsule_GetPointer(capsule, FXG_REGISTRY_CAPSULE);
    if (reg != NULL) {
        fxg_rlock_registry_free(reg);
        PyMem_Free(reg);
    }
}

static PyObject *
after_fork_in_child(PyObject *capsule, PyObject *Py_UNUSED(ignored))
{
    fxg_registry *reg = PyCapsule_GetPointer(capsule, FXG_REGISTRY_CAPSULE);
    if (reg == NULL) {
        return NULL;
    }
    int records = 0;
    if (reg->st != NULL) {
        /* Without the GIL: CPython stops the world before fork(), and no
         * thread waits or runs Python code holding these; made anew anyway,
         * as a thread that is gone may not release them. */
        fxg_mutex_reinit(&reg->st->config.mutex);
        fxg_mutex_reinit(&reg->st->tls.mutex);
        records = fxg_records_after_fork(reg->st);
    }
    Py_ssize_t stale = fxg_rlocks_after_fork(reg); /* every lock, whatever happened above */
    if (records < 0) {
        return NULL;
    }
    if (stale > 0) {
        return PyErr_NoMemory();
    }
    Py_RETURN_NONE;
}

static PyMethodDef after_fork_def = {
    "_after_fork_in_child", after_fork_in_child, METH_NOARGS,
    "_after_fork_in_child()\n--\n\n"
    "Forked child: only the forking thread's FX flag counts as tracing, and\n"
    "every fxguard RLock the forking thread does not hold is free.",
};

/* os.register_at_fork(after_in_child=<after_fork_in_child bound to capsule>). */
static int
register_after_fork(PyObject *capsule)
{
    PyObject *os = PyImport_ImportModule("os");
    if (os == NULL) {
        return -1;
    }
    PyObject *register_at_fork = PyObject_GetAttrString(os, "register_at_fork");
    Py_DECREF(os);
    if (register_at_fork == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear(); /* no fork() on this platform */
            return 0;
        }
        return -1;
    }
    PyObject *hook = PyCFunction_New(&after_fork_def, capsule);
    PyObject *args = PyTuple_New(0);
    PyObject *kwargs = hook ? Py_BuildValue("{s:O}", "after_in_child", hook) : NULL;
    PyObject *r = (args && kwargs) ? PyObject_Call(register_at_fork, args, kwargs) : NULL;
    Py_XDECREF(hook);
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    Py_DECREF(register_at_fork);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

int
fxg_fork_module_exec(fxg_state *st)
{
    fxg_registry *reg = PyMem_Calloc(1, sizeof(*reg));
    if (reg == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    st->registry = PyCapsule_New(reg, FXG_REGISTRY_CAPSULE, registry_free);
    if (st->registry == NULL) {
        PyMem_Free(reg);
        return -1;
    }
    reg->st = st;
    if (fxg_rlock_registry_init(reg) < 0) {
        return -1;
    }
    return register_after_fork(st->registry);
}
