/* _configure(): what install()/uninstall() hand the core (fxg_config).
 * Every call starts a new slot layout (epoch); _extend_layout() appends slots
 * to it for rows applied later (a torch module imported after install()). */
#include "fxguard.h"

/* The torch functions install() hands the core, by keyword, in kwlist's order. */
enum { HOOK_IS_COMPILING, HOOK_TLS_STASH, HOOK_TLS_HAS, HOOK_TLS_GET, HOOK_UPSTREAM_GET,
       HOOK_UPSTREAM_SET, N_HOOKS };

/* config's object fields, in HOOK order, then the layout's two. */
#define N_OBJECTS (N_HOOKS + 2)

static PyObject **
object_field(fxg_config *c, int i)
{
    PyObject **fields[N_OBJECTS] = {&c->is_compiling, &c->tls_stash, &c->tls_has, &c->tls_get,
                                    &c->upstream_get, &c->upstream_set, &c->defaults,
                                    &c->factories};
    return fields[i];
}

/* Put `objects` (new references) in config's fields, with the other values,
 * as one change; the old objects go back in `objects`, to be let go of
 * outside the mutex (their finalizers may run any code). */
static void
swap_config(fxg_state *st, PyObject *objects[N_OBJECTS], int mode, int carry_context, int steals)
{
    fxg_config *c = &st->config;
    fxg_mutex_lock(&c->mutex);
    for (int i = 0; i < N_OBJECTS; i++) {
        PyObject *old = *object_field(c, i);
        FXG_STORE_PTR(object_field(c, i), objects[i]);
        objects[i] = old;
    }
    c->stash_steals = steals;
    FXG_STORE_INT(&c->mode, mode);
    FXG_STORE_INT(&c->carry_context, carry_context);
    FXG_STORE_UINT64(&c->epoch, c->epoch + 1);
    c->base_epoch = c->epoch;
    fxg_mutex_unlock(&c->mutex);
}

void
fxg_config_clear(fxg_state *st)
{
    PyObject *objects[N_OBJECTS] = {NULL};
    swap_config(st, objects, FXG_LOAD_INT(&st->config.mode), 0, 0);
    for (int i = 0; i < N_OBJECTS; i++) {
        Py_XDECREF(objects[i]);
    }
}

void
fxg_config_layout(fxg_state *st, uint64_t *epoch, uint64_t *base_epoch, PyObject **defaults,
                  PyObject **factories)
{
    fxg_mutex_lock(&st->config.mutex);
    *epoch = st->config.epoch;
    *base_epoch = st->config.base_epoch;
    *defaults = Py_XNewRef(st->config.defaults);
    *factories = Py_XNewRef(st->config.factories);
    fxg_mutex_unlock(&st->config.mutex);
}

/* 0, or -1 with TypeError unless every item of the tuple (or NULL) is a callable or None. */
static int
check_factories(PyObject *factories, const char *who)
{
    for (Py_ssize_t i = 0; factories != NULL && i < PyTuple_GET_SIZE(factories); i++) {
        PyObject *f = PyTuple_GET_ITEM(factories, i);
        if (f != Py_None && !PyCallable_Check(f)) {
            PyErr_Format(PyExc_TypeError, "%s: factories must be callables or None", who);
            return -1;
        }
    }
    return 0;
}

typedef struct {
    int mode;
    int carry_context;
    PyObject *defaults;  /* borrowed, NULL if not given */
    PyObject *factories; /* borrowed, NULL if not given */
    PyObject *hooks[N_HOOKS]; /* borrowed, NULL if not given or None */
} configure_args;

/* Parse and check every argument; 0, or -1 with TypeError/ValueError. */
static int
parse_configure(PyObject *args, PyObject *kwargs, configure_args *a)
{
    static char *kwlist[] = {"mode", "defaults", "factories", "is_compiling", "tls_stash",
                             "tls_has", "tls_get", "upstream_get", "upstream_set",
                             "carry_context", NULL};
    *a = (configure_args){0};
    PyObject **h = a->hooks;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "i|$O!O!OOOOOOp:_configure", kwlist, &a->mode,
                                     &PyTuple_Type, &a->defaults, &PyTuple_Type, &a->factories,
                                     &h[HOOK_IS_COMPILING], &h[HOOK_TLS_STASH], &h[HOOK_TLS_HAS],
                                     &h[HOOK_TLS_GET], &h[HOOK_UPSTREAM_GET],
                                     &h[HOOK_UPSTREAM_SET], &a->carry_context)) {
        return -1;
    }
    if (a->mode < FXG_MODE_OFF || a->mode > FXG_MODE_UPSTREAM) {
        PyErr_Format(PyExc_ValueError, "unknown mode %d", a->mode);
        return -1;
    }
    Py_ssize_t nslots = a->defaults ? PyTuple_GET_SIZE(a->defaults) : 0;
    if ((a->factories ? PyTuple_GET_SIZE(a->factories) : 0) != nslots) {
        PyErr_SetString(PyExc_ValueError, "_configure: defaults and factories differ in length");
        return -1;
    }
    if (check_factories(a->factories, "_configure") < 0) {
        return -1;
    }
    if (nslots == 0) {
        a->defaults = a->factories = NULL;
    }
    for (int i = 0; i < N_HOOKS; i++) {
        if (h[i] == Py_None) {
            h[i] = NULL;
        }
        if (h[i] != NULL && !PyCallable_Check(h[i])) {
            PyErr_SetString(PyExc_TypeError, "_configure: hooks must be callables or None");
            return -1;
        }
    }
    if (a->mode == FXG_MODE_UPSTREAM && (h[HOOK_UPSTREAM_GET] == NULL ||
                                         h[HOOK_UPSTREAM_SET] == NULL)) {
        PyErr_SetString(PyExc_ValueError, "upstream mode needs upstream_get and upstream_set");
        return -1;
    }
    return 0;
}

/* _configure(mode, *, defaults=(), factories=(), is_compiling=None,
 *            tls_stash=None, tls_has=None, tls_get=None, upstream_get=None,
 *            upstream_set=None, carry_context=False)
 * Called by install()/uninstall(): the slot layout, and which torch
 * functions the core may use.  Every call starts a new layout (epoch): each
 * thread's slots start again from `defaults`/`factories` on next use.
 * carry_context: records note their thread's contextvars Context, so that an
 * autograd worker can run that thread's backward with its torch config. */
PyObject *
fxg_configure(PyObject *module, PyObject *args, PyObject *kwargs)
{
    configure_args a;
    if (parse_configure(args, kwargs, &a) < 0) {
        return NULL;
    }
    fxg_state *st = (fxg_state *)PyModule_GetState(module);
    int steals = 0;
    if (a.hooks[HOOK_TLS_STASH] != NULL &&
        (steals = fxg_stash_steals(st, a.hooks[HOOK_TLS_STASH])) < 0) {
        return NULL;
    }
    PyObject *objects[N_OBJECTS];
    for (int i = 0; i < N_HOOKS; i++) {
        objects[i] = Py_XNewRef(a.hooks[i]);
    }
    objects[N_HOOKS] = Py_XNewRef(a.defaults);
    objects[N_HOOKS + 1] = Py_XNewRef(a.factories);
    swap_config(st, objects, a.mode, a.carry_context, steals);
    for (int i = 0; i < N_OBJECTS; i++) {
        Py_XDECREF(objects[i]);
    }
    Py_RETURN_NONE;
}

/* old + more: a new tuple (old may be NULL). */
static PyObject *
joined(PyObject *old, PyObject *more)
{
    return old != NULL ? PySequence_Concat(old, more) : Py_NewRef(more);
}

/* _extend_layout(defaults, factories)
 * Rows applied after install() (their torch module was imported later) add
 * slots at the end of the layout.  A new epoch, but records made since the
 * last _configure() keep their values and get initial ones for the new slots
 * only (record.c, refresh_layout).  Callers serialise with _configure()
 * (fxguard._install's lock): the layout read here is the one replaced. */
PyObject *
fxg_extend_layout(PyObject *module, PyObject *args)
{
    PyObject *defaults, *factories;
    if (!PyArg_ParseTuple(args, "O!O!:_extend_layout", &PyTuple_Type, &defaults, &PyTuple_Type,
                          &factories)) {
        return NULL;
    }
    if (PyTuple_GET_SIZE(defaults) != PyTuple_GET_SIZE(factories)) {
        PyErr_SetString(PyExc_ValueError, "_extend_layout: defaults and factories differ in length");
        return NULL;
    }
    if (check_factories(factories, "_extend_layout") < 0) {
        return NULL;
    }
    fxg_state *st = (fxg_state *)PyModule_GetState(module);
    if (FXG_LOAD_INT(&st->config.mode) == FXG_MODE_OFF) {
        PyErr_SetString(PyExc_RuntimeError, "_extend_layout: the core is not configured");
        return NULL;
    }
    if (PyTuple_GET_SIZE(defaults) == 0) {
        Py_RETURN_NONE;
    }
    uint64_t epoch, base;
    PyObject *old[2];
    fxg_config_layout(st, &epoch, &base, &old[0], &old[1]);
    PyObject *new[2] = {joined(old[0], defaults), joined(old[1], factories)};
    PyObject *replaced[2] = {NULL, NULL}; /* let go of outside the mutex */
    int failed = new[0] == NULL || new[1] == NULL;
    if (!failed) {
        fxg_config *c = &st->config;
        PyObject **fields[2] = {&c->defaults, &c->factories};
        fxg_mutex_lock(&c->mutex);
        for (int i = 0; i < 2; i++) {
            replaced[i] = *fields[i];
            FXG_STORE_PTR(fields[i], new[i]);
            new[i] = NULL;
        }
        FXG_STORE_UINT64(&c->epoch, c->epoch + 1);
        fxg_mutex_unlock(&c->mutex);
    }
    for (int i = 0; i < 2; i++) {
        Py_XDECREF(new[i]);
        Py_XDECREF(old[i]);
        Py_XDECREF(replaced[i]);
    }
    if (failed) {
        return NULL;
    }
    Py_RETURN_NONE;
}
