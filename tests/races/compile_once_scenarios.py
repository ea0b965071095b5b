"""What test_compile_once.py and test_compile_once_concurrent.py share: a
backend that holds compiles open, threads released together into dynamo's
callback, and the scenarios both files run (the first under each mode, the
second with concurrent_compiles on too).  Not a test module: both import it."""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable

import torch

import fxguard
from fxguard.demos.duplicate_compile import CallbackWatch
from fxguard.torch_support import compile_once

N = 3
HANG = 300.0  # only against a hang: nothing here depends on speed


def _tensor_sig(t: torch.Tensor) -> tuple:
    return (t.dtype, t.requires_grad, t.device.type, tuple(t.shape),
            frozenset(getattr(t, "_dynamo_dynamic_indices", ())))


class Backend:
    """A dynamo backend that records each compile (thread, example inputs, grad
    mode), holds it at ``gate`` until the test opens it, may raise, and wraps the
    graph so that every call it serves is recorded with the caller's inputs."""

    def __init__(self, fail: Callable[[int], BaseException | None] | None = None) -> None:
        self.lock = threading.Lock()
        self.compiles: list[dict] = []
        self.calls: list[dict] = []
        self.held = 0
        self.gate = threading.Event()
        self.started = threading.Event()  # the first compile is in the backend
        self.fail = fail

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        dynamic = any(isinstance(e, torch.SymInt) for e in example_inputs)
        compile_ = {"thread": threading.current_thread().name, "dynamic": dynamic,
                    "grad": torch.is_grad_enabled(),
                    "inputs": [_tensor_sig(e) if isinstance(e, torch.Tensor) else "int"
                               for e in example_inputs]}
        with self.lock:
            index = len(self.compiles)
            self.compiles.append(compile_)
            self.held += 1
        self.started.set()
        try:
            assert self.gate.wait(HANG), "the test never opened the gate"
        finally:
            with self.lock:
                self.held -= 1
        error = self.fail(index) if self.fail else None
        if error is not None:
            raise error

        def run(*args: Any) -> Any:
            with self.lock:
                self.calls.append({"compile": index, "thread": threading.current_thread().name,
                                   "grad": torch.is_grad_enabled(),
                                   "inputs": [_tensor_sig(a) if isinstance(a, torch.Tensor)
                                              else "int" for a in args]})
            return gm.forward(*args)
        return run

    def assert_calls_match_their_compiles(self) -> None:
        """No call ran an entry whose guards fail for it: its inputs and grad
        mode are those its compile was made for (any size where it was dynamic)."""
        for call in self.calls:
            made = self.compiles[call["compile"]]
            where = f"{call['thread']} ran compile {call['compile']} (made by {made['thread']})"
            assert call["grad"] == made["grad"], f"{where}: grad mode differs"
            assert len(call["inputs"]) == len(made["inputs"]), f"{where}: other inputs"
            for got, want in zip(call["inputs"], made["inputs"]):
                assert (got == "int") == (want == "int"), f"{where}: other inputs"
                if got == "int":
                    continue
                assert got[:3] == want[:3], f"{where}: dtype/requires_grad/device {got} != {want}"
                if not made["dynamic"]:
                    assert got[3] == want[3] and not got[4], f"{where}: static entry, {got}"


def run_held(backend: Backend, targets: list[Callable[[], Any]], code: Any) -> dict[str, Any]:
    """Run each target in its own thread, released together by a Barrier; keep
    this round's compiles held until every thread is inside dynamo's callback or
    done.  Returns each thread's result or exception, by thread name."""
    backend.gate = threading.Event()
    barrier, watch = threading.Barrier(len(targets)), CallbackWatch(code)
    out: dict[str, Any] = {}

    def work(target: Callable[[], Any]) -> None:
        barrier.wait()
        try:
            watch.arm()
            out[threading.current_thread().name] = target()
        except Exception as e:  # noqa: BLE001 - handed to the test
            out[threading.current_thread().name] = e
        finally:
            watch.disarm()

    threads = [threading.Thread(target=work, args=(t,), name=f"t{i}", daemon=True)
               for i, t in enumerate(targets)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + HANG
    while True:
        waiting = [t for t in threads if t.is_alive()]
        if all(watch.inside(t) for t in waiting) and (not waiting or backend.held):
            break
        assert time.monotonic() < deadline, \
            f"threads never reached dynamo's callback, or none is in the backend:\n{_stacks(waiting)}"
        time.sleep(0.005)
    backend.gate.set()
    for t in threads:
        t.join(HANG)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    return out


def _stacks(threads: list[threading.Thread]) -> str:
    """Where each thread is (a hang guard's message: a deadlock reads the same)."""
    import sys
    import traceback
    frames = sys._current_frames()
    return "\n".join(f"{t.name}:\n"
                     + "".join(traceback.format_stack(frames[t.ident])[-12:])
                     for t in threads if t.ident in frames)


def real_entries(fn: Callable) -> int:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    return sum(not compile_once.is_stand_in(e) for e in _debug_get_cache_entry_list(fn.__code__))


def assert_one_compile_served_all(backend: Backend, results: dict[str, Any], f: Callable,
                                  x: torch.Tensor) -> None:
    """Every thread ran compiled code (never eager), equal to eager, all of it
    from one compile, which is f's one real cache entry."""
    assert len(results) == N, results
    for name, got in results.items():
        assert not isinstance(got, BaseException), f"{name}: {got!r}"
        out, compiled = got
        torch.testing.assert_close(out, f(x)[0])
        assert compiled is True, f"{name} ran eager"
    assert len(backend.calls) == N, "every thread runs compiled code"
    backend.assert_calls_match_their_compiles()
    assert (len(backend.compiles), real_entries(f)) == (1, 1), \
        f"{len(backend.compiles)} compiles, {real_entries(f)} cache entries"


# One function per scenario, defined at module level (torch 2.5 wraps an exec'd
# function in a helper and caches that instead); the caller's dynamo reset makes it cold.
def _f_guards(x):
    return x.sin() * 2 + 1


def _f_limit(x):
    return x.cos() + 1, torch.compiler.is_compiling()


def _f_fail(x):
    return x.tan() - 1


def _f_fail_once(x):
    return x.exp() * 3


def variant_dtype(x):
    return x.double(), contextlib.nullcontext()


def variant_requires_grad(x):
    return x.clone().requires_grad_(), contextlib.nullcontext()


def variant_grad_mode(x):
    return x, torch.no_grad()


def variant_dynamic_mark(x):
    y = x.clone()
    torch._dynamo.mark_dynamic(y, 0)
    return y, contextlib.nullcontext()


VARIANTS = {"dtype": variant_dtype, "requires_grad": variant_requires_grad,
            "grad_mode": variant_grad_mode, "dynamic_mark": variant_dynamic_mark,
            "backend": "backend"}


def recompile_limit() -> int:
    config = torch._dynamo.config
    return getattr(config, "recompile_limit", None) or config.cache_size_limit


def guards_still_separate(variant) -> None:
    """t1 calls with inputs whose guards fail for t0's compile: it compiles its
    own entry; t2 calls like t0 and shares t0's compile.  t1 and t2 call once
    t0's compile is in the backend (t1's own compile first, dynamic, would pass
    for t0 and t2 as well)."""
    f = _f_guards
    backend = Backend()
    cf = torch.compile(f, backend=backend, dynamic=False)
    x = torch.randn(8)
    if variant == "backend":
        other = Backend()
        other.gate.set()
        other_cf = torch.compile(f, backend=other, dynamic=False)
        t1 = lambda: other_cf(x)  # noqa: E731
    else:
        y, ctx = variant(x)

        def t1():
            with ctx:
                return cf(y)
    def after_t0(call):
        def run():
            assert backend.started.wait(HANG), "t0's compile never started"
            return call()
        return run
    results = run_held(backend, [lambda: cf(x), after_t0(t1), after_t0(lambda: cf(x))], f.__code__)
    for name, out in results.items():
        assert not isinstance(out, BaseException), f"{name}: {out!r}"
    backend.assert_calls_match_their_compiles()
    if variant == "backend":
        assert {c["thread"] for c in backend.calls} == {"t0", "t2"}, "t1 ran another backend's code"
        assert [c["thread"] for c in other.calls] == ["t1"] and len(other.compiles) == 1
        compiles = len(backend.compiles) + len(other.compiles)
    else:
        torch.testing.assert_close(results["t1"], f(y))
        compiles = len(backend.compiles)
    torch.testing.assert_close(results["t0"], f(x))
    torch.testing.assert_close(results["t2"], f(x))
    assert (compiles, real_entries(f)) == (2, 2), f"{compiles} compiles, {real_entries(f)} entries"


def recompile_limit_not_eaten_by_copies() -> None:
    """N threads x as many shapes as one thread may compile: every call runs
    compiled code, one compile per shape."""
    f = _f_limit
    backend = Backend()
    cf = torch.compile(f, backend=backend, dynamic=False)
    limit = recompile_limit()
    eager = []
    for n in range(1, limit + 1):
        x = torch.randn(n)
        for name, (out, compiled) in run_held(backend, [lambda: cf(x)] * N, f.__code__).items():
            torch.testing.assert_close(out, f(x)[0])
            if not compiled:
                eager.append((n, name))
    backend.assert_calls_match_their_compiles()
    assert not eager, f"recompile_limit {limit} hit: (size, thread) ran eager: {eager}"
    assert len(backend.compiles) == limit


def failed_compile_each_waiter_compiles_and_sees_its_own_error() -> None:
    f = _f_fail

    def fail(index: int) -> BaseException:
        return RuntimeError(f"compile {index} failed in {threading.current_thread().name}")
    backend = Backend(fail=fail)
    cf = torch.compile(f, backend=backend)
    x = torch.randn(4)
    results = run_held(backend, [lambda: cf(x)] * N, f.__code__)
    for name, out in results.items():
        assert isinstance(out, Exception), f"{name} got {out!r}"
        assert f"failed in {name}" in str(out), f"{name} saw another thread's error: {out}"
    assert len(backend.compiles) == N and not backend.calls
    counters = fxguard.status()["compile_once"]  # None: stock, or the option off
    assert counters is None or counters["compiles_avoided"] == 0


def after_a_failed_compile_the_next_one_is_shared() -> None:
    f = _f_fail_once
    backend = Backend(fail=lambda i: RuntimeError("the first compile fails") if i == 0 else None)
    cf = torch.compile(f, backend=backend)
    x = torch.randn(4)
    results = run_held(backend, [lambda: cf(x)] * N, f.__code__)
    first = backend.compiles[0]["thread"]
    assert "the first compile fails" in str(results.pop(first))
    for name, out in results.items():
        assert not isinstance(out, BaseException), f"{name}: {out!r}"
        torch.testing.assert_close(out, f(x))
    backend.assert_calls_match_their_compiles()
    assert len(backend.compiles) == 2, f"{len(backend.compiles)} compiles (1 failed)"
