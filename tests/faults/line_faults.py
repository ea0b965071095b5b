"""Raise an exception at a chosen line of fxguard's Python, or list the lines run.

fxguard's Python is its package's files and the code it swapped into torch's
functions (rewritten torch source keeps torch's file name).  A trace function
set on one thread sees that thread's lines only; raising from it raises in the
traced frame at that line, as an interrupt delivered there would.
"""
from __future__ import annotations

import dis
import functools
import os
import sys
import types
from typing import Callable, Iterable

import fxguard

PACKAGE = os.path.dirname(fxguard.__file__) + os.sep

Line = tuple[str, int]  # (file, line)


def swapped_codes(stock: bool = False) -> set[types.CodeType]:
    """The code objects fxguard put into torch's functions, nested code included
    (``stock``: the code they replaced, to raise at the same line of stock)."""
    from fxguard.machinery import originals
    found: set[types.CodeType] = set()
    which = "original" if stock else "value"
    stack = [getattr(p, which) for p in originals.applied() if p.attr == "__code__"]
    stack += [getattr(p, which).__code__ for p in originals.applied()
              if isinstance(getattr(p, which), types.FunctionType)]
    while stack:
        code = stack.pop()
        if isinstance(code, types.CodeType) and code not in found:
            found.add(code)
            stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return found


class Tracer:
    """Records every line of fxguard's Python this thread runs; with ``at``,
    raises ``make()`` at that line's first run (once)."""

    def __init__(self, swapped: Iterable[types.CodeType], at: Line | None = None,
                 make: Callable[[], BaseException] = KeyboardInterrupt) -> None:
        self.swapped = {id(c) for c in swapped}
        self.at, self.make = at, make
        self.seen: dict[Line, None] = {}  # in the order first run
        self.nops: set[Line] = set()       # first run at a NOP (``try:``): see at_nop
        self.fired = False

    def ours(self, code: types.CodeType) -> bool:
        return code.co_filename.startswith(PACKAGE) or id(code) in self.swapped

    def __call__(self, frame: types.FrameType, event: str, arg: object):
        if not self.ours(frame.f_code):
            return None
        return self._line

    def _line(self, frame: types.FrameType, event: str, arg: object):
        if event == "line":
            line = (frame.f_code.co_filename, frame.f_lineno)
            if line not in self.seen and at_nop(frame):
                self.nops.add(line)
            self.seen.setdefault(line)
            if line == self.at and not self.fired:
                self.fired = True
                raise self.make()
        return self._line

    def __enter__(self) -> "Tracer":
        sys.settrace(self)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)


@functools.lru_cache(maxsize=None)
def _nop_offsets(code: types.CodeType) -> frozenset[int]:
    return frozenset(ins.offset for ins in dis.get_instructions(code) if ins.opname == "NOP")


def at_nop(frame: types.FrameType) -> bool:
    """A line event at a NOP (a ``try:``, a constant ``return`` folded away) is
    no place for an interrupt: a signal's exception is raised where the
    interpreter checks for one (calls, jumps), never at a NOP.  A trace
    function can raise there, and CPython then skips the handlers around it (a
    ``with`` block's exit: a lock stays held), which no program meets."""
    return frame.f_lasti in _nop_offsets(frame.f_code)


def short(line: Line) -> str:
    path, number = line
    if path.startswith(PACKAGE):
        path = "fxguard/" + path[len(PACKAGE):]
    else:
        path = path.rsplit("site-packages" + os.sep, 1)[-1]
    return f"{path}:{number}"
