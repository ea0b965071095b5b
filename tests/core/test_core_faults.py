"""Faults in the C core, torch-free: asynchronous KeyboardInterrupt inside fx_tracing(),
fork() while another thread traces, a thread that exits inside fx_tracing(), bad
arguments to every public C function, and a short run of the core stress.

(The lock's own faults, KeyboardInterrupt while blocked in acquire() and fork()
while another thread holds it, are in test_rlock.py; the same faults inside a real
torch trace in torch_support/test_torch_faults.py.)
"""
import math
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from guarded import finish
from injected_faults import async_raise, exit_code_of_child, needs_fork

import fxguard
from fxguard import _core


def inside_fx_tracing_until(release):
    """A thread inside fx_tracing() until `release` is set; returns (thread, inside)."""
    inside = threading.Event()

    def run():
        with fxguard.fx_tracing():
            inside.set()
            assert release.wait(10)

    t = threading.Thread(target=run)
    t.start()
    assert inside.wait(5)
    return t


# -- asynchronous KeyboardInterrupt -----------------------------------------------------


@pytest.mark.parametrize("holding_the_lock", [False, True])
def test_async_keyboard_interrupt_inside_fx_tracing_restores_the_flag(holding_the_lock):
    lock, inside, outcome = fxguard.RLock(), threading.Event(), []

    def tracer():
        try:
            with fxguard.fx_tracing():
                with lock if holding_the_lock else fxguard.fx_tracing(True):
                    inside.set()
                    while True:
                        time.sleep(0.001)
        except KeyboardInterrupt:
            outcome.append((fxguard.is_fx_tracing(), lock._is_owned()))

    t = threading.Thread(target=tracer)
    t.start()
    assert inside.wait(5)
    assert _core._tracing_records() == 1
    async_raise(t, KeyboardInterrupt)
    finish(t)
    assert outcome == [(False, False)]
    assert _core._tracing_records() == 0 and not fxguard.is_fx_tracing()
    s = lock.stats()
    assert not lock.locked() and s["waiters"] == 0 and s["depth"] == 0
    assert s["acquisitions"] == (1 if holding_the_lock else 0)
    assert lock.acquire(timeout=1)
    lock.release()


# -- fork -----------------------------------------------------------------------------


@needs_fork
@pytest.mark.parametrize("forker_tracing", [False, True])
def test_fork_while_another_thread_is_inside_fx_tracing(forker_tracing):
    """The child has only the forking thread: its flag as it was, nobody else counted."""
    release = threading.Event()
    t = inside_fx_tracing_until(release)
    try:
        with fxguard.fx_tracing(forker_tracing):
            assert _core._tracing_records() == 1 + forker_tracing

            def child():
                seen = [fxguard.is_fx_tracing(), _core._tracing_records()]
                other = threading.Thread(target=lambda: seen.append(fxguard.is_fx_tracing()))
                other.start()
                other.join()
                return seen == [forker_tracing, int(forker_tracing), False]
            assert exit_code_of_child(child) == 0
        assert _core._tracing_records() == 1  # the parent is untouched
    finally:
        release.set()
        finish(t)
    assert _core._tracing_records() == 0


@needs_fork
def test_fork_child_unwinds_the_forking_threads_trace():
    release = threading.Event()
    t = inside_fx_tracing_until(release)
    try:
        with fxguard.fx_tracing():
            def child():
                with fxguard.fx_tracing(False):
                    ok = _core._tracing_records() == 0
                return ok and _core._tracing_records() == 1
            code = exit_code_of_child(child)
        assert code == 0
    finally:
        release.set()
        finish(t)


# -- a thread that exits inside fx_tracing() -------------------------------------------


def test_a_thread_that_exits_inside_fx_tracing_stops_counting_with_its_record():
    """Only an __enter__() without __exit__() can do this (a with-block always exits).
    The flag was that thread's alone; it counts until the thread's record is freed:
    at thread exit, once the core's one-entry cache has moved to another thread."""
    def enter_and_leave():
        fxguard.fx_tracing().__enter__()
        assert fxguard.is_fx_tracing()

    t = threading.Thread(target=enter_and_leave)
    t.start()
    finish(t)
    assert not fxguard.is_fx_tracing()  # any lookup moves the cache on
    assert _core._tracing_records() == 0


def test_an_entered_fx_tracing_object_that_outlives_its_thread_still_exits_cleanly():
    scopes = []
    t = threading.Thread(target=lambda: scopes.append(fxguard.fx_tracing()) or scopes[0].__enter__())
    t.start()
    finish(t)
    assert _core._tracing_records() == 1  # the scope is still open, on a dead thread's record
    assert scopes[0].__exit__(None, None, None) is False
    assert _core._tracing_records() == 0 and not fxguard.is_fx_tracing()


# -- bad arguments: a clear TypeError/ValueError, nothing changed ----------------------


NO_ARGUMENT_FUNCTIONS = ["is_fx_tracing", "is_fx_symbolic_tracing", "_tracing_records",
                         "_thread_values", "_stash_steals", "_mode", "_carried_context",
                         "_publish_record", "_current_frames"]


@pytest.mark.parametrize("name", NO_ARGUMENT_FUNCTIONS)
def test_functions_without_arguments_reject_arguments(name):
    with pytest.raises(TypeError, match="takes no arguments"):
        getattr(_core, name)(1)


@pytest.mark.parametrize("name, args, error", [
    ("_await_thread_exits", ("soon",), TypeError),
    ("_function_version", (1,), TypeError),
    ("_restore_function_version", (1, 2), TypeError),
    ("Reader", ("x",), TypeError),
    ("Reader", (99,), ValueError),
    ("Dispatch", (), TypeError),
    ("_stat_paths", ("/",), TypeError),
    ("_stat_paths", (1, "a"), TypeError),
    ("_stat_paths", ("/", 1), TypeError),
])
def test_bad_arguments_to_the_other_functions(name, args, error):
    with pytest.raises(error):
        getattr(_core, name)(*args)


def test_every_public_function_is_checked():
    callables = {n for n in dir(_core) if callable(getattr(_core, n)) and not n.startswith("__")}
    assert callables == set(NO_ARGUMENT_FUNCTIONS) | {
        "_configure", "_extend_layout", "fx_tracing", "SlotView", "RLock", "_await_thread_exits",
        "_function_version", "_restore_function_version", "Reader", "Dispatch", "_stat_paths"}


def test_stat_paths_reads_sizes_and_times_and_marks_what_is_missing(tmp_path):
    import struct
    (tmp_path / "a").write_bytes(b"xyz")
    values = struct.unpack("4q", _core._stat_paths(str(tmp_path), "a\0missing"))
    assert values[0] == 3 and values[1] == (tmp_path / "a").stat().st_mtime_ns
    assert values[2:] == (-1, -1)
    assert _core._stat_paths(str(tmp_path), "") == b""
    assert struct.unpack("2q", _core._stat_paths(str(tmp_path / "none"), "a")) == (-1, -1)


@pytest.mark.parametrize("args, kwargs, error", [
    ((1, 2), {}, TypeError),
    ((), {"active": 1, "extra": 2}, TypeError),
    ((), {"activ": True}, TypeError),
    ((type("Bad", (), {"__index__": lambda self: 1 / 0})(),), {}, ZeroDivisionError),
    ((type("Truthy", (), {"__bool__": lambda self: True})(),), {}, TypeError),  # not an int
])
def test_fx_tracing_rejects_bad_arguments(args, kwargs, error):
    with pytest.raises(error):
        fxguard.fx_tracing(*args, **kwargs)
    assert not fxguard.is_fx_tracing() and _core._tracing_records() == 0


@pytest.mark.parametrize("names, error", [
    ((), TypeError),
    (([("a", 0)],), TypeError),
    (({1: 0},), TypeError),
    (({"a": "0"},), TypeError),
    (({"a": 0.0},), TypeError),
    (({"a": -2},), TypeError),
    (({"a": 10 ** 30},), OverflowError),
])
def test_slot_view_rejects_bad_names(names, error):
    with pytest.raises(error):
        _core.SlotView(*names)


@pytest.fixture
def configured():
    """Two slots, this thread's first set to 'mine'; MODE_OFF again afterwards."""
    _core._configure(_core.MODE_PATCHED, defaults=(0, None), factories=(None, dict))
    view = _core.SlotView({"count": 0, "meta": 1, "flag": _core.FLAG_SLOT})
    view.count = "mine"
    yield view
    _core._configure(_core.MODE_OFF)


def test_slot_view_rejects_bad_attribute_use_and_keeps_the_value(configured):
    view = configured
    with pytest.raises(AttributeError):
        view.nothing = 1
    with pytest.raises(AttributeError):
        del view.count
    with pytest.raises(ZeroDivisionError):
        view.flag = type("Bad", (), {"__bool__": lambda self: 1 / 0})()
    with pytest.raises(RuntimeError, match="earlier install"):
        _core.SlotView({"beyond": 5}).beyond
    assert view.count == "mine" and view.flag is False and view.meta == {}


def callable_probe():
    return None


@pytest.mark.parametrize("args, kwargs, error", [
    ((), {}, TypeError),
    (("1",), {}, TypeError),
    ((7,), {}, ValueError),
    ((-1,), {}, ValueError),
    ((1,), {"defaults": [0]}, TypeError),
    ((1,), {"defaults": (0,), "factories": ()}, ValueError),
    ((1,), {"defaults": (0,), "factories": (5,)}, TypeError),
    ((1,), {"is_compiling": 5}, TypeError),
    ((1,), {"unknown": callable_probe}, TypeError),
    ((2,), {"upstream_get": callable_probe}, ValueError),
    ((1, 2), {}, TypeError),
])
def test_configure_rejects_bad_arguments_and_changes_nothing(configured, args, kwargs, error):
    with pytest.raises(error):
        _core._configure(*args, **kwargs)
    assert _core._mode() == _core.MODE_PATCHED
    assert _core._thread_values() == ["mine", {}]  # same layout: no new epoch


@pytest.mark.parametrize("args, error", [
    ((), TypeError),
    (([0], [None]), TypeError),
    (((0,), ()), ValueError),
    (((0,), (5,)), TypeError),
])
def test_extend_layout_rejects_bad_arguments_and_changes_nothing(configured, args, error):
    with pytest.raises(error):
        _core._extend_layout(*args)
    assert _core._thread_values() == ["mine", {}]


def test_extend_layout_needs_a_configured_core():
    with pytest.raises(RuntimeError, match="not configured"):
        _core._extend_layout((1,), (None,))


def test_extended_layout_keeps_every_threads_values(configured):
    """A row applied after install() adds slots: values set before stay, in this
    thread and in another, and a new thread starts from every default."""
    other, extended = threading.Event(), threading.Event()
    seen = {}

    def worker():
        configured.count = "theirs"
        other.set()
        extended.wait()
        seen["worker"] = _core._thread_values()

    thread = threading.Thread(target=worker)
    thread.start()
    other.wait()
    _core._extend_layout(("late", None), (None, list))
    extended.set()
    thread.join()
    assert _core._thread_values() == ["mine", {}, "late", []]
    assert seen["worker"] == ["theirs", {}, "late", []]
    assert _core.SlotView({"late": 2}).late == "late"
    fresh = []
    thread = threading.Thread(target=lambda: fresh.append(_core._thread_values()))
    thread.start()
    thread.join()
    assert fresh == [[0, {}, "late", []]]
    _core._configure(_core.MODE_PATCHED, defaults=(0,), factories=(None,))  # a new install
    assert _core._thread_values() == [0]


@pytest.mark.parametrize("state, error", [
    (None, TypeError), ((1,), TypeError), ((1, 2, 3), TypeError), (("1", 2), TypeError),
    ((0, 1), ValueError), ((1, 0), ValueError), ((-1, 1), OverflowError),
])
def test_acquire_restore_rejects_bad_state(state, error):
    lock = fxguard.RLock()
    with pytest.raises(error):
        lock._acquire_restore(state)
    assert not lock.locked() and lock.stats()["acquisitions"] == 0


@pytest.mark.parametrize("timeout", [math.nan, -2, -0.5, math.inf, 1e300, "1", None])
def test_acquire_rejects_bad_timeouts_and_stays_free(timeout):
    lock = fxguard.RLock()
    with pytest.raises((TypeError, ValueError, OverflowError)):
        lock.acquire(True, timeout)
    assert not lock.locked() and lock.stats()["acquisitions"] == 0


def test_fx_tracing_enter_rejects_arguments():
    with pytest.raises(TypeError):
        fxguard.fx_tracing().__enter__(1)
    assert not fxguard.is_fx_tracing()


def test_rlock_methods_without_arguments_reject_arguments():
    lock = fxguard.RLock()
    for name in ("release", "locked", "_is_owned", "_release_save", "_recursion_count",
                 "stats", "reset_stats", "_at_fork_reinit", "__enter__"):
        with pytest.raises(TypeError):
            getattr(lock, name)(1)
    assert not lock.locked()


# -- the stress the sanitizer job runs, briefly ----------------------------------------


def test_core_stress_briefly():
    stress = Path(__file__).with_name("stress.py")
    proc = subprocess.run([sys.executable, str(stress), "1", "4"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
