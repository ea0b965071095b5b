"""State held by the frame that set it up, for as long as that frame runs.

A flag or a global that a ``finally`` clears stays set when an interrupt lands
in that ``finally`` before the clearing line.  Held by a frame instead, it
lapses by itself once the frame has left its thread's stack, which no
interrupt can skip: the next look finds it stale.
"""
from __future__ import annotations

import sys
import types


def on_my_stack(owner: types.FrameType) -> bool:
    """Whether ``owner`` is running on the calling thread's stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame is owner:
            return True
        frame = frame.f_back
    return False
