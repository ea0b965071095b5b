"""fxguard.RLock / fxguard.block_mask_lock: re-entrant, GIL-releasing, fork-safe, counted."""
import os
import threading
import time

import pytest

import fxguard


@pytest.fixture
def lock():
    return fxguard.RLock()


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
    held.wait(10)
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
    waiting.wait(10)
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
    held.wait(10)
    pid = os.fork()
    if pid == 0:  # child: the holder thread does not exist here
        ok = lock.acquire(timeout=2)
        os._exit(0 if ok and lock._is_owned() else 1)
    _, status = os.waitpid(pid, 0)
    done.set()
    t.join()
    assert os.waitstatus_to_exitcode(status) == 0
