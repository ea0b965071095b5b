"""Stress the C core without torch: threads x fx_tracing()/RLock/Condition/SlotView/
Dispatch/Reader/thread records.

    python tests/core/stress.py [seconds] [threads]

Run by the sanitizer jobs (.ci/sanitize: ASan+UBSan, valgrind; .ci/tsan:
ThreadSanitizer on free-threaded CPython), briefly by tests/core/test_core_faults.py,
and with the GIL off by tests/core/test_free_threaded.py.  Each worker loops until the
deadline over: nested fx_tracing() scopes, contended RLock acquire/release
(blocking, with timeouts, re-entrant, threading.Condition), a read-modify-write of a
shared counter that only the lock protects, per-thread SlotView slots, a per-thread
Dispatch override and a Reader, short-lived threads (a record each); beside them,
producers and consumers hand items through a threading.Condition on an fxguard
RLock, and the main thread interrupts a blocked acquire() with an asynchronous
KeyboardInterrupt and makes and collects a second _core module object.  Exits 0
when every invariant held: no update lost, every item handed over once, flags back
to False, no trace counted, locks free, each thread saw only its own values.
"""
import ctypes
import gc
import importlib.util
import sys
import threading
import time

import fxguard
from fxguard import _core

SLOT_COUNT, SLOT_META = 0, 1  # the two slots _configure() is given below


def fresh_core_module():
    spec = importlib.util.spec_from_file_location("fxguard._core", _core.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def async_raise(thread, exc):
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
    return set_async_exc(thread.ident, exc)


class Shared:
    """What the workers share: the lock, the counter only it protects, the core objects."""

    def __init__(self, deadline):
        self.deadline = deadline
        self.lock = fxguard.RLock()
        self.counter = 0  # read-modify-written under self.lock only
        self.view = _core.SlotView({"count": SLOT_COUNT, "meta": SLOT_META,
                                    "flag": _core.FLAG_SLOT})
        self.reader = _core.Reader(_core.READ_VALUE, SLOT_COUNT)
        self.dispatch = _core.Dispatch(None, lambda: "callee")
        self.errors, self.increments = [], {}


def fx_tracing_round(shared):
    with fxguard.fx_tracing():
        assert fxguard.is_fx_tracing()
        with fxguard.fx_tracing(False):
            assert not fxguard.is_fx_symbolic_tracing()
        assert _core._tracing_records() >= 1
    assert not fxguard.is_fx_tracing()


def per_thread_round(shared, n, i):
    view = shared.view
    view.count = (n, i)  # per-thread slot: nobody else's write can show here
    view.meta[n] = i
    assert shared.reader.read() == (n, i)
    mine = lambda: n  # noqa: E731 (a value only this thread's calls may return)
    shared.dispatch.set(mine)
    assert shared.dispatch() == n and shared.dispatch.override(None) is mine
    shared.dispatch.reset()
    assert shared.dispatch() == "callee"


def lock_round(shared, cond, n, i):
    lock = shared.lock
    with lock:
        with lock:
            assert lock._is_owned() and shared.view.count == (n, i)
            shared.counter += 1  # the lost-update probe: two locked levels deep
    if lock.acquire(timeout=0.001):
        shared.counter += 1
        with cond:
            cond.notify_all()
        lock.release()
        return 2
    return 1


def worker(n, shared):
    cond = threading.Condition(shared.lock)
    i = increments = 0
    try:
        while time.monotonic() < shared.deadline:
            i += 1
            fx_tracing_round(shared)
            per_thread_round(shared, n, i)
            increments += lock_round(shared, cond, n, i)
            if i % 50 == 0:  # a short-lived thread that exits inside fx_tracing()
                t = threading.Thread(
                    target=lambda: (shared.view.count, fxguard.fx_tracing().__enter__()))
                t.start()
                t.join()
            if i % 200 == 0:
                with cond:
                    cond.wait(0.001)
        assert shared.view.meta == {n: i} and shared.view.count == (n, i)
        shared.increments[n] = increments
    except BaseException as e:  # noqa: BLE001 (reported, then the run fails)
        shared.errors.append(f"worker {n}: {e!r}")


def hand_over(shared, producers=2, consumers=2, items=2000):
    """Producers put numbered items in a one-slot box, consumers take them, all
    through one Condition on an fxguard RLock: each item must arrive exactly once."""
    lock, box, taken = fxguard.RLock(), [], []
    cond = threading.Condition(lock)

    def produce(p):
        for k in range(items):
            with cond:
                while box and time.monotonic() < shared.deadline + 30:
                    cond.wait(0.05)
                box.append((p, k))
                cond.notify_all()

    def consume():
        while True:
            with cond:
                while not box:
                    if len(taken) >= producers * items:
                        return
                    cond.wait(0.05)
                taken.append(box.pop())
                cond.notify_all()

    # Daemons: with a broken lock they may never finish, and the run must still end.
    threads = [threading.Thread(target=produce, args=(p,), daemon=True) for p in range(producers)]
    threads += [threading.Thread(target=consume, daemon=True) for _ in range(consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(10.0, shared.deadline + 60 - time.monotonic()))
    if sorted(taken) != [(p, k) for p in range(producers) for k in range(items)]:
        shared.errors.append(f"condition hand-over: {len(taken)} taken, "
                             f"{len(set(taken))} distinct, of {producers * items}")
    if lock.locked() or lock.stats()["waiters"]:
        shared.errors.append(f"condition hand-over left the lock busy: {lock.stats()}")


def interrupt_a_blocked_acquire(errors):
    lock, outcome = fxguard.RLock(), []

    def waiter():
        try:
            outcome.append(lock.acquire(timeout=5))
        except KeyboardInterrupt:
            outcome.append("interrupted")

    with lock:
        t = threading.Thread(target=waiter)
        t.start()
        while lock.stats()["waiters"] == 0:
            time.sleep(0.001)
        async_raise(t, KeyboardInterrupt)
        t.join(5)
    if outcome != ["interrupted"] or lock.locked() or lock.stats()["waiters"]:
        errors.append(f"interrupted acquire: {outcome} {lock.stats()}")


def check_left_behind(shared, nthreads):
    errors = shared.errors
    if len(shared.increments) != nthreads:
        errors.append(f"{nthreads - len(shared.increments)} worker(s) did not finish")
    expected = sum(shared.increments.values())
    if shared.counter != expected:
        errors.append(f"lost updates: the locked counter is {shared.counter}, "
                      f"{expected} increments were made")
    # (is_fx_tracing() first: with the GIL the core's one-entry cache may still hold
    # the record of the last thread that exited inside fx_tracing(), which counts
    # until freed.)
    if fxguard.is_fx_tracing() or _core._tracing_records() != 0 or shared.lock.locked():
        errors.append(f"state left behind: {_core._tracing_records()} tracing, "
                      f"{shared.lock.stats()}")
    if shared.dispatch.overriding:
        errors.append(f"{shared.dispatch.overriding} Dispatch override(s) left behind")


def main(seconds=3.0, nthreads=6):
    _core._configure(_core.MODE_PATCHED, defaults=(None, None), factories=(None, dict))
    shared = Shared(time.monotonic() + seconds)
    threads = [threading.Thread(target=worker, args=(n, shared)) for n in range(nthreads)]
    threads.append(threading.Thread(target=hand_over, args=(shared,)))
    for t in threads:
        t.start()
    rounds = 0
    while time.monotonic() < shared.deadline:
        interrupt_a_blocked_acquire(shared.errors)
        module = fresh_core_module()
        with module.RLock(), module.fx_tracing():
            pass
        del module
        gc.collect()
        rounds += 1
    for t in threads:
        t.join(120)
    if any(t.is_alive() for t in threads):
        shared.errors.append("a thread did not finish")
    _core._configure(_core.MODE_OFF)
    check_left_behind(shared, nthreads)
    gil = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
    print(f"core stress (GIL {'on' if gil else 'off'}): {nthreads} threads, "
          f"{shared.counter} locked increments, {rounds} interrupt/module rounds, "
          f"{len(shared.errors)} errors")
    for e in shared.errors[:10]:
        print("  ", e)
    return 1 if shared.errors else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(float(args[0]) if args else 3.0, int(args[1]) if len(args) > 1 else 6))
