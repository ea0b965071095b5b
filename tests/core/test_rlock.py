"""fxguard.RLock (and block_mask_lock, one of them) as a drop-in for threading.RLock:
re-entrancy, counters, contention with the GIL released, garbage collection, weak
references, argument checking, threading.Condition, interrupts while waiting, fork,
thread exit.

Torch-free (the autouse fixtures of conftest.py import torch; nothing here uses it).
Every wait is bounded; no test takes more than a few seconds.
"""
import gc
import importlib.util
import os
import signal
import sys
import sysconfig
import threading
import traceback
import time
import weakref

import pytest

import fxguard
import fxguard._core as core

PACKAGE_DIR = os.path.dirname(os.path.abspath(fxguard.__file__)) + os.sep


def in_fxguard(filename: str) -> bool:
    """A frame of fxguard's own code (not merely a path that contains 'fxguard':
    a checkout cloned into a folder named fxguard has its tests there)."""
    return os.path.abspath(filename).startswith(PACKAGE_DIR)


@pytest.fixture
def lock():
    return fxguard.RLock()


# -- the basics: re-entrant, counted, GIL released while waiting, fork-safe ----------------

def test_reentrant_owner_and_depth(lock):
    assert lock.acquire() and lock.acquire(blocking=False)
    s = lock.stats()
    assert s["owner"] == threading.get_ident() and s["depth"] == 2 and lock._is_owned()
    lock.release()
    lock.release()
    assert not lock.locked() and lock.stats()["owner"] is None
    with pytest.raises(RuntimeError, match="un-acquired"):
        lock.release()


def test_release_by_non_owner_raises(lock):
    lock.acquire()
    errors = []

    def other():
        try:
            lock.release()
        except RuntimeError as e:
            errors.append(e)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(errors) == 1 and lock._is_owned()
    lock.release()


def test_timeout_and_non_blocking(lock):
    held, done = threading.Event(), threading.Event()
    t = threading.Thread(target=lambda: (lock.acquire(), held.set(), done.wait(10), lock.release()))
    t.start()
    assert held.wait(10)
    assert lock.acquire(blocking=False) is False
    start = time.monotonic()
    assert lock.acquire(timeout=0.2) is False
    assert time.monotonic() - start >= 0.19
    with pytest.raises(ValueError):
        lock.acquire(blocking=False, timeout=1)
    done.set()
    t.join()
    assert lock.acquire(timeout=5) is True
    lock.release()


def test_contention_is_counted_and_gil_released_while_waiting(lock):
    lock.reset_stats()
    lock.acquire()
    waiting, spins = threading.Event(), [0]

    def waiter():
        waiting.set()
        with lock:
            pass

    t = threading.Thread(target=waiter)
    t.start()
    assert waiting.wait(10)
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:  # this thread keeps running Python...
        spins[0] += 1
    assert lock.stats()["waiters"] == 1  # ...while the other sleeps in acquire()
    lock.release()
    t.join(10)
    s = lock.stats()
    assert spins[0] > 1000
    assert s["contended"] == 1 and s["acquisitions"] == 2
    assert s["wait_ns_max"] >= 250_000_000 and s["wait_ns_total"] >= s["wait_ns_max"]


def test_exception_inside_region_releases(lock):
    with pytest.raises(KeyError):
        with lock:
            raise KeyError("x")
    assert not lock.locked()


def test_many_threads_mutual_exclusion(lock):
    inside, worst, n = [0], [0], 8

    def work():
        for _ in range(2000):
            with lock:
                inside[0] += 1
                worst[0] = max(worst[0], inside[0])
                inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert worst[0] == 1 and not lock.locked()
    assert lock.stats()["acquisitions"] == n * 2000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_while_another_thread_holds_the_block_mask_lock():
    lock = fxguard.block_mask_lock
    held, done = threading.Event(), threading.Event()
    t = threading.Thread(target=lambda: (lock.acquire(), held.set(), done.wait(10), lock.release()))
    t.start()
    assert held.wait(10)
    pid = os.fork()
    if pid == 0:  # child: the holder thread does not exist here
        ok = lock.acquire(timeout=2)
        os._exit(0 if ok and lock._is_owned() else 1)
    _, status = os.waitpid(pid, 0)
    done.set()
    t.join()
    assert os.waitstatus_to_exitcode(status) == 0


# -- garbage collection and weak references -------------------------------------------


def fresh_core_module():
    """fxguard._core imported again as a new module object (multi-phase init makes one
    per import), with its own RLock type and block_mask_lock."""
    spec = importlib.util.spec_from_file_location("fxguard._core", core.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module is not core and module.RLock is not core.RLock
    return module


def test_traverse_visits_the_type(lock):
    assert gc.is_tracked(lock)
    assert type(lock) in gc.get_referents(lock)


@pytest.mark.skipif(
    sys.version_info[:2] == (3, 13) and bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    reason="3.13t makes modules and types immortal once a thread has started "
           "(_PyGC_ImmortalizeDeferredObjects; 3.14 dropped it): nothing of them is ever freed")
def test_second_module_object_is_collected_with_its_locks():
    module = fresh_core_module()
    alive = weakref.ref(module)
    outside = module.RLock()  # a lock from it, held from outside
    with outside:
        assert outside._is_owned()
    with module.block_mask_lock:
        pass
    del module
    gc.collect()
    assert alive() is not None  # the lock keeps its type, and the type its module
    with outside:
        pass
    del outside
    gc.collect()
    assert alive() is None  # module <-> type <-> block_mask_lock: a cycle gc can see now


def test_weak_references():
    lock = fxguard.RLock()  # no fixture: the test must own the only reference
    assert type(lock).__weakrefoffset__ != 0
    ref = weakref.ref(lock)
    registry = weakref.WeakSet([lock])
    assert ref() is lock and len(registry) == 1
    del lock
    assert ref() is None and len(registry) == 0


# -- arguments, as threading checks them ------------------------------------------------


def test_constructor_takes_no_arguments():
    with pytest.raises(TypeError):
        fxguard.RLock(1)
    with pytest.raises(TypeError):
        fxguard.RLock(x=1)


@pytest.mark.parametrize("args, kwargs, error", [
    ((False, 1), {}, ValueError),                  # a timeout for a non-blocking call
    ((), {"blocking": False, "timeout": 0}, ValueError),
    ((True, -2), {}, ValueError),                  # negative, other than -1
    ((True, -0.5), {}, ValueError),
    ((), {"timeout": float("nan")}, ValueError),
    ((), {"timeout": threading.TIMEOUT_MAX * 2}, OverflowError),
    ((), {"timeout": float("inf")}, OverflowError),
    ((), {"timeout": 10 ** 400}, OverflowError),
    ((), {"timeout": "1"}, TypeError),
    ((), {"timeout": None}, TypeError),
    ((True, 1, 2), {}, TypeError),                 # too many arguments
    ((), {"wait": 1}, TypeError),
    ((True,), {"blocking": True}, TypeError),
])
def test_acquire_rejects_what_threading_rejects(lock, args, kwargs, error):
    reference = threading.RLock()
    with pytest.raises(error):
        reference.acquire(*args, **kwargs)
    with pytest.raises(error):
        lock.acquire(*args, **kwargs)
    assert not lock.locked() and lock.stats()["acquisitions"] == 0


def test_acquire_accepts_what_threading_accepts(lock):
    for args, kwargs in [((), {}), ((True,), {}), ((1, -1), {}), ((False, -1), {}), ((False,), {}),
                         ((), {"timeout": 0}), ((), {"timeout": 1e-9}), ((), {"timeout": 5}),
                         ((), {"blocking": 0}), ((), {"timeout": threading.TIMEOUT_MAX})]:
        assert lock.acquire(*args, **kwargs) is True, (args, kwargs)
    assert lock.stats()["depth"] == 10
    for _ in range(10):
        lock.release()
    assert not lock.locked()


def test_methods_have_signatures(lock):
    import inspect
    assert str(inspect.signature(lock.acquire)) == "(blocking=True, timeout=-1)"
    assert str(inspect.signature(type(lock).acquire)) == "(self, /, blocking=True, timeout=-1)"
    assert str(inspect.signature(lock.__exit__)) == "(*exc_info)"
    assert str(inspect.signature(fxguard.RLock)) == "()"
    assert str(inspect.signature(lock._acquire_restore)) == "(state, /)"
    for name in ("release", "__enter__", "locked", "_is_owned", "stats", "reset_stats",
                 "_at_fork_reinit", "_release_save", "_recursion_count"):
        assert str(inspect.signature(getattr(lock, name))) == "()", name


# -- threading.Condition ---------------------------------------------------------------


def test_release_save_and_acquire_restore(lock):
    me = threading.get_ident()
    with pytest.raises(RuntimeError):
        lock._release_save()
    lock.acquire()
    lock.acquire()
    assert lock._recursion_count() == 2
    state = lock._release_save()
    assert state == (2, me) and not lock.locked() and not lock._is_owned()
    assert lock._recursion_count() == 0
    lock._acquire_restore(state)
    assert lock._is_owned() and lock.stats()["depth"] == 2
    with pytest.raises(RuntimeError):  # already held: an error, not a deadlock
        lock._acquire_restore(state)
    lock.release()
    lock.release()
    assert not lock.locked()
    for bad in (None, (1,), (0, me), ("1", me)):
        with pytest.raises((TypeError, ValueError)):
            lock._acquire_restore(bad)


def test_release_save_by_non_owner_raises(lock):
    lock.acquire()
    errors = []

    def other():
        try:
            lock._release_save()
        except RuntimeError as e:
            errors.append(e)

    t = threading.Thread(target=other)
    t.start()
    t.join(5)
    assert len(errors) == 1 and lock._is_owned()
    lock.release()


def test_condition_wait_with_the_lock_held_twice(lock):
    cond = threading.Condition(lock)
    ready, notified = [], threading.Event()

    def notifier():
        # Can only get in while the waiter's wait() has let go of both levels.
        assert lock.acquire(timeout=5)
        with cond:
            ready.append(True)
            cond.notify()
        lock.release()
        notified.set()

    with cond:
        with cond:
            t = threading.Thread(target=notifier)
            t.start()
            assert cond.wait_for(lambda: ready, timeout=5)
            assert lock._is_owned() and lock.stats()["depth"] == 2
        assert lock._is_owned() and lock.stats()["depth"] == 1
    t.join(5)
    assert notified.is_set() and not lock.locked() and lock.stats()["waiters"] == 0


def test_condition_wait_times_out_and_restores(lock):
    cond = threading.Condition(lock)
    with cond:
        with cond:
            assert cond.wait(timeout=0.05) is False
            assert lock.stats()["depth"] == 2
    assert not lock.locked()


def test_condition_restore_waits_for_another_holder(lock):
    """notify() wakes the waiter while the notifier still holds the lock: the waiter's
    _acquire_restore() must wait for it (its contended path)."""
    cond = threading.Condition(lock)
    entered, order = threading.Event(), []

    def waiter():
        with cond:
            with cond:
                entered.set()
                notified = cond.wait(timeout=5)
                order.append(("waiter back", notified, lock.stats()["depth"]))

    t = threading.Thread(target=waiter)
    t.start()
    assert entered.wait(5)
    with cond:  # only possible once the waiter's wait() let go of both levels
        cond.notify()
        deadline = time.monotonic() + 5
        while lock.stats()["waiters"] == 0 and time.monotonic() < deadline:
            time.sleep(0.005)  # the waiter is woken, and blocks in _acquire_restore()
        assert lock.stats()["waiters"] == 1
        order.append("notifier lets go")
    t.join(5)
    assert not t.is_alive()
    assert order == ["notifier lets go", ("waiter back", True, 2)]
    assert lock.stats()["waiters"] == 0 and not lock.locked()


# -- fork: every lock, not only block_mask_lock ------------------------------------------

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def exit_code_of_child(check) -> int:
    """Fork; the child exits 0 if check() is true.  Bounded: the child's checks use
    timeouts, and a child still running after 10 s is killed."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            code = 0 if check() else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return -9


def holder(lock):
    """A thread holding lock (twice) until released; returns (thread, release event)."""
    held, done = threading.Event(), threading.Event()

    def run():
        with lock, lock:
            held.set()
            assert done.wait(10)

    t = threading.Thread(target=run)
    t.start()
    assert held.wait(5)
    return t, done


@needs_fork
def test_fork_while_another_thread_holds_a_fresh_lock(lock):
    t, done = holder(lock)
    try:
        def child():
            free = not lock.locked() and lock.stats()["owner"] is None
            return free and lock.acquire(timeout=2) and lock._is_owned() and lock.stats()["depth"] == 1
        assert exit_code_of_child(child) == 0
        assert lock.locked() and not lock._is_owned()  # the parent's holder still holds it
    finally:
        done.set()
        t.join(5)
    assert not lock.locked()


@needs_fork
def test_fork_while_a_thread_waits_in_acquire(lock):
    t, done = holder(lock)
    got = []
    waiter = threading.Thread(target=lambda: got.append(lock.acquire(timeout=5) and (lock.release() or True)))
    waiter.start()
    try:
        deadline = time.monotonic() + 5
        while lock.stats()["waiters"] == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert lock.stats()["waiters"] == 1

        def child():
            s = lock.stats()
            if s["waiters"] != 0 or s["owner"] is not None:
                return False
            with lock:  # uses the fresh semaphore; a second thread contends on it
                other = []
                t2 = threading.Thread(target=lambda: other.append(lock.acquire(timeout=2)))
                t2.start()
                time.sleep(0.05)
            t2.join(3)
            return other == [True] and lock.stats()["waiters"] == 0
        assert exit_code_of_child(child) == 0
    finally:
        done.set()
        t.join(5)
        waiter.join(5)
    assert got == [True] and lock.stats()["waiters"] == 0 and not lock.locked()


@needs_fork
def test_fork_by_the_holder_keeps_its_hold(lock):
    with lock, lock:
        def child():
            ok = lock._is_owned() and lock.stats()["depth"] == 2
            lock.release()
            lock.release()
            return ok and not lock.locked()
        assert exit_code_of_child(child) == 0
        assert lock.stats()["depth"] == 2
    assert not lock.locked()


@needs_fork
def test_fork_resets_locks_of_a_second_module_object():
    module = fresh_core_module()
    lock = module.RLock()
    t, done = holder(lock)
    try:
        assert exit_code_of_child(lambda: lock.acquire(timeout=2)) == 0
    finally:
        done.set()
        t.join(5)


# -- KeyboardInterrupt while waiting in acquire() ----------------------------------------


def wait_for_waiters(lock, n):
    deadline = time.monotonic() + 5
    while lock.stats()["waiters"] != n and time.monotonic() < deadline:
        time.sleep(0.002)
    assert lock.stats()["waiters"] == n


def async_raise(thread, exc):
    import ctypes
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
    assert set_async_exc(thread.ident, exc) == 1


@pytest.mark.parametrize("how", ["acquire()", "acquire(timeout=4)", "with"])
def test_async_keyboard_interrupt_wakes_a_blocked_acquire(lock, how):
    outcome, other = [], []

    def waiter():
        try:
            if how == "with":
                with lock:
                    outcome.append("acquired")
            else:
                outcome.append(lock.acquire(timeout=4 if "timeout" in how else -1))
        except KeyboardInterrupt as e:
            outcome.append(e)

    def bystander():  # waits too: must still get the lock once it is free
        other.append(lock.acquire(timeout=4))
        lock.release()

    lock.acquire()
    t = threading.Thread(target=waiter, daemon=True)
    try:
        t.start()
        wait_for_waiters(lock, 1)
        b = threading.Thread(target=bystander, daemon=True)
        b.start()
        wait_for_waiters(lock, 2)
        start = time.monotonic()
        async_raise(t, KeyboardInterrupt)
        t.join(2)
        assert not t.is_alive() and time.monotonic() - start < 1
    finally:
        lock.release()  # lets an unwoken waiter finish rather than hang
        t.join(5)
    b.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], KeyboardInterrupt), outcome
    assert other == [True]
    frames = traceback.extract_tb(outcome[0].__traceback__)
    assert frames[-1].name == "waiter" and not any(in_fxguard(f.filename) for f in frames)
    s = lock.stats()
    assert s["waiters"] == 0 and s["owner"] is None and s["depth"] == 0
    assert s["acquisitions"] == 2 and s["contended"] == 1  # this thread's and the bystander's
    assert lock.acquire(timeout=1)
    lock.release()


def sigint_from_another_thread(how):
    if how == "raise_signal":  # delivered to the calling thread, never the main one
        signal.raise_signal(signal.SIGINT)
    else:
        os.kill(os.getpid(), signal.SIGINT)  # to the process: any thread may get it


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signals are handled in the main thread")
@pytest.mark.parametrize("how", ["raise_signal", "kill"])
def test_sigint_interrupts_the_main_thread_waiting_in_acquire(lock, how):
    t, done = holder(lock)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.1, sigint_from_another_thread, args=(how,))
    interrupted_after = None
    try:
        start = time.monotonic()
        timer.start()
        try:
            lock.acquire(timeout=4)
        except KeyboardInterrupt:
            interrupted_after = time.monotonic() - start
        timer.join(5)
    except KeyboardInterrupt:  # late: after acquire() gave up
        pass
    finally:
        signal.signal(signal.SIGINT, previous)
        done.set()
        t.join(5)
    assert interrupted_after is not None and interrupted_after < 1.5, interrupted_after
    s = lock.stats()
    assert s["waiters"] == 0 and not lock.locked() and s["contended"] == 0


def test_waiting_runs_no_python_code_unless_an_exception_is_pending(lock):
    """The slices of a wait are invisible to a profiler: the tick that delivers an
    asynchronous exception runs only when one is pending."""
    import sys
    seen, result = set(), []

    def waiter():
        sys.setprofile(lambda frame, event, arg: seen.add(frame.f_code.co_filename))
        try:
            result.append(lock.acquire(timeout=0.2))  # several slices
        finally:
            sys.setprofile(None)

    with lock:
        t = threading.Thread(target=waiter)
        t.start()
        t.join(5)
    assert result == [False] and not any(in_fxguard(f) for f in seen), seen


# -- a thread that exits holding the lock -----------------------------------------------


def test_a_thread_that_exits_holding_the_lock_leaves_it_held(lock):
    """As CPython's RLock does (the choice is documented at the top of rlock.c)."""
    def take_twice(some_lock):
        some_lock.acquire()
        some_lock.acquire()

    t = threading.Thread(target=take_twice, args=(lock,))
    t.start()
    t.join(5)
    s = lock.stats()
    assert lock.locked() and s["owner"] == t.ident and s["depth"] == 2 and not lock._is_owned()
    assert lock.acquire(timeout=0.05) is False
    with pytest.raises(RuntimeError):
        lock.release()
    assert lock.stats()["waiters"] == 0

    reference = threading.RLock()
    t = threading.Thread(target=take_twice, args=(reference,))
    t.start()
    t.join(5)
    assert reference.acquire(timeout=0.05) is False  # the same with threading's


@needs_fork
def test_a_fork_frees_a_lock_whose_owner_exited(lock):
    t = threading.Thread(target=lock.acquire)
    t.start()
    t.join(5)
    assert lock.locked()
    assert exit_code_of_child(lambda: lock.acquire(timeout=2)) == 0
