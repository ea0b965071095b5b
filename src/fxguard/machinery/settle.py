"""Wait until no other thread runs code that a change is about to strand.

A function whose ``__code__`` is swapped keeps running its old code in frames
already inside it: a frame of a stock reader paused at its first instruction
reads the module global after install() deleted it (NameError), and a frame
of rewritten code reads fxguard's view after uninstall() removed it.  So
install() and uninstall() make their additive changes first, wait here until
no other thread has a frame of the retired code on its stack, and only then
remove names.

Other threads' stacks are walked with ``sys._current_frames()``; with the
GIL off that walk is not safe (it crashed on 3.13t), so there it is skipped.
"""
from __future__ import annotations

import gc
import sys
import threading
import time
import types
from typing import Iterable

from .. import interpreter


_walk = threading.Lock()


def current_frames() -> dict[int, types.FrameType]:
    """sys._current_frames() with the collector paused.  CPython 3.11 makes the
    frame objects while it holds the thread-state list's lock; a collection
    they trigger that frees a threading.local takes that lock again and the
    process hangs (seen in the suite on 3.11.7)."""
    with _walk:
        paused = gc.isenabled()
        gc.disable()
        try:
            return sys._current_frames()
        finally:
            if paused:
                gc.enable()


def threads_running(codes: Iterable[types.CodeType]) -> list[str]:
    """Names of the other threads with a frame of one of ``codes`` on their stack."""
    wanted = {id(code) for code in codes}
    me = threading.get_ident()
    names = {t.ident: t.name for t in threading.enumerate()}
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


def settle(codes: Iterable[types.CodeType], timeout: float = 5.0) -> list[str]:
    """Wait (sleeping, so other threads run) until no other thread runs ``codes``;
    the threads still in them after ``timeout`` seconds (empty: settled)."""
    codes = list(codes)
    if not codes or not interpreter.gil_enabled():
        return []
    deadline = time.monotonic() + timeout
    while True:
        busy = threads_running(codes)
        if not busy or time.monotonic() >= deadline:
            return busy
        time.sleep(0.0005)
