"""install() and uninstall() while other threads run the torch code they change.

A thread already inside a function whose code install() swaps keeps running
the old code: a stock reader must still find the module global it reads, and
a rewritten one must still find fxguard's view after uninstall().  install()
and uninstall() make their additive changes first, wait until no other thread
runs the retired code (machinery.settle), and remove names last.

Deterministic: a thread is held at the first instruction of the function
(a trace function's 'call' event) until install()/uninstall() either waits
for it (settle) or has finished (guard off: no wait, and the held frame then
reads a name that is gone).  The stress test below runs the readers through
install/uninstall cycles under a 1 us switch interval.
"""
import sys
import threading

import pytest
import torch
import torch.fx.traceback as fx_traceback
from guarded import finish

import fxguard
from fxguard import _install, interpreter
from fxguard.machinery import settle

pytestmark = pytest.mark.skipif(not interpreter.gil_enabled(),
                                reason="other threads' frames are not walked with the GIL off")


@pytest.fixture(params=["off", "on"])
def waits(request, monkeypatch):
    """'on': install()/uninstall() wait for threads in retired code; 'off': they don't."""
    settling = threading.Event()
    real = settle.threads_running

    def watched(codes):
        settling.set()
        return real(codes)

    monkeypatch.setattr(settle, "threads_running", watched)
    if request.param == "off":
        monkeypatch.setattr(_install, "_settle", lambda codes: None)
    return request.param, settling


def _held_call(fn, release):
    """Run fn() in a thread held at the first instruction of its frame until
    release() is true; the exception it raised, if any."""
    code = fn.__code__
    entered, failures = threading.Event(), []

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code is code:
            entered.set()
            while not release():
                threading.Event().wait(0.001)
        return None

    def run():
        sys.settrace(tracer)
        try:
            fn()
        except Exception as e:  # what the test checks
            failures.append(e)
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert entered.wait(60)
    return thread, failures


def _check(way, failures):
    if way == "off":  # the held frame read a name that was gone
        assert failures and isinstance(failures[0], NameError), failures
    else:
        assert not failures, failures


def _while_held(waits, change):
    """Run ``change()`` while a thread is held at format_stack's first instruction;
    what the held frame raised once released."""
    way, settling = waits
    settling.clear()
    done = threading.Event()
    thread, failures = _held_call(fx_traceback.format_stack,
                                  lambda: done.is_set() or settling.is_set())
    try:
        change()
    finally:
        done.set()
        finish(thread)
    return way, failures


def test_install_while_a_thread_is_inside_a_stock_reader(waits):
    way, failures = _while_held(waits, fxguard.install)
    assert "should_preserve_node_meta" not in vars(fx_traceback)
    _check(way, failures)


def test_uninstall_while_a_thread_is_inside_rewritten_code(waits):
    fxguard.install()
    way, failures = _while_held(waits, fxguard.uninstall)
    assert "should_preserve_node_meta" in vars(fx_traceback)
    _check(way, failures)


def test_readers_through_install_cycles():
    """Bounded stress: a thread reads trace state through 10 install/uninstall cycles."""
    from torch.fx._symbolic_trace import is_fx_tracing
    errors, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                torch.compiler.is_compiling()
                fx_traceback.get_current_meta()
                fx_traceback.format_stack()
                is_fx_tracing()
            except Exception as e:
                errors.append(e)

    thread = threading.Thread(target=reader, daemon=True)
    interval = sys.getswitchinterval()
    thread.start()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(10):
            fxguard.install()
            fxguard.uninstall()
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        finish(thread)
    assert errors == []
