/* fxguard: every CPython-version shim of the C core, in one place, each a
 * named macro or function with the CPython change behind it.
 *
 * Function objects.  Fast readers (reader.c) serve calls of a torch function
 * from C by setting the function object's vectorcall pointer.  Whether the
 * interpreter honours that pointer depends on the version:
 *   3.10  no specialiser: every call goes through func->vectorcall.
 *   3.11  the CALL bytecode inlines Python frames without looking at
 *         func->vectorcall (https://github.com/python/cpython/issues/91049,
 *         fixed in 3.12): the pointer is ignored from Python code.
 *   3.12, 3.13  PyFunction_SetVectorcall() (added by the fix above,
 *         https://github.com/python/cpython/pull/92257) also clears
 *         func_version, so call sites specialised on the function deoptimise
 *         and go through the pointer.  (3.13 may run one call through the
 *         code when a site first specialises,
 *         https://github.com/python/cpython/issues/139525: same answer.)
 * Later versions are untested: they take the 3.11 route.
 *
 * A function's version: the specialiser keys calls on func_version, which
 * CPython clears whenever __code__, __defaults__, __kwdefaults__ or the
 * vectorcall pointer change (3.13: for good, 3.12: until the next
 * specialisation gives it a new one).  uninstall() puts the saved version
 * back once the function is exactly as it was, or stock call sites stay
 * unspecialised (the "Function (and code) versions" comment at the top of
 * CPython's Objects/funcobject.c). */
#ifndef FXGUARD_COMPAT_H
#define FXGUARD_COMPAT_H

#ifndef PY_SSIZE_T_CLEAN
#  define PY_SSIZE_T_CLEAN
#endif
#include <Python.h>
#include <stddef.h> /* offsetof */

#if PY_VERSION_HEX >= 0x030A0000 && PY_VERSION_HEX < 0x030B0000
#  define FXG_VECTORCALL_READERS 1
#elif PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030E0000
#  define FXG_VECTORCALL_READERS 1
#else
#  define FXG_VECTORCALL_READERS 0
#endif

/* 3.13 moved the setter out of the public headers but still exports it. */
#if PY_VERSION_HEX >= 0x030D0000
PyAPI_FUNC(void) _PyFunction_SetVersion(PyFunctionObject *func, uint32_t version);
#endif

static inline void
fxg_function_set_vectorcall(PyFunctionObject *func, vectorcallfunc vectorcall)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyFunction_SetVectorcall(func, vectorcall); /* clears func_version too */
#else
    func->vectorcall = vectorcall;
#endif
}

/* func_version exists from 3.11; 0 means "none" (never specialised on). */
static inline unsigned long
fxg_function_version(PyFunctionObject *func)
{
#if PY_VERSION_HEX >= 0x030B0000
    return func->func_version;
#else
    (void)func;
    return 0;
#endif
}

static inline void
fxg_function_restore_version(PyFunctionObject *func, unsigned long version)
{
#if PY_VERSION_HEX >= 0x030D0000
    _PyFunction_SetVersion(func, (uint32_t)version); /* also its version-cache entry */
#elif PY_VERSION_HEX >= 0x030B0000
    func->func_version = (uint32_t)version;
#else
    (void)func;
    (void)version;
#endif
}

/* Weak references of a type made from a spec.  From 3.12 the VM keeps an
 * object's weakref list in front of it (Py_TPFLAGS_MANAGED_WEAKREF,
 * https://github.com/python/cpython/issues/95245); 3.10 and 3.11 need a field
 * in the struct, whose offset the type declares with a "__weaklistoffset__"
 * entry in Py_tp_members.  FXG_WEAKREF_FIELD goes in the struct,
 * FXG_WEAKREF_MEMBER(struct type) in the members, FXG_WEAKREF_FLAG in the
 * type's flags; tp_dealloc calls PyObject_ClearWeakRefs() either way. */
#if PY_VERSION_HEX >= 0x030C0000
#  define FXG_WEAKREF_FIELD
#  define FXG_WEAKREF_MEMBER(type)
#  define FXG_WEAKREF_FLAG Py_TPFLAGS_MANAGED_WEAKREF
#else
#  include <structmember.h> /* T_PYSSIZET, READONLY */
#  define FXG_WEAKREF_FIELD PyObject *weakreflist;
#  define FXG_WEAKREF_MEMBER(type) \
    {"__weaklistoffset__", T_PYSSIZET, offsetof(type, weakreflist), READONLY, NULL},
#  define FXG_WEAKREF_FLAG 0
#endif

/* The exception being raised: 3.12 keeps it as one object
 * (PyErr_GetRaisedException, https://github.com/python/cpython/issues/101578)
 * where earlier versions keep a (type, value, traceback) triple
 * (PyErr_Fetch, deprecated in 3.12). */
#if PY_VERSION_HEX >= 0x030C0000
#  define FXG_RAISED_EXCEPTION_OBJECT 1
#else
#  define FXG_RAISED_EXCEPTION_OBJECT 0
#endif

/* Drop the innermost frame from the traceback of the exception being raised
 * (one that came out of a frame the core ran on the caller's behalf). */
static inline void
fxg_err_drop_innermost_frame(void)
{
#if FXG_RAISED_EXCEPTION_OBJECT
    PyObject *exc = PyErr_GetRaisedException();
    PyObject *tb = exc ? PyException_GetTraceback(exc) : NULL;
    if (tb != NULL) {
        PyObject *rest = PyObject_GetAttrString(tb, "tb_next");
        if (rest != NULL) {
            PyException_SetTraceback(exc, rest);
            Py_DECREF(rest);
        }
        else {
            PyErr_Clear();
        }
        Py_DECREF(tb);
    }
    PyErr_SetRaisedException(exc);
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (tb != NULL) {
        PyObject *rest = PyObject_GetAttrString(tb, "tb_next");
        if (rest != NULL) {
            Py_DECREF(tb);
            tb = rest;
            if (tb == Py_None) {
                Py_DECREF(tb);
                tb = NULL;
            }
        }
        else {
            PyErr_Clear();
        }
    }
    PyErr_Restore(type, value, tb);
#endif
}

/* Free-threaded CPython (3.13t: Py_GIL_DISABLED, PEP 703).  With the GIL,
 * it serialises every structure of the core; without it, each structure has
 * the protection its definition states, built from these, which are plain
 * accesses and no-ops on GIL builds (so the GIL build's code is as before):
 *   fxg_mutex, fxg_mutex_lock/unlock: a PyMutex (3.13, cpython/lock.h),
 *       held for a few loads and stores, never around code that can run
 *       Python code or wait for another lock; reinitialised in a fork child;
 *   FXG_BEGIN/END_CRITICAL_SECTION(obj): the object's own lock, PEP 703's
 *       critical section (3.13, cpython/critical_section.h);
 *   FXG_LOAD/STORE/EXCHANGE/ADD/CAS: atomic accesses (3.13's _Py_atomic_*),
 *       relaxed unless said otherwise.
 *   fxg_dict_get_ref: a dict lookup that returns a strong reference, since
 *       a borrowed one may be freed by another thread (PyDict_GetItemRef,
 *       3.13). */
#ifdef Py_GIL_DISABLED
#  define FXG_FREE_THREADED 1
#  define FXG_RECORD_CACHE 0 /* fxguard.h: a one-entry cache for all threads */
typedef PyMutex fxg_mutex;
#  define fxg_mutex_lock(m) PyMutex_Lock(m)
#  define fxg_mutex_unlock(m) PyMutex_Unlock(m)
#  define fxg_mutex_reinit(m) (*(m) = (PyMutex){0})
#  define FXG_BEGIN_CRITICAL_SECTION(op) Py_BEGIN_CRITICAL_SECTION(op)
#  define FXG_END_CRITICAL_SECTION() Py_END_CRITICAL_SECTION()
#  define FXG_LOAD_INT(p) _Py_atomic_load_int_relaxed(p)
#  define FXG_STORE_INT(p, v) _Py_atomic_store_int_relaxed((p), (v))
#  define FXG_EXCHANGE_INT(p, v) _Py_atomic_exchange_int((p), (v))
#  define FXG_LOAD_SSIZE(p) _Py_atomic_load_ssize_relaxed(p)
#  define FXG_ADD_SSIZE(p, v) ((void)_Py_atomic_add_ssize((p), (v)))
#  define FXG_LOAD_UINT64(p) _Py_atomic_load_uint64_relaxed(p)
#  define FXG_STORE_UINT64(p, v) _Py_atomic_store_uint64_relaxed((p), (v))
#  define FXG_LOAD_PTR(p) _Py_atomic_load_ptr_relaxed(p)
#  define FXG_STORE_PTR(p, v) _Py_atomic_store_ptr_relaxed((p), (v))
#  define FXG_LOAD_PTR_ACQUIRE(p) _Py_atomic_load_ptr_acquire(p)
#  define FXG_STORE_PTR_RELEASE(p, v) _Py_atomic_store_ptr_release((p), (v))
/* *p = desired if *p == *expected (1); else *expected = *p (0). */
#  define FXG_CAS_PTR(p, expected, desired) \
    _Py_atomic_compare_exchange_ptr((p), (expected), (void *)(desired))
#else
#  define FXG_FREE_THREADED 0
#  define FXG_RECORD_CACHE 1
typedef struct { char unused; } fxg_mutex; /* the GIL serialises */
#  define fxg_mutex_lock(m) ((void)(m))
#  define fxg_mutex_unlock(m) ((void)(m))
#  define fxg_mutex_reinit(m) ((void)(m))
#  define FXG_BEGIN_CRITICAL_SECTION(op) {
#  define FXG_END_CRITICAL_SECTION() }
#  define FXG_LOAD_INT(p) (*(p))
#  define FXG_STORE_INT(p, v) ((void)(*(p) = (v)))
#  define FXG_LOAD_SSIZE(p) (*(p))
#  define FXG_ADD_SSIZE(p, v) ((void)(*(p) += (v)))
#  define FXG_LOAD_UINT64(p) (*(p))
#  define FXG_STORE_UINT64(p, v) ((void)(*(p) = (v)))
#  define FXG_LOAD_PTR(p) ((void *)*(p))
#  define FXG_STORE_PTR(p, v) ((void)(*(p) = (v)))
#  define FXG_LOAD_PTR_ACQUIRE(p) ((void *)*(p))
#  define FXG_STORE_PTR_RELEASE(p, v) ((void)(*(p) = (v)))
static inline int
fxg_exchange_int(int *p, int v)
{
    int old = *p;
    *p = v;
    return old;
}
#  define FXG_EXCHANGE_INT(p, v) fxg_exchange_int((p), (v))
static inline int
fxg_cas_ptr(void **p, void **expected, void *desired)
{
    if (*p == *expected) {
        *p = desired;
        return 1;
    }
    *expected = *p;
    return 0;
}
#  define FXG_CAS_PTR(p, expected, desired) \
    fxg_cas_ptr((void **)(p), (void **)(expected), (void *)(desired))
#endif

/* 1 found (*value a new reference), 0 not found, -1 error. */
static inline int
fxg_dict_get_ref(PyObject *dict, PyObject *key, PyObject **value)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyDict_GetItemRef(dict, key, value);
#else
    *value = Py_XNewRef(PyDict_GetItemWithError(dict, key));
    return *value != NULL ? 1 : (PyErr_Occurred() ? -1 : 0);
#endif
}

#endif
