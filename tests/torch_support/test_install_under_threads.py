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
from fxguard import interpreter

pytestmark = pytest.mark.skipif(not interpreter.gil_enabled(),
                                reason="other threads' frames are not walked with the GIL off")


# Threads parked inside every rewritten function and context manager while
# install() and uninstall() run: tests/livethreads.


@pytest.mark.slow
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


def test_a_thread_started_after_install_holds_nothing_back(caplog):
    """A thread started after install() has fxguard's Thread._bootstrap at the
    bottom of its stack, already past its one read of fxguard's namespace (as
    inductor's tqdm_monitor and compile pool after any compile): install() with
    other options and uninstall() neither wait for it nor warn, and remove
    every name at once."""
    import logging

    from fxguard.machinery import originals
    fxguard.install()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, args=(120,), name="idle-after-install")
    thread.start()
    try:
        with caplog.at_level(logging.WARNING, logger="fxguard"):
            fxguard.install(compile_once=False)
            fxguard.uninstall()
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
        assert originals.held() == ()
        assert not [name for name in vars(threading) if name.startswith("__fxguard")]
    finally:
        stop.set()
        finish(thread, timeout=120)
