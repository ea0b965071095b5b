/* fxguard._core: module object, its per-interpreter state, and the functions
 * the Python layer calls.  Everything mutable lives in the module state, so
 * each interpreter that imports fxguard gets its own. */
#include "fxguard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static fxg_state *
state_of(PyObject *module)
{
    return (fxg_state *)PyModule_GetState(module);
}

/* The two readers are METH_FASTCALL, not METH_NOARGS: CPython 3.11+
 * specialises calls of FASTCALL builtins (CALL_BUILTIN_FAST), not of
 * NOARGS ones, and these are called on every compiled call. */
static int
no_arguments(const char *name, Py_ssize_t nargs)
{
    if (nargs != 0) {
        PyErr_Format(PyExc_TypeError, "%s() takes no arguments (%zd given)", name, nargs);
        return -1;
    }
    return 0;
}

static PyObject *
is_fx_tracing(PyObject *module, PyObject *const *Py_UNUSED(args), Py_ssize_t nargs)
{
    if (no_arguments("is_fx_tracing", nargs) < 0) {
        return NULL;
    }
    int r = fxg_thread_is_tracing(state_of(module));
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *
is_fx_symbolic_tracing(PyObject *module, PyObject *const *Py_UNUSED(args), Py_ssize_t nargs)
{
    if (no_arguments("is_fx_symbolic_tracing", nargs) < 0) {
        return NULL;
    }
    int r = fxg_thread_is_symbolic_tracing(state_of(module));
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *
tracing_records(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    fxg_state *st = state_of(module);
    /* A record torch 2.11 no longer holds may still count (its thread ended
     * inside a trace): let go of those first.  Rare: uninstall() asks. */
    if (FXG_LOAD_SSIZE(&st->records.tracing) > 0 && fxg_sweep_kept(st) < 0) {
        return NULL;
    }
    return PyLong_FromSsize_t(FXG_LOAD_SSIZE(&st->records.tracing));
}

/* _await_thread_exits(timeout): an exit handler (see
 * fxg_exiting_records): wait, with the GIL released, until threads that ended
 * have destroyed their torch thread-locals, or `timeout` seconds passed.
 * Returns how many are still pending. */
static PyObject *
await_thread_exits(PyObject *module, PyObject *arg)
{
    double timeout = PyFloat_AsDouble(arg);
    if (timeout == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    fxg_state *st = state_of(module);
    Py_ssize_t pending;
    for (int waited_ms = 0; (pending = fxg_exiting_records(st)) > 0 && waited_ms < timeout * 1000;
         waited_ms++) {
        Py_BEGIN_ALLOW_THREADS
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        Py_END_ALLOW_THREADS
    }
    return PyLong_FromSsize_t(pending);
}

static PyObject *
stash_steals_flag(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    fxg_state *st = state_of(module);
    fxg_mutex_lock(&st->config.mutex);
    int steals = st->config.stash_steals;
    fxg_mutex_unlock(&st->config.mutex);
    return PyBool_FromLong(steals);
}

static PyObject *
get_mode(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLong(fxg_config_mode(state_of(module)));
}

static PyObject *
thread_values(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    fxg_record *rec = fxg_record_for(state_of(module));
    if (rec == NULL) {
        return NULL;
    }
    PyObject *copy = fxg_record_values(rec);
    Py_DECREF(rec);
    return copy;
}

static PyObject *
carried_context(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return fxg_carried_context(state_of(module));
}

/* Before a thread's backward (torch.autograd's _engine_run_backward): its
 * record, published to torch's thread-local objects with its Context noted,
 * so the graph task carries both into autograd workers.  A pointer compare
 * and a flag test once the thread has one. */
static PyObject *
publish_record(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    if (PyThreadState_Get()->context == NULL) {
        PyObject *copy = PyContext_CopyCurrent(); /* creates the thread's Context */
        if (copy == NULL) {
            return NULL;
        }
        Py_DECREF(copy);
    }
    fxg_record *rec = fxg_record_for(state_of(module));
    if (rec == NULL) {
        return NULL;
    }
    Py_DECREF(rec);
    Py_RETURN_NONE;
}

/* Docstrings start with text signatures, so inspect.signature() works. */
/* _current_frames(): sys._current_frames() with the collector paused (a
 * collection while CPython 3.11 builds the frames can hang the process), in C
 * so that no exception can land between the pause and its end. */
static PyObject *
current_frames(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    PyObject *fn = PySys_GetObject("_current_frames"); /* borrowed: owned at once */
    if (fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "sys._current_frames is missing");
        return NULL;
    }
    Py_INCREF(fn);
    int was_enabled = PyGC_Disable();
    PyObject *frames = PyObject_CallNoArgs(fn);
    if (was_enabled) {
        PyGC_Enable();
    }
    Py_DECREF(fn);
    return frames;
}

/* _stat_paths(root, paths): each path's (st_size, st_mtime_ns) as two native
 * int64s, (-1, -1) where stat() fails.  paths: one str, the paths relative to
 * root separated by NUL ("" is none), as the writers scan caches its listing;
 * each is stat()ed with fstatat from one descriptor of root, the GIL released.
 * The scan's tree signature stats ~3000 paths per install(): ~3x faster than
 * os.stat, and no str object per path. */
static PyObject *
stat_paths(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *root = NULL, *paths;
    if (!PyArg_ParseTuple(args, "O&U:_stat_paths", PyUnicode_FSConverter, &root, &paths)) {
        return NULL;
    }
    PyObject *encoded = PyUnicode_EncodeFSDefault(paths);
    if (encoded == NULL) {
        Py_DECREF(root);
        return NULL;
    }
    const char *text = PyBytes_AS_STRING(encoded);
    Py_ssize_t size = PyBytes_GET_SIZE(encoded), n = size == 0 ? 0 : 1;
    for (Py_ssize_t i = 0; i < size; i++) {
        n += text[i] == '\0';
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 2 * (Py_ssize_t)sizeof(int64_t));
    if (out == NULL) {
        Py_DECREF(encoded);
        Py_DECREF(root);
        return NULL;
    }
    int64_t *values = (int64_t *)PyBytes_AS_STRING(out);
    const char *root_path = PyBytes_AS_STRING(root);
    Py_BEGIN_ALLOW_THREADS
    int fd = open(root_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const char *name = text; /* NUL-terminated: PyBytes keeps a NUL past the end */
    for (Py_ssize_t i = 0; i < n; i++) {
        struct stat st;
        if (fd >= 0 && fstatat(fd, name, &st, 0) == 0) {
            values[2 * i] = (int64_t)st.st_size;
            values[2 * i + 1] = (int64_t)st.st_mtim.tv_sec * 1000000000 + (int64_t)st.st_mtim.tv_nsec;
        }
        else {
            values[2 * i] = values[2 * i + 1] = -1;
        }
        name += strlen(name) + 1;
    }
    if (fd >= 0) {
        close(fd);
    }
    Py_END_ALLOW_THREADS
    Py_DECREF(encoded);
    Py_DECREF(root);
    return out;
}

static PyMethodDef core_methods[] = {
    {"is_fx_tracing", (PyCFunction)(void (*)(void))is_fx_tracing, METH_FASTCALL,
     "is_fx_tracing($module, /)\n--\n\nWhether the calling thread is FX tracing."},
    {"is_fx_symbolic_tracing", (PyCFunction)(void (*)(void))is_fx_symbolic_tracing, METH_FASTCALL,
     "is_fx_symbolic_tracing($module, /)\n--\n\n"
     "Whether the calling thread is FX tracing and not being compiled by dynamo.\n"
     "Does not call into torch unless the thread is tracing."},
    {"_current_frames", current_frames, METH_NOARGS,
     "_current_frames($module, /)\n--\n\n"
     "sys._current_frames() with the collector paused, uninterruptibly."},
    {"_stat_paths", stat_paths, METH_VARARGS,
     "_stat_paths($module, root, paths, /)\n--\n\n"
     "The size and mtime_ns of each path under root (paths: one str, separated\n"
     "by NUL), as native int64 pairs in bytes ((-1, -1) where stat fails)."},
    {"_tracing_records", tracing_records, METH_NOARGS,
     "_tracing_records($module, /)\n--\n\nNumber of threads whose FX flag is set."},
    {"_thread_values", thread_values, METH_NOARGS,
     "_thread_values($module, /)\n--\n\n"
     "The calling thread's per-thread globals, in slot order (a copy)."},
    {"_stash_steals", stash_steals_flag, METH_NOARGS,
     "_stash_steals($module, /)\n--\n\n"
     "Whether torch's _stash_obj_in_tls needed a compensating reference (torch 2.11)."},
    {"_mode", get_mode, METH_NOARGS,
     "_mode($module, /)\n--\n\nMODE_OFF, MODE_PATCHED or MODE_UPSTREAM."},
    {"_carried_context", carried_context, METH_NOARGS,
     "_carried_context($module, /)\n--\n\n"
     "On an autograd worker running another thread's graph task: that thread's\n"
     "contextvars.Context (torch config lives there); None elsewhere."},
    {"_publish_record", publish_record, METH_NOARGS,
     "_publish_record($module, /)\n--\n\n"
     "Before a backward: the calling thread's record, published for autograd\n"
     "workers, with its Context noted."},
    {"_await_thread_exits", await_thread_exits, METH_O,
     "_await_thread_exits($module, timeout, /)\n--\n\n"
     "At exit: wait until threads that ended have let go of their\n"
     "torch thread-locals (or timeout seconds); returns how many are left."},
    {"_configure", (PyCFunction)(void (*)(void))fxg_configure, METH_VARARGS | METH_KEYWORDS,
     "_configure($module, /, mode, *, defaults=(), factories=(), is_compiling=None,\n"
     "           tls_stash=None, tls_has=None, tls_get=None, upstream_get=None,\n"
     "           upstream_set=None, carry_context=False)\n--\n\n"
     "Called by install()/uninstall(): the slot layout and the torch functions\n"
     "the core may call.  Each call starts a new layout."},
    {"_extend_layout", fxg_extend_layout, METH_VARARGS,
     "_extend_layout($module, defaults, factories, /)\n--\n\n"
     "Slots added at the end of the layout (rows applied after install());\n"
     "threads keep the values they have."},
    {NULL, NULL, 0, NULL},
};

static int
add_type(PyObject *module, PyType_Spec *spec, PyTypeObject **slot, const char *public_name)
{
    *slot = (PyTypeObject *)PyType_FromModuleAndSpec(module, spec, NULL);
    if (*slot == NULL) {
        return -1;
    }
    if (public_name != NULL) {
        return PyModule_AddObjectRef(module, public_name, (PyObject *)*slot);
    }
    return 0;
}

static int
core_exec(PyObject *module)
{
    fxg_state *st = state_of(module);
    *st = (fxg_state){.config.mode = FXG_MODE_OFF};
#define FXG_NAME_INIT(field, text)                                    \
    if ((st->str.field = PyUnicode_InternFromString(text)) == NULL) { \
        return -1;                                                    \
    }
    FXG_NAMES(FXG_NAME_INIT)
#undef FXG_NAME_INIT
    st->tls.kept = PyList_New(0); /* its first keep sweeps and sets kept_sweep_at */
    if (st->tls.kept == NULL) {
        return -1;
    }
    if (PyModule_AddIntConstant(module, "MODE_OFF", FXG_MODE_OFF) < 0 ||
        PyModule_AddIntConstant(module, "MODE_PATCHED", FXG_MODE_PATCHED) < 0 ||
        PyModule_AddIntConstant(module, "MODE_UPSTREAM", FXG_MODE_UPSTREAM) < 0 ||
        PyModule_AddIntConstant(module, "FLAG_SLOT", FXG_FLAG_SLOT) < 0) {
        return -1;
    }
    fxg_types *t = &st->types;
    if (fxg_fork_module_exec(st) < 0 ||
        add_type(module, &fxg_record_spec, &t->record, NULL) < 0 ||
        add_type(module, &fxg_slot_view_spec, &t->slot_view, "SlotView") < 0 ||
        add_type(module, &fxg_fx_tracing_spec, &t->fx_tracing, "fx_tracing") < 0 ||
        add_type(module, &fxg_rlock_spec, &t->rlock, "RLock") < 0 ||
        fxg_rlock_type_exec(module, t->rlock) < 0 ||
        add_type(module, &fxg_reader_spec, &t->reader, "Reader") < 0 ||
        fxg_reader_module_exec(module) < 0 ||
        add_type(module, &fxg_dispatch_spec, &t->dispatch, "Dispatch") < 0) {
        return -1;
    }
    /* The one process-wide lock around block-mask creation (meant to be shared). */
    PyObject *lock = PyObject_CallNoArgs((PyObject *)t->rlock);
    if (lock == NULL) {
        return -1;
    }
    int r = PyModule_AddObjectRef(module, "block_mask_lock", lock);
    Py_DECREF(lock);
    return r;
}

/* The state's objects traverse visits; clear lets go of the second list
 * (config's go through fxg_config_clear, under its mutex). */
#define FXG_CONFIG_OBJECTS(X)                                                            \
    X(config.defaults) X(config.factories) X(config.is_compiling) X(config.upstream_get)  \
    X(config.upstream_set) X(config.tls_stash) X(config.tls_has) X(config.tls_get)
#define FXG_OWNED_OBJECTS(X)                                                             \
    X(tls.kept) X(types.record) X(types.slot_view) X(types.fx_tracing) X(types.rlock)    \
    X(types.reader) X(types.dispatch) X(registry)

static int
core_traverse(PyObject *module, visitproc visit, void *arg)
{
    fxg_state *st = state_of(module);
#define FXG_VISIT(field) Py_VISIT(st->field);
    FXG_CONFIG_OBJECTS(FXG_VISIT)
    FXG_OWNED_OBJECTS(FXG_VISIT)
#undef FXG_VISIT
#if FXG_RECORD_CACHE
    Py_VISIT(st->records.cached);
#endif
    return 0;
}

static int
core_clear(PyObject *module)
{
    fxg_state *st = state_of(module);
    fxg_fork_module_clear(st);
    fxg_config_clear(st);
#define FXG_NAME_CLEAR(field, text) Py_CLEAR(st->str.field);
    FXG_NAMES(FXG_NAME_CLEAR)
#undef FXG_NAME_CLEAR
#define FXG_CLEAR(field) Py_CLEAR(st->field);
    FXG_OWNED_OBJECTS(FXG_CLEAR)
#undef FXG_CLEAR
#if FXG_RECORD_CACHE
    Py_CLEAR(st->records.cached);
#endif
    return 0;
}

static void
core_free(void *module)
{
    core_clear((PyObject *)module);
}

static PyModuleDef_Slot core_slots[] = {
    {Py_mod_exec, core_exec},
#ifdef Py_mod_multiple_interpreters
    /* 3.12+: every mutable thing lives in the module state or in objects made
     * from it (no static PyObject *, types from specs; the one static, the
     * address of CPython's Python-function vectorcall, is the same for every
     * interpreter), and each RLock keeps its books under its own interpreter's
     * GIL or its own mutex; so each interpreter's import is independent, with
     * or without a GIL of its own.  (torch itself does not support
     * subinterpreters: this is about the core.) */
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#ifdef Py_mod_gil
    /* 3.13+: every shared structure has its own protection without the GIL
     * (fxguard.h, compat.h): on a free-threaded build importing the core
     * leaves the GIL off. */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fxguard._core",
    .m_doc = "C core of fxguard: per-thread FX-tracing state and a GIL-releasing RLock.",
    .m_size = sizeof(fxg_state),
    .m_methods = core_methods,
    .m_slots = core_slots,
    .m_traverse = core_traverse,
    .m_clear = core_clear,
    .m_free = core_free,
};

PyMODINIT_FUNC
PyInit__core(void)
{
    return PyModuleDef_Init(&core_module);
}
