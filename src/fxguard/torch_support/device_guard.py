"""The CUDA device guard of a machine without a GPU, registered up front.

On a CUDA build of torch with no GPU (and on CPU builds of older releases),
the first ``FakeTensorMode.__enter__``
of a thread (every compile enters one) calls
``torch._C._ensureCUDADeviceGuardSet()``, which puts a no-op CUDA guard in the
process-wide guard registry.  In some releases (2.11.0 among them) that guard
is a C++ ``thread_local`` of the calling thread: when that thread ends, the
registry points at freed memory, and the next fake mode of any thread
segfaults (two drafter threads compiling at once, or one compiling after
another has finished).  Registered once from the main thread, which lives as
long as the process, the guard stays valid and no later call replaces it.

It cannot be undone, and needs not be: it is what torch's own first compile
would register.  Where install() runs in another thread, a daemon thread that
never ends makes the registration.
"""
from __future__ import annotations

import threading
from typing import Callable

from ..machinery.changes import Outcome, Row

WHAT = "CUDA device guard up front"
WHERE = "torch._C._ensureCUDADeviceGuardSet"


def plan() -> tuple[Row, Callable[[], None] | None]:
    """The row, and what install() runs for it (None where nothing is needed)."""
    import torch
    ensure = getattr(torch._C, "_ensureCUDADeviceGuardSet", None)
    if ensure is None:
        return Row(WHAT, WHERE, Outcome.NOT_NEEDED, "this torch registers no fake CUDA guard"), None
    if torch.cuda.is_available():
        return Row(WHAT, WHERE, Outcome.NOT_NEEDED, "a GPU is present: torch's own guard serves"), None
    return Row(WHAT, WHERE, Outcome.PATCHED), lambda: register(ensure)


def register(ensure: Callable[[], None]) -> None:
    """Call ``ensure`` from a thread that outlives every compile."""
    if threading.current_thread() is threading.main_thread():
        ensure()
        return
    done = threading.Event()

    def keep() -> None:
        ensure()
        done.set()
        threading.Event().wait()  # its thread_local guard must outlive every compile

    threading.Thread(target=keep, name="fxguard-cuda-guard", daemon=True).start()
    done.wait()
