"""Ids and statistics stay exact when compiles overlap (concurrent_compiles).

- Ids allocated by ``x = NEXT; NEXT += 1`` in small functions: dynamo's frame
  ids (``get_compile_id``), meta-tensor describer ids (which key memo tables),
  the linecache keys of generated GraphModule code.  Thread A is paused on the
  line that increments (a trace function of A's own thread: where a thread
  switch lands under a tracer, or anywhere without the GIL); B allocates
  meanwhile.  Stock: both got the same id.  The option runs each function
  under one lock: B waits for A.
- ``torch._dynamo.utils.counters[group][key] += 1``: a new group runs
  ``Counter.__init__`` (Python code: a thread switch can land there) inside the
  defaultdict's insert.  A paused there, B counts into the same new group, A
  goes on and puts its own empty group in: B's count is lost.  With the option
  every step of the statement is C (no switch, no lock).

Three ways each (guarded.concurrent_ways); no compile runs, so compile_lock
hides nothing.
"""
import inspect
import sys
import threading

import pytest
import torch
from guarded import apply_way, concurrent_ways, finish, held_in, needs_the_gil, wait_until

import fxguard

pytestmark = needs_the_gil

HOLD = 60.0


def compile_ids():
    from torch._dynamo import convert_frame
    return convert_frame.get_compile_id, (lambda: convert_frame.get_compile_id({}).frame_id), \
        "FRAME_COUNTER += 1"


def describer_ids():
    from torch._subclasses import meta_utils
    return meta_utils.MetaTensorDescriber.__init__, \
        (lambda: meta_utils.MetaTensorDescriber().id), "DESCRIBER_NEXT_ID = "


def graph_module_keys():
    from torch.fx import graph_module
    return graph_module._EvalCacheLoader._get_key, (lambda: graph_module._loader._get_key()), \
        "self.next_id += 1"


def line_of(fn, text: str) -> int:
    """The line of fn's original source that holds ``text``."""
    original = fxguard.get_original(fn, "__code__")
    lines, first = inspect.getsourcelines(fn)
    assert original.co_firstlineno == first
    return next(first + i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize("case", [compile_ids, describer_ids, graph_module_keys],
                         ids=["frame ids", "describer ids", "graph module keys"])
@concurrent_ways()
@pytest.mark.slow
def test_two_threads_never_get_one_id(case, way, monkeypatch):
    fn, allocate, text = case()
    apply_way(way, monkeypatch, lock_hides=False)
    code = fxguard.get_original(fn, "__code__")
    line = line_of(fn, text)
    paused, release, got = threading.Event(), threading.Event(), {}

    def pause_before_the_increment(frame, event, arg):
        if event == "call":
            return pause_before_the_increment if frame.f_code.co_name == code.co_name and \
                frame.f_code.co_filename == code.co_filename else None
        if event == "line" and frame.f_lineno == line and not paused.is_set():
            paused.set()
            assert release.wait(HOLD)
        return pause_before_the_increment

    def a():
        sys.settrace(pause_before_the_increment)
        try:
            got["a"] = allocate()
        finally:
            sys.settrace(None)
            paused.set()

    def b():
        got["b"] = allocate()

    ta = threading.Thread(target=a, daemon=True)
    ta.start()
    assert paused.wait(HOLD)
    tb = threading.Thread(target=b, daemon=True)
    tb.start()
    # B done (stock), or waiting in the function's swapped code for A's lock
    wait_until(lambda: not tb.is_alive() or (
        fxguard.is_object_patched(fn, "__code__") and held_in(tb, fn.__code__)),
        "B done or waiting for the lock")
    release.set()
    finish(ta, tb, timeout=HOLD)
    assert got["a"] != got["b"], got


@concurrent_ways()
def test_counts_made_at_once_into_a_new_group_all_count(way, monkeypatch):
    from torch._dynamo.utils import counters
    apply_way(way, monkeypatch, lock_hides=False)
    group = f"fxguard-test-{way}"
    paused, release, done = threading.Event(), threading.Event(), threading.Event()

    def pause_in_a_python_step(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.endswith(("collections/__init__.py",)) \
                and not paused.is_set():
            paused.set()
            assert release.wait(HOLD)
        return None

    def a():
        sys.settrace(pause_in_a_python_step)
        try:
            counters[group]["compiles"] += 1
        finally:
            sys.settrace(None)
            done.set()

    def b():
        counters[group]["compiles"] += 1

    ta = threading.Thread(target=a, daemon=True)
    ta.start()
    wait_until(lambda: paused.is_set() or done.is_set(), "A paused in Python code, or done")
    tb = threading.Thread(target=b, daemon=True)
    tb.start()
    try:
        finish(tb, timeout=HOLD)  # B never waits for A: no lock, its count is C
    finally:
        release.set()
    finish(ta, timeout=HOLD)
    try:
        assert counters[group]["compiles"] == 2, dict(counters[group])
    finally:
        del counters[group]
