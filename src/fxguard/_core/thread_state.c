/* Per-thread FX-tracing state: trace cells and the readers/writers on them. */
#include "fxguard.h"

typedef struct {
    PyObject_HEAD
    int tracing;
    int kept; /* in st->kept_cells */
} CellObject;

static void
cell_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    /* A cell that dies set (its thread ended mid-trace) must not keep the
     * "someone is tracing" count up forever. */
    if (((CellObject *)self)->tracing) {
        fxg_state *st = fxg_state_of_type(tp);
        if (st != NULL) {
            st->tracing_cells--;
        }
    }
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyObject *
cell_repr(PyObject *self)
{
    return PyUnicode_FromFormat("<fxguard trace cell tracing=%s>",
                                ((CellObject *)self)->tracing ? "True" : "False");
}

static PyType_Slot cell_slots[] = {
    {Py_tp_dealloc, cell_dealloc},
    {Py_tp_repr, cell_repr},
    {Py_tp_doc, "One thread's FX-tracing flag (internal)."},
    {0, NULL},
};

PyType_Spec fxg_cell_spec = {
    .name = "fxguard._core.TraceCell",
    .basicsize = sizeof(CellObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cell_slots,
};

void
fxg_cell_set(fxg_state *st, PyObject *cell, int value)
{
    CellObject *c = (CellObject *)cell;
    value = value != 0;
    if (c->tracing != value) {
        st->tracing_cells += value ? 1 : -1;
        c->tracing = value;
    }
}

/* The calling thread's own cell, borrowed; NULL without error if it has none. */
static PyObject *
own_cell(fxg_state *st)
{
    PyObject *tsdict = PyThreadState_GetDict();
    if (tsdict == NULL) {
        return NULL;
    }
    return PyDict_GetItemWithError(tsdict, st->cell_key);
}

/* The cell torch's thread-local state carries into this thread (an autograd
 * worker running a tracing thread's backward), as a new reference; NULL
 * without error if none.  Calls into torch: only taken while some thread is
 * tracing and the caller has no cell of its own. */
static PyObject *
propagated_cell(fxg_state *st)
{
    if (st->tls_has == NULL || st->tls_get == NULL) {
        return NULL;
    }
    PyObject *has = PyObject_CallOneArg(st->tls_has, st->cell_key);
    if (has == NULL) {
        return NULL;
    }
    int present = PyObject_IsTrue(has);
    Py_DECREF(has);
    if (present <= 0) {
        return NULL;
    }
    PyObject *cell = PyObject_CallOneArg(st->tls_get, st->cell_key);
    if (cell != NULL && !Py_IS_TYPE(cell, st->cell_type)) {
        Py_CLEAR(cell); /* someone else's object under our key: ignore it */
    }
    return cell;
}

/* Stock torch's module global, read when fxguard is not installed so that
 * fxguard.is_fx_tracing() still tells the truth.  Never imports torch. */
static int
torch_global_flag(void)
{
    PyObject *name = PyUnicode_FromString("torch.fx._symbolic_trace");
    if (name == NULL) {
        return -1;
    }
    PyObject *mod = PyImport_GetModule(name);
    Py_DECREF(name);
    if (mod == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *flag = PyObject_GetAttrString(mod, "_is_fx_tracing_flag");
    Py_DECREF(mod);
    if (flag == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    int r = PyObject_IsTrue(flag);
    Py_DECREF(flag);
    return r;
}

static int
call_truth(PyObject *fn)
{
    PyObject *r = PyObject_CallNoArgs(fn);
    if (r == NULL) {
        return -1;
    }
    int t = PyObject_IsTrue(r);
    Py_DECREF(r);
    return t;
}

int
fxg_thread_is_tracing(fxg_state *st)
{
    if (st->mode == FXG_MODE_UPSTREAM) {
        return call_truth(st->upstream_get);
    }
    PyObject *own = own_cell(st);
    if (own != NULL) {
        /* A thread with a cell of its own answers from it: no torch call. */
        if (((CellObject *)own)->tracing || st->mode == FXG_MODE_PATCHED) {
            return ((CellObject *)own)->tracing;
        }
    }
    else if (PyErr_Occurred()) {
        return -1;
    }
    if (st->mode == FXG_MODE_OFF) {
        return torch_global_flag();
    }
    if (st->tracing_cells == 0) {
        return 0; /* nobody traces: nothing can have been carried here */
    }
    PyObject *carried = propagated_cell(st);
    if (carried == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    int r = ((CellObject *)carried)->tracing;
    Py_DECREF(carried);
    return r;
}

static int
torch_is_compiling(fxg_state *st)
{
    if (st->is_compiling != NULL) {
        return call_truth(st->is_compiling);
    }
    /* Not installed: use torch.compiler.is_compiling if torch is loaded. */
    PyObject *name = PyUnicode_FromString("torch.compiler");
    if (name == NULL) {
        return -1;
    }
    PyObject *mod = PyImport_GetModule(name);
    Py_DECREF(name);
    if (mod == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *fn = PyObject_GetAttrString(mod, "is_compiling");
    Py_DECREF(mod);
    if (fn == NULL) {
        return -1;
    }
    int r = call_truth(fn);
    Py_DECREF(fn);
    return r;
}

int
fxg_thread_is_symbolic_tracing(fxg_state *st)
{
    int tracing = fxg_thread_is_tracing(st);
    if (tracing <= 0) {
        return tracing; /* the common case: torch is never called */
    }
    int compiling = torch_is_compiling(st);
    return compiling < 0 ? -1 : !compiling;
}

/* The cell a write on this thread goes to, as a new reference: the thread's
 * own; else the one carried in by autograd (a worker acting for a tracing
 * thread writes that thread's state); else a new own cell. */
static PyObject *
cell_for_write(fxg_state *st, int *is_own)
{
    PyObject *own = own_cell(st);
    if (own != NULL) {
        *is_own = 1;
        return Py_NewRef(own);
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (st->tracing_cells > 0) {
        PyObject *carried = propagated_cell(st);
        if (carried != NULL) {
            *is_own = 0;
            return carried;
        }
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
    PyObject *tsdict = PyThreadState_GetDict();
    if (tsdict == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "fxguard: no thread state dict");
        return NULL;
    }
    CellObject *cell = PyObject_New(CellObject, st->cell_type);
    if (cell == NULL) {
        return NULL;
    }
    cell->tracing = 0;
    cell->kept = 0;
    if (PyDict_SetItem(tsdict, st->cell_key, (PyObject *)cell) < 0) {
        Py_DECREF(cell);
        return NULL;
    }
    *is_own = 1;
    return (PyObject *)cell;
}

PyObject *
fxg_thread_set_tracing(fxg_state *st, int value, int *prev)
{
    int is_own = 0;
    PyObject *cell = cell_for_write(st, &is_own);
    if (cell == NULL) {
        return NULL;
    }
    *prev = ((CellObject *)cell)->tracing;
    fxg_cell_set(st, cell, value);
    if (value && is_own && st->tls_stash != NULL) {
        /* Publish the cell in torch's thread-local objects so that graph
         * tasks started from here carry it into autograd workers. */
        PyObject *r = PyObject_CallFunctionObjArgs(st->tls_stash, st->cell_key, cell, NULL);
        if (r != NULL && st->tls_stash_steals) {
            /* torch 2.11 keeps the cell without a reference of its own and
             * drops one later, also from C++ thread-exit code that may not
             * hold the GIL.  Give it the reference it will drop, and keep the
             * cell for good, so that drop is never the last one. */
            Py_INCREF(cell);
            CellObject *c = (CellObject *)cell;
            if (!c->kept && PyList_Append(st->kept_cells, cell) == 0) {
                c->kept = 1;
            }
            PyErr_Clear(); /* a failed append only costs the safety margin */
        }
        if (r == NULL) {
            fxg_cell_set(st, cell, *prev);
            Py_DECREF(cell);
            return NULL;
        }
        Py_DECREF(r);
    }
    return cell;
}

int
fxg_upstream_set(fxg_state *st, PyObject *value)
{
    PyObject *r = PyObject_CallOneArg(st->upstream_set, value);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}
