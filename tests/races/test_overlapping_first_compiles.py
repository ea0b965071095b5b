"""One-time lazy set-up runs exactly once when first compiles overlap (concurrent_compiles).

Two first compiles reach torch's lazy set-up at once:

- inductor's pattern registration (``functools.cache``'d ``lazy_init``s made by
  ``init_once_fakemode``, ``_sfdp_init``, ``_pad_mm_init``, ...): both threads
  miss the cache and both register; post_grad's then raises ``Duplicate
  pattern`` (the others append duplicates silently);
- dynamo's ``populate_builtin_to_tensor_fn_map`` (2.9+): it returns early once
  the map has an entry, so a second thread reads a half-filled map
  (``KeyError: <built-in function and_>``).

Thread A is paused inside the set-up (a trace function of A's own thread stops
it at a chosen call); B runs its own first compile meanwhile; A is released
once B has finished (stock) or waits on the once-lock (with the option).
Three ways (guarded.concurrent_ways); compile_lock, which hides these races,
is made a no-op in the first two.
"""
import json
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
from guarded import (apply_way, child_env, concurrent_ways, finish, needs_the_gil, on_stack,
                     wait_until)

pytestmark = [pytest.mark.slow, needs_the_gil]

HOLD = 120.0

# A fresh process: patterns, once registered, stay registered.
CHILD = textwrap.dedent("""
    import json, sys, threading
    import torch
    import torch._dynamo.convert_frame as convert_frame
    from torch._inductor.fx_passes import post_grad
    from fxguard.machinery.once import OnceCall
    from guarded import NoLock, on_stack, wait_until

    way, HOLD = sys.argv[1], 120.0
    # A stops as post_grad's own set-up body starts (the one whose second run
    # raises "Duplicate pattern"): functools.cache -> init_once_fakemode's
    # lazy_init -> post_grad's def (not the function fxguard swaps)
    hold_at = post_grad.lazy_init.__wrapped__.__wrapped__.__code__
    if way != "stock":
        import fxguard
        fxguard.install(concurrent_compiles=(way == "on"))
    if way != "on":
        convert_frame.compile_lock = NoLock()

    held, release, seen = threading.Event(), threading.Event(), {}

    def stop_at_registration(frame, event, arg):
        if event == "call" and frame.f_code is hold_at:
            sys.settrace(None)
            held.set()
            assert release.wait(HOLD)
        return None

    def compile_in(name, fn, trace=None):
        def run():
            if trace:
                sys.settrace(trace)
            try:
                out = torch.compile(fn)(torch.ones(8))  # inductor: the post-grad passes
                seen[name] = bool(torch.allclose(out, fn(torch.ones(8))))
            except Exception as e:
                seen[name] = f"{type(e).__name__}: {str(e)[:160]}"
        return threading.Thread(target=run, name=name, daemon=True)

    a = compile_in("a", lambda x: (x * 2).relu(), stop_at_registration)
    b = compile_in("b", lambda x: x.sin() + 1)
    a.start()
    assert held.wait(HOLD), "A never reached pattern registration"
    b.start()
    wait_until(lambda: not b.is_alive() or on_stack(b, OnceCall.__call__.__code__),
               "B done or on the once-lock")
    release.set()
    a.join(HOLD); b.join(HOLD)
    assert not a.is_alive() and not b.is_alive(), "a thread did not finish"
    print(json.dumps(seen))
""")


@concurrent_ways()
def test_pattern_registration_runs_once_when_first_compiles_overlap(way):
    # No FX-graph/AOT cache hits: a hit skips the graph passes and their set-up.
    env = child_env(TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0")
    done = subprocess.run([sys.executable, "-c", CHILD, way], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert (seen["a"], seen["b"]) == (True, True), seen


def builtin_map_is_lazy() -> bool:
    from torch._dynamo.variables import builtin
    return hasattr(builtin, "populate_builtin_to_tensor_fn_map")


@pytest.fixture
def empty_builtin_map():
    """The map as in a fresh process (filled on first use), and whole again after."""
    from torch._dynamo.variables import builtin
    maps = (builtin.BUILTIN_TO_TENSOR_FN_MAP, builtin.BUILTIN_TO_TENSOR_RFN_MAP)
    for m in maps:
        m.clear()
    yield
    for m in maps:
        m.clear()
    builtin.populate_builtin_to_tensor_fn_map()


@pytest.mark.skipif(not builtin_map_is_lazy(), reason="torch <= 2.8 fills the map at import")
@concurrent_ways()
def test_builtin_map_is_whole_for_a_second_compile(way, monkeypatch, empty_builtin_map):
    from fxguard.machinery.once import OnceCall
    from torch._dynamo.variables import builtin
    from torch.overrides import TorchFunctionMode
    apply_way(way, monkeypatch, lock_hides=True)

    class Passthrough(TorchFunctionMode):  # dynamo then maps builtins to tensor methods
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    held, release, seen = threading.Event(), threading.Event(), {}

    def stop_once_the_map_has_an_entry(frame, event, arg):
        # the map's first entry is in; A stops before its second
        if event == "call" and frame.f_code.co_name == "__torch_function__" and \
                builtin.BUILTIN_TO_TENSOR_FN_MAP and not held.is_set():
            sys.settrace(None)
            held.set()
            assert release.wait(HOLD)
        return None

    ints = (torch.tensor([6], dtype=torch.int32), torch.tensor([3], dtype=torch.int32))

    def compile_in(name, fn, trace=None):
        def run():
            if trace:
                sys.settrace(trace)
            try:
                with Passthrough():
                    seen[name] = torch.compile(fn, backend="eager")(*ints).tolist()
            except Exception as e:  # noqa: BLE001 - the stock failure is a KeyError inside dynamo
                seen[name] = f"{type(e).__name__}: {str(e)[:160]}"
        return threading.Thread(target=run, name=name, daemon=True)

    a = compile_in("a", lambda x, y: x - y, stop_once_the_map_has_an_entry)
    b = compile_in("b", lambda x, y: (x & y) + (x | y))
    a.start()
    assert held.wait(HOLD), "A never filled the map"
    b.start()
    wait_until(lambda: not b.is_alive() or on_stack(b, OnceCall.__call__.__code__),
               "B done or on the once-lock")
    release.set()
    finish(a, b, timeout=HOLD)
    assert seen == {"a": [3], "b": [9]}, seen
