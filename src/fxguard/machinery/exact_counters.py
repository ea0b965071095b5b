"""Statistics counters that stay exact when threads count at once.
Machinery: knows no torch names.

A library's ``counters = collections.defaultdict(collections.Counter)`` is
updated everywhere as ``counters[group][key] += 1``: a read, an add and a write.
With the GIL a thread switch happens only where Python code runs (a function's
start, a call's end, a backward jump), and two steps of that statement run
Python code: a new group calls ``Counter.__init__`` (inside the defaultdict's
insert), a new key calls ``Counter.__missing__``.  A switch there loses the
other thread's count (or its whole new group).

``ExactCounter`` is a Counter whose every step of ``c[k] += n`` is C (its
``__missing__`` and ``__init__`` are C callables), so under the GIL no other
thread runs between the read and the write: no lock, nothing to wait for.
``plan`` makes a counters dict use it: its factory, and the class of the
counters already in it (``__class__`` assignment: same layout).  On a
free-threaded build with the GIL off this is not enough (docs/limits.md).
"""
from __future__ import annotations

import collections
import functools
import operator
from dataclasses import dataclass
from typing import Any

from . import originals
from .changes import Change, Context, Outcome, Planned, RowKind


class ExactCounter(collections.Counter):
    """collections.Counter whose ``c[k] += n`` runs no Python code.  Made with
    no argument or a mapping (``dict.__init__``: a Counter's own ``copy()`` and
    ``__reduce__`` pass a mapping), not with an iterable of elements."""
    __slots__ = ()
    __init__ = dict.__init__
    # operator.countOf((), key) == 0, in C; staticmethod: not bound to the counter
    __missing__ = staticmethod(functools.partial(operator.countOf, ()))


@dataclass(frozen=True)
class ExactCounters(RowKind):
    """A defaultdict(Counter) whose ``+= 1`` steps stay exact under threads."""
    where: str
    option: Any = None  # the option it follows (None: always on)
    what = "exact counters"

    def plan(self, ctx: Context) -> Planned:
        changes, outcome, detail = plan(self.what, self.where)
        return Planned(changes, outcome, detail)


def plan(label: str, where: str) -> tuple[list[Change], Outcome, str]:
    """Changes making the defaultdict(Counter) at ``where`` count exactly."""
    try:
        _, _, counters = originals.resolve_path(where)
    except (ImportError, AttributeError):
        return [], Outcome.NOT_AVAILABLE, ""
    if not isinstance(counters, collections.defaultdict) or \
            counters.default_factory is not collections.Counter:
        return [], Outcome.NOT_AVAILABLE, "(not a defaultdict(Counter) on this torch)"
    changes = [Change(label, counters, "default_factory", ExactCounter)]
    changes += [Change(label, group, "__class__", ExactCounter)
                for group in list(counters.values()) if type(group) is collections.Counter]
    return changes, Outcome.PATCHED, ""
