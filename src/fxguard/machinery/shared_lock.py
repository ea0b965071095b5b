"""A re-entrant lock that many threads may hold at once (shared) or one alone
(exclusive).  Machinery: knows no torch names.

It stands in for a library's process-wide ``threading.RLock`` whose one long
holder (a whole compile) should overlap with itself in other threads, while
every other ``with lock:`` keeps its meaning:

- ``with lock:`` / ``acquire()`` (the RLock interface) is exclusive: it waits
  until no thread holds the lock in any way, and holds off new shared holders
  meanwhile (so a steady stream of them cannot starve it);
- ``with lock.shared():`` waits only for an exclusive holder (or waiter);
- a thread that holds the lock in either way re-enters in either way at once:
  inside a shared hold, ``with lock:`` is as an RLock's re-entry is (it does not
  wait for the other shared holders, which would deadlock two of them doing it);
- ``_is_owned()``: whether the calling thread holds it in any way.

Waiting releases the GIL (``threading.Condition``); every field is guarded by
the condition's lock, so it needs no GIL either.  After ``fork()`` the child
keeps only the forking thread's holds.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

from . import process_hooks

_get_ident = threading.get_ident
_instances: weakref.WeakSet = weakref.WeakSet()


class SharedLock:
    __slots__ = ("_cond", "_holds", "_owner", "_exclusive_waiting", "_shared", "__weakref__")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._holds: dict[int, int] = {}       # thread ident -> depth, whichever way it holds
        self._owner: int | None = None          # the exclusive holder
        self._exclusive_waiting = 0
        self._shared = _Shared(self)
        _instances.add(self)

    # -- the RLock interface: exclusive ------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._acquire(True, blocking, timeout)

    def release(self) -> None:
        me = _get_ident()
        with self._cond:
            depth = self._holds.get(me)
            if not depth:
                raise RuntimeError("cannot release un-acquired lock")
            if depth > 1:
                self._holds[me] = depth - 1
                return
            del self._holds[me]
            if self._owner == me:
                self._owner = None
            self._cond.notify_all()

    def __enter__(self) -> bool:
        return self._acquire(True, True, -1)

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def _is_owned(self) -> bool:
        return _get_ident() in self._holds

    # -- shared ------------------------------------------------------------------

    def shared(self) -> "_Shared":
        """Context manager: hold the lock shared (re-entrant)."""
        return self._shared

    def state(self) -> dict[str, Any]:
        """Who holds it now: for status checks and tests."""
        with self._cond:
            return {"holders": len(self._holds), "exclusive": self._owner is not None,
                    "exclusive_waiting": self._exclusive_waiting}

    # -- inside ------------------------------------------------------------------

    def _free_for(self, exclusive: bool) -> bool:
        if exclusive:
            return not self._holds
        return self._owner is None and not self._exclusive_waiting

    def _acquire(self, exclusive: bool, blocking: bool, timeout: float) -> bool:
        me = _get_ident()
        with self._cond:
            depth = self._holds.get(me)
            if depth:  # held by this thread already, either way: re-entry
                self._holds[me] = depth + 1
                return True
            if not self._free_for(exclusive):
                if not blocking:
                    return False
                if exclusive:
                    self._exclusive_waiting += 1
                try:
                    got = self._cond.wait_for(lambda: self._free_for(exclusive),
                                              None if timeout < 0 else timeout)
                finally:
                    if exclusive:
                        self._exclusive_waiting -= 1
                        if not self._exclusive_waiting:
                            self._cond.notify_all()  # shared waiters held off by this one
                if not got:
                    return False
            self._holds[me] = 1
            if exclusive:
                self._owner = me
            return True

    def _after_fork_in_child(self) -> None:
        me = _get_ident()
        self._cond = threading.Condition(threading.Lock())
        self._holds = {me: self._holds[me]} if me in self._holds else {}
        self._owner = me if self._owner == me else None
        self._exclusive_waiting = 0


class _Shared:
    """``with lock.shared():`` (made once per lock: a ``with`` allocates nothing)."""
    __slots__ = ("_lock",)

    def __init__(self, lock: SharedLock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        self._lock._acquire(False, True, -1)

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()


def _after_fork() -> None:
    for lock in list(_instances):
        lock._after_fork_in_child()


process_hooks.after_fork_in_child(_after_fork)
