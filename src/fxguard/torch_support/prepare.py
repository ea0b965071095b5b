"""The rows that apply to the installed torch, turned into changes.

``prepare(facts, options)`` computes everything install() will change and a
Row per line of the plan, without changing anything; install() applies the
changes in order (machinery.originals) and uninstall() undoes them in reverse.
Every row is planned the same way (machinery.changes.RowKind): option off,
not needed on this torch, waiting for its module, or ``row.plan(ctx)``.  A new
kind of row is a new RowKind and rows in rows.ROWS; this file does not change.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..machinery import import_watch, writers
from ..machinery.changes import Change, Context, NotCovered, Outcome, Planned, Row
from ..machinery.per_thread_globals import PerThread, Planner
from . import facts as facts_module
from . import rows
from .facts import TorchFacts, UnsupportedTorchError

if TYPE_CHECKING:
    from .compile_once import CompileOnce


@dataclass
class Prepared:
    changes: list[Change]
    rows: list[Row]
    defaults: tuple[tuple, tuple]         # the new slots' defaults and factories (_core)
    initial: list[tuple[Any, str, Any]]   # (module, name, value): the installing thread's values
    carry_context: bool                   # records note their thread's Context
    concurrent: list[Row]                 # the rows of option concurrent_compiles (also in rows)
    compile_once: CompileOnce | None      # its counters, where the row is patched
    up_front: list[Callable[[], None]]    # one-time registrations, made before any change
    later: Later                          # what a later prepare() for waiting rows goes on from


@dataclass
class Later:
    """Rows that wait for their module (import_watch), and what planning them
    later goes on from: the per-thread planner, the rows already decided."""
    planner: Planner = field(default_factory=Planner)
    decided: set[int] = field(default_factory=set)               # indices in rows.ROWS
    waiting: dict[str, list[Row]] = field(default_factory=dict)  # module -> its rows


def prepare(facts: TorchFacts, options: rows.Options, later: Later | None = None) -> Prepared:
    """Everything install() will change, computed without changing anything.
    UnsupportedTorchError where a required row (the FX flag's) cannot be
    followed, or for concurrent_compiles where it was not stress-tested.

    Planned inside import_watch.no_imports, a row that would import a module
    waits for it (Outcome.WAITING); ``later`` (the last Prepared's) plans those
    again once modules arrived, going on from the rows applied before."""
    if options.concurrent_compiles and (refusal := facts_module.concurrent_compiles_refusal(facts)):
        raise UnsupportedTorchError(refusal)
    later = later or Later()
    ctx = Context(facts, options, later.planner, _writes(options))
    planned_rows, changes, concurrent = [], [], []
    later.waiting = {}
    for index, row in enumerate(rows.ROWS):
        if index in later.decided:
            continue
        shown, made = _plan(row, ctx)
        if all(r.outcome is not Outcome.WAITING for r in shown):
            later.decided.add(index)
        for r in shown:
            if r.outcome is Outcome.WAITING:
                later.waiting.setdefault(r.detail, []).append(r)
        ctx.carry_context |= row.carries_context and any(r.patched for r in shown)
        planned_rows += shown
        changes += made
        if row.option == rows.CONCURRENT:
            concurrent += shown
    # The per-thread globals' changes go first: the other rows wrap the code they leave.
    changes = later.planner.changes("per-thread") + changes
    defaults, initial = later.planner.defaults(), later.planner.initial()
    later.planner.emitted()
    return Prepared(changes, planned_rows, defaults, initial, ctx.carry_context, concurrent,
                    ctx.compile_once, ctx.up_front, later)


def _plan(row: Any, ctx: Context) -> tuple[list[Row], list[Change]]:
    """One row: its status rows and its changes (none unless patched)."""
    if row.option is not None and not ctx.options[row.option]:
        return row.report(Outcome.OPTION_OFF), []
    try:
        if (why := row.needed(ctx.facts)) is not None:
            return row.report(*why), []
        planned = row.plan(ctx)
    except import_watch.ModuleWaiting as e:  # nothing was planned: it waits for the module
        return row.report(Outcome.WAITING, e.module), []
    except NotCovered as e:
        planned = Planned(outcome=Outcome.NOT_COVERED, detail=str(e))
    if row.required and planned.outcome is Outcome.NOT_COVERED:
        raise UnsupportedTorchError(planned.detail)
    shown = list(planned.rows) or row.report(planned.outcome, planned.detail)
    return shown + list(planned.also), list(planned.changes)


def _writes(options: rows.Options) -> dict[str, tuple]:
    """Every attribute write of the per-thread globals' names inside a def in
    the installed torch (machinery.writers)."""
    import torch
    names = tuple(row.name for row in rows.ROWS if isinstance(row, PerThread)
                  and (row.option is None or options[row.option]))
    root = os.path.dirname(torch.__file__)
    return writers.attribute_writes(root, os.path.join(root, "version.py"), names)
