"""Race: another thread's dynamo compile runs inside _set_compilation_env's config window.

_set_compilation_env sets process-global torch._dynamo.config.allow_empty_graphs
and capture_scalar_outputs for its window; a compile on another thread during
that window compiles under them (torch <= 2.12; 2.13 keeps config overrides in
ContextVars, so there each thread has its own and nothing races).
"""
import inspect
import threading

import pytest
import torch
from guarded import both_ways, finish, run_together
from torch._higher_order_ops.utils import _set_compilation_env

from fxguard.torch_support import facts


def config_is_process_global() -> bool:
    return not facts.config_is_per_thread()

HOLD = 60.0  # hang guard only
# What the window sets on this torch: both on 2.9+, allow_empty_graphs on 2.7/2.8, none before.
SET = [name for name in ("capture_scalar_outputs", "allow_empty_graphs")
       if f"config.{name} = True" in inspect.getsource(_set_compilation_env.__wrapped__)]
pytestmark = pytest.mark.skipif(not SET, reason="this torch's window sets no dynamo config")


@both_ways(races=config_is_process_global)  # torch >= 2.12 keeps config per thread
def test_no_compile_of_another_thread_inside_the_config_window(guard):
    before = (torch._dynamo.config.capture_scalar_outputs, torch._dynamo.config.allow_empty_graphs)
    in_window, compiled, seen = threading.Event(), threading.Event(), []

    def backend(gm, example_inputs):
        seen.append((torch._dynamo.config.capture_scalar_outputs,
                     torch._dynamo.config.allow_empty_graphs))
        compiled.set()
        return gm.forward

    def window():
        with _set_compilation_env():
            in_window.set()
            assert compiled.wait(HOLD)  # the compile lands in here (the window is not a lock)

    def compile_elsewhere():
        assert in_window.wait(HOLD)
        torch.compile(lambda x: x * 5 - 1, backend=backend)(torch.ones(2))

    run_together(window, compile_elsewhere)
    assert seen == [before], f"compiled under the window's config {seen[0]}"


@both_ways(races=config_is_process_global)
def test_interleaved_windows_leave_the_config_as_it_was(guard):
    """Window A saves False and sets True; window B saves A's True; A restores
    False; B restores True: stock keeps the window's config for good."""
    before = (torch._dynamo.config.capture_scalar_outputs, torch._dynamo.config.allow_empty_graphs)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    inside = []

    def a():
        with _set_compilation_env():
            inside.append(getattr(torch._dynamo.config, SET[0]))
            a_in.set()
            assert b_in.wait(HOLD)
        a_out.set()

    def b():
        assert a_in.wait(HOLD)
        with _set_compilation_env():
            inside.append(getattr(torch._dynamo.config, SET[0]))
            b_in.set()
            assert a_out.wait(HOLD)

    run_together(a, b)
    assert inside == [True, True]  # each window sees its own config
    after = (torch._dynamo.config.capture_scalar_outputs, torch._dynamo.config.allow_empty_graphs)
    assert after == before, f"config left at {after}"


def test_a_window_does_not_wait_for_another_threads_compile():
    """Eager flex_attention opens the window on every call: it must not queue
    behind a compile running in another thread (with dynamo's compile_lock held
    for the window, a warm eager-flex thread waits out every compile)."""
    import fxguard
    fxguard.install()
    compiling, release, entered = threading.Event(), threading.Event(), threading.Event()

    def held_backend(gm, example_inputs):
        compiling.set()
        assert release.wait(HOLD)
        return gm.forward

    def compile_held():
        torch.compile(lambda x: x * 3 + 2, backend=held_backend)(torch.ones(3))

    let_go = threading.Timer(5.0, release.set)  # a window that waits is let go after 5 s

    def window():
        assert compiling.wait(HOLD)
        let_go.start()
        try:
            with _set_compilation_env():
                if not release.is_set():
                    entered.set()
        finally:
            release.set()

    try:
        run_together(compile_held, window)
    finally:  # no timer left behind (uninstall would wait for it as for a running thread)
        let_go.cancel()
        if let_go.ident is not None:
            finish(let_go)
    assert entered.is_set(), "the window waited for the other thread's compile"
