"""The suite's own guard (tests/thread_failures.py): a test whose thread
raised fails, whether the thread is a threading.Thread or a bare
_thread.start_new_thread, and in every phase; a strict xfail counts it as its
expected failure; a test that failed itself keeps its failure; a thread an
earlier test left running fails the test it raises in, naming the earlier one."""
import os
import subprocess
import sys

TESTS = """\
import _thread
import threading

import pytest


def raise_in_a_thread():
    t = threading.Thread(target=lambda: 1 / 0)
    t.start()
    t.join()


def test_thread_raises():
    raise_in_a_thread()


def test_bare_thread_raises():
    done = threading.Lock()
    done.acquire()

    def body():
        try:
            raise ValueError("bare")
        finally:
            done.release()
    _thread.start_new_thread(body, ())
    assert done.acquire(timeout=60)
    while _thread._count() > 0:  # the hook runs after body's finally
        threading.Event().wait(0.01)


@pytest.fixture
def raises_at_teardown():
    yield
    raise_in_a_thread()


def test_teardown_thread_raises(raises_at_teardown):
    pass


@pytest.mark.xfail(strict=True)
def test_expected_failure():
    raise_in_a_thread()


def test_threads_that_end_well():
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()


def test_own_failure_kept():
    raise_in_a_thread()
    assert False, "its own"


LEFT = []


def test_leaves_a_thread_running():
    go = threading.Event()

    def late():
        assert go.wait(60)
        raise RuntimeError("late")
    LEFT.append((threading.Thread(target=late, daemon=True), go))
    LEFT[0][0].start()


def test_after_it():
    thread, go = LEFT[0]
    go.set()
    thread.join(60)
"""


def test_a_thread_that_raised_fails_its_test(tmp_path):
    (tmp_path / "conftest.py").write_text("from thread_failures import *  # noqa: F401,F403\n")
    (tmp_path / "test_threads.py").write_text(TESTS)
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests] + [p for p in sys.path if p]))
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
                           "-p", "no:fxguard", "test_threads.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    lines = [line for line in done.stdout.splitlines()
             if line.split(" ")[0] in ("PASSED", "FAILED", "XFAIL", "XPASS", "ERROR")]
    outcome = {line.split("::")[1].split(" ")[0]: line.split(" ")[0] for line in lines}
    assert outcome == {
        "test_thread_raises": "FAILED",
        "test_bare_thread_raises": "FAILED",
        "test_teardown_thread_raises": "ERROR",
        "test_expected_failure": "XFAIL",
        "test_threads_that_end_well": "PASSED",
        "test_own_failure_kept": "FAILED",
        "test_leaves_a_thread_running": "PASSED",
        "test_after_it": "FAILED",  # and names the test that left the thread
    }, done.stdout[-4000:]
    assert "(left running by test_threads.py::test_leaves_a_thread_running) raised " \
        "RuntimeError: late" in done.stdout
    assert "ThreadRaised: thread started by" in done.stdout
    assert "AssertionError: its own" in done.stdout
    assert "Captured thread exceptions call" in done.stdout
