"""A process-wide setting that overlapping windows share.  Machinery: knows no torch names.

Some library code turns a process-wide setting on for the length of a window
with a context manager that saves the old value on entry and puts it back on
exit.  Two threads' windows overlapping interleave those saves and restores:
A saves "off", B saves "on" (A's), A puts "off" back while B is still inside,
B puts "on" back, for good.

A ``SharedWindow`` row names such a context manager (``target``, called at the
sites) and the functions that call it; those are recompiled from source so the
call goes to a ``CountedWindow`` instead: the first thread in enters one real
window, the last one out exits it.  While any thread is inside, the setting is
on for every thread (as it was); once none is, it is back as it was before.
"""
from __future__ import annotations

import importlib
import threading
import types
from dataclasses import dataclass
from typing import Any, Callable

from . import originals, rewrite
from .changes import Change, Context, NotCovered, Outcome, Planned, RowKind

VIEW = "__fxguard_windows__"  # what the rewritten functions call through, in their module


@dataclass(frozen=True)
class SharedWindow(RowKind):
    target: str                  # 'pkg.mod.context_manager', as the call sites spell it
    used_in: tuple[str, ...]     # 'pkg.mod.function' calling it (closures made there included)
    option: Any = None  # the option it follows (None: always on)
    what = "shared window"

    @property
    def where(self) -> str:
        return self.target

    def plan(self, ctx: Context) -> Planned:
        changes, outcome, detail = plan(self.what, self, ctx.code_for)
        return Planned(changes, outcome, detail)

    @property
    def name(self) -> str:
        return self.target.replace(".", "__")


class CountedWindow:
    """Stands in for ``factory(*args)`` at the call sites: one real window for
    every overlapping one (the first caller's arguments)."""

    def __init__(self, factory: Callable[..., Any]) -> None:
        self.factory, self.lock = factory, threading.Lock()
        self.depth, self.active = 0, None

    def __call__(self, *args: Any, **kwargs: Any) -> "_Entered":
        return _Entered(self, args, kwargs)


class _Entered:
    __slots__ = ("window", "args", "kwargs")

    def __init__(self, window: CountedWindow, args: tuple, kwargs: dict) -> None:
        self.window, self.args, self.kwargs = window, args, kwargs

    def __enter__(self) -> None:
        w = self.window
        with w.lock:
            if w.depth == 0:
                active = w.factory(*self.args, **self.kwargs)
                active.__enter__()
                w.active = active
            w.depth += 1

    def __exit__(self, *exc: Any) -> None:
        w = self.window
        with w.lock:
            w.depth -= 1
            if w.depth == 0:
                active, w.active = w.active, None
                active.__exit__(None, None, None)


def plan(label: str, row: SharedWindow, code_for: Callable[[Any], Any]
         ) -> tuple[list[Change], Outcome, str]:
    try:
        _, _, factory = originals.resolve_path(row.target)
    except (ImportError, AttributeError):
        return [], Outcome.NOT_AVAILABLE, ""
    fns = [_function(path) for path in row.used_in]
    if None in fns:
        return [], Outcome.NOT_AVAILABLE, ""
    changes, views = [], {}
    for fn in fns:
        try:
            code, count = rewrite.redirect(fn, (), VIEW, {row.target: row.name})
        except rewrite.RewriteError as e:
            return [], Outcome.NOT_COVERED, str(e)
        if count == 0:
            return [], Outcome.NOT_COVERED, f"{fn.__qualname__} no longer calls {row.target}"
        if code_for(fn) is not fn.__code__:
            raise NotCovered(f"{fn.__qualname__} is rewritten by another row too")
        views.setdefault(fn.__module__, types.SimpleNamespace())
        changes.append(Change(label, fn, "__code__", code))
    window = CountedWindow(factory)
    for module, view in views.items():
        setattr(view, row.name, window)
        changes.insert(0, Change(label, importlib.import_module(module), VIEW, view))
    return changes, Outcome.PATCHED, ""


def _function(path: str) -> types.FunctionType | None:
    try:
        _, _, fn = originals.resolve_path(path)
    except (ImportError, AttributeError):
        return None
    return fn if isinstance(fn, types.FunctionType) else None
