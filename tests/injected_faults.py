"""Faults a test injects into a thread or a process: an asynchronous exception
raised in another thread, a check run in a forked child.  Shared by
core/test_core_faults.py and torch_support/test_torch_faults.py."""
import ctypes
import os

import pytest

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() here")


def async_raise(thread, exc):
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
    assert set_async_exc(thread.ident, exc) == 1


def exit_code_of_child(check) -> int:
    """Fork; the child exits 0 if check() is true, 1 if false, 2 if it raised."""
    pid = os.fork()
    if pid == 0:
        try:
            code = 0 if check() else 1
        except BaseException:  # noqa: BLE001 (a child must never return into pytest)
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
