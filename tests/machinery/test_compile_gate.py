"""machinery.compile_gate, torch-free: one compile per code object at a time,
its result only for the threads that waited for it."""
import threading

import pytest
from guarded import finish, wait_until

from fxguard.machinery import compile_gate
from fxguard.machinery.compile_gate import CompileGate


def _code(filename: str):
    return compile("def f(x):\n    return x + 1\n", filename, "exec").co_consts[0]


def _wait_until_waiting(gate: CompileGate, count: int) -> None:
    import time
    deadline = time.monotonic() + 60
    while gate.waits < count:
        assert time.monotonic() < deadline, "the waiter never waited"
        time.sleep(0.001)


def test_a_waiter_gets_the_compile_it_waited_for():
    gate, code = CompileGate(), _code("a.py")
    mine = gate.begin(code)
    assert not mine.done and mine.mine
    got = []
    waiter = threading.Thread(target=lambda: got.append(gate.begin(code)))
    waiter.start()
    _wait_until_waiting(gate, 1)
    gate.end(code, "compiled")
    finish(waiter)
    assert got[0] is mine and got[0].done and got[0].result == "compiled"
    assert gate.in_flight() == 0
    later = gate.begin(code)  # nothing kept: a later miss compiles
    assert not later.done and later is not mine
    gate.end(code, None)


@pytest.mark.parametrize("key", ["identity", pytest.param("equality", marks=pytest.mark.xfail(
    strict=True, reason="a gate keyed by code equality makes distinct functions wait"))])
def test_equal_code_objects_of_two_files_do_not_wait(key, monkeypatch):
    if key == "equality":
        monkeypatch.setattr(compile_gate, "id", hash, raising=False)
    gate, a, b = CompileGate(), _code("a.py"), _code("b.py")
    assert a == b and a is not b
    gate.begin(a)
    got = []
    other = threading.Thread(target=lambda: got.append(gate.begin(b)), daemon=True)
    other.start()
    import time
    deadline = time.monotonic() + 60
    while not got and gate.waits == 0:  # begin returned, or waits for a's compile
        assert time.monotonic() < deadline
        time.sleep(0.001)
    try:
        assert got and not got[0].done, "b waited for a's compile"
    finally:
        gate.end(a, None)
        finish(other)
        gate.end(b, None)


def test_a_compile_that_raises_hands_nothing_on():
    gate, code = CompileGate(), _code("a.py")
    got = []

    def owner():
        try:
            gate.begin(code)
            _wait_until_waiting(gate, 1)
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
        finally:
            gate.end(code, None)

    def waiter():
        first = gate.begin(code)
        again = gate.begin(code)  # the waiter compiles itself
        got.append((first.done, first.result, again.done))
        gate.end(code, "its own")

    t = threading.Thread(target=owner)
    t.start()
    wait_until(lambda: gate.in_flight() > 0, "the owner's ticket")
    w = threading.Thread(target=waiter)
    w.start()
    finish(t, w)
    assert got == [(True, None, False)]
    assert gate.in_flight() == 0


def test_end_without_a_ticket_changes_nothing():
    gate, code = CompileGate(), _code("a.py")
    gate.end(code, "nothing")  # no ticket: no-op
    mine = gate.begin(code)
    t = threading.Thread(target=gate.end, args=(code, "not its own"))
    t.start()
    finish(t)
    assert gate.in_flight() == 1 and not mine.done
    gate.end(code, None)
    assert gate.in_flight() == 0 and mine.done


def test_reentry_by_the_compiling_thread_is_refused():
    gate, code = CompileGate(), _code("a.py")
    gate.begin(code)
    with pytest.raises(RuntimeError):
        gate.begin(code)
    gate.end(code, None)


def test_held_takes_turns_per_code_object_and_nests():
    gate, a, b = CompileGate(), _code("a.py"), _code("b.py")
    inside, order = threading.Event(), []
    release = threading.Event()

    def first():
        with gate.held(a):
            with gate.held(a):  # re-entered by the holder: nests
                order.append("first in")
                inside.set()
                assert release.wait(60)
        order.append("first out")

    def second():
        with gate.held(a):
            order.append("second in")

    t1 = threading.Thread(target=first)
    t1.start()
    assert inside.wait(60)
    with gate.held(b):  # another code object (equal code): no wait
        order.append("b")
    t2 = threading.Thread(target=second)
    t2.start()
    _wait_until_waiting(gate, 1)
    release.set()
    finish(t1, t2)
    assert order == ["first in", "b", "first out", "second in"]
    assert gate.in_flight() == 0


def _leak(gate: CompileGate, code) -> None:
    """Take a ticket in a frame that ends without end(): what an interrupt in
    the caller's finally, before its end(), leaves."""
    gate.begin(code)


OTHER_STACKS = pytest.mark.skipif(
    not __import__("fxguard").interpreter.gil_enabled(),
    reason="with the GIL off other threads' stacks are not walked: a leaked ticket waits")


@OTHER_STACKS
def test_a_ticket_whose_frame_ended_without_end_is_abandoned():
    gate, code = CompileGate(), _code("a.py")
    _leak(gate, code)
    assert gate.in_flight() == 1
    got = []
    other = threading.Thread(target=lambda: got.append(gate.begin(code)), daemon=True)
    other.start()
    other.join(60)
    assert not other.is_alive(), "another thread waited for a ticket nobody holds"
    assert not got[0].done and gate.abandoned == 1  # it holds the code's turn now
    gate_same_thread, code_b = CompileGate(), _code("b.py")
    _leak(gate_same_thread, code_b)
    mine = gate_same_thread.begin(code_b)  # the same thread: no "re-entered"
    assert not mine.done
    gate_same_thread.end(code_b, None)


@OTHER_STACKS
def test_a_waiter_wakes_when_the_owners_frame_ends_without_end():
    gate, code = CompileGate(), _code("a.py")
    owner_in, owner_go = threading.Event(), threading.Event()

    def owner():
        _leak_after(gate, code, owner_in, owner_go)
    got = []
    t = threading.Thread(target=owner)
    t.start()
    assert owner_in.wait(60)
    w = threading.Thread(target=lambda: got.append(gate.begin(code)))
    w.start()
    _wait_until_waiting(gate, 1)
    owner_go.set()  # the owner's frame returns without end()
    t.join(60)
    w.join(60)
    assert not w.is_alive(), "the waiter never woke"
    assert got[0].done and got[0].result is None


def _leak_after(gate, code, inside, go) -> None:
    gate.begin(code)
    inside.set()
    assert go.wait(60)


@OTHER_STACKS
def test_an_owner_thread_ident_reused_owns_nothing():
    """Owners are frames: a later thread with the same ident (the OS reuses
    them) does not inherit a ticket whose frame is gone."""
    gate, code = CompileGate(), _code("a.py")
    t = threading.Thread(target=_leak, args=(gate, code))
    t.start()
    t.join(60)
    got = []
    again = threading.Thread(target=lambda: got.append(gate.begin(code)))
    again.start()
    again.join(60)
    assert not again.is_alive() and not got[0].done
