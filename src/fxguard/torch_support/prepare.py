"""The rows that apply to the installed torch, turned into changes.

``prepare(facts, options)`` computes everything install() will change and a
Row per line of the plan, without changing anything; install() applies the
changes in order (machinery.originals) and uninstall() undoes them in reverse.
"""
from __future__ import annotations

import contextvars
import importlib
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Callable

from ..machinery import (codegen, compile_gate, exact_counters, import_watch, once, originals,
                         overlay, per_thread_attrs,
                         per_thread_patching, shared_lock, shared_window, writers)
from ..machinery.changes import Change, NotCovered, Outcome, Row
from ..machinery.per_thread_globals import Planner
from . import compile_once, config, device_guard, rows
from . import facts as facts_module
from .facts import MODULE_GLOBAL, TorchFacts, UnsupportedTorchError


@dataclass
class Prepared:
    changes: list[Change]
    rows: list[Row]
    defaults: tuple[tuple, tuple]         # the new slots' defaults and factories (_core)
    initial: list[tuple[Any, str, Any]]   # (module, name, value): the installing thread's values
    carry_context: bool                   # records note their thread's Context
    concurrent: list[Row]                 # the rows of option concurrent_compiles (also in rows)
    compile_once: compile_once.CompileOnce | None  # its counters, where the row is patched
    up_front: list[Callable[[], None]]    # one-time registrations, made before any change
    later: Later                          # what a later prepare() for waiting rows goes on from


@dataclass
class Later:
    """Rows that wait for their module (import_watch), and what planning them
    later goes on from: the per-thread planner, the rows already decided."""
    planner: Planner = field(default_factory=Planner)
    decided: set[tuple[str, str]] = field(default_factory=set)
    waiting: dict[str, list[Row]] = field(default_factory=dict)  # module -> its rows


def prepare(facts: TorchFacts, options: dict[str, bool], later: Later | None = None) -> Prepared:
    """Everything install() will change, computed without changing anything.
    UnsupportedTorchError where the FX flag's own row cannot be followed, or
    for concurrent_compiles where it was not stress-tested.

    Planned inside import_watch.no_imports, a row that would import a module
    waits for it (Outcome.WAITING); ``later`` (the last Prepared's) plans those
    again once modules arrived, going on from the rows applied before."""
    if options[rows.CONCURRENT] and (refusal := facts_module.concurrent_compiles_refusal()):
        raise UnsupportedTorchError(refusal)
    first = later is None
    later = later or Later()
    planner, plan = later.planner, _Sites(later.decided)
    readers_before = len(planner.reader_rows)
    guard_row, register = plan.one(device_guard.WHAT, device_guard.WHERE,
                                   device_guard.plan) if first else ([], None)
    writes = _writes(rows.PER_THREAD + (rows.CONCURRENT_PER_THREAD if options[rows.CONCURRENT] else ()))
    plan_rows = []
    for row in rows.PER_THREAD:
        plan_rows += plan.rows(_per_thread_what(row), row.where,
                               lambda row=row: _per_thread(planner, row, facts, writes))
    concurrent = []
    for row in rows.CONCURRENT_PER_THREAD:
        concurrent += plan.rows("per-thread global", row.where,
                                lambda row=row: _concurrent_per_thread(planner, row, options, writes))
    plan_rows += planner.reader_rows[readers_before:]
    changes = planner.changes("per-thread")
    for spec in rows.PATCHING:
        plan_rows += plan.rows("per-thread patching", spec.where, lambda spec=spec: _patching(spec, changes))
    for state in rows.CLASS_STATE:
        plan_rows += plan.rows("per-thread class state", state.where,
                               lambda state=state: _class_state(state, changes))
    carry_context = False
    for wrap in rows.WRAPPED:
        made = plan.rows(wrap.what, wrap.where, lambda wrap=wrap: _wrap(wrap, facts, options, planner, changes))
        carry_context |= any(r.patched for r in made) and wrap.carries_context
        plan_rows += made
    for cfg in rows.CONFIG_DEFAULTS:
        plan_rows += plan.rows(cfg.what, cfg.where, lambda cfg=cfg: _config_default(cfg, options, changes))
    for wrap in rows.THREADS:
        plan_rows += plan.rows(wrap.what, wrap.where,
                               lambda wrap=wrap: _wrap(wrap, facts, options, planner, changes))
    what, where, _ = rows.COMPILE_ONCE
    shared = []
    plan_rows += plan.rows(what, where, lambda: _compile_once(options, changes, shared))
    if first:  # with the option on, install() plans every row at once (nothing waits)
        concurrent += _concurrent(options, planner, changes, facts, once_per_code=bool(shared))
    plan_rows += guard_row
    defaults, initial = planner.defaults(), planner.initial()
    planner.emitted()
    later.waiting = {}
    for row in plan_rows + concurrent:
        if row.outcome is Outcome.WAITING:
            later.waiting.setdefault(row.detail, []).append(row)
        else:
            later.decided.add((row.what, row.where))
    return Prepared(changes, plan_rows + concurrent, defaults, initial, carry_context, concurrent,
                    shared[0] if shared else None, [register] if register else [], later)


class _Sites:
    """Each row planned once: a row decided before is skipped; one whose
    planning would import a module waits for it, having changed nothing."""

    def __init__(self, decided: set[tuple[str, str]]) -> None:
        self.decided = decided

    def rows(self, what: str, where: str, plan: Callable[[], Row | list[Row]]) -> list[Row]:
        if (what, where) in self.decided:
            return []
        try:
            out = plan()
        except import_watch.ModuleWaiting as e:
            return [Row(what, where, Outcome.WAITING, e.module)]
        return out if isinstance(out, list) else [out]

    def one(self, what: str, where: str, plan: Callable[[], tuple[Row, Any]]) -> tuple[list[Row], Any]:
        if (what, where) in self.decided:
            return [], None
        try:
            row, extra = plan()
        except import_watch.ModuleWaiting as e:
            return [Row(what, where, Outcome.WAITING, e.module)], None
        return [row], extra


def _per_thread_what(row: Any) -> str:
    return "FX-tracing flag" if row.flag else "per-thread global"


def _writes(per_thread: tuple) -> dict[str, tuple]:
    """Every attribute write of these globals' names inside a def in the installed torch."""
    import os

    import torch
    root = os.path.dirname(torch.__file__)
    return writers.attribute_writes(root, os.path.join(root, "version.py"),
                                    tuple(row.name for row in per_thread))


def _check_writers(row: Any, writes: dict[str, tuple]) -> None:
    """NotCovered where torch assigns the global in a function the row does not
    rewrite (a release fxguard has not seen): that write would be lost."""
    listed = {w.rsplit(".", 1)[1] for w in row.writers + row.or_writers}
    missed = writers.unlisted(writes.get(row.name, ()), listed)
    if missed:
        raise NotCovered(f"torch assigns {row.name} where fxguard does not rewrite it: "
                         f"{', '.join(missed[:3])}; it stays process-wide")


def _per_thread(planner: Planner, row: Any, facts: TorchFacts, writes: dict[str, tuple]) -> Row:
    what = _per_thread_what(row)
    if row.flag and facts.layout != MODULE_GLOBAL:
        return Row(what, row.where, Outcome.NOT_NEEDED, "torch keeps it per thread")
    try:
        _check_writers(row, writes)
        return Row(what, row.where, planner.add(row))
    except NotCovered as e:  # the planner is as it was before this row
        if row.flag:
            raise UnsupportedTorchError(str(e)) from None
        return Row(what, row.where, Outcome.NOT_COVERED, str(e))


def _class_state(state: Any, changes: list) -> Row:
    more, outcome = per_thread_patching.plan_class_state(state)
    changes += more
    return Row("per-thread class state", state.where, outcome)


def _patching(spec: Any, changes: list) -> Row:
    what = "per-thread patching"
    try:
        more, outcome = per_thread_patching.plan(spec)
    except NotCovered as e:
        return Row(what, spec.where, Outcome.NOT_COVERED, str(e))
    changes += more
    return Row(what, spec.where, outcome)


def _wrap(wrap: rows.Wrapped, facts: TorchFacts, options: dict, planner: Planner,
          changes: list) -> Row:
    """The row's swaps, all or none."""
    if wrap.option and not options[wrap.option]:
        return Row(wrap.what, wrap.where, Outcome.OPTION_OFF)
    if (why := wrap.needed(facts)) is not None:
        return Row(wrap.what, wrap.where, *why)
    made: list[Change] = []
    for swap in reversed(wrap.swaps):  # the first is in place last, once what it relies on is
        fn = _function(swap.where)
        if fn is None or not set(swap.params) <= set(fn.__code__.co_varnames):
            where = "on this torch" if swap.where.startswith("torch") else \
                f"on this Python ({swap.where})"
            return Row(wrap.what, wrap.where, Outcome.NOT_AVAILABLE, where)
        # What the body calls as inner: fn's code as the other rows leave it,
        # in a function object of its own (not a record of originals).
        namespace = types.SimpleNamespace(inner=codegen.shadow_function(fn, planner.code_for(fn)))
        for name, make in swap.helpers:
            setattr(namespace, name, make())
        made += codegen.swap_code(wrap.what, fn, swap.body, namespace)
    overlays = _overlays(wrap)
    if overlays is None:
        return Row(wrap.what, wrap.where, Outcome.NOT_AVAILABLE)
    if any(swap.where.endswith("install_config_module") for swap in wrap.swaps):
        config.rescan_later()  # modules converted before the hook: found by one scan
    changes += overlays + made
    return Row(wrap.what, wrap.where, Outcome.PATCHED)


def _function(where: str) -> types.FunctionType | None:
    """The plain function at ``where`` (a contextmanager's generator function)."""
    try:
        _, _, fn = originals.resolve_path(where)
    except (ImportError, AttributeError):
        return None
    while fn is not None and not isinstance(fn, types.FunctionType):
        fn = getattr(fn, "__wrapped__", None)
    if isinstance(fn, types.FunctionType) and "__wrapped__" in vars(fn):
        fn = fn.__wrapped__  # contextmanager: the generator function
    return fn if isinstance(fn, types.FunctionType) else None


def _overlays(wrap: rows.Wrapped) -> list[Change] | None:
    """Changes making the row's windowed config entries honour overlay.window();
    None if one is missing."""
    if wrap.windowed is None:
        return []
    module, names = wrap.windowed
    entries = getattr(importlib.import_module(module), "_config", {})
    if any(name not in entries for name in names):
        return None
    return [Change(wrap.what, entries[name], "__class__",
                   overlay.overlaid(entries[name], "user_override")) for name in names]


def _config_default(cfg: rows.ConfigDefault, options: dict, changes: list) -> Row:
    """Change a torch config's default, for every thread.  (Assigning the config
    where it is per thread would only reach the calling thread's context; a
    value a user assigned explicitly still wins, as it should.)"""
    if cfg.option and not options[cfg.option]:
        return Row(cfg.what, cfg.where, Outcome.OPTION_OFF)
    try:
        owner, name, _ = originals.resolve_path(cfg.where)
    except (ImportError, AttributeError):
        owner = name = None
    entry = getattr(owner, "_config", {}).get(name) if owner is not None else None
    if entry is None or not hasattr(entry, "default"):
        return Row(cfg.what, cfg.where, *cfg.missing)
    changes.append(Change(cfg.what, entry, "default", cfg.value))
    return Row(cfg.what, cfg.where, Outcome.PATCHED)


def _compile_once(options: dict, changes: list, shared: list) -> Row:
    """The row; its CompileOnce (counters) goes to ``shared`` where patched."""
    what, where, option = rows.COMPILE_ONCE
    if not options[option]:
        return Row(what, where, Outcome.OPTION_OFF)
    state = compile_once.CompileOnce()
    try:
        changes += compile_once.changes(state)
    except compile_once.ContractChanged as e:  # a release fxguard has not seen: stock there
        return Row(what, where, Outcome.NOT_COVERED, f"{e}; dynamo's callback runs as stock")
    except compile_once.NotAvailable as e:
        return Row(what, where, Outcome.NOT_AVAILABLE, f"{e.where} ({e})")
    shared.append(state)
    return Row(what, where, Outcome.PATCHED)


# -- option concurrent_compiles --------------------------------------------------

def _concurrent_per_thread(planner: Planner, row: Any, options: dict,
                           writes: dict[str, tuple]) -> Row:
    what = "per-thread global"
    if not options[rows.CONCURRENT]:
        return Row(what, row.where, Outcome.OPTION_OFF)
    module = importlib.import_module(row.module)
    if isinstance(vars(module).get(row.name), (contextvars.ContextVar, threading.local)):
        return Row(what, row.where, Outcome.NOT_NEEDED, "torch keeps it per thread")
    try:
        _check_writers(row, writes)
        return Row(what, row.where, planner.add(row))
    except NotCovered as e:
        return Row(what, row.where, Outcome.NOT_COVERED, str(e))


def _concurrent(options: dict, planner: Planner, changes: list, facts: TorchFacts, *,
                once_per_code: bool) -> list[Row]:
    """The option's rows after the per-thread globals (planned with the others).
    ``once_per_code``: the compile-once row is patched (its wait per code object
    keeps one function's compiles one at a time)."""
    on = options[rows.CONCURRENT]
    off = Outcome.OPTION_OFF
    out = [Row("per-thread class attribute", r.where, off) for r in rows.CLASS_ATTRS] if not on \
        else _class_attrs(planner, changes)
    for attr in rows.INSTANCE_ATTRS:
        what = "per-thread instance attribute"
        if not on:
            out.append(Row(what, attr.where, off))
            continue
        more, outcome = per_thread_attrs.plan_instance_attr(what, attr)
        changes += more
        out.append(Row(what, attr.where, outcome))
    if on:
        made, outcomes = once.plan("once-lock", rows.ONCE, planner.code_for)
        changes += made
    else:
        outcomes = [(r, off, "") for r in rows.ONCE]
    out += [Row("once-lock", r.where, outcome, detail) for r, outcome, detail in outcomes]
    out += [_wrap(wrap, facts, options, planner, changes) for wrap in rows.ID_LOCKS]
    for window in rows.SHARED_WINDOWS:
        what = "shared window"
        if not on:
            out.append(Row(what, window.target, off))
            continue
        more, outcome, detail = shared_window.plan(what, window, planner.code_for)
        changes += more
        out.append(Row(what, window.target, outcome, detail))
    for where in rows.EXACT_COUNTERS:
        if not on:
            out.append(Row("exact counters", where, off))
            continue
        more, outcome, detail = exact_counters.plan("exact counters", where)
        changes += more
        out.append(Row("exact counters", where, outcome, detail))
    out += _shared_lock(rows.COMPILE_LOCK, options, planner, changes, facts,  # last: the lock opens
                        per_code=not once_per_code)
    return out


def _class_attrs(planner: Planner, changes: list) -> list[Row]:
    what = "per-thread class attribute"
    try:
        made, outcomes = per_thread_attrs.plan_class_attrs(what, rows.CLASS_ATTRS, planner.code_for)
    except NotCovered as e:
        return [Row(what, r.where, Outcome.NOT_COVERED, str(e)) for r in rows.CLASS_ATTRS]
    changes += made
    return [Row(what, r.where, outcome, detail) for r, outcome, detail in outcomes]


def _shared_lock(row: rows.SharedLockRow, options: dict, planner: Planner, changes: list,
                 facts: TorchFacts, *, per_code: bool) -> list[Row]:
    """The lock becomes a SharedLock; the functions hold it shared for their
    whole body (where config is process-wide, in an overlay window too; with
    ``per_code``, the frame's code object's lock too)."""
    config_row = "config per compile", ", ".join(rows.COMPILE_CONFIG)
    if not options[row.option]:
        return [Row(row.what, row.where, Outcome.OPTION_OFF), Row(*config_row, Outcome.OPTION_OFF)]
    try:
        owner, name, current = originals.resolve_path(row.where)
    except (ImportError, AttributeError):
        return [Row(row.what, row.where, Outcome.NOT_AVAILABLE)]
    if type(current) is not type(threading.RLock()):
        return [Row(row.what, row.where, Outcome.NOT_COVERED,
                    f"{name} is a {type(current).__name__}, not the RLock fxguard knows")]
    functions = [_function(where) for where in row.shared_in]
    if None in functions or per_code and any(  # PER_CODE_HELD reads the frame argument
            "frame" not in fn.__code__.co_varnames[:fn.__code__.co_argcount] for fn in functions):
        return [Row(row.what, row.where, Outcome.NOT_AVAILABLE)]
    lock, keyed = shared_lock.SharedLock(), compile_gate.CompileGate() if per_code else None
    made = [Change(row.what, owner, name, lock)]
    held, config = rows.PER_CODE_HELD if per_code else "", Row(*config_row, Outcome.NOT_NEEDED,
                                                               "config per thread")
    if not facts.config_per_thread:
        made += _overlay_every_entry(config_row[0])
        held, config = held + rows.WINDOW_HELD, Row(*config_row, Outcome.PATCHED)
    body = rows.SHARED_BODY.replace("{held}", held)
    for fn in functions:
        namespace = types.SimpleNamespace(
            inner=codegen.shadow_function(fn, planner.code_for(fn)), lock=lock, per_code=keyed,
            window=overlay.window)
        made += codegen.swap_code(row.what, fn, body, namespace)
    changes += made
    return [Row(row.what, row.where, Outcome.PATCHED), config]


def _overlay_every_entry(label: str) -> list[Change]:
    """Every entry of the compile's config modules honours overlay.window()."""
    made = []
    for module in rows.COMPILE_CONFIG:
        for entry in getattr(importlib.import_module(module), "_config", {}).values():
            made.append(Change(label, entry, "__class__", overlay.overlaid(entry, "user_override")))
    return made
