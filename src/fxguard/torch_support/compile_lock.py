"""Dynamo's compile_lock held shared by its frame callback (a row kind, option
concurrent_compiles): rows.COMPILE_LOCK says why."""
from __future__ import annotations

import importlib
import threading
import types
from dataclasses import dataclass
from typing import Any

from ..machinery import codegen, compile_gate, overlay, shared_lock
from ..machinery.changes import Change, Context, Outcome, Planned, Row, RowKind
from ..machinery.originals import resolve_path
from ..machinery.wrapped import plain_function

CONFIG_ROW = "config per compile"


@dataclass(frozen=True)
class SharedLockRow(RowKind):
    """A process-wide RLock (``where``) becomes a machinery SharedLock: every
    ``with lock:`` keeps its meaning (exclusive: it waits for every holder),
    while the functions in ``shared_in`` run their whole body holding it
    shared, so several threads are inside them at once.  ``body`` with
    ``{held}``: what else the body holds (``per_code_held`` where no
    compile-once row gives one compile per code object; ``window_held`` and an
    overlay over every entry of ``config_modules`` where config is process-wide)."""
    what: str
    where: str
    shared_in: tuple[str, ...]
    body: str
    per_code_held: str
    window_held: str
    config_modules: tuple[str, ...]
    option: Any = None
    needs = ("compile_once",)  # where compile once is patched, it keys compiles per code

    def report(self, outcome: Outcome, detail: str = "") -> list[Row]:
        return [Row(self.what, self.where, outcome, detail),
                Row(CONFIG_ROW, ", ".join(self.config_modules), outcome, detail)]

    def plan(self, ctx: Context) -> Planned:
        try:
            owner, name, current = resolve_path(self.where)
        except (ImportError, AttributeError):
            return Planned(rows=(Row(self.what, self.where, Outcome.NOT_AVAILABLE),))
        if type(current) is not type(threading.RLock()):
            return Planned(rows=(Row(self.what, self.where, Outcome.NOT_COVERED,
                                     f"{name} is a {type(current).__name__}, not the RLock "
                                     "fxguard knows"),))
        per_code = ctx.provided.get("compile_once") is None
        functions = [plain_function(where) for where in self.shared_in]
        if None in functions or per_code and any(  # per_code_held reads the frame argument
                "frame" not in fn.__code__.co_varnames[:fn.__code__.co_argcount]
                for fn in functions):
            return Planned(rows=(Row(self.what, self.where, Outcome.NOT_AVAILABLE),))
        lock, keyed = shared_lock.SharedLock(), compile_gate.CompileGate() if per_code else None
        made = [Change(self.what, owner, name, lock)]
        held = self.per_code_held if per_code else ""
        config = Row(CONFIG_ROW, ", ".join(self.config_modules), Outcome.NOT_NEEDED,
                     "config per thread")
        if not ctx.facts.config_per_thread:
            entries = [entry for module in self.config_modules
                       for entry in getattr(importlib.import_module(module), "_config", {}).values()]
            if not all(overlay.can_overlay(entry, "user_override") for entry in entries):
                return Planned(rows=(Row(self.what, self.where, Outcome.NOT_COVERED,
                                         "this torch's config keeps plain values, which fxguard "
                                         "cannot keep per compile; compiles run one at a time"),))
            # Every entry of the compile's config modules honours overlay.window().
            made += [Change(CONFIG_ROW, entry, "__class__", overlay.overlaid(entry, "user_override"))
                     for entry in entries]
            held += self.window_held
            config = Row(CONFIG_ROW, ", ".join(self.config_modules), Outcome.PATCHED)
        body = self.body.replace("{held}", held)
        for fn in functions:
            namespace = types.SimpleNamespace(inner=codegen.shadow_function(fn, ctx.code_for(fn)),
                                              lock=lock, per_code=keyed, window=overlay.window)
            made += codegen.swap_code(self.what, fn, body, namespace)
        return Planned(made, rows=(Row(self.what, self.where, Outcome.PATCHED), config))
