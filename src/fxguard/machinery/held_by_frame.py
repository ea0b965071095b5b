"""State held by the frame that set it up, for as long as that frame runs.

A flag or a global that a ``finally`` clears stays set when an interrupt lands
in that ``finally`` before the clearing line.  Held by a frame instead, it
lapses by itself once the frame has left its thread's stack, which no
interrupt can skip: the next look finds it stale.
"""
from __future__ import annotations

import sys
import threading
import types

from .. import interpreter
from .settle import current_frames


def on_my_stack(owner: types.FrameType) -> bool:
    """Whether ``owner`` is running on the calling thread's stack."""
    return _on_stack(sys._getframe(1), owner)


def runs_on(thread: int, owner: types.FrameType) -> bool:
    """Whether ``owner`` is running on thread ``thread``'s stack.  With the GIL
    off another thread's stack cannot be walked safely (it runs on): there the
    answer is whether that thread runs Python at all, so state a thread left
    when it ended lapses, and state an interrupt left in a live thread waits."""
    if thread == threading.get_ident():
        return _on_stack(sys._getframe(1), owner)
    frames = current_frames()
    if not interpreter.gil_enabled():
        return thread in frames
    return _on_stack(frames.get(thread), owner)


def _on_stack(frame: types.FrameType | None, owner: types.FrameType) -> bool:
    while frame is not None:
        if frame is owner:
            return True
        frame = frame.f_back
    return False
