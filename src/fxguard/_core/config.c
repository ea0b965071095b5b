/* _configure(): what install()/uninstall() hand the core (fxg_config and the
 * torch TLS functions).  Every call starts a new slot layout (epoch). */
#include "fxguard.h"

void
fxg_config_clear(fxg_state *st)
{
    Py_CLEAR(st->config.defaults);
    Py_CLEAR(st->config.factories);
    Py_CLEAR(st->config.is_compiling);
    Py_CLEAR(st->config.upstream_get);
    Py_CLEAR(st->config.upstream_set);
    Py_CLEAR(st->tls.stash);
    Py_CLEAR(st->tls.has);
    Py_CLEAR(st->tls.get);
}

/* The torch functions install() hands the core, by keyword, in kwlist's order. */
enum { HOOK_IS_COMPILING, HOOK_TLS_STASH, HOOK_TLS_HAS, HOOK_TLS_GET, HOOK_UPSTREAM_GET,
       HOOK_UPSTREAM_SET, N_HOOKS };

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
    for (Py_ssize_t i = 0; i < nslots; i++) {
        PyObject *f = PyTuple_GET_ITEM(a->factories, i);
        if (f != Py_None && !PyCallable_Check(f)) {
            PyErr_SetString(PyExc_TypeError, "_configure: factories must be callables or None");
            return -1;
        }
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
    fxg_config_clear(st);
    st->config.defaults = Py_XNewRef(a.defaults);
    st->config.factories = Py_XNewRef(a.factories);
    st->config.is_compiling = Py_XNewRef(a.hooks[HOOK_IS_COMPILING]);
    st->config.upstream_get = Py_XNewRef(a.hooks[HOOK_UPSTREAM_GET]);
    st->config.upstream_set = Py_XNewRef(a.hooks[HOOK_UPSTREAM_SET]);
    st->tls.stash = Py_XNewRef(a.hooks[HOOK_TLS_STASH]);
    st->tls.has = Py_XNewRef(a.hooks[HOOK_TLS_HAS]);
    st->tls.get = Py_XNewRef(a.hooks[HOOK_TLS_GET]);
    st->tls.stash_steals = steals;
    st->config.mode = (fxg_mode)a.mode;
    st->config.carry_context = a.carry_context;
    st->config.epoch++;
    Py_RETURN_NONE;
}
