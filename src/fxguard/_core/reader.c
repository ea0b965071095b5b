/* Reader: serves calls of a one-line torch reader (`return the_global`) from C.
 *
 * install() rewrites such a function's code to read a per-thread slot, which
 * costs a Python frame plus a SlotView lookup per call.  A Reader answers the
 * same question in C.  Two routes, by Python version (compat.h):
 *   - vectorcall (3.10, 3.12, 3.13): `reader.function = fn` points fn's
 *     vectorcall at reader_vectorcall(); calls then never enter fn's code.
 *     fn keeps its identity, __code__ (the rewritten code, with the Reader
 *     as its last constant: that is how reader_vectorcall finds it) and
 *     signature.  `reader.function = None` puts the pointer back.
 *   - elsewhere fn's code calls `reader.read()`, a METH_FASTCALL builtin,
 *     which 3.11 specialises (a METH_NOARGS one it does not).
 * Either way no Python frame runs for fn: debuggers, sys.settrace and
 * coverage do not see these calls.
 * A reader may call one global of its module first (`first`, by name: torch's
 * is_fx_tracing() warns on every call); the vectorcall route calls it, the
 * code route's code does.
 *
 * Without the GIL: kind, slot, st and first never change after __new__;
 * function and saved are written by the `function` setter (install(),
 * uninstall()) inside the Reader's critical section, and reader_vectorcall
 * reads them with atomic loads.  The function's own vectorcall pointer is
 * set as CPython's PyFunction_SetVectorcall sets it (a plain store that
 * calls racing with install()/uninstall() may miss, as with any function). */
#include "fxguard.h"

typedef enum {
    FXG_READ_VALUE = 0,    /* the slot's value (FXG_FLAG_SLOT: the FX flag, a bool) */
    FXG_READ_SYMBOLIC = 1, /* FX flag and not is_compiling(): fxguard.is_fx_symbolic_tracing */
} fxg_read_kind;

typedef struct {
    PyObject_HEAD
    fxg_read_kind kind;
    Py_ssize_t slot;
    fxg_state *st;         /* its module's state: the type keeps the module alive */
    PyObject *first;       /* name of the global called before answering, or NULL */
    PyObject *function;    /* the function served by vectorcall; NULL when detached */
    vectorcallfunc saved;  /* its vectorcall pointer before attaching */
} ReaderObject;

static PyObject *
reader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"kind", "slot", "first", NULL};
    int kind;
    Py_ssize_t slot = FXG_FLAG_SLOT;
    PyObject *first = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "i|n$O:Reader", kwlist, &kind, &slot,
                                     &first)) {
        return NULL;
    }
    if (first != Py_None && !PyUnicode_Check(first)) {
        PyErr_Format(PyExc_TypeError, "Reader: first must be a global's name or None, not %.100s",
                     Py_TYPE(first)->tp_name);
        return NULL;
    }
    if (kind != FXG_READ_VALUE && kind != FXG_READ_SYMBOLIC) {
        PyErr_Format(PyExc_ValueError, "Reader: unknown kind %d", kind);
        return NULL;
    }
    if (slot < FXG_FLAG_SLOT || (kind == FXG_READ_SYMBOLIC && slot != FXG_FLAG_SLOT)) {
        PyErr_SetString(PyExc_ValueError,
                        "Reader: slot must be >= -1 (-1 for READ_SYMBOLIC, the FX flag)");
        return NULL;
    }
    fxg_state *st = fxg_state_of_type(type);
    ReaderObject *self = st ? (ReaderObject *)type->tp_alloc(type, 0) : NULL;
    if (self != NULL) {
        self->kind = (fxg_read_kind)kind;
        self->slot = slot;
        self->st = st;
        if (first != Py_None) {
            self->first = Py_NewRef(first);
            PyUnicode_InternInPlace(&self->first); /* hashed once: a fast lookup per call */
        }
    }
    return (PyObject *)self;
}

static PyObject *
answer(ReaderObject *r)
{
    if (r->kind == FXG_READ_VALUE) {
        return fxg_slot_value(r->st, r->slot);
    }
    int v = fxg_thread_is_symbolic_tracing(r->st);
    return v < 0 ? NULL : PyBool_FromLong(v);
}

static PyObject *
reader_read(PyObject *self, PyObject *const *Py_UNUSED(args), Py_ssize_t nargs)
{
    if (nargs != 0) {
        PyErr_Format(PyExc_TypeError, "read() takes no arguments (%zd given)", nargs);
        return NULL;
    }
    return answer((ReaderObject *)self);
}

/* -- the vectorcall route ---------------------------------------------------- */

static void reader_dealloc(PyObject *self);

/* The Reader a function's code carries as its last constant, borrowed; NULL
 * if none (someone swapped __code__ since: then the code runs). */
static ReaderObject *
reader_of(PyObject *func)
{
    PyObject *consts = ((PyCodeObject *)PyFunction_GET_CODE(func))->co_consts;
    Py_ssize_t n = PyTuple_GET_SIZE(consts);
    PyObject *last = n ? PyTuple_GET_ITEM(consts, n - 1) : NULL;
    /* tp_dealloc tells a Reader from any other constant without module state. */
    if (last == NULL || Py_TYPE(last)->tp_dealloc != reader_dealloc) {
        return NULL;
    }
    ReaderObject *r = (ReaderObject *)last;
    return FXG_LOAD_PTR(&r->function) == (void *)func ? r : NULL;
}

/* Call the global `name` of func's module with no arguments, as its code would. */
static int
call_first(PyObject *func, PyObject *name)
{
    PyObject *fn; /* a strong reference: the call (or another thread) may rebind the global */
    int found = fxg_dict_get_ref(PyFunction_GET_GLOBALS(func), name, &fn);
    if (found <= 0) {
        if (found == 0) {
            PyErr_Format(PyExc_NameError, "name '%U' is not defined", name);
        }
        return -1;
    }
    PyObject *result = PyObject_CallNoArgs(fn);
    Py_DECREF(fn);
    Py_XDECREF(result);
    return result == NULL ? -1 : 0;
}

/* CPython's own vectorcall of Python functions: a code address, the same for
 * every interpreter, so one process-wide copy is right.  Set by the module's
 * exec from a function it makes (3.13 no longer exports the symbol). */
static vectorcallfunc python_vectorcall;

static PyObject *
reader_vectorcall(PyObject *func, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    ReaderObject *r = reader_of(func);
    if (r == NULL) {
        /* __code__ was swapped since attaching (or the reader detached):
         * run whatever code it has. */
        vectorcallfunc python = (vectorcallfunc)FXG_LOAD_PTR_ACQUIRE(&python_vectorcall);
        return python(func, args, nargsf, kwnames);
    }
    if (PyVectorcall_NARGS(nargsf) == 0 && (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0)) {
        if (r->first != NULL && call_first(func, r->first) < 0) {
            return NULL;
        }
        return answer(r);
    }
    vectorcallfunc saved = (vectorcallfunc)FXG_LOAD_PTR(&r->saved);
    return saved(func, args, nargsf, kwnames); /* the code raises the TypeError */
}

static int
attach(ReaderObject *r, PyObject *func)
{
    if (!FXG_VECTORCALL_READERS) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Reader.function: this Python ignores a function's vectorcall "
                        "(use read() from the function's code)");
        return -1;
    }
    if (!PyFunction_Check(func)) {
        PyErr_SetString(PyExc_TypeError, "Reader.function must be a Python function or None");
        return -1;
    }
    PyCodeObject *code = (PyCodeObject *)PyFunction_GET_CODE(func);
    if (code->co_argcount != 0 || code->co_kwonlyargcount != 0 ||
        (code->co_flags & (CO_VARARGS | CO_VARKEYWORDS))) {
        PyErr_SetString(PyExc_ValueError,
                        "Reader.function: only a function without parameters can be served");
        return -1;
    }
    PyObject *consts = code->co_consts;
    Py_ssize_t n = PyTuple_GET_SIZE(consts);
    if (n == 0 || PyTuple_GET_ITEM(consts, n - 1) != (PyObject *)r) {
        PyErr_SetString(PyExc_ValueError,
                        "Reader.function: the function's code must carry this Reader "
                        "as its last constant");
        return -1;
    }
    PyFunctionObject *fn = (PyFunctionObject *)func;
    if (fn->vectorcall == reader_vectorcall) {
        PyErr_SetString(PyExc_ValueError, "Reader.function: the function already has a reader");
        return -1;
    }
    FXG_STORE_PTR(&r->saved, fn->vectorcall);
    FXG_STORE_PTR(&r->function, Py_NewRef(func));
    fxg_function_set_vectorcall(fn, reader_vectorcall);
    return 0;
}

/* The function it served, to be let go of (outside the critical section). */
static PyObject *
detach(ReaderObject *r)
{
    PyFunctionObject *fn = (PyFunctionObject *)r->function;
    if (fn->vectorcall == reader_vectorcall) {
        fxg_function_set_vectorcall(fn, r->saved);
    }
    FXG_STORE_PTR(&r->function, NULL);
    return (PyObject *)fn;
}

static PyObject *
reader_get_function(PyObject *self, void *Py_UNUSED(closure))
{
    PyObject *f;
    FXG_BEGIN_CRITICAL_SECTION(self);
    f = Py_NewRef(((ReaderObject *)self)->function ? ((ReaderObject *)self)->function : Py_None);
    FXG_END_CRITICAL_SECTION();
    return f;
}

static int
reader_set_function(PyObject *self, PyObject *value, void *Py_UNUSED(closure))
{
    ReaderObject *r = (ReaderObject *)self;
    PyObject *detached = NULL;
    int result = 0;
    FXG_BEGIN_CRITICAL_SECTION(self);
    if (value == NULL || value == Py_None) {
        if (r->function != NULL) {
            detached = detach(r);
        }
    }
    else if (r->function != NULL) {
        PyErr_SetString(PyExc_ValueError, "Reader.function: already serving a function");
        result = -1;
    }
    else {
        result = attach(r, value);
    }
    FXG_END_CRITICAL_SECTION();
    Py_XDECREF(detached);
    return result;
}

/* -- function versions (compat.h) -------------------------------------------- */

/* _function_version(fn) -> int: 0 where the Python has none. */
static PyObject *
function_version(PyObject *Py_UNUSED(module), PyObject *func)
{
    if (!PyFunction_Check(func)) {
        PyErr_SetString(PyExc_TypeError, "_function_version() needs a Python function");
        return NULL;
    }
    return PyLong_FromUnsignedLong(fxg_function_version((PyFunctionObject *)func));
}

/* _restore_function_version(fn, version): the caller vouches that fn's code,
 * defaults and kwdefaults are the objects they were when `version` was read.
 * Only a cleared version (0) is replaced. */
static PyObject *
restore_function_version(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyFunction_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "_restore_function_version(function, version)");
        return NULL;
    }
    unsigned long version = PyLong_AsUnsignedLong(args[1]);
    if (version == (unsigned long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (version > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "_restore_function_version: version too large");
        return NULL;
    }
    PyFunctionObject *fn = (PyFunctionObject *)args[0];
    if (version != 0 && fxg_function_version(fn) == 0 && fn->vectorcall != reader_vectorcall) {
        fxg_function_restore_version(fn, version);
    }
    Py_RETURN_NONE;
}

static PyMethodDef fxg_reader_functions[] = {
    {"_function_version", function_version, METH_O,
     "_function_version($module, function, /)\n--\n\n"
     "The function's specialisation version (0 if none or no such field)."},
    {"_restore_function_version", (PyCFunction)(void (*)(void))restore_function_version,
     METH_FASTCALL,
     "_restore_function_version($module, function, version, /)\n--\n\n"
     "Give a function whose version was cleared the version it had; the caller\n"
     "vouches that its code and defaults are the objects they were then."},
    {NULL, NULL, 0, NULL},
};

/* -- the type ------------------------------------------------------------------ */

static int
reader_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(((ReaderObject *)self)->function);
    Py_VISIT(((ReaderObject *)self)->first);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int
reader_clear(PyObject *self)
{
    ReaderObject *r = (ReaderObject *)self;
    if (r->function != NULL) {
        Py_DECREF(detach(r)); /* never leave a function pointing at a dead reader */
    }
    Py_CLEAR(r->first);
    return 0;
}

static void
reader_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    reader_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyObject *
reader_repr(PyObject *self)
{
    ReaderObject *r = (ReaderObject *)self;
    PyObject *function = reader_get_function(self, NULL);
    PyObject *repr = PyUnicode_FromFormat("<fxguard.Reader %s slot=%zd function=%R>",
                                          r->kind == FXG_READ_VALUE ? "value" : "symbolic",
                                          r->slot, function);
    Py_DECREF(function);
    return repr;
}

static PyMethodDef reader_methods[] = {
    {"read", (PyCFunction)(void (*)(void))reader_read, METH_FASTCALL,
     "read($self, /)\n--\n\nThe calling thread's answer."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef reader_getset[] = {
    {"function", reader_get_function, reader_set_function,
     "The function whose calls this Reader serves through its vectorcall\n"
     "pointer, or None.  Setting None puts the function's pointer back.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot reader_slots[] = {
    {Py_tp_new, reader_new},
    {Py_tp_dealloc, reader_dealloc},
    {Py_tp_traverse, reader_traverse},
    {Py_tp_clear, reader_clear},
    {Py_tp_methods, reader_methods},
    {Py_tp_getset, reader_getset},
    {Py_tp_repr, reader_repr},
    {Py_tp_doc, "Reader(kind, slot=-1, *, first=None)\n--\n\n"
                "Answers a one-line per-thread reader from C: kind READ_VALUE gives the\n"
                "slot's value, READ_SYMBOLIC the FX flag and not is_compiling().  first:\n"
                "the name of a global of the function's module that a served call calls\n"
                "first (the function's code calls it too)."},
    {0, NULL},
};

PyType_Spec fxg_reader_spec = {
    .name = "fxguard._core.Reader",
    .basicsize = sizeof(ReaderObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = reader_slots,
};

int
fxg_reader_module_exec(PyObject *module)
{
    if (PyModule_AddFunctions(module, fxg_reader_functions) < 0 ||
        PyModule_AddIntConstant(module, "READ_VALUE", FXG_READ_VALUE) < 0 ||
        PyModule_AddIntConstant(module, "READ_SYMBOLIC", FXG_READ_SYMBOLIC) < 0 ||
        PyModule_AddIntConstant(module, "VECTORCALL_READERS", FXG_VECTORCALL_READERS) < 0) {
        return -1;
    }
    if (FXG_LOAD_PTR_ACQUIRE(&python_vectorcall) != NULL) {
        return 0;
    }
    PyObject *code = Py_CompileString("def f(): pass", "<fxguard>", Py_file_input);
    PyObject *globals = code ? PyDict_New() : NULL;
    PyObject *fn = globals ? PyFunction_New(code, globals) : NULL;
    if (fn != NULL) { /* every interpreter stores the same address */
        FXG_STORE_PTR_RELEASE(&python_vectorcall, ((PyFunctionObject *)fn)->vectorcall);
    }
    Py_XDECREF(fn);
    Py_XDECREF(globals);
    Py_XDECREF(code);
    return fn != NULL ? 0 : -1;
}
