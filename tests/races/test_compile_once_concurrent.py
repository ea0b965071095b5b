"""compile_once and concurrent_compiles together (issue 23: same-graph waiters
keep compile once; distinct graphs still compile at once).

With both on, dynamo's callback is compile_once's wrapper (a wait per code
object, outside the lock) around the option's shared hold of compile_lock; the
option takes no lock per code object of its own then.

- One cold function, N threads released by a Barrier, the first compile held
  open in its backend until every thread is inside dynamo's callback: one
  compile, every thread runs it compiled, results equal eager.  Stock torch and
  concurrent_compiles without compile_once compile once per thread (strict
  xfail).
- N cold functions, one per thread: every compile is inside its backend at the
  same moment.  compile_once without concurrent_compiles: they wait for
  compile_lock one after another (strict xfail).
- test_compile_once.py's scenarios (guards that differ, recompile_limit, failed
  compiles; in compile_once_scenarios.py) with both options on (their guard-off
  runs are there).
"""
from __future__ import annotations

import threading

import pytest
import torch
import torch._dynamo.convert_frame as convert_frame
from guarded import ObservedLock, needs_the_gil_for_compile_once, run_together, wait_until
import compile_once_scenarios as scenarios
from compile_once_scenarios import N, Backend, assert_one_compile_served_all, run_held

import fxguard

pytestmark = needs_the_gil_for_compile_once

HOLD = 120.0  # only against a hang: nothing here depends on speed


def _install(way: str) -> None:
    assert way in ("both", "concurrent only", "compile_once only", "stock")
    torch._dynamo.reset()
    if way == "both":
        fxguard.install(concurrent_compiles=True)  # compile_once on by default
    elif way == "concurrent only":
        fxguard.install(concurrent_compiles=True, compile_once=False)
    elif way == "compile_once only":
        fxguard.install()


def _xfail(way: str, why: str):
    return pytest.param(way, marks=pytest.mark.xfail(strict=True, raises=AssertionError,
                                                     reason=why))


def _same(x):
    return x.sin() * 3 - 1, torch.compiler.is_compiling()


@pytest.mark.race
@pytest.mark.parametrize("way", [
    _xfail("stock", "stock torch compiles the graph once per thread that missed together"),
    _xfail("concurrent only", "without compile_once each waiter compiles its own copy"),
    "both"])
def test_same_graph_waiters_share_one_compile(way):
    _install(way)
    try:
        backend = Backend()
        cf = torch.compile(_same, backend=backend)
        x = torch.randn(8)
        assert_one_compile_served_all(
            backend, run_held(backend, [lambda: cf(x)] * N, _same.__code__), _same, x)
        counters = fxguard.status()["compile_once"]
        assert counters["compiles_avoided"] == N - 1, counters
        assert not convert_frame.compile_lock._is_owned()
        if way == "both":
            assert convert_frame.compile_lock.state()["holders"] == 0
    finally:
        fxguard.uninstall()
        torch._dynamo.reset()


# One function (one code object) per thread, at module level: torch 2.11 compiles
# functions exec'd from a string through one helper code object ("inner"), so
# compile_once (whose unit is the code object) queues them (README, limits).
def _distinct0(x):
    return x * 2 + 1, torch.compiler.is_compiling()


def _distinct1(x):
    return x * 3 + 1, torch.compiler.is_compiling()


def _distinct2(x):
    return x * 4 + 1, torch.compiler.is_compiling()


_DISTINCT = (_distinct0, _distinct1, _distinct2)
assert len(_DISTINCT) == N


@pytest.mark.race
@pytest.mark.parametrize("way", [
    _xfail("compile_once only", "compile_lock held across each whole compile"), "both"])
def test_distinct_graphs_still_compile_at_once(way, monkeypatch):
    _install(way)
    try:
        if way != "both":  # the stock lock, observed
            monkeypatch.setattr(convert_frame, "compile_lock",
                                ObservedLock(convert_frame.compile_lock))
        lock, seen, release = threading.Lock(), {"inside": 0, "most": 0}, threading.Event()
        barrier = threading.Barrier(N)
        functions = _DISTINCT

        def backend(gm, example_inputs):
            with lock:
                seen["inside"] += 1
                seen["most"] = max(seen["most"], seen["inside"])
            try:
                assert release.wait(HOLD), "the test never released the compiles"
            finally:
                with lock:
                    seen["inside"] -= 1
            return gm.forward

        results: dict = {}

        def worker(i):
            def run():
                barrier.wait()
                results[i] = torch.compile(functions[i], backend=backend)(torch.ones(2))
            return run

        def main():
            waiting = getattr(convert_frame.compile_lock, "waiting", set())
            # every compile inside its backend, or the rest waiting for compile_lock
            wait_until(lambda: seen["inside"] == N or (seen["inside"] and
                                                       len(waiting) == N - seen["inside"]),
                       "every compile inside its backend, or the others waiting for the lock")
            release.set()

        run_together(*(worker(i) for i in range(N)), main, timeout=2 * HOLD)
        for i, f in enumerate(functions):
            out, compiled = results[i]
            torch.testing.assert_close(out, f(torch.ones(2))[0])
            assert compiled is True, f"function {i} ran eager"
        assert fxguard.status()["compile_once"]["compiles_avoided"] == 0
        assert seen["most"] == N, f"at most {seen['most']} of {N} compiles at once"
    finally:
        fxguard.uninstall()
        torch._dynamo.reset()


_SCENARIOS = {
    **{f"guards differ: {name}": (lambda v=v: scenarios.guards_still_separate(v))
       for name, v in scenarios.VARIANTS.items()},
    "recompile_limit": scenarios.recompile_limit_not_eaten_by_copies,
    "failed compile": scenarios.failed_compile_each_waiter_compiles_and_sees_its_own_error,
    "after a failed compile": scenarios.after_a_failed_compile_the_next_one_is_shared,
}


@pytest.mark.parametrize("scenario", list(_SCENARIOS))
def test_compile_once_scenarios_with_concurrent_compiles(scenario):
    _install("both")
    try:
        _SCENARIOS[scenario]()
    finally:
        fxguard.uninstall()
        torch._dynamo.reset()
