"""The rows that apply to the installed torch, turned into one value: the Plan.

``prepare(facts, options)`` computes everything install() will change, without
changing anything: the changes in order, a status Row per line, and each row's
typed effects (up-front calls, context carrying, the per-thread slots, values
later rows read).  install() applies a Plan in one place (_install._apply) and
uninstall() undoes its changes in reverse.  Every row is planned the same way
(machinery.changes.RowKind): option off, not needed on this torch, waiting for
its module, or ``row.plan(ctx)``.  A new kind of row is a new RowKind and rows
in its feature's module, placed in rows.ROWS; this file does not change.
"""
from __future__ import annotations

import os
import types
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..machinery import import_watch, writers
from ..machinery.changes import Change, Context, NotCovered, Outcome, Planned, Row
from ..machinery.per_thread_globals import PerThread, Planner
from . import facts as facts_module
from . import rows
from .facts import TorchFacts, UnsupportedTorchError
from .options import Option, Options


@dataclass(frozen=True)
class Plan:
    """What install() applies: the rows planned this time, in ROWS order."""
    changes: list[Change]
    rows: list[Row]                       # status rows of the rows planned this time
    defaults: tuple[tuple, tuple]         # the new slots' defaults and factories (_core)
    initial: list[tuple[Any, str, Any]]   # (module, name, value): the installing thread's values
    up_front: list[Callable[[], None]]    # one-time registrations, made before any change
    carry_context: bool                   # records note their thread's Context
    later: Later                          # every row's status so far, and what waits


@dataclass
class Later:
    """What the rows planned so far decided (status rows by index in ROWS), what
    they provided, and the per-thread planner a later prepare() goes on from
    for the rows that wait for their module (import_watch)."""
    planner: Planner = field(default_factory=Planner)
    shown: dict[int, list[Row]] = field(default_factory=dict)  # index in ROWS -> its rows
    provided: dict[str, Any] = field(default_factory=dict)

    @property
    def rows(self) -> list[Row]:
        return [r for index in sorted(self.shown) for r in self.shown[index]]

    @property
    def waiting(self) -> dict[str, list[Row]]:
        """module -> the rows applied when it is imported."""
        found: dict[str, list[Row]] = {}
        for r in self.rows:
            if r.outcome is Outcome.WAITING:
                found.setdefault(r.detail, []).append(r)
        return found

    def decided(self, index: int) -> bool:
        return index in self.shown and all(r.outcome is not Outcome.WAITING
                                           for r in self.shown[index])

    def checkpoint(self) -> tuple[dict[int, list[Row]], dict[str, Any]]:
        return dict(self.shown), dict(self.provided)

    def stand_down(self, before: tuple[dict[int, list[Row]], dict[str, Any]], why: str) -> None:
        """A Plan made from ``before`` (a checkpoint) could not be applied: its
        rows, waiting then, are not covered now (``why``, formatted with the
        module they waited for) and what they provided is gone."""
        shown, provided = before
        self.shown = {index: [replace(r, outcome=Outcome.NOT_COVERED, detail=why.format(r.detail))
                              if r.outcome is Outcome.WAITING else r for r in rows]
                      for index, rows in shown.items()}
        self.provided.clear()
        self.provided.update(provided)

    def option_rows(self, option: Option) -> list[Row]:
        return [r for r in self.rows if r.option is option]


def prepare(facts: TorchFacts, options: Options, later: Later | None = None) -> Plan:
    """Everything install() will change, computed without changing anything.
    UnsupportedTorchError where a required row (the FX flag's) cannot be
    followed, or for concurrent_compiles where it was not stress-tested.

    Planned inside import_watch.no_imports, a row that would import a module
    waits for it (Outcome.WAITING); ``later`` (the last Plan's) plans those
    again once modules arrived, going on from the rows applied before."""
    if options.concurrent_compiles and (refusal := facts_module.concurrent_compiles_refusal(facts)):
        raise UnsupportedTorchError(refusal)
    later = later or Later()
    ctx = Context(facts, options, later.planner, _writes(options),
                  types.MappingProxyType(later.provided))
    planned_rows, changes, up_front, carry = [], [], [], False
    try:
        for index, row in enumerate(rows.ROWS):
            if later.decided(index):
                continue
            shown, planned = _plan(row, ctx)
            _check_provides(row, planned)
            later.shown[index] = shown
            later.provided.update(planned.provides)
            planned_rows += shown
            changes += planned.changes
            up_front += planned.up_front
            carry |= planned.carries_context and any(r.patched for r in shown)
    finally:
        later.planner.forget()
    # The per-thread globals' changes go first: the other rows wrap the code they leave.
    changes = later.planner.changes("per-thread") + changes
    defaults, initial = later.planner.defaults(), later.planner.initial()
    later.planner.emitted()
    return Plan(changes, planned_rows, defaults, initial, up_front, carry, later)


def _plan(row: Any, ctx: Context) -> tuple[list[Row], Planned]:
    """One row: its status rows (carrying its option) and what planning it gave."""
    planned = _planned(row, ctx)
    if row.required and planned.outcome is Outcome.NOT_COVERED:
        raise UnsupportedTorchError(planned.detail)
    shown = list(planned.rows) or row.report(planned.outcome, planned.detail)
    return [replace(r, option=row.option) for r in shown + list(planned.also)], planned


def _planned(row: Any, ctx: Context) -> Planned:
    if row.option is not None and not ctx.options.on(row.option):
        return Planned(rows=tuple(row.report(Outcome.OPTION_OFF)))
    try:
        if (why := row.needed(ctx.facts)) is not None:
            return Planned(rows=tuple(row.report(*why)))
        planned = row.plan(ctx)
    except import_watch.ModuleWaiting as e:  # nothing was planned: it waits for the module
        return Planned(rows=tuple(row.report(Outcome.WAITING, e.module)))
    except NotCovered as e:
        return Planned(outcome=Outcome.NOT_COVERED, detail=str(e))
    if not any(r.patched for r in planned.rows) and planned.outcome is not Outcome.PATCHED:
        return replace(planned, changes=(), up_front=(), provides={}, carries_context=False)
    return planned


def _check_provides(row: Any, planned: Planned) -> None:
    """A row provides only what its kind declares (rows.ROWS' order is checked
    against the declarations: tests/machinery)."""
    unexpected = set(planned.provides) - set(row.provides)
    if unexpected:
        raise TypeError(f"{type(row).__name__} provided {sorted(unexpected)} without declaring it")


def _writes(options: Options) -> dict[str, tuple]:
    """Every attribute write of the per-thread globals' names inside a def in
    the installed torch (machinery.writers)."""
    import torch
    names = tuple(row.name for row in rows.ROWS if isinstance(row, PerThread)
                  and (row.option is None or options.on(row.option)))
    root = os.path.dirname(torch.__file__)
    return writers.attribute_writes(root, os.path.join(root, "version.py"), names)
