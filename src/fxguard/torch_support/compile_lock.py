"""Dynamo's compile_lock held shared by its frame callback (option
concurrent_compiles): the row kind and its row, ``ROWS``."""
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
from .options import Option

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


# The callback's whole body holds the lock shared.  One function's compiles
# still run one at a time, as stock: three threads compiling one graph at once
# deadlocked in torch (grad-accumulator mutex against the GIL under anomaly
# mode).  Where the compile-once row is patched, its wait per code object (it
# wraps this callback, outside the lock) is what keeps them one at a time, and
# the threads that missed together share that compile; with it off, the
# callback also takes its code object's turn at the same compile gate
# (machinery.compile_gate, PER_CODE_HELD), sharing no result.  A callback
# inside a compile (a compiled function called while tracing) is a re-entry,
# as with stock's RLock: it takes neither, so it cannot wait for a code another
# thread's compile holds while that one waits for this one's.
SHARED_BODY = """\
    if {ns}.lock._is_owned():
        return {ns}.inner({call})
    with {ns}.lock.shared(){held}:
        return {ns}.inner({call})
"""
PER_CODE_HELD = ", {ns}.per_code.held(frame.f_code)"
# torch <= 2.11 (config process-wide): a compile also runs in an overlay window
# (machinery.overlay) over every entry of these config modules, so that its
# `with config.patch(...)` (inductor's own: inplace_buffers, unroll thresholds,
# padding, ...; torch.compile's options and mode) stays in its thread.
# Interleaved, two compiles' patches otherwise crossed and stayed for good.
WINDOW_HELD = ", {ns}.window()"
COMPILE_CONFIG = ("torch._dynamo.config", "torch._inductor.config", "torch._functorch.config")

# Dynamo's frame callback holds compile_lock (with _disable_current_modes())
# across a whole compile: every thread waits out every other's compile.  Held
# shared instead, compiles of distinct graphs overlap; its own `with
# compile_lock:` inside is a re-entry.  torch's other holders keep their meaning
# (exclusive): reset() and reset_code_caches() wait until no compile runs,
# compile_fx's lazy backward compile likewise (run inside a compile, as with
# eager backward, it is a re-entry, as with stock's RLock).  Same-graph threads
# still compile once where fxguard's compile-once row waits them.
ROWS = (SharedLockRow("compile lock", "torch._dynamo.convert_frame.compile_lock",
                      ("torch._dynamo.convert_frame.CatchErrorsWrapper.__call__",),  # 2.10+
                      SHARED_BODY, PER_CODE_HELD, WINDOW_HELD, COMPILE_CONFIG,
                      option=Option.CONCURRENT_COMPILES),)
