/* RLock: a re-entrant lock whose books take no OS lock.
 *
 * Like CPython's _thread.RLock it tracks an owner thread and a count.  The
 * owner, the count, the number of waiters, the semaphore and the statistics
 * are the lock's books.  With the GIL they are touched only while holding
 * it, which already serialises every Python thread: the uncontended path
 * takes no lock at all.  Without the GIL (3.13t) they are guarded by `books`,
 * a PyMutex held for a few loads and stores, never while waiting and never
 * around Python code: the uncontended path costs its two atomic operations.
 * Only a thread that must wait touches the OS semaphore, and it detaches
 * from the interpreter (releases the GIL) while it sleeps on it.
 *
 * It stands in for threading.RLock, threading.Condition's protocol included.
 * Where it differs: a blocked acquire() wakes for KeyboardInterrupt (see
 * "Interrupts while waiting"), and a forked child resets every lock (see
 * "Fork").
 *
 * A thread that exits while holding the lock leaves it held, at its depth,
 * for good: as with CPython's RLock, nothing notices the owner is gone.
 * Other threads' acquire() blocks or times out, release() raises for them.
 * Releasing on the owner's exit would hand out the lock while the data it
 * guards may be half-updated; detecting the exit would cost the fast path.
 * As in CPython, a later thread that the OS gives the dead thread's ident is
 * taken for the owner.  Only a fork clears such a hold (in the child). */
#include "fxguard.h"
#include <math.h>
#include <stddef.h> /* offsetof */
#include <time.h>

typedef struct RLockObject RLockObject;

/* Every live RLock of one module object is on its registry's list (fork.c),
 * so that a forked child can reset them all (fxg_rlocks_after_fork).  Each
 * lock holds the registry's capsule: the list head outlives every lock on it.
 * The list (and each lock's prev/next) is guarded by the registry's mutex. */
struct RLockObject {
    PyObject_HEAD
    fxg_mutex books;           /* without the GIL: guards the books, up to `reg` */
    unsigned long owner;       /* thread ident, 0 when free */
    unsigned long count;       /* re-entrancy depth of the owner */
    Py_ssize_t waiters;        /* threads in wait_and_take() */
    PyThread_type_lock wakeup; /* posted by release() when waiters > 0 */
    int posted;                /* wakeup holds a post nobody has taken yet */
    /* statistics */
    unsigned long long acquisitions;
    unsigned long long contended;
    long long wait_ns_total;
    long long wait_ns_max;
    /* on the registry's list while alive */
    PyObject *registry_capsule; /* strong reference to the capsule of reg */
    fxg_registry *reg;
    RLockObject *prev, *next;
    FXG_WEAKREF_FIELD
    PyObject *bound_enter; /* __enter__ and __exit__ bound to this lock, made on */
    PyObject *bound_exit;  /* first use (cached_method.c: a with-cycle allocates nothing) */
};

#define LOCK_BOOKS(o) fxg_mutex_lock(&(o)->books)
#define UNLOCK_BOOKS(o) fxg_mutex_unlock(&(o)->books)

static long long
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Seconds beyond which a timeout does not fit 64-bit nanoseconds. */
#define NS_LIMIT_S ((double)LLONG_MAX / 1e9)

/* now + timeout, or -1 (no deadline) for no timeout or one too far to add. */
static long long
deadline_after(long long now, long long timeout_ns)
{
    if (timeout_ns < 0 || timeout_ns > LLONG_MAX - now) {
        return -1;
    }
    return now + timeout_ns;
}

static PyThread_type_lock
new_wakeup(void)
{
    /* Starts taken: a waiter blocks on it until release() posts it. */
    PyThread_type_lock l = PyThread_allocate_lock();
    if (l != NULL) {
        PyThread_acquire_lock(l, WAIT_LOCK);
    }
    return l;
}

static PyObject *
rlock_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "RLock() takes no arguments");
        return NULL;
    }
    fxg_state *st = fxg_state_of_type(type);
    fxg_registry *reg = st != NULL ? fxg_registry_of(st) : NULL;
    if (reg == NULL) {
        return NULL;
    }
    RLockObject *self = (RLockObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->wakeup = new_wakeup();
    if (self->wakeup == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->registry_capsule = Py_NewRef(st->registry);
    self->reg = reg;
    fxg_mutex_lock(&reg->mutex);
    self->next = reg->locks;
    if (reg->locks != NULL) {
        reg->locks->prev = self;
    }
    reg->locks = self;
    fxg_mutex_unlock(&reg->mutex);
    return (PyObject *)self;
}

/* A heap type's instances own a reference to it, and the type one to the
 * module: visiting the type lets the collector free a module object (one
 * imported a second time, say) together with the locks in its dict. */
static int
rlock_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(((RLockObject *)self)->bound_enter);
    Py_VISIT(((RLockObject *)self)->bound_exit);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int
rlock_clear(PyObject *self)
{
    Py_CLEAR(((RLockObject *)self)->bound_enter);
    Py_CLEAR(((RLockObject *)self)->bound_exit);
    return 0;
}

static void
rlock_dealloc(PyObject *self)
{
    RLockObject *o = (RLockObject *)self;
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    PyObject_ClearWeakRefs(self);
    if (o->reg != NULL) {
        fxg_mutex_lock(&o->reg->mutex);
        if (o->prev != NULL) {
            o->prev->next = o->next;
        }
        else {
            o->reg->locks = o->next;
        }
        if (o->next != NULL) {
            o->next->prev = o->prev;
        }
        fxg_mutex_unlock(&o->reg->mutex);
    }
    rlock_clear(self);
    Py_XDECREF(o->registry_capsule); /* after unlinking: it may free the registry */
    if (o->wakeup != NULL) {
        PyThread_free_lock(o->wakeup);
    }
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* Books held.  Post the wakeup, unless a post is already waiting to be
 * taken.  With the flag the semaphore never counts above one, on every
 * platform (a POSIX semaphore would otherwise pile up posts, each a spurious
 * wakeup later). */
static void
wake_one(RLockObject *o)
{
    if (!o->posted) {
        o->posted = 1;
        PyThread_release_lock(o->wakeup);
    }
}

/* Books held: the lock becomes `owner`'s, at depth `count`. */
static void
take(RLockObject *o, unsigned long owner, unsigned long count)
{
    o->owner = owner;
    o->count = count;
    o->acquisitions++;
}

/* Interrupts while waiting.
 *
 * CPython's lock.acquire() sleeps in one OS wait and only wakes early when a
 * signal interrupts that wait (EINTR, then Py_MakePendingCalls runs the
 * handlers).  So it never sees an exception set with
 * PyThreadState_SetAsyncExc() (the eval loop raises that one only when the
 * thread runs bytecode again), nor a SIGINT the kernel delivered to another
 * thread than the waiting main thread (Python's C handler only sets a flag).
 *
 * fxguard's RLock waits in slices instead: 5 ms, doubling to 50 ms.  Between
 * slices, attached again (with the GIL where there is one), deliver_pending()
 * runs signal handlers and pending calls, and raises an asynchronous
 * exception aimed at this thread.  So KeyboardInterrupt (from a signal or
 * from SetAsyncExc) reaches a blocked acquire() within about 50 ms, and a
 * lost wakeup could never stall a waiter longer than a slice.  The price: a
 * waiting thread wakes about 20 times a second (a release still wakes it at
 * once, through the semaphore).  _acquire_restore() waits in one piece,
 * without delivering anything. */
#define SLICE_FIRST_US 5000
#define SLICE_MAX_US 50000

/* Between two slices of a wait (attached, books not held: handlers may use
 * the lock, or fork): 0, or -1 with the exception a signal handler, a
 * pending call or PyThreadState_SetAsyncExc raised.
 *
 * An asynchronous exception sits in the thread state until the eval loop
 * raises it, and clearing the flags that tell the eval loop to look is not
 * possible from outside CPython (on 3.10/3.11 a stale flag would keep every
 * thread on the loop's slow path).  So when one is pending (the public
 * PyThreadState field async_exc) the thread runs a
 * one-instruction code object: the eval loop checks its breaker on entry
 * (RESUME from 3.11, the first instruction on 3.10), raises the exception and
 * clears the flags itself.  Only then, so a tracer or profiler never sees the
 * tick otherwise. */
static int
deliver_pending(RLockObject *o)
{
    if (PyErr_CheckSignals() < 0 || Py_MakePendingCalls() < 0) {
        return -1;
    }
    /* Atomic: PyThreadState_SetAsyncExc() writes it from another thread. */
    if (FXG_LOAD_PTR(&PyThreadState_Get()->async_exc) == NULL) {
        return 0;
    }
    PyObject *r = PyEval_EvalCode(o->reg->tick, o->reg->tick_globals, o->reg->tick_globals);
    if (r == NULL) {
        /* The exception came out of the tick's frame: drop that frame, so
         * the traceback starts in the caller of acquire(), as with any other
         * error raised by a C function. */
        fxg_err_drop_innermost_frame();
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* The next wait: `slice_us` (-1: no limit), cut to the deadline (-1: none);
 * 0 once the deadline has passed. */
static PY_TIMEOUT_T
next_wait_us(PY_TIMEOUT_T slice_us, long long deadline)
{
    if (deadline < 0) {
        return slice_us;
    }
    long long left = deadline - now_ns();
    if (left <= 0) {
        return 0;
    }
    left = (left + 999) / 1000;
    return slice_us < 0 || left < (long long)slice_us ? (PY_TIMEOUT_T)left : slice_us;
}

/* Books held, leaving wait_and_take(): count this waiter out, and with
 * result 1 take the lock. */
static void
leave_wait(RLockObject *o, int result, unsigned long owner, unsigned long count, long long start)
{
    if (o->waiters > 0) { /* 0 if a signal handler forked: the child's reset counted us out */
        o->waiters--;
    }
    if (result == 1) {
        take(o, owner, count);
        long long waited = now_ns() - start;
        o->contended++;
        o->wait_ns_total += waited;
        if (waited > o->wait_ns_max) {
            o->wait_ns_max = waited;
        }
    }
    else if (o->owner == 0 && o->waiters > 0) {
        wake_one(o); /* leaving without the lock: pass on a post this thread took */
    }
}

/* Books not held.  Wait until the lock is free, then take it for `owner`
 * at depth `count`.  Returns 1 taken, 0 timed out, -1 with an exception set
 * (see deliver_pending).  timeout_ns -1 waits without a deadline.
 * interruptible 0 (for _acquire_restore, as CPython's) waits in one piece
 * through signals, leaving them to the eval loop.
 *
 * Whoever wakes re-checks the owner in the books: a thread that never
 * waited may have taken the lock first (no hand-off, as in CPython), and
 * then the waiter sleeps again until that thread's release posts the
 * wakeup. */
static int
wait_and_take(RLockObject *o, unsigned long owner, unsigned long count, long long timeout_ns,
              int interruptible)
{
    long long start = now_ns();
    long long deadline = deadline_after(start, timeout_ns);
    PY_TIMEOUT_T slice_us = interruptible ? SLICE_FIRST_US : -1;
    int result;
    LOCK_BOOKS(o);
    o->waiters++;
    for (;;) {
        PY_TIMEOUT_T wait_us = next_wait_us(slice_us, deadline);
        if (o->owner == 0 || wait_us == 0) {
            result = o->owner == 0;
            break;
        }
        PyThread_type_lock wakeup = o->wakeup;
        UNLOCK_BOOKS(o);
        PyLockStatus r;
        Py_BEGIN_ALLOW_THREADS
        r = PyThread_acquire_lock_timed(wakeup, wait_us, interruptible);
        Py_END_ALLOW_THREADS
        if (r != PY_LOCK_ACQUIRED && interruptible) {
            if (deliver_pending(o) < 0) {
                LOCK_BOOKS(o);
                result = -1;
                break;
            }
            slice_us = slice_us * 2 < SLICE_MAX_US ? slice_us * 2 : SLICE_MAX_US;
        }
        LOCK_BOOKS(o);
        if (r == PY_LOCK_ACQUIRED) {
            o->posted = 0; /* this thread took the post */
        }
    }
    leave_wait(o, result, owner, count, start);
    UNLOCK_BOOKS(o);
    return result;
}

/* rlock_acquire_impl's first look at the books. */
enum { TAKEN = 1, BUSY = 0, OVERFLOW = -1, MUST_WAIT = 2 };

/* 1 acquired, 0 not, -1 error. */
static int
rlock_acquire_impl(RLockObject *o, int blocking, long long timeout_ns)
{
    unsigned long me = PyThread_get_thread_ident();
    int r;
    LOCK_BOOKS(o);
    if (o->owner == me) {
        r = o->count == ULONG_MAX ? OVERFLOW : TAKEN;
        if (r == TAKEN) {
            o->count++;
            o->acquisitions++;
        }
    }
    else if (o->owner == 0) {
        take(o, me, 1);
        r = TAKEN;
    }
    else {
        r = blocking ? MUST_WAIT : BUSY;
    }
    UNLOCK_BOOKS(o);
    if (r == OVERFLOW) {
        PyErr_SetString(PyExc_OverflowError, "internal lock count overflowed");
    }
    return r == MUST_WAIT ? wait_and_take(o, me, 1, timeout_ns, 1) : r;
}

/* acquire()'s timeout, checked as _thread's locks check it (CPython's
 * lock_acquire_parse_args and _PyTime_FromSecondsObject): NaN is a ValueError;
 * a value that does not fit 64-bit nanoseconds, or exceeds PY_TIMEOUT_MAX
 * (threading.TIMEOUT_MAX), an OverflowError; a timeout with blocking=False,
 * or a negative one other than -1, a ValueError; a non-number a TypeError.
 * One difference: any object float() accepts is taken (threading takes int
 * and float only).  *timeout_ns is -1 for "no timeout". */
static int
check_timeout(PyObject *timeout_obj, int blocking, long long *timeout_ns)
{
    *timeout_ns = -1;
    if (timeout_obj == NULL) {
        return 0;
    }
    double t = PyFloat_AsDouble(timeout_obj);
    if (t == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    if (isnan(t)) {
        PyErr_SetString(PyExc_ValueError, "Invalid value NaN (not a number)");
        return -1;
    }
    if (!(t > -NS_LIMIT_S && t < NS_LIMIT_S)) {
        PyErr_SetString(PyExc_OverflowError, "timeout value is too large");
        return -1;
    }
    if (t == -1.0) {
        return 0;
    }
    if (!blocking) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return -1;
    }
    if (t < 0) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return -1;
    }
    if (t * 1e6 > (double)PY_TIMEOUT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "timeout value is too large");
        return -1;
    }
    double ns = t * 1e9;
    *timeout_ns = (long long)ns;
    if ((double)*timeout_ns < ns) {
        (*timeout_ns)++; /* round up, as CPython does for timeouts */
    }
    return 0;
}

/* acquire(blocking=True, timeout=-1)'s arguments, by the standard parser
 * (PyArg_ParseTupleAndKeywords, on a tuple and a dict made from the call's
 * vector).  0, or -1 with the error threading's locks raise. */
static int
parse_acquire_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, int *blocking,
                   long long *timeout_ns)
{
    static char *kwlist[] = {"blocking", "timeout", NULL};
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *tuple = PyTuple_New(nargs), *dict = nkw ? PyDict_New() : NULL;
    PyObject *timeout_obj = NULL; /* borrowed from tuple or dict */
    int ok = tuple != NULL && (nkw == 0 || dict != NULL);
    for (Py_ssize_t i = 0; ok && i < nargs; i++) {
        PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
    }
    for (Py_ssize_t k = 0; ok && k < nkw; k++) {
        ok = PyDict_SetItem(dict, PyTuple_GET_ITEM(kwnames, k), args[nargs + k]) == 0;
    }
    ok = ok && PyArg_ParseTupleAndKeywords(tuple, dict, "|pO:acquire", kwlist, blocking,
                                           &timeout_obj);
    ok = ok && check_timeout(timeout_obj, *blocking, timeout_ns) == 0;
    Py_XDECREF(tuple);
    Py_XDECREF(dict);
    return ok ? 0 : -1;
}

/* METH_FASTCALL: acquire() without arguments, the common call, parses nothing. */
static PyObject *
rlock_acquire(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    int blocking = 1;
    long long timeout_ns = -1;
    if ((nargs != 0 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) &&
        parse_acquire_args(args, nargs, kwnames, &blocking, &timeout_ns) < 0) {
        return NULL;
    }
    int r = rlock_acquire_impl((RLockObject *)self, blocking, timeout_ns);
    if (r < 0) {
        return NULL;
    }
    return PyBool_FromLong(r);
}

/* Books held: whether the calling thread holds the lock. */
static int
owned_by_caller(RLockObject *o)
{
    return o->count > 0 && o->owner == PyThread_get_thread_ident();
}

/* Books held: the lock is free; a waiter, if any, is woken. */
static void
set_free(RLockObject *o)
{
    o->count = 0;
    o->owner = 0;
    if (o->waiters > 0) {
        wake_one(o);
    }
}

static int
rlock_release_impl(RLockObject *o)
{
    LOCK_BOOKS(o);
    int owned = owned_by_caller(o);
    if (owned && --o->count == 0) {
        set_free(o);
    }
    UNLOCK_BOOKS(o);
    if (!owned) {
        PyErr_SetString(PyExc_RuntimeError, "cannot release un-acquired lock");
        return -1;
    }
    return 0;
}

static PyObject *
rlock_release(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    if (rlock_release_impl((RLockObject *)self) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
rlock_enter(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    int r = rlock_acquire_impl((RLockObject *)self, 1, -1);
    if (r < 0) {
        return NULL;
    }
    Py_RETURN_TRUE;
}

static PyObject *
rlock_exit(PyObject *self, PyObject *const *Py_UNUSED(args), Py_ssize_t Py_UNUSED(nargs))
{
    if (rlock_release_impl((RLockObject *)self) < 0) {
        return NULL;
    }
    Py_RETURN_FALSE;
}

static PyObject *
rlock_is_owned(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    RLockObject *o = (RLockObject *)self;
    LOCK_BOOKS(o);
    int owned = owned_by_caller(o);
    UNLOCK_BOOKS(o);
    return PyBool_FromLong(owned);
}

/* threading.Condition's protocol (as _thread.RLock's): _release_save() lets
 * go of every level the calling thread holds and returns (count, owner);
 * _acquire_restore(state) takes the lock back at that depth.  Stricter than
 * CPython in two ways: _release_save() checks the owner, not only the count,
 * and _acquire_restore() by a thread that already holds the lock raises
 * instead of deadlocking. */
static PyObject *
rlock_release_save(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    RLockObject *o = (RLockObject *)self;
    LOCK_BOOKS(o);
    int owned = owned_by_caller(o);
    unsigned long count = o->count, owner = o->owner;
    UNLOCK_BOOKS(o);
    if (!owned) {
        PyErr_SetString(PyExc_RuntimeError, "cannot release un-acquired lock");
        return NULL;
    }
    /* Made first, so that a failure leaves the lock held; only the owner,
     * this thread, can change owner and count meanwhile. */
    PyObject *state = Py_BuildValue("(kk)", count, owner);
    if (state == NULL) {
        return NULL;
    }
    LOCK_BOOKS(o);
    set_free(o);
    UNLOCK_BOOKS(o);
    return state;
}

/* Like CPython's it waits through signals: Condition.wait() calls it in a
 * finally block, and must come out holding the lock.  A KeyboardInterrupt
 * that arrives meanwhile is raised by the eval loop right after. */
static PyObject *
rlock_acquire_restore(PyObject *self, PyObject *state)
{
    RLockObject *o = (RLockObject *)self;
    if (!PyTuple_Check(state) || PyTuple_GET_SIZE(state) != 2) {
        PyErr_SetString(PyExc_TypeError, "_acquire_restore() expects a (count, owner) tuple");
        return NULL;
    }
    unsigned long count = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(state, 0));
    if (count == (unsigned long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    unsigned long owner = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(state, 1));
    if (owner == (unsigned long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (count == 0 || owner == 0) {
        PyErr_SetString(PyExc_ValueError, "_acquire_restore(): count and owner must be non-zero");
        return NULL;
    }
    unsigned long me = PyThread_get_thread_ident();
    LOCK_BOOKS(o);
    int mine = o->owner == me, free = o->owner == 0;
    if (free) {
        take(o, owner, count);
    }
    UNLOCK_BOOKS(o);
    if (mine) {
        PyErr_SetString(PyExc_RuntimeError, "_acquire_restore(): the lock is already held");
        return NULL;
    }
    if (!free && wait_and_take(o, owner, count, -1, 0) != 1) {
        return NULL; /* cannot happen: no deadline, not interruptible */
    }
    Py_RETURN_NONE;
}

static PyObject *
rlock_recursion_count(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    RLockObject *o = (RLockObject *)self;
    LOCK_BOOKS(o);
    unsigned long count = o->owner == PyThread_get_thread_ident() ? o->count : 0;
    UNLOCK_BOOKS(o);
    return PyLong_FromUnsignedLong(count);
}

static PyObject *
rlock_locked(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    RLockObject *o = (RLockObject *)self;
    LOCK_BOOKS(o);
    int locked = o->owner != 0;
    UNLOCK_BOOKS(o);
    return PyBool_FromLong(locked);
}

static PyObject *
rlock_stats(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    RLockObject *o = (RLockObject *)self;
    LOCK_BOOKS(o); /* the books, read at one moment */
    unsigned long long acquisitions = o->acquisitions, contended = o->contended;
    long long wait_ns_total = o->wait_ns_total, wait_ns_max = o->wait_ns_max;
    unsigned long owner_ident = o->owner, depth = o->count;
    Py_ssize_t waiters = o->waiters;
    UNLOCK_BOOKS(o);
    PyObject *owner = owner_ident ? PyLong_FromUnsignedLong(owner_ident) : Py_NewRef(Py_None);
    if (owner == NULL) {
        return NULL;
    }
    return Py_BuildValue("{s:K,s:K,s:L,s:L,s:N,s:k,s:n}",
                         "acquisitions", acquisitions,
                         "contended", contended,
                         "wait_ns_total", wait_ns_total,
                         "wait_ns_max", wait_ns_max,
                         "owner", owner,
                         "depth", depth,
                         "waiters", waiters);
}

static PyObject *
rlock_reset_stats(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    RLockObject *o = (RLockObject *)self;
    LOCK_BOOKS(o);
    o->acquisitions = o->contended = 0;
    o->wait_ns_total = o->wait_ns_max = 0;
    UNLOCK_BOOKS(o);
    Py_RETURN_NONE;
}

/* Fork.  A child has one thread, the one that forked.  Other threads' holds
 * on a lock would never be released there, and a thread that was waiting may
 * have been inside the semaphore: the module's after-fork hook (fork.c)
 * resets every live lock of that module.  A lock the forking thread holds
 * stays held, at its depth (so `with lock: os.fork()` releases cleanly in the
 * child); any other is free.  The semaphore is replaced where a thread was
 * waiting, and the old one leaked on purpose, as CPython's
 * _PyThread_at_fork_reinit does: it may be in any state.  Where nobody waited
 * it is idle (every other use of it is in the books, which no thread holds
 * across a fork) and is kept.  Without the GIL the books' mutex and the
 * registry's are made anew first: a thread that is gone may have held one.
 *
 * Books held (or a fork child): reset o, keeping the hold of `keeper` (0:
 * nobody's).  0 if o kept its old semaphore for want of memory. */
static int
reset(RLockObject *o, unsigned long keeper)
{
    int ok = 1;
    if (o->waiters > 0 || keeper == 0) {
        PyThread_type_lock fresh = new_wakeup();
        if (fresh != NULL) {
            o->wakeup = fresh;
            o->posted = 0;
        }
        else {
            ok = 0; /* keep the old one: better than none */
        }
    }
    o->waiters = 0;
    if (keeper == 0 || o->owner != keeper) {
        o->owner = 0;
        o->count = 0;
    }
    return ok;
}

Py_ssize_t
fxg_rlocks_after_fork(fxg_registry *reg)
{
    unsigned long me = PyThread_get_thread_ident();
    Py_ssize_t stale = 0;
    fxg_mutex_reinit(&reg->mutex);
    for (RLockObject *o = reg->locks; o != NULL; o = o->next) {
        fxg_mutex_reinit(&o->books);
        stale += !reset(o, me);
    }
    return stale;
}

/* _thread.RLock's method of that name, kept for callers that use it: it
 * frees the lock whoever holds it.  fxguard's after-fork hook resets every
 * lock already (fxg_rlocks_after_fork). */
static PyObject *
rlock_at_fork_reinit(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    RLockObject *o = (RLockObject *)self;
    LOCK_BOOKS(o);
    int ok = reset(o, 0);
    UNLOCK_BOOKS(o);
    if (!ok) {
        return PyErr_NoMemory();
    }
    Py_RETURN_NONE;
}

static PyObject *
rlock_repr(PyObject *self)
{
    RLockObject *o = (RLockObject *)self;
    LOCK_BOOKS(o);
    unsigned long owner = o->owner, count = o->count;
    UNLOCK_BOOKS(o);
    return PyUnicode_FromFormat("<fxguard.RLock %s owner=%lu count=%lu at %p>",
                                owner ? "locked" : "unlocked", owner, count, self);
}

/* Docstrings start with text signatures, so inspect.signature() works. */
static PyMethodDef rlock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))rlock_acquire, METH_FASTCALL | METH_KEYWORDS,
     "acquire($self, /, blocking=True, timeout=-1)\n--\n\n"
     "Like threading.RLock.acquire: True once the calling thread holds the lock\n"
     "(again, if it already did), False if blocking is false or the timeout passed.\n"
     "The GIL is released while waiting."},
    {"release", rlock_release, METH_NOARGS,
     "release($self, /)\n--\n\n"
     "Undo one acquire().  RuntimeError unless the calling thread holds the lock."},
    {"locked", rlock_locked, METH_NOARGS,
     "locked($self, /)\n--\n\nTrue while any thread holds the lock."},
    {"_is_owned", rlock_is_owned, METH_NOARGS,
     "_is_owned($self, /)\n--\n\nTrue if the calling thread holds the lock."},
    {"_release_save", rlock_release_save, METH_NOARGS,
     "_release_save($self, /)\n--\n\n"
     "For threading.Condition: release every level the calling thread holds;\n"
     "returns the state for _acquire_restore()."},
    {"_acquire_restore", rlock_acquire_restore, METH_O,
     "_acquire_restore($self, state, /)\n--\n\n"
     "For threading.Condition: take the lock back as _release_save() left it."},
    {"_recursion_count", rlock_recursion_count, METH_NOARGS,
     "_recursion_count($self, /)\n--\n\n"
     "How many times the calling thread holds the lock (0 if it does not)."},
    {"stats", rlock_stats, METH_NOARGS,
     "stats($self, /)\n--\n\n"
     "dict: acquisitions, contended, wait_ns_total, wait_ns_max, owner, depth, waiters."},
    {"reset_stats", rlock_reset_stats, METH_NOARGS,
     "reset_stats($self, /)\n--\n\nZero the counters of stats()."},
    {"_at_fork_reinit", rlock_at_fork_reinit, METH_NOARGS,
     "_at_fork_reinit($self, /)\n--\n\n"
     "In a forked child: free the lock and give it a fresh semaphore.  fxguard\n"
     "already resets every RLock after fork; this is for threading's callers."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef rlock_members[] = {
    FXG_WEAKREF_MEMBER(RLockObject)
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot rlock_slots[] = {
    {Py_tp_new, rlock_new},
    {Py_tp_dealloc, rlock_dealloc},
    {Py_tp_traverse, rlock_traverse},
    {Py_tp_clear, rlock_clear},
    {Py_tp_members, rlock_members},
    {Py_tp_methods, rlock_methods},
    {Py_tp_repr, rlock_repr},
    {Py_tp_doc, "RLock()\n--\n\nRe-entrant lock (owner + count) that releases the GIL while waiting."},
    {0, NULL},
};

PyType_Spec fxg_rlock_spec = {
    .name = "fxguard._core.RLock",
    .basicsize = sizeof(RLockObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_HAVE_GC |
             FXG_WEAKREF_FLAG,
    .slots = rlock_slots,
};

int
fxg_rlock_registry_init(fxg_registry *reg)
{
    /* Empty globals: the eval loop falls back to the interpreter's builtins. */
    reg->tick = Py_CompileString("None", "<fxguard.RLock.acquire>", Py_eval_input);
    reg->tick_globals = PyDict_New();
    return reg->tick != NULL && reg->tick_globals != NULL ? 0 : -1;
}

void
fxg_rlock_registry_free(fxg_registry *reg)
{
    Py_CLEAR(reg->tick);
    Py_CLEAR(reg->tick_globals);
}

static PyMethodDef rlock_with_methods[] = {
    {"__enter__", rlock_enter, METH_NOARGS,
     "__enter__($self, /)\n--\n\nacquire(), blocking without timeout."},
    {"__exit__", (PyCFunction)(void (*)(void))rlock_exit, METH_FASTCALL,
     "__exit__($self, /, *exc_info)\n--\n\nrelease()."},
    {NULL, NULL, 0, NULL},
};

int
fxg_rlock_type_exec(PyObject *module, PyTypeObject *type)
{
    static const Py_ssize_t slots[] = {offsetof(RLockObject, bound_enter),
                                       offsetof(RLockObject, bound_exit)};
    return fxg_cache_methods(module, type, rlock_with_methods, slots);
}
