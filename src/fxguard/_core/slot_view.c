/* SlotView: the object rewritten torch code reads its per-thread globals from.
 *
 * install() recompiles each function that used a module global `x` so that
 * it says `__fxguard_tls__.x` instead; `__fxguard_tls__` is a SlotView whose
 * `names` maps "x" to a slot of the thread record.  Reading the attribute
 * gives the calling thread's value, assigning it sets only that thread's.
 * Names not in the map behave as on a plain object (and cannot be set).
 * Without the GIL: `names` is a private copy, never changed after __new__,
 * so reads need no lock; the values live in the records (fxguard.h). */
#include "fxguard.h"

typedef struct {
    PyObject_HEAD
    PyObject *names; /* dict: str -> int slot index (FXG_FLAG_SLOT for the FX flag) */
} SlotViewObject;

static PyObject *
slot_view_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"names", NULL};
    PyObject *names;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!:SlotView", kwlist, &PyDict_Type, &names)) {
        return NULL;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(names, &pos, &key, &value)) {
        Py_ssize_t index = PyLong_CheckExact(value) ? PyLong_AsSsize_t(value) : FXG_FLAG_SLOT - 1;
        if (index == -1 && PyErr_Occurred()) {
            return NULL; /* OverflowError: no such slot */
        }
        if (!PyUnicode_CheckExact(key) || index < FXG_FLAG_SLOT) {
            PyErr_SetString(PyExc_TypeError,
                            "SlotView(names): a dict of str -> slot index (int >= -1)");
            return NULL;
        }
    }
    SlotViewObject *self = (SlotViewObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->names = PyDict_Copy(names);
    if (self->names == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
slot_view_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(((SlotViewObject *)self)->names);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int
slot_view_clear(PyObject *self)
{
    Py_CLEAR(((SlotViewObject *)self)->names);
    return 0;
}

static void
slot_view_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    slot_view_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* The slot `name` maps to: 1 with *index set, 0 if none, -1 on error. */
static int
slot_of(SlotViewObject *v, PyObject *name, Py_ssize_t *index)
{
    PyObject *i = PyDict_GetItemWithError(v->names, name);
    if (i == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    *index = PyLong_AsSsize_t(i);
    return 1;
}

PyObject *
fxg_slot_value(fxg_state *st, Py_ssize_t index)
{
    fxg_record *own = fxg_record_ready(st);
    if (own != NULL) {
        if (index == FXG_FLAG_SLOT) {
            return PyBool_FromLong(FXG_LOAD_INT(&own->flag));
        }
        PyObject *value = fxg_record_value(own, index);
        if (value != NULL) {
            return value;
        }
    }
    else if (PyErr_Occurred()) {
        return NULL;
    }
    fxg_record *rec = fxg_record_for(st);
    if (rec == NULL) {
        return NULL;
    }
    PyObject *value;
    if (index == FXG_FLAG_SLOT) {
        value = PyBool_FromLong(FXG_LOAD_INT(&rec->flag));
    }
    else if ((value = fxg_record_value(rec, index)) == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "fxguard: a SlotView from an earlier install() was used");
    }
    Py_DECREF(rec);
    return value;
}

static PyObject *
slot_view_getattro(PyObject *self, PyObject *name)
{
    Py_ssize_t index;
    int found = slot_of((SlotViewObject *)self, name, &index);
    if (found <= 0) {
        return found < 0 ? NULL : PyObject_GenericGetAttr(self, name);
    }
    return fxg_slot_value(fxg_state_of_type(Py_TYPE(self)), index);
}

static int
slot_view_setattro(PyObject *self, PyObject *name, PyObject *value)
{
    Py_ssize_t index;
    int found = slot_of((SlotViewObject *)self, name, &index);
    if (found <= 0) {
        if (found == 0) {
            PyErr_Format(PyExc_AttributeError, "SlotView has no slot %R", name);
        }
        return -1;
    }
    if (value == NULL) {
        PyErr_Format(PyExc_AttributeError, "per-thread global %R cannot be deleted", name);
        return -1;
    }
    fxg_state *st = fxg_state_of_type(Py_TYPE(self));
    fxg_record *rec = fxg_record_for(st);
    if (rec == NULL) {
        return -1;
    }
    int r = 0;
    if (index == FXG_FLAG_SLOT) {
        int truth = PyObject_IsTrue(value);
        if (truth < 0) {
            r = -1;
        }
        else {
            fxg_record_set_flag(st, rec, truth);
        }
    }
    else {
        r = fxg_record_set_value(rec, index, value);
    }
    Py_DECREF(rec);
    return r;
}

static PyObject *
slot_view_repr(PyObject *self)
{
    return PyUnicode_FromFormat("<fxguard per-thread globals %R>", ((SlotViewObject *)self)->names);
}

static PyType_Slot slot_view_slots[] = {
    {Py_tp_new, slot_view_new},
    {Py_tp_dealloc, slot_view_dealloc},
    {Py_tp_traverse, slot_view_traverse},
    {Py_tp_clear, slot_view_clear},
    {Py_tp_getattro, slot_view_getattro},
    {Py_tp_setattro, slot_view_setattro},
    {Py_tp_repr, slot_view_repr},
    {Py_tp_doc, "SlotView(names)\n--\n\n"
                "Attribute access to the calling thread's values of per-thread globals;\n"
                "names maps attribute names to slot indices (-1: the FX-tracing flag)."},
    {0, NULL},
};

PyType_Spec fxg_slot_view_spec = {
    .name = "fxguard._core.SlotView",
    .basicsize = sizeof(SlotViewObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = slot_view_slots,
};
