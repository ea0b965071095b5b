"""The frame walk settle() (and the tests' helpers) make: torch-free."""
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
