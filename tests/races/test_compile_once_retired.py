"""Compile once never serves a compile torch retired, and tells code objects
apart by identity (issue "Trust", items 1-3).

Stock torch passes each of these; the old mechanism (results kept per code
object, keyed by code equality) failed them: a function never compiled again
after reset_code_caches(), remove_from_cache() grew stand-ins on every call,
and a function with code equal to another's ran the other's compile.
"""
import threading

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import fxguard
from fxguard.machinery import compile_gate
from fxguard.machinery.settle import current_frames
from guarded import finish, fresh_function, needs_the_gil_for_compile_once, wait_until

pytestmark = needs_the_gil_for_compile_once


@pytest.fixture(params=["stock", "fxguard"])
def way(request):
    torch._dynamo.reset()
    if request.param == "fxguard":
        assert fxguard.install()["compile_once"] is not None
    yield request.param
    fxguard.uninstall()
    torch._dynamo.reset()


def _entries(fn) -> int:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    return len(_debug_get_cache_entry_list(fn.__code__))


@pytest.mark.skipif(not hasattr(torch._dynamo, "reset_code_caches"), reason="no reset_code_caches")
def test_reset_code_caches_makes_it_compile_again(way):
    counter = CompileCounter()
    f = fresh_function("def f(x):\n    return x.sin() + 1\n")
    compiled = torch.compile(f, backend=counter)
    compiled(torch.ones(3))
    torch._dynamo.reset_code_caches()
    compiled(torch.ones(3))
    assert counter.frame_count == 2


def test_remove_from_cache_then_calls_keep_one_entry(way):
    from torch._dynamo.eval_frame import remove_from_cache
    counter = CompileCounter()
    f = fresh_function("def f(x):\n    return x.cos() * 2\n")
    compiled = torch.compile(f, backend=counter)
    compiled(torch.ones(3))
    remove_from_cache(f)
    for _ in range(50):
        compiled(torch.ones(3))
    assert counter.frame_count == 2 and _entries(f) == 1


class _HeldBackend:
    """Holds the first compile until ``release()`` is true."""

    def __init__(self, release):
        self.release, self.compiles = release, 0
        self.entered = threading.Event()

    def __call__(self, gm, example_inputs):
        self.compiles += 1
        if self.compiles == 1:
            self.entered.set()
            wait_until(self.release, "the other thread to reach its compile")
        return gm.forward


def test_equal_code_with_other_globals_is_not_shared():
    """a and b: equal code objects (same source, same line, two files), other
    globals.  b misses while a's compile is held: it must compile its own, not
    run a's (tests/machinery/test_compile_gate.py shows a gate keyed by code
    equality making b wait for a)."""
    torch._dynamo.reset()
    fxguard.install()
    source = "def f(x):\n    return x + K\n"
    a, b = fresh_function(source, namespace={"K": 1}), fresh_function(source, namespace={"K": 2})
    assert a.__code__ == b.__code__ and a.__code__ is not b.__code__
    b_thread = {}

    def b_waits():
        ident = b_thread.get("ident")
        return ident is not None and (_in_gate(ident) or _at_compile_lock(ident))

    backend = _HeldBackend(b_waits)
    results = {}

    def run(name, fn):
        results[name] = torch.compile(fn, backend=backend)(torch.zeros(2)).tolist()

    ta = threading.Thread(target=run, args=("a", a), daemon=True)
    ta.start()
    assert backend.entered.wait(120)
    tb = threading.Thread(target=run, args=("b", b), daemon=True)
    tb.start()
    b_thread["ident"] = tb.ident
    finish(ta, tb, timeout=300)
    fxguard.uninstall()
    torch._dynamo.reset()
    assert results == {"a": [1.0, 1.0], "b": [2.0, 2.0]}


def _in_gate(ident) -> bool:
    frame = current_frames().get(ident)
    while frame is not None:
        if frame.f_code.co_filename == compile_gate.__file__:
            return True
        frame = frame.f_back
    return False


def _at_compile_lock(ident) -> bool:
    """The thread is past the gate, in torch's own callback (convert_frame.py
    near the top of its stack: where it waits for compile_lock)."""
    frame, depth = current_frames().get(ident), 0
    while frame is not None and depth < 3:
        if frame.f_code.co_filename.endswith("convert_frame.py"):
            return True
        frame, depth = frame.f_back, depth + 1
    return False


def test_a_compile_ended_by_ctrl_c_wakes_its_waiters():
    """The compiling thread's backend raises KeyboardInterrupt while another
    thread waits for that compile: the waiter compiles itself."""
    torch._dynamo.reset()
    state = fxguard.install()
    assert state["compile_once"] is not None
    gate = fxguard._install._installed.later.provided["compile_once"].gate
    f = fresh_function("def f(x):\n    return x * 3\n")
    calls = []

    def backend(gm, example_inputs):
        calls.append(threading.get_ident())
        if len(calls) == 1:
            wait_until(lambda: gate.waits >= 1, "the other thread to wait for this compile")
            raise KeyboardInterrupt
        return gm.forward

    compiled = torch.compile(f, backend=backend)
    outcome = {}

    def first():
        try:
            compiled(torch.ones(2))
        except KeyboardInterrupt:
            outcome["first"] = "interrupted"

    def second():
        outcome["second"] = compiled(torch.ones(2)).tolist()

    t1 = threading.Thread(target=first, daemon=True)
    t1.start()
    wait_until(lambda: calls, "the first compile to reach its backend")
    t2 = threading.Thread(target=second, daemon=True)
    t2.start()
    finish(t1, t2, timeout=300)
    assert outcome == {"first": "interrupted", "second": [3.0, 3.0]}
    assert gate.in_flight() == 0
    fxguard.uninstall()
    torch._dynamo.reset()


@pytest.mark.parametrize("mode, per_thread, compiles", [
    ("default", True, 1), ("reduce-overhead", True, 1), ("reduce-overhead", False, 2),
    ("cudagraphs-backend", True, 2)])
def test_cuda_graph_compiles_shared_only_with_a_callable_per_thread(mode, per_thread, compiles):
    """torch wraps a CUDA-graph compile after compiling it, in one attribute for
    every thread that runs it (pytorch#186192): such a compile is handed to
    another thread only where the row "CUDA-graph callable per thread" makes
    that attribute give each thread its own graphs; without it each compiles its
    own, as stock.  Dynamo's backend="cudagraphs" keeps its own callable per
    compile, which no row makes per thread: never shared.  (On CPU the graphs
    are skipped, but the compile is the same kind.)"""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    fxguard.install(cuda_graphs_per_thread=per_thread)
    b_thread, entered = {}, threading.Event()

    def hold():
        if not entered.is_set():
            entered.set()
            wait_until(lambda: b_thread.get("ident") is not None and (
                _in_gate(b_thread["ident"]) or _at_compile_lock(b_thread["ident"])),
                "the other thread to wait")

    from guarded import holding_op
    held = holding_op(f"fxguard_test::cuda_graph_{mode.replace('-', '_')}", hold)
    f = fresh_function("def f(x):\n    return held(x) + 1\n", namespace={"held": held})
    compiled = (torch.compile(f, backend="cudagraphs") if mode == "cudagraphs-backend" else
                torch.compile(f, mode=None if mode == "default" else mode))
    counters.clear()
    results = []
    ta = threading.Thread(target=lambda: results.append(compiled(torch.ones(2)).tolist()),
                          daemon=True)
    ta.start()
    assert entered.wait(300)
    tb = threading.Thread(target=lambda: results.append(compiled(torch.ones(2)).tolist()),
                          daemon=True)
    tb.start()
    b_thread["ident"] = tb.ident
    finish(ta, tb, timeout=600)
    fxguard.uninstall()
    assert results == [[2.0, 2.0], [2.0, 2.0]]
    assert counters["stats"]["unique_graphs"] == compiles
    torch._dynamo.reset()
