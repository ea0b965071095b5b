"""Stress the C core without torch: threads x fx_tracing()/RLock/SlotView/thread records.

    python tests/core_stress.py [seconds] [threads]

Run by the sanitizer job (.ci/sanitize: ASan+UBSan, valgrind) and, briefly, by
tests/test_core_faults.py.  Each worker loops until the deadline over: nested
fx_tracing() scopes, contended RLock acquire/release (blocking, with timeouts,
re-entrant, threading.Condition), per-thread SlotView slots, short-lived threads
(a record each), an asynchronous KeyboardInterrupt into a blocked acquire(), and
a second _core module object made and collected.  Exits 0 when every invariant
held: flags back to False, no trace counted, locks free, each thread saw only its
own slot values.
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


def worker(n, deadline, lock, view, errors, counts):
    cond = threading.Condition(lock)
    i = 0
    try:
        while time.monotonic() < deadline:
            i += 1
            with fxguard.fx_tracing():
                assert fxguard.is_fx_tracing()
                with fxguard.fx_tracing(False):
                    assert not fxguard.is_fx_symbolic_tracing()
                assert _core._tracing_records() >= 1
            assert not fxguard.is_fx_tracing()
            view.count = (n, i)  # per-thread slot: nobody else's write can show here
            view.meta[n] = i
            with lock:
                with lock:
                    assert lock._is_owned() and view.count == (n, i)
            if lock.acquire(timeout=0.001):
                with cond:
                    cond.notify_all()
                lock.release()
            if i % 50 == 0:  # a short-lived thread that exits inside fx_tracing()
                t = threading.Thread(target=lambda: (view.count, fxguard.fx_tracing().__enter__()))
                t.start()
                t.join()
            if i % 200 == 0:
                with cond:
                    cond.wait(0.001)
        assert view.meta == {n: i} and view.count == (n, i)
        counts[n] = i
    except BaseException as e:  # noqa: BLE001 (reported, then the run fails)
        errors.append(repr(e))


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


def main(seconds=3.0, nthreads=6):
    _core._configure(_core.MODE_PATCHED, defaults=(None, None), factories=(None, dict))
    view = _core.SlotView({"count": SLOT_COUNT, "meta": SLOT_META, "flag": _core.FLAG_SLOT})
    lock, errors, counts = fxguard.RLock(), [], {}
    deadline = time.monotonic() + seconds
    threads = [threading.Thread(target=worker, args=(n, deadline, lock, view, errors, counts))
               for n in range(nthreads)]
    for t in threads:
        t.start()
    rounds = 0
    while time.monotonic() < deadline:
        interrupt_a_blocked_acquire(errors)
        module = fresh_core_module()
        with module.RLock(), module.fx_tracing():
            pass
        del module
        gc.collect()
        rounds += 1
    for t in threads:
        t.join(60)
    _core._configure(_core.MODE_OFF)
    if any(t.is_alive() for t in threads):
        errors.append("a worker did not finish")
    # (is_fx_tracing() first: the core's one-entry cache may still hold the record
    # of the last thread that exited inside fx_tracing(), which counts until freed.)
    if fxguard.is_fx_tracing() or _core._tracing_records() != 0 or lock.locked():
        errors.append(f"state left behind: {_core._tracing_records()} {lock.stats()}")
    print(f"core stress: {nthreads} threads x {sum(counts.values())} rounds, "
          f"{rounds} interrupt/module rounds, {len(errors)} errors")
    for e in errors[:10]:
        print("  ", e)
    return 1 if errors or len(counts) != nthreads else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(float(args[0]) if args else 3.0, int(args[1]) if len(args) > 1 else 6))
