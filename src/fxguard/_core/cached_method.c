/* CachedMethod: a method descriptor that binds once per instance.
 *
 * A `with` statement looks up __enter__ and __exit__ on the type and binds
 * each to the instance: two method objects made and freed per with-block,
 * most of an uncontended lock cycle.  A CachedMethod keeps the bound method
 * in a slot of the instance and hands out that one.  The instance and its
 * bound methods form a cycle, so the owning type must be GC-aware and visit
 * and clear the slots: an instance used in a with-block is freed by the
 * cycle collector, not at its last reference.  Without the GIL the slot is
 * filled with a compare-and-swap (cached_get). */
#include "fxguard.h"

typedef struct {
    PyObject_HEAD
    PyObject *method;   /* the plain method descriptor */
    PyTypeObject *owner;
    Py_ssize_t offset;  /* of the instance's PyObject * cache slot */
} CachedMethodObject;

static PyObject *
cached_get(PyObject *self, PyObject *obj, PyObject *type)
{
    CachedMethodObject *c = (CachedMethodObject *)self;
    descrgetfunc bind = Py_TYPE(c->method)->tp_descr_get;
    if (obj == NULL || obj == Py_None || !Py_IS_TYPE(obj, c->owner)) {
        return bind(c->method, obj, type); /* class access, or someone else's object */
    }
    /* Without the GIL two threads may bind at once: the first to store wins,
     * the other lets its own go.  The slot is cleared only by the owner's
     * tp_clear, when no thread can reach the instance. */
    PyObject **slot = (PyObject **)((char *)obj + c->offset);
    PyObject *bound = FXG_LOAD_PTR_ACQUIRE(slot);
    if (bound == NULL) {
        PyObject *fresh = bind(c->method, obj, type), *expected = NULL;
        if (fresh == NULL) {
            return NULL;
        }
        if (FXG_CAS_PTR(slot, &expected, fresh)) {
            bound = fresh;
        }
        else {
            Py_DECREF(fresh);
            bound = expected;
        }
    }
    return Py_NewRef(bound);
}

static int
cached_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(((CachedMethodObject *)self)->method);
    Py_VISIT(((CachedMethodObject *)self)->owner);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int
cached_clear(PyObject *self)
{
    Py_CLEAR(((CachedMethodObject *)self)->method);
    Py_CLEAR(((CachedMethodObject *)self)->owner);
    return 0;
}

static void
cached_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    cached_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyType_Slot cached_slots[] = {
    {Py_tp_dealloc, cached_dealloc},
    {Py_tp_traverse, cached_traverse},
    {Py_tp_clear, cached_clear},
    {Py_tp_descr_get, cached_get},
    {0, NULL},
};

static PyType_Spec cached_spec = {
    .name = "fxguard._core.CachedMethod",
    .basicsize = sizeof(CachedMethodObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cached_slots,
};

int
fxg_cache_methods(PyObject *module, PyTypeObject *owner, PyMethodDef *defs,
                  const Py_ssize_t *offsets)
{
    PyObject *cached_type = PyType_FromModuleAndSpec(module, &cached_spec, NULL);
    if (cached_type == NULL) {
        return -1;
    }
    int r = 0;
    for (int i = 0; r == 0 && defs[i].ml_name != NULL; i++) {
        CachedMethodObject *c = PyObject_GC_New(CachedMethodObject, (PyTypeObject *)cached_type);
        if (c == NULL) {
            r = -1;
            break;
        }
        c->owner = (PyTypeObject *)Py_NewRef(owner);
        c->offset = offsets[i];
        c->method = PyDescr_NewMethod(owner, &defs[i]);
        PyObject_GC_Track(c);
        /* The type is immutable to Python code; its own module may finish it. */
        if (c->method == NULL || PyDict_SetItemString(owner->tp_dict, defs[i].ml_name,
                                                      (PyObject *)c) < 0) {
            r = -1;
        }
        Py_DECREF(c);
    }
    PyType_Modified(owner);
    Py_DECREF(cached_type);
    return r;
}
