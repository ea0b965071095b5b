/* ThreadFlag: a data descriptor that install() puts on the class of
 * torch.fx._symbolic_trace, so that reading or assigning the module attribute
 * _is_fx_tracing_flag (as _set_compilation_env does) reads or writes the
 * calling thread's flag instead of one process-wide global. */
#include "fxguard.h"

typedef struct {
    PyObject_HEAD
} FlagAttributeObject;

static PyObject *
flag_get(PyObject *self, PyObject *obj, PyObject *Py_UNUSED(type))
{
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self); /* looked up on the class itself */
    }
    fxg_state *st = fxg_state_of_type(Py_TYPE(self));
    if (st == NULL) {
        return NULL;
    }
    int r = fxg_thread_is_tracing(st);
    if (r < 0) {
        return NULL;
    }
    return PyBool_FromLong(r);
}

static int
flag_set(PyObject *self, PyObject *Py_UNUSED(obj), PyObject *value)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError,
                        "fxguard: _is_fx_tracing_flag cannot be deleted while fxguard is installed");
        return -1;
    }
    fxg_state *st = fxg_state_of_type(Py_TYPE(self));
    if (st == NULL) {
        return -1;
    }
    int v = PyObject_IsTrue(value);
    if (v < 0) {
        return -1;
    }
    if (st->mode == FXG_MODE_UPSTREAM) {
        return fxg_upstream_set(st, v ? Py_True : Py_False);
    }
    int prev;
    PyObject *cell = fxg_thread_set_tracing(st, v, &prev);
    if (cell == NULL) {
        return -1;
    }
    Py_DECREF(cell);
    return 0;
}

static void
flag_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyType_Slot flag_slots[] = {
    {Py_tp_descr_get, flag_get},
    {Py_tp_descr_set, flag_set},
    {Py_tp_dealloc, flag_dealloc},
    {Py_tp_doc, "ThreadFlag()\n--\n\n"
                "Data descriptor: the attribute reads and writes the calling thread's FX-tracing flag."},
    {0, NULL},
};

PyType_Spec fxg_flag_attribute_spec = {
    .name = "fxguard._core.ThreadFlag",
    .basicsize = sizeof(FlagAttributeObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = flag_slots,
};
