"""The frame walk settle() (and the tests' helpers) make: torch-free."""
import contextlib
import gc
import threading

import pytest

from fxguard.machinery import settle
from guarded import gil_off

# settle() walks no frames without the GIL (the walk is not safe there).
pytestmark = pytest.mark.skipif(gil_off(), reason="no frame walks with the GIL off")


def test_current_frames_pauses_the_collector_and_puts_it_back():
    """On CPython 3.11 a collection triggered inside sys._current_frames() that
    frees a threading.local hangs the process (the walk holds the thread-state
    lock that threading.local's clear takes again): the walk runs with the
    collector paused, and leaves it as it found it."""
    inside, done = threading.Event(), threading.Event()

    def waiting():
        inside.set()
        assert done.wait(30)
    t = threading.Thread(target=waiting)
    t.start()
    assert inside.wait(30)
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            frames = settle.current_frames()
            assert t.ident in frames and threading.get_ident() in frames
            assert gc.isenabled() is enabled
    finally:
        gc.enable()
        done.set()
        t.join()


def test_threads_running_names_a_thread_inside_the_code():
    inside, done = threading.Event(), threading.Event()

    def busy():
        inside.set()
        assert done.wait(30)
    t = threading.Thread(target=busy, name="busy-one")
    t.start()
    assert inside.wait(30)
    try:
        assert settle.threads_running([busy.__code__]) == ["busy-one"]
    finally:
        done.set()
        t.join()
    assert settle.threads_running([busy.__code__]) == []


X = 0


@contextlib.contextmanager
def _restores_x():
    global X
    saved = X
    try:
        yield
    finally:
        X = saved


def test_a_with_body_is_found_though_it_is_on_no_stack():
    """A @contextmanager whose with-body runs is a suspended generator: it still
    assigns X on exit, so X is in use; once exited, nothing is."""
    code = _restores_x.__wrapped__.__code__
    cm = _restores_x()
    assert settle.names_in_use(settle.live([code]), {"X"}) == {"X"}  # not started: all ahead
    with cm:
        assert settle.names_in_use(settle.live([code]), {"X", "Y"}) == {"X"}
    assert settle.live([code]) == [] or settle.names_in_use(settle.live([code]), {"X"}) == set()


def test_a_frame_past_its_last_read_holds_nothing():
    """A thread whose frame already read X (a swapped Thread._bootstrap calls
    on after its one read) does not hold X; one about to read it does."""
    read, done = threading.Event(), threading.Event()

    def reads_then_waits():
        X
        read.set()
        done.wait(30)

    def waits_then_reads():
        read.set()
        done.wait(30)
        return X

    for target, expected in ((reads_then_waits, set()), (waits_then_reads, {"X"})):
        read.clear()
        done.clear()
        t = threading.Thread(target=target)
        t.start()
        assert read.wait(30)
        try:
            found = settle.live([target.__code__])
            assert len(found) == 1
            assert settle.names_in_use(found, {"X"}) == expected
        finally:
            done.set()
            t.join()
        assert settle.names_in_use(found, {"X"}) == set()  # gone with its thread
