"""Races forced deterministically with Events (used by doctor and tests).

Each function runs one interleaving on the installed torch and reports whether
the bad outcome happened.  They work with fxguard installed or not; that is
the point: run them both ways and compare.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

TIMEOUT = 60.0  # seconds any one wait may take before the scenario gives up


@dataclass
class RaceResult:
    name: str
    raced: bool   # the bad outcome happened
    detail: str


def _wait(event: threading.Event, what: str, errors: list | None = None) -> None:
    """Wait for ``event``; re-raise at once what the other thread died of."""
    deadline = time.monotonic() + TIMEOUT
    while not event.wait(0.05):
        if errors:
            raise errors[0]
        if time.monotonic() > deadline:
            raise TimeoutError(f"race scenario stalled waiting for {what}")


def _run(target, name: str) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def body() -> None:
        try:
            target()
        except BaseException as e:  # reported by the caller
            errors.append(e)

    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    return thread, errors


def make_compiled():
    """A small compiled function, compiled and warmed on the calling thread."""
    import torch

    compiled = torch.compile(lambda x: x * 2 + 1, backend="eager")
    compiled(torch.ones(3))
    return compiled


def trace_vs_compiled_call(compiled=None) -> RaceResult:
    """(a) Thread 1 sits inside torch.fx.symbolic_trace; thread 2 calls a compiled function.

    Stock torch: thread 2 reads thread 1's flag and raises "Detected that you are
    using FX to symbolically trace a dynamo-optimized function".
    """
    import torch

    compiled = compiled or make_compiled()
    compiled(torch.ones(3))  # compiled already (a dynamo reset in between would recompile here)
    inside, release = threading.Event(), threading.Event()

    class Waits(torch.nn.Module):
        def forward(self, x):
            inside.set()
            _wait(release, "the compiled call")
            return x + 1

    tracer, errors = _run(lambda: torch.fx.symbolic_trace(Waits()), "fx-tracer")
    try:
        _wait(inside, "the tracer to enter its trace", errors)
        compiled(torch.ones(3))
        outcome = RaceResult("trace-vs-compiled-call", False, "compiled call ran")
    except RuntimeError as e:
        outcome = RaceResult("trace-vs-compiled-call", True, str(e).split("\n")[0])
    finally:
        release.set()
        tracer.join(TIMEOUT)
    if errors:
        raise errors[0]
    return outcome


def trace_vs_compilation_env() -> RaceResult:
    """(b) Tracer.trace and _set_compilation_env interleave their save/restore.

    A enters a trace (flag True); B enters _set_compilation_env (saves True,
    sets False); A's trace ends (restores False); B exits (restores True).
    Stock torch: the flag is left True for every thread, for good.
    """
    import torch
    from torch._higher_order_ops.utils import _set_compilation_env

    a_inside, b_inside, a_done = threading.Event(), threading.Event(), threading.Event()

    class Waits(torch.nn.Module):
        def forward(self, x):
            a_inside.set()
            _wait(b_inside, "B to enter _set_compilation_env")
            return x + 1

    def tracer() -> None:
        try:
            torch.fx.symbolic_trace(Waits())
        finally:
            a_done.set()

    def env_user() -> None:
        _wait(a_inside, "A to enter its trace")
        with _set_compilation_env():
            b_inside.set()
            _wait(a_done, "A to finish its trace")

    a, a_errors = _run(tracer, "fx-tracer")
    b, b_errors = _run(env_user, "compilation-env")
    a.join(TIMEOUT)
    b.join(TIMEOUT)
    if a_errors or b_errors:
        raise (a_errors + b_errors)[0]
    seen = [torch.fx._symbolic_trace.is_fx_tracing()]  # this thread, and a fresh one:
    fresh = threading.Thread(target=lambda: seen.append(torch.fx._symbolic_trace.is_fx_tracing()))
    fresh.start()
    fresh.join(TIMEOUT)
    stuck = any(seen)
    detail = ("flag left True after both threads finished" if stuck
              else "flag False after both threads finished")
    return RaceResult("trace-vs-compilation-env", stuck, detail)


def compile_vs_is_compiling() -> RaceResult:
    """(g) Thread 1 is held inside a dynamo compile; thread 2 asks is_compiling().

    Stock torch >= 2.13 sets one module flag for every compile: thread 2 reads
    True, and transformers then calls uncompiled flex_attention.
    """
    import torch

    inside, release, seen = threading.Event(), threading.Event(), []

    def held_backend(gm, example_inputs):
        inside.set()
        _wait(release, "the other thread's question")
        return gm.forward

    compiler, errors = _run(lambda: torch.compile(lambda x: x.tan() - 3, backend=held_backend)(
        torch.ones(2)), "compiler")
    try:
        _wait(inside, "the compile to start", errors)
        seen.append(torch.compiler.is_compiling())
    finally:
        release.set()
        compiler.join(TIMEOUT)
    if errors:
        raise errors[0]
    detail = "is_compiling() True in a thread that compiles nothing" if seen[0] \
        else "is_compiling() False outside the compiling thread"
    return RaceResult("compile-vs-is-compiling", seen[0], detail)


def reset_stock_leftovers() -> None:
    """Undo what a stock race left behind (only meaningful without fxguard).

    Overlapping stock traces can end with the flag stuck True, a dead
    ``CURRENT_PATCHER`` (then later races raise no AssertionError: they pass
    silently), nn.Module's methods still patched by a finished Tracer, and
    a dead export's mode on the pre-dispatch stack (one for the process): the
    calling thread then keeps the PreDispatch key and its next HOP call fails
    with "Current active mode ... not registered".
    """
    import torch
    import torch._ops as ops
    import torch.fx._symbolic_trace as st

    stack = vars(ops).get("_mode_stack_state_for_pre_dispatch")
    if stack is not None and stack.count() > 0:
        ops._mode_stack_state_for_pre_dispatch = type(stack)()
        torch._C._dispatch_tls_set_dispatch_key_included(torch._C.DispatchKey.PreDispatch, False)

    names = vars(st)
    if "_is_fx_tracing_flag" in names:
        names["_is_fx_tracing_flag"] = False
    if "CURRENT_PATCHER" in names:
        names["CURRENT_PATCHER"] = None
    for attr, original in (("__call__", names.get("_orig_module_call")),
                           ("__getattr__", names.get("_orig_module_getattr"))):
        current = vars(torch.nn.Module).get(attr)
        if current is not original and getattr(current, "__wrapped__", None) is original:
            setattr(torch.nn.Module, attr, original)  # a Tracer's functools.wraps wrapper

    _reset_overlapping_compile_leftovers()


def _reset_overlapping_compile_leftovers() -> None:
    """What overlapping stock compiles leave process-wide (the concurrent_compiles
    races): dispatch-mode flags and is_compiling() stuck True, a compile's global
    state, dynamo's saved mode stack and skip wrapper, inductor's lowering
    contexts.  Only modules already imported are looked at."""
    import sys
    for module, name, value in (
            ("torch.utils._python_dispatch", "_is_in_torch_dispatch_mode", False),
            ("torch.utils._python_dispatch", "_is_in_non_infra_torch_dispatch_mode", False),
            ("torch.utils._python_dispatch", "_is_in_any_mode_without_ignore_compile_internals",
             False),
            ("torch.compiler", "_is_compiling_flag", False),
            ("torch._dynamo.convert_frame", "initial_global_state", None)):
        names = vars(sys.modules[module]) if module in sys.modules else {}
        if name in names and (names[name] is None or isinstance(names[name], bool)
                              or type(names[name]).__name__ == "GlobalStateGuard"):
            names[name] = value  # a compile's GlobalStateGuard: two overlapping ones leave one
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    graph_module = sys.modules.get("torch.fx.graph_module")
    if convert_frame is not None and graph_module is not None and \
            "_forward_from_src" in vars(graph_module):
        graph_module._forward_from_src = convert_frame.original_forward_from_src
    torch_function = sys.modules.get("torch._dynamo.variables.torch_function")
    mgr = getattr(torch_function, "torch_function_mode_stack_state_mgr", None)
    if mgr is not None and isinstance(vars(mgr).get("stack"), list):
        mgr.__dict__["stack"] = []
    ir = sys.modules.get("torch._inductor.ir")
    bundler = sys.modules.get("torch._inductor.triton_bundler")
    for cls, name, value in (
            (getattr(ir, "IRNode", None), "_current_origins", "empty"),
            (getattr(ir, "IRNode", None), "_current_stream_idx", None),
            (getattr(ir, "IRNode", None), "_current_mempool", None),
            (getattr(ir, "ComputedBuffer", None), "_force_realize", False),
            (getattr(ir, "FlexibleLayout", None), "allow_indexing", False),
            (getattr(ir, "ConstantBuffer", None), "override_device", None),
            (getattr(bundler, "TritonBundler", None), "_entries", None),
            (getattr(bundler, "TritonBundler", None), "_static_autotuners", None),
            (getattr(bundler, "TritonBundler", None), "_winners", None)):
        current = vars(cls).get(name, ...) if cls is not None else ...
        if current is ... or hasattr(type(current), "__get__"):
            continue  # absent, or fxguard's descriptor
        setattr(cls, name, type(current)() if value == "empty" else value)
