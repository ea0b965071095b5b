"""A config window per thread (option config_window_lock, torch <= 2.11, where
torch's config is process-wide)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..machinery import overlay
from ..machinery.changes import Outcome
from ..machinery.wrapped import Swap, Wrapped
from .options import Option

if TYPE_CHECKING:  # for annotations only: no import at run time
    from .facts import TorchFacts


def _config_process_wide(facts: TorchFacts) -> tuple[Outcome, str] | None:
    return None if not facts.config_per_thread else (Outcome.NOT_NEEDED, "config per thread")


# _set_compilation_env sets dynamo config for its window (eager flex_attention,
# HOP compiles) and puts the old values back.  Where that config is
# process-wide (torch <= 2.11) another thread's compile would read the
# window's values, and two windows' saves and restores interleave.  The
# window's writes to these entries stay in the thread inside it (no lock:
# holding dynamo's compile_lock for the window made an eager flex call wait
# for every other thread's compile).
CONFIG_WINDOW = """\
    with {ns}.window():
        yield from {ns}.inner({call})
"""
WINDOW_CONFIG = ("torch._dynamo.config", ("allow_empty_graphs", "capture_scalar_outputs"))

ROWS = (
    Wrapped("config window per thread",
            (Swap("torch._higher_order_ops.utils._set_compilation_env", CONFIG_WINDOW,
                  (("window", lambda: overlay.window),)),),
            _config_process_wide, option=Option.CONFIG_WINDOW_LOCK, windowed=WINDOW_CONFIG),
)
