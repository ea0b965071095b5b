"""torch 2.13+'s CUDA-graph capture lock, one per device.

torch 2.13 serialises warm-up, recording and tree-manager set-up with one
``threading.Lock`` for the process (``cudagraph_trees.graph_capture_lock``):
drafters on different GPUs wait for each other's first steps of every shape.
What it guards is per device (a capture's stream, the device's allocator pool,
``torch.cuda.synchronize()`` of that device; RNG capture state is per capture
since 2.12), so fxguard gives each device its own lock: the two functions that
take it (the tree manager's ``__init__`` and ``_run``, checked at install) say
which device they take it for.  Same device: one at a time, as torch.
"""
from __future__ import annotations

import threading
import types
from dataclasses import dataclass, replace
from typing import Any, Callable

from ..machinery import originals
from ..machinery.changes import Change, Context, Outcome, Planned
from ..machinery.wrapped import Swap, Wrapped
from .cudagraphs import (MANAGER, MANAGER_CAPTURE, OPTION, TREES, CaptureLocks, capture_locks,
                         sets_attribute, stood_down)

CAPTURE_LOCK = f"{TREES}.graph_capture_lock"
# Where torch takes it (qualified names in cudagraph_trees); anywhere else: stand down.
TAKEN_IN = frozenset({"CUDAGraphTreeManager.__init__", "CUDAGraphTreeManager._run"})


class DeviceCaptureLock:
    """Stands in for graph_capture_lock: ``with`` takes the lock of the device
    the calling thread named last (``enter_device``), device None where it
    named none.  Each thread keeps its own stacks."""

    def __init__(self, locks: CaptureLocks) -> None:
        self._locks = locks
        self._thread = threading.local()  # .devices, .held: this thread's stacks

    def _stack(self, name: str) -> list:
        stack = getattr(self._thread, name, None)
        if stack is None:
            stack = []
            setattr(self._thread, name, stack)
        return stack

    def enter_device(self, device_index: int | None) -> None:
        self._stack("devices").append(device_index)

    def leave_device(self) -> None:
        self._stack("devices").pop()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        devices = self._stack("devices")
        lock = self._locks(devices[-1] if devices else None)
        if not lock.acquire(blocking, timeout):
            return False
        self._stack("held").append(lock)
        return True

    def release(self) -> None:
        self._stack("held").pop().release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


device_capture_lock = DeviceCaptureLock(capture_locks)

ON_DEVICE_INIT = """\
    {ns}.capture_lock.enter_device(device_index)
    try:
        with {ns}.manager_capture(device_index):
            return {ns}.inner({call})
    finally:
        {ns}.capture_lock.leave_device()
"""
ON_DEVICE_METHOD = """\
    {ns}.capture_lock.enter_device(self.device_index)
    try:
        return {ns}.inner({call})
    finally:
        {ns}.capture_lock.leave_device()
"""


def functions_naming(module: types.ModuleType, name: str) -> set[str]:
    """Qualified names of the module's functions and methods whose original code
    (nested code included, under its own name) reads global ``name``."""
    found: set[str] = set()

    def walk(code: types.CodeType, qualname: str) -> None:
        if name in code.co_names:
            found.add(qualname)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                walk(const, f"{qualname}.{const.co_name}")

    def visit(fn: Any, qualname: str) -> None:
        fn = getattr(fn, "__func__", fn)
        if isinstance(fn, property):
            fn = fn.fget
        if isinstance(fn, types.FunctionType) and fn.__module__ == module.__name__:
            walk(originals.get_original(fn, "__code__"), qualname)

    for attr, value in vars(module).items():
        if isinstance(value, type) and value.__module__ == module.__name__:
            for method, fn in vars(value).items():
                visit(fn, f"{attr}.{method}")
        else:
            visit(value, attr)
    return found


def needed(_facts: Any) -> tuple[Outcome, str] | None:
    try:
        module, name, _ = originals.resolve_path(CAPTURE_LOCK)
        original = originals.get_original(module, name)
    except (ImportError, AttributeError):
        return Outcome.NOT_NEEDED, "no capture lock (<= 2.12: row 'CUDA-graph trees per thread')"
    if type(original) is not type(threading.Lock()):
        return stood_down("graph_capture_lock is not the lock fxguard knows")
    if functions_naming(module, name) != TAKEN_IN:
        return stood_down("graph_capture_lock is taken elsewhere than fxguard knows")
    if not sets_attribute(f"{MANAGER}.__init__", "device_index"):
        return stood_down("CUDAGraphTreeManager keeps its device under another name")
    return None


@dataclass(frozen=True)
class WrappedAndReplaced(Wrapped):
    """Wrapped, and a module global (``replaces``) set to what ``replacement`` gives."""
    replaces: str = ""
    replacement: Callable[[], Any] = lambda: None

    def plan(self, ctx: Context) -> Planned:
        planned = super().plan(ctx)
        if planned.outcome is not Outcome.PATCHED:
            return planned
        module, name, _ = originals.resolve_path(self.replaces)
        return replace(planned, changes=[*planned.changes,
                                         Change(self.what, module, name, self.replacement())])


ROWS = (WrappedAndReplaced(
        "CUDA-graph capture lock per device",
        (Swap(f"{MANAGER}.__init__", ON_DEVICE_INIT, (("capture_lock", lambda: device_capture_lock),
                                                      MANAGER_CAPTURE), params=("device_index",)),
         Swap(f"{MANAGER}._run", ON_DEVICE_METHOD, (("capture_lock", lambda: device_capture_lock),),
              params=("self",))),
        needed, option=OPTION, replaces=CAPTURE_LOCK, replacement=lambda: device_capture_lock),)
