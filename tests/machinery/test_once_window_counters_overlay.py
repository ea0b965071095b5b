"""machinery.once, shared_window, exact_counters, overlay and per_thread_attrs,
torch-free, on modules of our own (conftest.source_module)."""
import collections
import threading

import pytest
from guarded import apply, finish, on_stack, wait_until

from fxguard import interpreter
from fxguard.machinery import exact_counters, once, overlay, per_thread_attrs, shared_window
from fxguard.machinery.changes import Outcome

# Each test also runs without the change: it must fail there (what the machinery fixes).
way = pytest.mark.parametrize("way", ["patched", pytest.param(
    "stock", marks=pytest.mark.xfail(strict=True, reason="without the change the race shows"))])


def apply_if(way, changes):
    if way == "patched":
        apply(changes)


@way
def test_once_runs_a_cached_setup_once_for_threads_that_arrive_together(source_module, way):
    mod = source_module("""
        import functools, threading
        started, release, runs = threading.Event(), threading.Event(), []

        @functools.cache
        def setup():
            runs.append(1)
            started.set()
            assert release.wait(30)
            return len(runs)
    """)
    changes, outcomes = once.plan("once-lock", (once.Once(f"{mod.__name__}.setup"),),
                                  lambda fn: fn.__code__)
    assert [o for _, o, _ in outcomes] == [Outcome.PATCHED]
    apply_if(way, changes)
    results = []
    first = threading.Thread(target=lambda: results.append(mod.setup()))
    first.start()
    assert mod.started.wait(30)
    second = threading.Thread(target=lambda: results.append(mod.setup()))
    second.start()   # misses the cache too: waits at the once-lock (stock: runs the body)
    try:
        wait_until(lambda: on_stack(second, mod.setup.__wrapped__.__code__),
                   "the second caller inside")
    finally:
        mod.release.set()
        finish(first, second, timeout=30)
    assert mod.runs == [1] and results == [1, 1]


def test_once_reports_a_function_of_another_shape_not_available(source_module):
    mod = source_module("def plain():\n    return 1\n")
    _, outcomes = once.plan("once-lock", (once.Once(f"{mod.__name__}.plain"),), lambda fn: fn.__code__)
    assert outcomes[0][1] is Outcome.NOT_AVAILABLE


@way
def test_shared_window_enters_the_real_window_once_for_overlapping_users(source_module, way):
    win = source_module("""
        import contextlib
        state = {"on": False, "enters": 0}

        @contextlib.contextmanager
        def switch_on():
            old = state["on"]
            state["on"] = True
            state["enters"] += 1
            try:
                yield
            finally:
                state["on"] = old
    """)
    mod = source_module(f"""
        import {win.__name__}

        def user(inside, leave):
            with {win.__name__}.switch_on():
                inside.set()
                assert leave.wait(30)
    """)
    mod.state = win.state
    row = shared_window.SharedWindow(f"{win.__name__}.switch_on", (f"{mod.__name__}.user",))
    changes, outcome, detail = shared_window.plan("shared window", row, lambda fn: fn.__code__)
    assert outcome is Outcome.PATCHED, detail
    apply_if(way, changes)
    ins, leave_a, leave_b = [threading.Event(), threading.Event()], threading.Event(), threading.Event()
    a = threading.Thread(target=mod.user, args=(ins[0], leave_a))
    b = threading.Thread(target=mod.user, args=(ins[1], leave_b))
    a.start()
    b.start()
    try:  # the threads are let go whatever fails here: none outlives the test
        assert ins[0].wait(30) and ins[1].wait(30)
        leave_a.set()      # a leaves first: b still inside, the setting stays on
        finish(a, timeout=30)
        assert mod.state["on"] is True
    finally:
        leave_a.set()
        leave_b.set()
        finish(a, b, timeout=30)
    assert mod.state == {"on": False, "enters": 1}   # stock: b's exit would leave it on


@pytest.mark.skipif(not interpreter.gil_enabled(),
                    reason="exact under the GIL: each step is one C call (machinery.exact_counters)")
def test_exact_counters_count_every_step(source_module):
    mod = source_module("import collections\ncounters = collections.defaultdict(collections.Counter)\n"
                        "counters['g']['k'] += 1\n")
    changes, outcome, _ = exact_counters.plan("exact counters", f"{mod.__name__}.counters")
    assert outcome is Outcome.PATCHED
    apply(changes)
    assert type(mod.counters["g"]) is exact_counters.ExactCounter  # existing groups too
    assert type(mod.counters["new"]) is exact_counters.ExactCounter

    def bump():
        for _ in range(20000):
            mod.counters["g"]["k"] += 1

    threads = [threading.Thread(target=bump) for _ in range(4)]
    [t.start() for t in threads]
    finish(*threads)
    assert mod.counters["g"]["k"] == 80001
    assert exact_counters.plan("x", f"{mod.__name__}.missing")[1] is Outcome.NOT_AVAILABLE


@way
def test_overlay_window_writes_stay_in_their_thread(source_module, way):
    mod = source_module("class Entry:\n    def __init__(self):\n        self.value = 'shared'\n")
    entry = mod.Entry()
    if way == "patched":
        entry.__class__ = overlay.overlaid(entry, "value")
    try:
        seen, inside, leave = [], threading.Event(), threading.Event()

        def writer():
            with overlay.window():
                entry.value = "mine"
                with overlay.window():
                    seen.append(entry.value)       # nested: sees the outer window's write
                    entry.value = "inner"
                seen.append(entry.value)           # the inner window took its write back
                inside.set()
                assert leave.wait(30)
            seen.append(entry.value)

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            assert inside.wait(30)
            assert entry.value == "shared"         # another thread reads the shared value
        finally:
            leave.set()
            finish(thread, timeout=30)
        assert seen == ["mine", "mine", "shared"]
    finally:
        entry.__class__ = mod.Entry
    assert vars(entry) == {"value": "shared"}


@way
def test_per_thread_class_attribute_is_each_threads_own(source_module, way):
    mod = source_module("""
        class Node:
            current = None

            @classmethod
            def set_current(cls, value):
                Node.current = value
    """)
    row = per_thread_attrs.ClassAttr(f"{mod.__name__}.Node.current",
                                     (f"{mod.__name__}.Node.set_current",))
    changes, outcomes = per_thread_attrs.plan_class_attrs("per-thread class attribute", (row,),
                                                          lambda fn: fn.__code__)
    assert [o for _, o, _ in outcomes] == [Outcome.PATCHED]
    apply_if(way, changes)
    set_, go, seen = threading.Event(), threading.Event(), {}

    def other():
        mod.Node.set_current("theirs")
        set_.set()
        assert go.wait(30)
        seen["other"] = mod.Node.current

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert set_.wait(30)
        assert mod.Node.current is None        # not the other thread's
        mod.Node.set_current("mine")
    finally:
        go.set()
        finish(thread, timeout=30)
    assert (mod.Node.current, seen["other"]) == ("mine", "theirs")


def test_exact_counter_is_a_counter():
    assert issubclass(exact_counters.ExactCounter, collections.Counter)
