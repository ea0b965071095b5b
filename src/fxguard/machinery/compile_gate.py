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

``with gate.held(code):`` takes a turn without sharing a result (concurrent
compiles with compile once off).  Code objects are told apart by identity (code ``==`` ignores the file name and
qualified name), and nothing is kept once a compile's waiters have it: a
later miss that waited for nothing compiles.  ``end`` finds the ticket by code
object and owning thread, so a ``finally`` releases it even where an
exception arrived before ``begin`` returned.
"""
from __future__ import annotations

import contextlib
import threading
import types
from typing import Any, Iterator


class Ticket:
    """One compile of one code object."""

    __slots__ = ("code", "owner", "done", "result", "waiters")

    def __init__(self, code: types.CodeType, owner: int) -> None:
        self.code = code          # held: the key is its id
        self.owner = owner        # thread ident of the compiling thread
        self.done = False
        self.result: Any = None   # what the compile gave; None: nothing to share
        self.waiters = 0

    @property
    def mine(self) -> bool:
        return not self.done and self.owner == threading.get_ident()


class CompileGate:
    """Protected by one Condition: the in-flight tickets and the counters."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._in_flight: dict[int, Ticket] = {}  # id(code) -> its compile's ticket
        self.waits = 0

    def begin(self, code: types.CodeType) -> Ticket:
        """A ticket this thread owns (compile, then end()), or a finished one it waited for."""
        me = threading.get_ident()
        with self._cond:
            ticket = self._in_flight.get(id(code))
            if ticket is None:
                ticket = self._in_flight[id(code)] = Ticket(code, me)
                return ticket
            if ticket.owner == me:  # re-entered: the caller's own compile
                raise RuntimeError("CompileGate.begin re-entered by the compiling thread")
            self.waits += 1
            ticket.waiters += 1
            while not ticket.done:
                self._cond.wait()
            return ticket

    def end(self, code: types.CodeType, result: Any) -> None:
        """This thread's compile of ``code`` ended with ``result``; no-op where
        this thread holds no ticket for it."""
        me = threading.get_ident()
        with self._cond:
            ticket = self._in_flight.get(id(code))
            if ticket is None or ticket.owner != me:
                return
            del self._in_flight[id(code)]
            ticket.result, ticket.done = result, True
            self._cond.notify_all()

    @contextlib.contextmanager
    def held(self, code: types.CodeType) -> Iterator[None]:
        """Hold ``code``'s turn for the block, sharing no result (concurrent
        compiles without compile once); a block re-entered by the holder nests."""
        with self._cond:
            ticket = self._in_flight.get(id(code))
            reentered = ticket is not None and ticket.owner == threading.get_ident()
        if reentered:  # the outer block holds the turn
            yield
            return
        try:
            while self.begin(code).done:
                pass  # waited for another thread's turn: take one now
            yield
        finally:
            self.end(code, None)

    def in_flight(self) -> int:
        with self._cond:
            return len(self._in_flight)
