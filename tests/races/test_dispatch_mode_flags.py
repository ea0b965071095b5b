"""TorchDispatchMode's module flags stay in the thread whose mode set them.

``torch.utils._python_dispatch`` keeps ``_is_in_torch_dispatch_mode``,
``_is_in_non_infra_torch_dispatch_mode`` and (2.9+)
``_is_in_any_mode_without_ignore_compile_internals`` as module globals: every
mode's ``__enter__`` saves them on the mode and sets them, ``__exit__`` puts the
saved values back, while the mode stack itself is per thread (C++).  So a
thread inside no mode reads another thread's modes, and two threads' enter/exit
interleaved leave them True for good.  Readers that matter: dynamo's frame
callback skips compiling (the call runs eager) while the non-infra flag (2.5-2.8)
or the without-ignore flag (2.9-2.10; 2.11+ with
``inline_torch_dispatch_torch_compile=False``) reads True; inductor's
``wrap_inductor_compiled_regions`` wrapper reads the first flag.

Each scenario runs both ways: guard off (stock torch) must fail where the flags
are process-wide (strict xfail), and with fxguard installed pass.
"""
import threading

import pytest
import torch
from guarded import finish, fresh_function, holding_op, run_together
from torch.utils import _python_dispatch as dispatch
from torch.utils._python_dispatch import TorchDispatchMode, is_in_torch_dispatch_mode

HOLD = 30.0
WITHOUT_IGNORE = "_is_in_any_mode_without_ignore_compile_internals"
FLAGS = ("_is_in_torch_dispatch_mode", "_is_in_non_infra_torch_dispatch_mode", WITHOUT_IGNORE)


def flags_are_process_wide() -> bool:
    return isinstance(vars(dispatch).get("_is_in_torch_dispatch_mode"), bool)


def both_ways(races=flags_are_process_wide):
    fails = pytest.mark.xfail(races(), strict=True, reason="process-wide flags: must catch it")
    return pytest.mark.parametrize("way", [pytest.param("off", marks=fails), "on"])


@pytest.fixture
def applied(way):
    """Stock torch, or fxguard.install(); stock after."""
    try:
        if way == "on":
            import fxguard
            fxguard.install()
        yield way
    finally:
        # a stock race can leave the flags True for good: later tests start clean
        for name in FLAGS:
            if isinstance(vars(dispatch).get(name), bool):
                setattr(dispatch, name, False)


class UserMode(TorchDispatchMode):
    """A plain user mode: not infra, does not ignore compile internals."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def flags_now() -> dict:
    """What the calling thread reads, through torch's own readers."""
    seen = {"any": is_in_torch_dispatch_mode(),
            "non_infra": is_in_torch_dispatch_mode(include_infra_modes=False)}
    if hasattr(dispatch, "is_in_any_mode_without_ignore_compile_internals"):
        seen["without_ignore"] = dispatch.is_in_any_mode_without_ignore_compile_internals()
    return seen


NONE = {"any": False, "non_infra": False, "without_ignore": False}


def expected(seen: dict, value: bool) -> dict:
    return {k: value for k in seen}


@both_ways()
def test_thread_in_no_mode_does_not_see_another_threads_user_mode(applied):
    inside, release, seen = threading.Event(), threading.Event(), {}

    def a():
        with UserMode():
            seen["a"] = flags_now()
            inside.set()
            assert release.wait(HOLD)

    def b():
        assert inside.wait(HOLD)
        try:
            seen["b"] = flags_now()
        finally:
            release.set()

    run_together(a, b)
    assert seen["a"] == expected(seen["a"], True), "A is inside its own mode"
    assert seen["b"] == expected(seen["b"], False), f"B saw A's mode: {seen['b']}"


@both_ways()
def test_thread_in_no_mode_does_not_see_another_threads_compile(applied):
    """A is held inside dynamo's tracing, where FakeTensorMode (an infra mode)
    runs a custom op's fake implementation; B reads the flags meanwhile."""
    inside, release, seen = threading.Event(), threading.Event(), {}

    def hold_the_compiler():
        if threading.current_thread().name == "compiler":
            seen["a"] = is_in_torch_dispatch_mode()
            inside.set()
            assert release.wait(HOLD)

    held = holding_op(f"fxguard_test::held_{applied}", hold_the_compiler)

    def a():
        torch.compile(lambda x: held(x) + 1, backend="eager")(torch.ones(3))

    def b():
        assert inside.wait(HOLD)
        try:
            seen["b"] = flags_now()
        finally:
            release.set()

    threads = [threading.Thread(target=a, name="compiler", daemon=True),
               threading.Thread(target=b, daemon=True)]
    for t in threads:
        t.start()
    finish(*threads, timeout=60)
    assert seen["a"] is True, "the compiling thread is inside FakeTensorMode"
    assert seen["b"]["any"] is False, f"B saw A's compile's FakeTensorMode: {seen['b']}"


@both_ways()
def test_interleaved_enter_exit_leave_no_flag_stuck(applied):
    """A enters, B enters, A exits, B exits.  Stock: B saved A's True on entry
    and puts it back on exit, so every thread reads True from then on (and B's
    C++ mirror of the without-ignore flag stays True)."""
    a_in, b_in, a_out, seen = threading.Event(), threading.Event(), threading.Event(), {}

    def a():
        with UserMode():
            a_in.set()
            assert b_in.wait(HOLD)
        a_out.set()

    def b():
        assert a_in.wait(HOLD)
        with UserMode():
            b_in.set()
            assert a_out.wait(HOLD)
        seen["b after"] = flags_now()

    run_together(a, b)
    seen["main after"] = flags_now()
    assert seen["b after"] == expected(seen["b after"], False), seen
    assert seen["main after"] == expected(seen["main after"], False), seen


@both_ways()
def test_compiled_call_runs_compiled_while_another_thread_is_in_a_user_mode(applied):
    """The harm: dynamo's frame callback skips a frame (it runs eager) while the
    flag reads True, and on torch <= 2.13 that code stays skipped for good (the
    main thread's later call, no mode anywhere, still runs eager).  Torch 2.11+
    reads the flag only with inline_torch_dispatch_torch_compile off (2.5-2.10:
    always); the test turns it off there for the calling thread's compile."""
    import contextlib

    import torch._dynamo.config as config
    inside, release, seen, graphs = threading.Event(), threading.Event(), {}, []

    def counting(gm, example_inputs):
        graphs.append(threading.current_thread().name)
        return gm.forward

    # Dynamo marks a code it skipped as skipped for good (see above): each run needs its own.
    compiled = torch.compile(fresh_function("def f(x):\n    return x + 1\n"), backend=counting)

    def a():
        with UserMode():
            inside.set()
            assert release.wait(HOLD)

    def b():
        assert inside.wait(HOLD)
        try:
            with (config.patch(inline_torch_dispatch_torch_compile=False)
                  if hasattr(config, "inline_torch_dispatch_torch_compile")
                  else contextlib.nullcontext()):
                compiled(torch.zeros(1))
            seen["b compiled"] = len(graphs)
        finally:
            release.set()

    run_together(a, b)
    compiled(torch.zeros(1))
    seen["compiled by then"] = len(graphs)
    assert seen == {"b compiled": 1, "compiled by then": 1}, \
        f"dynamo skipped B's frame (0 graphs), and kept skipping it: {seen}"
