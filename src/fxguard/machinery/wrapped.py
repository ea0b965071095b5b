"""Functions whose code runs a body around the original: a lock, a window, the
thread's config.  A row kind: ``Wrapped``, one or more ``Swap``s, all or none.

Each function keeps its identity (codegen.swap_code); its body calls the
original as ``{ns}.inner`` (the code the per-thread globals leave it, in a
function object of its own) and reaches its helpers as ``{ns}.<name>``.
"""
from __future__ import annotations

import importlib
import types
from dataclasses import dataclass
from typing import Any, Callable

from . import codegen, originals, overlay
from .changes import Change, Context, Outcome, Planned, RowKind


@dataclass(frozen=True)
class Swap:
    """One function (``where``; a contextmanager's generator function is taken)
    whose code runs ``body``: ``{ns}.inner({call})`` is the original (as the
    other rows leave it), ``{ns}.<name>`` the helpers, each made by its factory."""
    where: str
    body: str
    helpers: tuple[tuple[str, Callable[[], Any]], ...] = ()
    params: tuple[str, ...] = ()  # parameters the body names; absent: not available


@dataclass(frozen=True)
class Wrapped(RowKind):
    what: str
    swaps: tuple[Swap, ...]       # the first names the row and is put in place last
    # None if this library needs the row, else (outcome, detail) saying why not
    needed: Callable[[Any], tuple[Outcome, str] | None] = RowKind.needed
    option: Any = None
    # (config module, entry names): entries whose user_override the window keeps per thread
    windowed: tuple[str, tuple[str, ...]] | None = None
    carries_context: bool = False  # patched: records note their thread's Context
    up_front: Callable[[], None] | None = None  # run by install() before it changes anything
    guards: tuple[str, ...] = ()  # 'pkg.mod.name' of the state its lock guards (for surveys)

    @property
    def where(self) -> str:
        return self.swaps[0].where

    def plan(self, ctx: Context) -> Planned:
        made: list[Change] = []
        for swap in reversed(self.swaps):  # the first is in place last, once what it relies on is
            fn = plain_function(swap.where)
            if fn is None or not set(swap.params) <= set(fn.__code__.co_varnames):
                where = "on this torch" if swap.where.startswith("torch") else \
                    f"on this Python ({swap.where})"
                return Planned(outcome=Outcome.NOT_AVAILABLE, detail=where)
            namespace = types.SimpleNamespace(inner=codegen.shadow_function(fn, ctx.code_for(fn)))
            for name, make in swap.helpers:
                setattr(namespace, name, make())
            made += codegen.swap_code(self.what, fn, swap.body, namespace)
        overlays = self._overlays()
        if isinstance(overlays, Planned):  # the row stands down
            return overlays
        return Planned(overlays + made, carries_context=self.carries_context,
                       up_front=(self.up_front,) if self.up_front is not None else ())

    def _overlays(self) -> list[Change] | Planned:
        """Changes making the windowed config entries honour overlay.window(),
        or why the row stands down."""
        if self.windowed is None:
            return []
        module, names = self.windowed
        entries = getattr(importlib.import_module(module), "_config", {})
        if any(name not in entries for name in names):
            return Planned(outcome=Outcome.NOT_AVAILABLE)
        if not all(overlay.can_overlay(entries[name], "user_override") for name in names):
            return Planned(outcome=Outcome.NOT_COVERED,
                           detail=f"{module} keeps plain values, which fxguard cannot keep per thread")
        return [Change(self.what, entries[name], "__class__",
                       overlay.overlaid(entries[name], "user_override")) for name in names]


def plain_function(where: str) -> types.FunctionType | None:
    """The plain function at ``where`` (a contextmanager's generator function)."""
    try:
        _, _, fn = originals.resolve_path(where)
    except (ImportError, AttributeError):
        return None
    if isinstance(fn, types.MethodType):  # a classmethod read from its class
        fn = fn.__func__
    while fn is not None and not isinstance(fn, types.FunctionType):
        fn = getattr(fn, "__wrapped__", None)
    if isinstance(fn, types.FunctionType) and "__wrapped__" in vars(fn):
        fn = fn.__wrapped__  # contextmanager: the generator function
    return fn if isinstance(fn, types.FunctionType) else None
