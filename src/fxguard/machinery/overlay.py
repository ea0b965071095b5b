"""Writes made inside a window stay in the writing thread.

Some state is one attribute shared by every thread (torch <= 2.11 keeps each
config entry's ``user_override`` that way), yet a function sets it only for
the length of a window of its own: it saves the value, sets its own, and puts
the old one back.  Two threads doing that interleave their saves and
restores, and a third thread compiling meanwhile reads the window's values.

``overlaid(obj, attr)`` gives a subclass of ``type(obj)`` whose ``attr`` is a
property: while the calling thread is inside ``window()``, its writes go to a
per-thread overlay that its reads see first; the overlay is gone when the
window closes.  Outside every window, and in every other thread, reads and
writes reach the shared value (kept in the instance ``__dict__`` as before).
Swapping ``obj.__class__`` to it, and back, is the whole patch: the object
keeps its identity and its shared value.  Knows no torch names.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

_MISSING: Any = object()


class _Windows(threading.local):
    overlay: dict[int, Any] | None = None  # id(obj) -> value, inside a window


_windows = _Windows()


@contextlib.contextmanager
def window() -> Iterator[None]:
    """Writes to overlaid attributes made by this thread inside stay inside.
    Nested windows see the outer one's writes; each takes its own back."""
    outer = _windows.overlay
    _windows.overlay = {} if outer is None else dict(outer)
    try:
        yield
    finally:
        _windows.overlay = outer


_classes: dict[tuple[type, str], type] = {}


def can_overlay(obj: object, attr: str) -> bool:
    """Whether overlaid(obj, attr) can be obj's class: an instance with a
    ``__dict__`` and that attribute (torch 2.5's config keeps plain values)."""
    return isinstance(getattr(obj, "__dict__", None), dict) and hasattr(obj, attr)


def overlaid(obj: object, attr: str) -> type:
    """The subclass of type(obj) whose ``attr`` honours window()."""
    base = type(obj)
    key = (base, attr)
    if key not in _classes:
        default = getattr(base, attr, _MISSING)  # a class-level default (dataclass field)

        def get(self: Any) -> Any:
            overlay = _windows.overlay
            if overlay is not None:
                value = overlay.get(id(self), _MISSING)
                if value is not _MISSING:
                    return value
            value = self.__dict__.get(attr, default)
            if value is _MISSING:
                raise AttributeError(attr)
            return value

        def set_(self: Any, value: Any) -> None:
            overlay = _windows.overlay
            if overlay is not None:
                overlay[id(self)] = value
            else:
                self.__dict__[attr] = value

        _classes[key] = type(base.__name__, (base,), {
            attr: property(get, set_, doc=f"{attr}: per thread inside fxguard windows"),
            "__module__": base.__module__, "__qualname__": base.__qualname__,
        })
    return _classes[key]
