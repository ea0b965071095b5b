/* fxguard: every CPython-version shim of the C core that concerns function
 * objects, in one place, each with the CPython change behind it.
 *
 * Fast readers (reader.c) serve calls of a torch function from C by setting
 * the function object's vectorcall pointer.  Whether the interpreter honours
 * that pointer depends on the version:
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

#include "fxguard.h"

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

#endif
