"""One-time lazy set-up run exactly once when threads reach it together.
Machinery: knows no torch names.

A library's lazy set-up is usually a ``functools.cache``'d function: the cache
decides "first call", and two threads that both miss it (the first has not
returned yet) both run the body, registering everything twice.  Or it is a
plain function that guards itself (``if registry: return``), which a second
thread passes while the first is still filling the registry.

A ``Once`` row names one.  Its Python function (the one under the cache) keeps
its identity (``codegen.swap_code``: module attributes, ``from`` aliases and
the cache wrapper all stay) and its code runs the original body under one
re-entrant lock shared by every row (set-ups call each other; one lock has no
order to get wrong).  A thread that waited there while the body ran for the same
arguments gets that run's result instead of running it again (memo rows); a
call after the body finished, which only happens once the cache was cleared,
runs it as the library would.  A cache hit never reaches the lock.
"""
from __future__ import annotations

import threading
import types
from dataclasses import dataclass
from typing import Any

from . import codegen, originals
from .changes import Change, Context, GroupKind, Outcome


@dataclass(frozen=True)
class Once:
    where: str         # 'pkg.mod.name'
    memo: bool = True  # True: a functools.cache'd function; False: a self-guarding plain one
    guards: tuple[str, ...] = ()  # 'pkg.mod.name' of the state it fills (for surveys)


@dataclass(frozen=True)
class Onces(GroupKind):
    """One-time set-up functions, planned together (one lock)."""
    entries: tuple[Once, ...]
    option: Any = None  # the option it follows (None: always on)
    what = "once-lock"

    def plan_entries(self, ctx: Context) -> tuple[list[Change], list[tuple[Once, Outcome, str]]]:
        return plan(self.what, self.entries, ctx.code_for)


class OnceLock:
    """The lock every row's body runs under, and the results of finished runs."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.finished = 0                               # bodies finished, under the lock
        self.results: dict[tuple, tuple[int, Any]] = {}  # key -> (its finish number, result)


class OnceCall:
    """A swapped function's namespace: ``{ns}({call})`` runs the body once."""
    __slots__ = ("once", "inner", "memo", "index")

    def __init__(self, once: OnceLock, inner: types.FunctionType, memo: bool, index: int) -> None:
        self.once, self.inner, self.memo, self.index = once, inner, memo, index

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        once = self.once
        if not self.memo:
            with once.lock:
                return self.inner(*args, **kwargs)
        key = (self.index, args, tuple(sorted(kwargs.items())))
        arrived = once.finished
        with once.lock:
            done = once.results.get(key)
            if done is not None and done[0] > arrived:  # ran while this thread waited
                return done[1]
            result = self.inner(*args, **kwargs)
            once.finished += 1
            once.results[key] = (once.finished, result)
            return result


BODY = "    return {ns}({call})\n"


def plan(label: str, rows: tuple[Once, ...], code_for: Any
         ) -> tuple[list[Change], list[tuple[Once, Outcome, str]]]:
    """Changes for the rows, and each row's outcome; changes nothing.
    ``code_for(fn)``: fn's code as the plan's other rows leave it."""
    once, changes, outcomes = OnceLock(), [], []
    names: set[tuple[int, str]] = set()  # (id(globals), namespace name) already taken
    for index, row in enumerate(rows):
        try:
            _, _, found = originals.resolve_path(row.where)
        except (ImportError, AttributeError):
            outcomes.append((row, Outcome.NOT_AVAILABLE, ""))
            continue
        cached = hasattr(found, "cache_info") and hasattr(found, "__wrapped__")
        fn = found.__wrapped__ if cached else found
        if cached != row.memo or not isinstance(fn, types.FunctionType):
            shape = "a cached function" if row.memo else "a plain function"
            outcomes.append((row, Outcome.NOT_AVAILABLE, f"(not {shape} on this torch)"))
            continue
        inner = codegen.shadow_function(fn, code_for(fn))
        # init_once_fakemode-style closures share one qualname in one module:
        # each gets a namespace global of its own.
        name, n = codegen.namespace_name(fn), 1
        while (id(fn.__globals__), name) in names:
            n += 1
            name = f"{codegen.namespace_name(fn)[:-2]}_{n}__"
        names.add((id(fn.__globals__), name))
        changes += codegen.swap_code(label, fn, BODY, OnceCall(once, inner, row.memo, index),
                                     name=name)
        outcomes.append((row, Outcome.PATCHED, ""))
    return changes, outcomes
