"""Which frames can still use a name that a change is about to remove.

A function whose ``__code__`` is swapped keeps running its old code in frames
already inside it: a frame of a stock reader paused at its first instruction
reads the module global after install() deleted it (NameError), and a frame
of rewritten code reads fxguard's view after uninstall() removed it.  So
install() and uninstall() make their additive changes first, wait here until
no other thread has a frame of the retired code on its stack, and only then
remove names.

A frame counts only while an instruction still ahead of it (by control
flow from ``f_lasti``) names the name: a thread whose bottom frame is a
swapped ``Thread._bootstrap`` that already passed its one read holds nothing.
Frames are found on other threads' stacks (``sys._current_frames()``) and
suspended: a ``@contextmanager`` whose with-body runs is a generator frame on
no stack, found through the collector's referrers of the code.  Callers
keep such names bound rather than wait for them (machinery.originals).

With the GIL off the stack walk is not safe (it crashed on 3.13t), so there it
is skipped.
"""
from __future__ import annotations

import dis
import gc
import inspect
import threading
import types
from typing import Iterable

from .. import _core, interpreter


_walk = threading.Lock()


def current_frames() -> dict[int, types.FrameType]:
    """sys._current_frames() with the collector paused.  CPython 3.11 makes the
    frame objects while it holds the thread-state list's lock; a collection
    they trigger that frees a threading.local takes that lock again and the
    process hangs (seen in the suite on 3.11.7).  The pause is the C core's, so
    no exception can leave the collector off; the lock keeps two walks' pauses
    apart where the GIL does not (free-threaded builds)."""
    with _walk:
        return _core._current_frames()


def _names() -> dict[int, str]:
    """Thread names by ident, for messages only (decisions rest on the frames)."""
    return {t.ident: t.name for t in threading.enumerate() if t.ident is not None}


def threads_running(codes: Iterable[types.CodeType]) -> list[str]:
    """Names of the other threads with a frame of one of ``codes`` on their stack."""
    wanted = {id(code) for code in codes}
    me = threading.get_ident()
    names = _names()
    busy = []
    for ident, frame in current_frames().items():
        if ident == me:
            continue
        while frame is not None:
            if id(frame.f_code) in wanted:
                busy.append(names.get(ident, str(ident)))
                break
            frame = frame.f_back
    return busy


def threads_past(points: dict[types.CodeType, int]) -> list[str]:
    """Names of the threads, this one included, with a frame of one of the
    codes in ``points`` stopped past that code's offset (``f_lasti`` beyond
    it): inside what the code set up there and undoes on its way out.  Empty
    with the GIL off, where other threads' stacks are not walked."""
    if not points or not interpreter.gil_enabled():
        return []
    wanted = {id(code): offset for code, offset in points.items()}
    names = _names()
    me = threading.get_ident()
    found = []
    for ident, frame in current_frames().items():
        while frame is not None:
            offset = wanted.get(id(frame.f_code))
            if offset is not None and frame.f_lasti > offset:
                name = names.get(ident, f"thread {ident}")
                found.append(f"{name} (this thread)" if ident == me else name)
                break
            frame = frame.f_back
    return found


def first_use(code: types.CodeType, names: set[str], ops: tuple[str, ...]) -> int | None:
    """Offset of the first instruction of ``code`` whose opname starts with one
    of ``ops`` and whose argument is one of ``names`` (None: there is none)."""
    return next((ins.offset for ins in dis.get_instructions(code)
                 if ins.opname.startswith(ops) and ins.argval in names), None)


_SUSPENDABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
_STOPS = {"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE", "JUMP_FORWARD",
          "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT",
          "JUMP_ABSOLUTE"}
_JUMPS = set(getattr(dis, "hasjump", ())) | set(dis.hasjrel) | set(dis.hasjabs)
# Globals, and attributes: a writer in another module assigns ``module.name``
# (an unrelated attribute of the same name only holds a name a little longer).
_USES = {"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME", "STORE_NAME",
         "LOAD_ATTR", "STORE_ATTR", "DELETE_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR"}


def _flow(code: types.CodeType) -> tuple[list, dict[int, int]]:
    instructions = list(dis.get_instructions(code))
    return instructions, {ins.offset: i for i, ins in enumerate(instructions)}


def names_ahead(code: types.CodeType, lasti: int) -> set[str]:
    """Global (and attribute) names that instructions reachable from offset
    ``lasti`` use (-1: a frame that has not started)."""
    instructions, index = _flow(code)
    handlers = [(e.start, e.end, e.target)
                for e in getattr(dis.Bytecode(code), "exception_entries", ())]
    # The instruction at lasti counts: a frame stopped at a line event has not run it yet.
    todo = [i for i, ins in enumerate(instructions) if ins.offset >= lasti][:1]
    todo += [index[t] for s, e, t in handlers if s <= max(lasti, 0) < e and t in index]
    seen, found = set(), set()
    while todo:
        i = todo.pop()
        if i in seen or i >= len(instructions):
            continue
        seen.add(i)
        ins = instructions[i]
        if ins.opname in _USES:
            found.add(ins.argval)
        if ins.opname not in _STOPS:
            todo.append(i + 1)
        if ins.opcode in _JUMPS:
            if ins.argval in index:
                todo.append(index[ins.argval])
        todo += [index[t] for s, e, t in handlers if s <= ins.offset < e and t in index]
    return found


def _nested(codes: Iterable[types.CodeType]) -> list[types.CodeType]:
    out, stack = [], list(codes)
    while stack:
        code = stack.pop()
        out.append(code)
        stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return out


class Live:
    """A frame found running retired code: on a thread's stack (looked up again
    by thread and code, frames cannot be weakly held) or a suspended generator
    (held weakly).  ``names()``: the globals it can still use; empty once gone."""

    def __init__(self, frame: types.FrameType, ident: int | None = None, holder: object = None):
        import weakref
        self.code, self.ident = frame.f_code, ident
        self.holder = weakref.ref(holder) if holder is not None else None

    def frame(self) -> types.FrameType | None:
        if self.holder is not None:
            gen = self.holder()
            return None if gen is None else _frame_of(gen)
        frame = current_frames().get(self.ident)
        while frame is not None and frame.f_code is not self.code:
            frame = frame.f_back
        return frame

    def names(self) -> set[str]:
        frame = self.frame()
        return set() if frame is None else names_ahead(frame.f_code, frame.f_lasti)


def _frame_of(gen: object) -> types.FrameType | None:
    return getattr(gen, "gi_frame", None) or getattr(gen, "cr_frame", None) \
        or getattr(gen, "ag_frame", None)


def live(codes: Iterable[types.CodeType]) -> list[Live]:
    """Frames of ``codes`` (nested code included) outside this thread's stack:
    on other threads' stacks, and suspended generators and coroutines (not yet
    started ones included).  Nothing makes new ones once the code is retired."""
    codes = _nested(codes)
    wanted = {id(c) for c in codes}
    found = []
    if interpreter.gil_enabled():
        me = threading.get_ident()
        for ident, frame in current_frames().items():
            while frame is not None and ident != me:
                if id(frame.f_code) in wanted:
                    found.append(Live(frame, ident=ident))
                frame = frame.f_back
    suspendable = [c for c in codes if c.co_flags & _SUSPENDABLE]
    if suspendable:
        for holder in gc.get_referrers(*suspendable):
            frame = _frame_of(holder)
            running = getattr(holder, "gi_running", False) or getattr(holder, "cr_running", False)
            if frame is not None and not running and id(frame.f_code) in wanted:
                found.append(Live(frame, holder=holder))
    return found


def names_in_use(found: Iterable[Live], names: set[str]) -> set[str]:
    """Which of ``names`` one of these frames can still use."""
    used: set[str] = set()
    for one in found:
        if not names - used:
            break
        used |= names & one.names()
    return used
