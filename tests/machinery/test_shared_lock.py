"""machinery.shared_lock.SharedLock, torch-free: shared holders overlap, an
exclusive holder is alone, re-entry either way, timeouts, fork."""
import os
import sys
import threading

import pytest

from fxguard.machinery.shared_lock import SharedLock


def hold(lock, how, entered, leave):
    """A thread holding lock (shared or exclusive) until leave is set."""
    def run():
        with (lock.shared() if how == "shared" else lock):
            entered.set()
            assert leave.wait(30)
    thread = threading.Thread(target=run)
    thread.start()
    assert entered.wait(30)
    return thread


def test_shared_holders_overlap_and_exclusive_waits_for_them():
    lock, leave = SharedLock(), threading.Event()
    a = hold(lock, "shared", threading.Event(), leave)
    b = hold(lock, "shared", threading.Event(), leave)  # entered while a holds it
    assert lock.state() == {"holders": 2, "exclusive": False, "exclusive_waiting": 0}
    assert lock.acquire(timeout=0.05) is False          # exclusive: waits for both
    assert lock.state()["exclusive_waiting"] == 0       # a timed-out waiter leaves no trace
    leave.set()
    a.join()
    b.join()
    assert lock.acquire(blocking=False) and lock.state()["exclusive"]
    lock.release()


def test_a_waiting_exclusive_holds_off_new_shared_holders():
    lock, leave = SharedLock(), threading.Event()
    reader = hold(lock, "shared", threading.Event(), leave)
    got = threading.Event()
    writer = threading.Thread(target=lambda: (lock.acquire(), got.set(), lock.release()))
    writer.start()
    while lock.state()["exclusive_waiting"] == 0:
        threading.Event().wait(0.001)
    late = threading.Event()
    later = threading.Thread(target=lambda: (lock._acquire(False, True, 5), late.set(), lock.release()))
    later.start()
    assert not late.wait(0.1)            # behind the waiting writer, not beside the reader
    leave.set()
    reader.join()
    writer.join()
    later.join()
    assert got.is_set() and late.is_set()


def test_reentry_either_way_in_the_holding_thread():
    lock = SharedLock()
    with lock.shared():
        with lock:            # inside a shared hold: a re-entry, not a wait
            with lock.shared():
                assert lock._is_owned() and lock.state()["holders"] == 1
    assert not lock._is_owned() and lock.state()["holders"] == 0
    with pytest.raises(RuntimeError):
        lock.release()


def test_an_exclusive_holder_is_alone():
    lock, leave = SharedLock(), threading.Event()
    owner = hold(lock, "exclusive", threading.Event(), leave)
    assert not lock._acquire(False, True, 0.05)  # shared waits for it
    leave.set()
    owner.join()
    with lock.shared():
        pass


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="needs fork()")
def test_after_fork_the_child_keeps_only_the_forking_threads_holds():
    lock, leave = SharedLock(), threading.Event()
    other = hold(lock, "shared", threading.Event(), leave)
    with lock.shared():
        pid = os.fork()
        if pid == 0:  # the child: the other thread's hold is gone, ours stays
            ok = lock.state()["holders"] == 1 and lock._is_owned()
            lock.release()
            ok = ok and lock.acquire(blocking=False)
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
    leave.set()
    other.join()
    assert os.waitstatus_to_exitcode(status) == 0
