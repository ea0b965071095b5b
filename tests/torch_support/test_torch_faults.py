"""Faults with fxguard installed on the real torch: an asynchronous KeyboardInterrupt
inside torch.fx.symbolic_trace, fork() while another thread is inside a trace, a
thread that exits inside fx_tracing(), and memory per thread after 20 000
short-lived tracing threads (torch 2.11's stash keeps each record: fxguard frees it
once torch has let go; bounded here on every torch)."""
import gc
import threading
import time
import tracemalloc

import pytest
import torch

import fxguard
from fxguard import _core
from guarded import finish
from injected_faults import async_raise, exit_code_of_child, needs_fork


class Spins(torch.nn.Module):
    """forward() waits (in plain Python, while being traced) until released."""

    def __init__(self, inside, release):
        super().__init__()
        self.inside, self.release = inside, release

    def forward(self, x):
        self.inside.set()
        while not self.release.is_set():
            time.sleep(0.001)
        return x + 1


def thread_in_symbolic_trace(release, outcome):
    inside = threading.Event()

    def run():
        try:
            torch.fx.symbolic_trace(Spins(inside, release))
            outcome.append("traced")
        except KeyboardInterrupt:
            outcome.append(("interrupted", fxguard.is_fx_tracing(),
                            torch.fx._symbolic_trace.is_fx_tracing()))

    t = threading.Thread(target=run)
    t.start()
    assert inside.wait(10)
    return t


def compiled_call_works():
    fn = torch.compile(lambda x: x * 2, backend="eager")
    return bool((fn(torch.ones(2)) == 2).all())


def test_async_keyboard_interrupt_inside_symbolic_trace():
    status = fxguard.install()
    release, outcome = threading.Event(), []
    t = thread_in_symbolic_trace(release, outcome)
    try:
        assert fxguard.is_fx_tracing() is False  # this thread's own flag
        if status["mode"] == "patched":
            assert _core._tracing_records() == 1
        async_raise(t, KeyboardInterrupt)
        t.join(10)
    finally:
        release.set()
        finish(t, timeout=10)
    assert outcome == [("interrupted", False, False)]
    assert _core._tracing_records() == 0
    assert compiled_call_works()
    fxguard.uninstall()  # not refused: nothing is left inside a trace


@needs_fork
def test_fork_while_another_thread_is_inside_symbolic_trace():
    fxguard.install()
    release, outcome = threading.Event(), []
    t = thread_in_symbolic_trace(release, outcome)
    try:
        def child():
            sane = (not fxguard.is_fx_tracing() and _core._tracing_records() == 0
                    and not torch.fx._symbolic_trace.is_fx_tracing())
            fxguard.uninstall()  # refused if the tracing thread still counted
            return sane and not fxguard.is_installed()
        assert exit_code_of_child(child) == 0
    finally:
        release.set()
        finish(t, timeout=10)
    assert outcome == ["traced"] and _core._tracing_records() == 0


def test_a_thread_that_exits_inside_fx_tracing_does_not_block_uninstall():
    fxguard.install()
    t = threading.Thread(target=lambda: fxguard.fx_tracing().__enter__())
    t.start()
    t.join(10)
    fxguard.is_fx_tracing()  # moves the core's one-entry cache off the dead thread's record
    # torch 2.11 drops its reference from the thread's C++ thread-locals, just after join().
    deadline = time.monotonic() + 5
    while _core._tracing_records() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _core._tracing_records() == 0
    fxguard.uninstall()
    assert not fxguard.is_installed()


@pytest.mark.slow
def test_twenty_thousand_short_lived_tracing_threads_are_bounded():
    """Before fxguard freed what torch 2.11's stash let go, each thread kept ~270 bytes
    there for good (benchmarks/RESULTS.md)."""
    fxguard.install()

    def body():
        with fxguard.fx_tracing():
            torch.compiler.is_compiling()  # reads a per-thread slot of the record

    def churn(n):
        for _ in range(n):
            t = threading.Thread(target=body)
            t.start()
            t.join()

    churn(500)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        churn(20_000)
        time.sleep(0.1)
        fxguard.is_fx_tracing()
        _core._tracing_records()  # sweeps what torch has let go
        gc.collect()
        per_thread = (tracemalloc.get_traced_memory()[0] - before) / 20_000
    finally:
        tracemalloc.stop()
    assert per_thread < 32, f"{per_thread:.1f} bytes per thread (stash steals: " \
                            f"{_core._stash_steals()})"
