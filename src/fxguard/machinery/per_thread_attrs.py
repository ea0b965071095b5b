"""Class and instance attributes served per thread.  Machinery: knows no torch names.

- ``ClassAttr``: a class attribute that a library swaps for the length of a
  context (``Cls.attr = new`` ... ``Cls.attr = old``, or
  ``patch.object(Cls, "attr", new)``) and reads through the class or its
  instances.  A descriptor in the class dict answers ``Cls.attr`` and
  ``obj.attr`` (subclasses included) with the calling thread's value; the
  writers are recompiled from source (``rewrite.redirect``) so that their
  ``Cls.attr = v`` goes to the calling thread's value, and their patch.object
  call patches only the calling thread's, instead of replacing the descriptor.
- ``InstanceAttr``: an attribute of a process-wide singleton that one thread
  sets, reads back and restores (``self.stack = ...``).  A data descriptor on
  its class makes every read and write of it the calling thread's.

Values are kept in a ``threading.local`` per attribute; a thread starts from
the row's default (or a fresh empty value).  ``uninstall()`` puts the class attributes
back (``originals``); what threads had set goes with the descriptors.
"""
from __future__ import annotations

import importlib
import threading
import types
from dataclasses import dataclass
from typing import Any, Callable

from . import originals, rewrite
from .changes import Change, Context, GroupKind, NotCovered, Outcome, Planned, RowKind
from .per_thread_globals import functions_in

VIEW = "__fxguard_attrs__"  # what the rewritten writers assign through, in their module


@dataclass(frozen=True)
class ClassAttr:
    where: str                         # 'pkg.mod.Cls.attr'
    writers: tuple[str, ...]           # 'pkg.mod.Cls.method' of the functions that assign it
    default: Any = None                # each thread's initial value (immutable)
    empty: bool = False                # or: an empty one of the install-time value's type
    spellings: tuple[str, ...] = ()    # how writers also name it ('cls.attr' in classmethods)
    # modules whose functions swap it with patch.object(<target>, "attr", new), and
    # how those calls spell the class ('FlexibleLayout', 'ir.FlexibleLayout')
    patched_in: tuple[str, ...] = ()
    patch_targets: tuple[str, ...] = ()

    @property
    def spelled(self) -> tuple[str, ...]:
        """How the writers name it: 'Cls.attr', and the row's other spellings."""
        return (".".join(self.where.split(".")[-2:]),) + self.spellings


@dataclass(frozen=True)
class ClassAttrs(GroupKind):
    """Class attributes made per thread, planned together (one function may
    write several)."""
    entries: tuple[ClassAttr, ...]
    option: Any = None  # the option it follows (None: always on)
    what = "per-thread class attribute"

    def plan_entries(self, ctx: Context) -> tuple[list[Change], list[tuple[ClassAttr, Outcome, str]]]:
        return plan_class_attrs(self.what, self.entries, ctx.code_for)


@dataclass(frozen=True)
class InstanceAttr(RowKind):
    where: str                         # 'pkg.mod.singleton.attr'
    factory: Callable[[], Any] = lambda: None  # each thread's initial value
    option: Any = None  # the option it follows (None: always on)
    what = "per-thread instance attribute"

    def plan(self, ctx: Context) -> Planned:
        changes, outcome = plan_instance_attr(self.what, self)
        return Planned(changes, outcome)


class ThreadValue:
    """Non-data descriptor: ``Cls.attr`` and ``obj.attr`` give the calling
    thread's value.  (An assignment ``Cls.attr = v`` would replace it: the
    writers assign through the view.)"""
    __slots__ = ("local", "default", "factory", "name")

    def __init__(self, name: str, default: Any, factory: Callable[[], Any] | None) -> None:
        self.local, self.name = threading.local(), name
        self.default, self.factory = default, factory

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        try:
            return self.local.value
        except AttributeError:
            value = self.local.value = self.factory() if self.factory else self.default
            return value

    def set(self, value: Any) -> None:
        self.local.value = value

    def __repr__(self) -> str:
        return f"<fxguard per-thread class attribute {self.name}>"


class ThreadInstanceValue(ThreadValue):
    """Data descriptor: reads and writes through any instance are the calling
    thread's (the instance's own ``__dict__`` entry is shadowed); read through
    the class, the descriptor itself."""
    __slots__ = ()

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        return self if obj is None else ThreadValue.__get__(self, obj, owner)

    def __set__(self, obj: Any, value: Any) -> None:
        self.local.value = value


class AttrView:
    """What rewritten writers read and assign: ``view.<name>`` is a descriptor's
    value for the calling thread; ``view.patch(name, new)`` stands in for
    ``patch.object(Cls, attr, new)``."""
    __slots__ = ("_values",)

    def __init__(self, values: dict[str, ThreadValue]) -> None:
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name: str) -> Any:
        return self._values[name].__get__(None)

    def __setattr__(self, name: str, value: Any) -> None:
        self._values[name].set(value)

    def patch(self, name: str, new: Any) -> "ThreadPatch":
        return ThreadPatch(self._values[name], new)


class ThreadPatch:
    """``patch.object(Cls, attr, new)`` for the calling thread only: a context
    manager (its value is ``new``), or a decorator whose every call is one."""
    __slots__ = ("value", "new", "saved")

    def __init__(self, value: ThreadValue, new: Any) -> None:
        self.value, self.new = value, new

    def __enter__(self) -> Any:
        self.saved = self.value.__get__(None)
        self.value.set(self.new)
        return self.new

    def __exit__(self, *exc: Any) -> None:
        self.value.set(self.saved)

    def __call__(self, fn: Callable) -> Callable:
        import functools
        value, new = self.value, self.new

        @functools.wraps(fn)
        def patched(*args: Any, **kwargs: Any) -> Any:
            with ThreadPatch(value, new):
                return fn(*args, **kwargs)
        return patched


def view_name(row: ClassAttr) -> str:
    return row.spelled[0].replace(".", "__")


class _Rewrites:
    """What each function's recompiled code redirects: assignments and patch calls."""

    def __init__(self) -> None:
        self.found: dict[int, tuple[types.FunctionType, dict[str, str], dict]] = {}

    def counts(self, fns: list, redirects: dict, patches: dict) -> list[int]:
        """How many uses each function has (RewriteError: its source does not match)."""
        return [rewrite.redirect(fn, (), VIEW, redirects, patches)[1] for fn in fns]

    def add(self, fns: list, redirects: dict, patches: dict) -> None:
        for fn in fns:
            _, r, p = self.found.setdefault(id(fn), (fn, {}, {}))
            r.update(redirects)
            p.update(patches)


def plan_class_attrs(label: str, attrs: tuple[ClassAttr, ...], code_for: Callable[[Any], Any]
                     ) -> tuple[list[Change], list[tuple[ClassAttr, Outcome, str]]]:
    """Changes for the rows, and each row's outcome (with a detail); changes nothing.
    ``code_for(fn)``: fn's code as the plan's other rows leave it (rewritten on top)."""
    changes: list[Change] = []
    outcomes: list[tuple[ClassAttr, Outcome, str]] = []
    views: dict[str, dict[str, ThreadValue]] = {}          # module -> {view name: descriptor}
    rewrites = _Rewrites()
    for row in attrs:
        try:
            owner, name, _ = originals.resolve_path(row.where)
        except (ImportError, AttributeError):
            outcomes.append((row, Outcome.NOT_AVAILABLE, ""))
            continue
        if not isinstance(owner, type) or name not in vars(owner) or \
                hasattr(type(vars(owner)[name]), "__get__"):  # a method, property, ...
            outcomes.append((row, Outcome.NOT_AVAILABLE, ""))
            continue
        writers = [function_at(path) for path in row.writers]
        if None in writers:
            missing = row.writers[writers.index(None)]
            outcomes.append((row, Outcome.NOT_COVERED, f"writer {missing} not found"))
            continue
        patchers = [fn for module in row.patched_in for fn in _naming(module, name)]
        redirects = {spelled: view_name(row) for spelled in row.spelled}
        patches = {(target, name): view_name(row) for target in row.patch_targets}
        try:
            counts = rewrites.counts(writers, redirects, {}) + \
                rewrites.counts(patchers, {}, patches)
        except rewrite.RewriteError as e:
            outcomes.append((row, Outcome.NOT_COVERED, str(e)))
            continue
        if not all(counts):
            fn = (writers + patchers)[counts.index(0)]
            outcomes.append((row, Outcome.NOT_COVERED,
                             f"{fn.__qualname__} uses {name} in a way fxguard does not follow"))
            continue
        value = ThreadValue(row.where, row.default,
                            type(vars(owner)[name]) if row.empty else None)
        for fn in writers + patchers:
            views.setdefault(fn.__module__, {})[view_name(row)] = value
        rewrites.add(writers, redirects, {})
        rewrites.add(patchers, {}, patches)
        changes.append(Change(label, owner, name, value))
        outcomes.append((row, Outcome.PATCHED, ""))
    made = [Change(label, importlib.import_module(m), VIEW, AttrView(v)) for m, v in views.items()]
    for fn, redirects, patches in rewrites.found.values():
        if code_for(fn) is not fn.__code__:
            raise NotCovered(f"{fn.__qualname__} is rewritten by another row too")
        made.append(Change(label, fn, "__code__",
                           rewrite.redirect(fn, (), VIEW, redirects, patches)[0]))
    return made + changes, outcomes


def _naming(module_name: str, attr: str) -> list[types.FunctionType]:
    """The functions of a module whose code (nested code included) has the
    string ``attr`` as a constant: those that name it in a patch.object call."""
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return []
    found = []
    for fn in functions_in(module):
        stack = [fn.__code__]
        while stack:
            code = stack.pop()
            if attr in code.co_consts:
                found.append(fn)
                break
            stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return found


def plan_instance_attr(label: str, row: InstanceAttr) -> tuple[list[Change], Outcome]:
    try:
        owner, name, _ = originals.resolve_path(row.where)
    except (ImportError, AttributeError):
        return [], Outcome.NOT_AVAILABLE
    cls = type(owner)
    if isinstance(owner, (type, types.ModuleType)) or name not in getattr(owner, "__dict__", {}) \
            or name in vars(cls):
        return [], Outcome.NOT_AVAILABLE
    value = ThreadInstanceValue(row.where, None, row.factory)
    value.set(vars(owner)[name])  # the installing thread keeps what it had
    return [Change(label, cls, name, value)], Outcome.PATCHED


def function_at(path: str) -> types.FunctionType | None:
    """The plain function at 'pkg.mod.Cls.name' (under staticmethod, contextmanager,
    functools.wraps), or None."""
    try:
        _, _, fn = originals.resolve_path(path)
    except (ImportError, AttributeError):
        return None
    fn = getattr(fn, "__func__", fn)
    for _ in range(5):
        if isinstance(fn, types.FunctionType) and "__wrapped__" not in vars(fn):
            return fn
        fn = getattr(fn, "__wrapped__", None)
    return None
