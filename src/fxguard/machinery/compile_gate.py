"""One compile per code object at a time, its result handed to those who waited.

Knows no torch names.  A thread that misses a cache for a code object calls
``gate.begin(code)`` inside a ``try`` whose ``finally`` calls
``gate.end(code, result)``:

- no compile of that code object in flight: ``begin`` returns a ``Ticket``
  this thread owns; it compiles, and ``end`` hands the result (None where
  the compile raised, KeyboardInterrupt included, or gave nothing) to the
  threads that waited for this very compile, and wakes them;
- one in flight: ``begin`` waits (the GIL released) until it ends and
  returns that ticket, finished; the caller looks at ``ticket.result`` and, if
  it cannot use it, calls ``begin`` again (and may compile itself).

A ticket is held by a *frame*, the one that called ``begin`` (``held``: the
one whose ``with`` took it), not by a flag someone must clear: it is in flight
only while that frame runs on its thread's stack.  So no interrupt can leak
it, wherever it lands (inside ``begin`` or ``end``, or in the ``finally``
before ``end``): once that frame is gone, the next ``begin`` for the code, and
every waiter within ``CHECK_EVERY`` seconds, finds the ticket abandoned and
hands on nothing.  A thread ident the OS reuses owns nothing: the frame is
what counts.

``with gate.held(code):`` takes a turn without sharing a result (concurrent
compiles with compile once off).  Code objects are told apart by identity
(code ``==`` ignores the file name and qualified name), and nothing is kept
once a compile's waiters have it: a later miss that waited for nothing
compiles.
"""
from __future__ import annotations

import sys
import threading
import types
from typing import Any

from .held_by_frame import runs_on

CHECK_EVERY = 0.25  # seconds between a waiter's looks at whether the owner's frame still runs


class Ticket:
    """One compile of one code object."""

    __slots__ = ("code", "owner", "frame", "done", "result", "waiters")

    def __init__(self, code: types.CodeType, owner: int, frame: types.FrameType) -> None:
        self.code = code          # held: the key is its id
        self.owner = owner        # thread ident of the compiling thread
        self.frame = frame        # the frame that holds the ticket while it runs
        self.done = False
        self.result: Any = None   # what the compile gave; None: nothing to share
        self.waiters = 0

    @property
    def mine(self) -> bool:
        return not self.done and self.owner == threading.get_ident()

    def running(self) -> bool:
        """Whether the frame that took the ticket still runs on its thread."""
        return runs_on(self.owner, self.frame)


class CompileGate:
    """Protected by one Condition: the in-flight tickets and the counters."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._in_flight: dict[int, Ticket] = {}  # id(code) -> its compile's ticket
        self.waits = 0
        self.abandoned = 0  # tickets whose frame ended without end(): an interrupt skipped it

    def begin(self, code: types.CodeType, frame: types.FrameType | None = None) -> Ticket:
        """A ticket this thread owns, held by ``frame`` (default: the caller's),
        or a finished one it waited for."""
        me = threading.get_ident()
        frame = frame or sys._getframe(1)
        with self._cond:
            ticket = self._in_flight.get(id(code))
            if ticket is not None and not ticket.running():
                self._abandon(ticket)
                ticket = None
            if ticket is None:
                ticket = self._in_flight[id(code)] = Ticket(code, me, frame)
                return ticket
            if ticket.owner == me:  # re-entered: the caller's own compile, still running
                raise RuntimeError("CompileGate.begin re-entered by the compiling thread")
            self.waits += 1
            ticket.waiters += 1
            while not ticket.done:
                if not self._cond.wait(CHECK_EVERY) and not ticket.done and not ticket.running():
                    self._abandon(ticket)
            return ticket

    def end(self, code: types.CodeType, result: Any) -> None:
        """This thread's compile of ``code`` ended with ``result``; no-op where
        this thread holds no ticket for it."""
        me = threading.get_ident()
        with self._cond:
            ticket = self._in_flight.get(id(code))
            if ticket is None or ticket.owner != me:
                return
            self._finish(ticket, result)

    def _abandon(self, ticket: Ticket) -> None:
        """The ticket's frame ended without end(): hand on nothing (lock held)."""
        self.abandoned += 1
        self._finish(ticket, None)

    def _finish(self, ticket: Ticket, result: Any) -> None:
        if self._in_flight.get(id(ticket.code)) is ticket:
            del self._in_flight[id(ticket.code)]
        ticket.result, ticket.done = result, True
        self._cond.notify_all()

    def held(self, code: types.CodeType) -> "_Held":
        """Hold ``code``'s turn for the ``with`` block, sharing no result
        (concurrent compiles without compile once); a block re-entered by the
        holder nests."""
        return _Held(self, code)

    def in_flight(self) -> int:
        with self._cond:
            return len(self._in_flight)


class _Held:
    """``with gate.held(code):``: the frame running the ``with`` holds the turn."""

    __slots__ = ("gate", "code", "outer")

    def __init__(self, gate: CompileGate, code: types.CodeType) -> None:
        self.gate, self.code, self.outer = gate, code, False

    def __enter__(self) -> None:
        gate, frame = self.gate, sys._getframe(1)
        with gate._cond:
            ticket = gate._in_flight.get(id(self.code))
            self.outer = (ticket is not None and ticket.owner == threading.get_ident()
                          and ticket.running())
        if self.outer:  # an outer block of this thread holds the turn
            return
        while gate.begin(self.code, frame).done:
            pass  # waited for another thread's turn: take one now

    def __exit__(self, *exc: object) -> None:
        if not self.outer:
            self.gate.end(self.code, None)
