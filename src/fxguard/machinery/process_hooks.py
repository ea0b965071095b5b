"""The hooks fxguard's Python code sets on the process, in one room: in a forked
child, around imports, at exit.  Each is registered once, however often
install() and uninstall() run.  Machinery: knows no torch names.

- In a forked child: ``after_fork_in_child(callback)``.  One
  ``os.register_at_fork`` serves every callback, made at the first; they run in
  the order they came.  The C core has the other after-fork hook, its own
  (``_core/fork.c``: records, then the core's RLocks): the core registers it
  as it executes, before this room can be imported (the package imports the
  core first), once per module object, so its locks are fork-safe from the
  moment they exist; it runs before this room's.
- Around imports: ``watch_imports(finder)`` puts a meta-path finder first on
  ``sys.meta_path`` (once), ``stop_watching(finder)`` takes it off, and
  ``spec_after(finder, ...)`` is what the finders after it would find
  (``import_watch``'s finders).  Before fxguard is imported, the FXGUARD=1
  start-up hook (``_fxguard_startup``, outside the package) has a finder of its
  own: it must not import fxguard before torch, and nothing ``import fxguard``
  runs imports it (only ``fxguard run``, the command line, uses its finder).
- At exit: ``at_exit(callback, *args)``: ``atexit.register``, once per
  callback and arguments.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any, Callable

_lock = threading.Lock()  # registrations are rare; every list below is read or grown under it
_in_forked_child: list[Callable[[], None]] = []
_at_exit: list[tuple[Callable[..., Any], tuple]] = []


def after_fork_in_child(callback: Callable[[], None]) -> None:
    """Call ``callback()`` in the child after every later ``os.fork()``
    (nothing where the platform has no fork).  Once per callback."""
    if not hasattr(os, "register_at_fork"):
        return
    with _lock:
        if callback not in _in_forked_child:
            _in_forked_child.append(callback)


def _run_in_forked_child() -> None:
    global _lock
    _lock = threading.Lock()  # a thread that is gone in the child may have held it
    for callback in list(_in_forked_child):
        callback()


if hasattr(os, "register_at_fork"):  # once, on import: the lock above is renewed in every child
    os.register_at_fork(after_in_child=_run_in_forked_child)


def at_exit(callback: Callable[..., Any], *args: Any) -> None:
    """``atexit.register(callback, *args)``, once per callback and arguments."""
    with _lock:
        if (callback, args) in _at_exit:
            return
        atexit.register(callback, *args)
        _at_exit.append((callback, args))


def watch_imports(finder: Any) -> None:
    """Put ``finder`` first on sys.meta_path, unless it is on it already."""
    if finder not in sys.meta_path:
        sys.meta_path.insert(0, finder)


def stop_watching(finder: Any) -> None:
    """Take ``finder`` off sys.meta_path (nothing if it is not on it)."""
    try:
        sys.meta_path.remove(finder)
    except ValueError:
        pass


def spec_after(finder: Any, name: str, path: Any, target: Any) -> Any:
    """The spec the finders after ``finder`` on sys.meta_path give (nothing runs)."""
    finders = list(sys.meta_path)
    for other in finders[finders.index(finder) + 1:] if finder in finders else finders:
        find = getattr(other, "find_spec", None)
        spec = find(name, path, target) if find is not None else None
        if spec is not None:
            return spec
    return None
