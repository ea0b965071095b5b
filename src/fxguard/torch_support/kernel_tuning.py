"""A shared Triton kernel is tuned by one thread at a time.

Threads that run one compiled graph launch the very same kernels
(``CachingAutotuner``): compile once hands every thread the graph one thread
compiled, and inductor's code cache hands every compile of one graph the same
module.  A kernel's first launch reads ``len(self.launchers)`` with no lock
and benchmarks every config it has; two threads' first launches benchmark
together, and on torch 2.14+ ``benchmark_all_configs`` closes the launchers it
did not pick while the other thread may still launch one (pytorch#198257).

Here a kernel's autotuning (``autotune_to_one_config``) runs one thread at a
time per kernel, and a thread that waited finds the kernel tuned and launches
its one launcher.  Launches after the first never reach it, so they cost
nothing.  Coordinate descent is left as stock: two threads' descents each
build launchers of their own and close none (the last result is kept), and
on torch <= 2.12 some kernels call it at every launch.
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any

from ..machinery.changes import Outcome
from ..machinery.wrapped import Swap, Wrapped, plain_function

HEURISTICS = "torch._inductor.runtime.triton_heuristics"
AUTOTUNE = f"{HEURISTICS}.CachingAutotuner.autotune_to_one_config"


class KernelTuning:
    """A lock per kernel (its autotuner), made on first use; ``enabled`` False:
    tuning runs as stock (tests see the race)."""

    def __init__(self) -> None:
        self._locks: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
        self._made = threading.Lock()  # guards _locks (free-threaded builds too)
        self.enabled = True

    def lock_for(self, autotuner: Any) -> Any:
        """The kernel's tuning lock (a no-op where not enabled).  Taken by the
        swapped function's own ``with``, so its frame releases it, whatever
        exception leaves the block; waiting for it releases the GIL."""
        if not self.enabled:
            return contextlib.nullcontext()
        with self._made:
            lock = self._locks.get(autotuner)
            if lock is None:
                lock = self._locks[autotuner] = threading.RLock()
        return lock


kernel_tuning = KernelTuning()

# A thread that waited finds the kernel down to one launcher: nothing to tune.
TUNE_ONCE = """\
    with {ns}.tuning.lock_for(self):
        if {ns}.tuning.enabled and len(self.launchers) <= 1:
            return None
        return {ns}.inner({call})
"""
TUNING = ("tuning", lambda: kernel_tuning)


def tuning_needed(_facts: Any) -> tuple[Outcome, str] | None:
    autotune = plain_function(AUTOTUNE)
    if autotune is None:
        return Outcome.NOT_AVAILABLE, "on this torch"
    if "launchers" not in autotune.__code__.co_names:
        return Outcome.NOT_COVERED, ("CachingAutotuner.autotune_to_one_config is not the one "
                                     "fxguard knows; kernels tune as stock")
    return None


ROWS = (
    Wrapped("a shared kernel tuned by one thread at a time",
            (Swap(AUTOTUNE, TUNE_ONCE, (TUNING,), params=("self",)),),
            tuning_needed),
)
