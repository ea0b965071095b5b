"""The CUDA device guard of a machine without a GPU, registered up front.

On a CUDA build of torch with no GPU, the first ``FakeTensorMode.__enter__``
of a thread (every compile enters one) calls
``torch._C._ensureCUDADeviceGuardSet()``, which puts a no-op CUDA guard in the
process-wide guard registry.  In 2.10 and 2.11 that guard is a C++
``thread_local`` of the calling thread: when that thread ends, the
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
from dataclasses import dataclass
from typing import Callable

from ..machinery.changes import Context, Outcome, Planned, Row, RowKind

WHAT = "CUDA device guard up front"
# 2.10 brought the lazy registration with a thread_local guard; 2.12 made it a
# static (pytorch#178950).  Seen crashing: 2.10.0, 2.11.0; not: 2.12.0-2.15.0.
FIXED_IN = (2, 12)
WHERE = "torch._C._ensureCUDADeviceGuardSet"


@dataclass(frozen=True)
class DeviceGuardUpFront(RowKind):
    """The row: no change to torch, a registration install() makes up front."""
    what = WHAT
    where = WHERE

    def plan(self, ctx: Context) -> Planned:
        row, register = plan()
        return Planned(outcome=row.outcome, detail=row.detail,
                       up_front=(register,) if register is not None else ())


def plan() -> tuple[Row, Callable[[], None] | None]:
    """The row, and what install() runs for it (None where nothing is needed)."""
    import torch
    ensure = getattr(torch._C, "_ensureCUDADeviceGuardSet", None)
    if ensure is None:
        return Row(WHAT, WHERE, Outcome.NOT_NEEDED, "this torch registers no fake CUDA guard"), None
    if _release(torch.__version__) >= FIXED_IN:
        return Row(WHAT, WHERE, Outcome.NOT_NEEDED,
                   "torch keeps the guard for the process (pytorch#178950)"), None
    if torch.cuda.is_available():
        return Row(WHAT, WHERE, Outcome.NOT_NEEDED, "a GPU is present: torch's own guard serves"), None
    return Row(WHAT, WHERE, Outcome.PATCHED), lambda: register(ensure)


def _release(version: str) -> tuple[int, int]:
    major, minor = (version.split("+")[0].split(".") + ["0"])[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


_registered = threading.Event()  # process-wide on purpose, like the registration itself


def register(ensure: Callable[[], None]) -> None:
    """Call ``ensure`` from a thread that outlives every compile, once a process."""
    if _registered.is_set():
        return
    _registered.set()
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


ROWS = (DeviceGuardUpFront(),)
