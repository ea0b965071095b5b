"""Rows applied when their module is imported (install on import).

``install()`` plans every row without importing anything (``no_imports``): a
row whose planning would import a module of the watched package waits
(``ModuleWaiting``, its outcome WAITING).  A ``Watcher`` on ``sys.meta_path``
then sees each later import of that package's modules; when one a row waits
for has been imported and no module of the package is still executing in any
thread, it calls back, from inside the outermost import, before that import
returns: the module that brought the others in is still marked initializing, so
another thread importing it waits until the rows are in place.

Both are torch-free: the package is a parameter (tests use their own).
"""
from __future__ import annotations

import contextlib
import sys
import threading
import types
from typing import Any, Callable, Iterator

from . import process_hooks
from .held_by_frame import on_my_stack


class ModuleWaiting(BaseException):
    """Planning a row would import ``module``: the row waits for it.

    A BaseException, so that a planner's ``except Exception`` (or ImportError)
    cannot turn a row that waits into one that is "not available" for good."""

    def __init__(self, module: str) -> None:
        super().__init__(module)
        self.module = module


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


class _NoImports:
    """A finder that refuses, in the threads inside ``no_imports``, every module
    of the package not imported yet, before anything of it runs.  A name that
    is no module (``torch.nn.Module``, tried by a path resolver) stays an
    ImportError.  A thread is inside while the frame that entered is on its
    stack: an interrupt that cut the way out short leaves an entry that no
    longer refuses anything, and the next look removes it."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.threads: dict[int, types.FrameType] = {}  # thread -> the frame inside the with

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if _under(name, self.package) and name not in sys.modules and _inside(self) \
                and process_hooks.spec_after(self, name, path, target) is not None:
            raise ModuleWaiting(name)
        return None


def _inside(guard: _NoImports) -> bool:
    """Whether this thread is inside ``no_imports`` (its entry, if left by an
    interrupted exit, is removed)."""
    me = threading.get_ident()
    owner = guard.threads.get(me)
    if owner is None:
        return False
    if on_my_stack(owner):
        return True
    _leave(guard.package, me, owner)
    return False


_guards: dict[str, _NoImports] = {}
_guards_lock = threading.Lock()


@contextlib.contextmanager
def no_imports(package: str) -> Iterator[None]:
    """Inside, this thread's imports of modules of ``package`` that are not in
    sys.modules yet raise ModuleWaiting (other threads import as usual)."""
    caller = sys._getframe(2)  # the with-statement's (1: contextmanager's __enter__)
    me = threading.get_ident()
    with _guards_lock:
        guard = _guards.get(package)
        if guard is None:
            guard = _guards[package] = _NoImports(package)
            process_hooks.watch_imports(guard)
        owner = guard.threads.get(me)
        if owner is None or not on_my_stack(owner):  # nested: the outer with keeps it
            guard.threads[me] = caller
    try:
        yield
    finally:
        _leave(package, me, caller)


def _leave(package: str, me: int, frame: types.FrameType) -> None:
    """Thread ``me`` left the with-block of ``frame``: no finder is left for the
    process's later imports once no thread is inside."""
    with _guards_lock:
        guard = _guards.get(package)
        if guard is not None and guard.threads.get(me) is frame:
            del guard.threads[me]
        _drop_if_unused(package)


def _drop_if_unused(package: str) -> None:
    guard = _guards.get(package)
    if guard is not None and not guard.threads:
        process_hooks.stop_watching(guard)
        del _guards[package]


def prune() -> None:
    """Remove what an interrupted exit of this thread's no_imports left (the
    finder for the whole process, where no other thread is inside)."""
    for package, guard in list(_guards.items()):
        _inside(guard)
        with _guards_lock:
            _drop_if_unused(package)


class Watcher:
    """Calls ``ready()`` once a module in ``wanted`` was imported and no module
    of ``package`` is executing in any thread (still inside the outermost
    import, see the module's docstring).  ``wanted`` may be changed by ready().
    ``settled()`` says whether such a module arrived and nothing executes now
    (for a caller that catches up on a ready() it could not serve at once)."""

    def __init__(self, package: str, ready: Callable[[], None],
                 reloaded: Callable[[str], None] | None = None) -> None:
        self.package = package
        self.ready = ready
        self.reloaded = reloaded  # called after importlib.reload ran a module in ``patched``
        self.patched: set[str] = set()
        self.wanted: set[str] = set()
        self._lock = threading.Lock()
        self._executing = 0      # modules of the package executing, every thread
        self._due = False        # a wanted module was imported since the last ready()
        self._local = threading.local()  # find_spec's own lookups (no recursion)

    def settled(self) -> bool:
        """A wanted module arrived since the last call that said so, and no
        module of the package is executing: time to apply what waited."""
        with self._lock:
            due = self._due and self._executing == 0
            if due:
                self._due = False
            return due

    def start(self) -> None:
        process_hooks.watch_imports(self)

    def stop(self) -> None:
        process_hooks.stop_watching(self)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if not _under(name, self.package) or getattr(self._local, "busy", False):
            return None
        reload = name in sys.modules and name in self.patched
        if not reload and not self.wanted:  # watching reloads only: no cost to other imports
            return None
        self._local.busy = True
        try:
            spec = process_hooks.spec_after(self, name, path, target)
        finally:
            self._local.busy = False
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            if reload:  # importlib.reload: an import of a module in sys.modules
                self._watch_reload(spec.loader, name)
            else:
                self._watch(spec.loader, name)
        return spec

    def _watch_reload(self, loader: Any, name: str) -> None:
        """reload() runs the module's source again into the same dict: stock
        functions and globals come back over what was patched."""
        exec_module = loader.exec_module

        def watched(module: Any) -> None:
            try:
                exec_module(module)
            finally:
                vars(loader).pop("exec_module", None)
            if self.reloaded is not None:
                self.reloaded(name)

        try:
            loader.exec_module = watched
        except AttributeError:
            pass

    def _watch(self, loader: Any, name: str) -> None:
        """This import's loader (an instance per module) reports when its module ran."""
        exec_module = loader.exec_module

        def watched(module: Any) -> None:
            with self._lock:
                self._executing += 1
            ran = False
            try:
                exec_module(module)
                ran = True
            finally:
                vars(loader).pop("exec_module", None)  # the loader as it was
                with self._lock:
                    self._executing -= 1
                    self._due |= ran and name in self.wanted
                    run = ran and self._due and self._executing == 0
            if run:
                self.ready()

        try:
            loader.exec_module = watched
        except AttributeError:  # a loader with __slots__: its import is not seen
            pass
