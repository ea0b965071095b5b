"""Module globals served per thread: machinery that knows no torch names.

A ``PerThread`` row names one module global.  A ``Planner`` turns rows into
changes (``Planner.add`` each row, then ``Planner.changes``), computed without
touching anything:

1. each module whose code uses a per-thread global gets ``__fxguard_tls__``,
   a ``_core.SlotView`` mapping those names to slots of the thread record;
2. every function of the owning module that uses the global (found in its
   code, nested code included) is recompiled from source with the global
   read and written through that view (``rewrite.redirect``); so are the
   named writers in other modules that assign ``module.name``;
3. the owning module gets a PEP 562 ``__getattr__`` so that
   ``module.name`` and ``from module import name`` give the calling
   thread's value (chained to a ``__getattr__`` the module already had);
4. last, the module global itself is deleted.

A row may also name *readers*: functions of the owning module that only
return the global (or, kind ``"symbolic"``, the FX flag and not
``is_compiling()``).  Their calls are answered by a ``_core.Reader`` in C,
with no Python frame: through the function's vectorcall pointer where the
interpreter honours it (``_core.VECTORCALL_READERS``), else from code that
calls ``Reader.read``.  Only a function whose source body is the one the row
states is served; any other keeps its rewritten code (correct, slower), and
``Planner.reader_rows`` says which.

A row whose global is missing is reported ``not available on this torch``;
one whose module source has a use that no rewritten function covers is
refused, since a silent miss would leave a process-wide read behind.

Rows added after ``changes()`` was applied (their module was imported after
install(), machinery.import_watch) go on in the same Planner: their slots
follow, and the next ``changes()`` lists only what is new (a module's view
and a function's code again where they gained names).
"""
from __future__ import annotations

import contextvars
import gc
import importlib
import inspect
import sys
import threading
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from .. import _core
from . import codegen, rewrite, writers
from .changes import Change, Context, NotCovered, Outcome, Planned, Row, RowKind
from . import originals
from .originals import MISSING

VIEW = codegen.TLS


@dataclass(frozen=True)
class FastReader:
    """A function of a row's module that only returns the row's global."""
    name: str
    kind: str = "value"      # "value": the global; "symbolic": FX flag and not is_compiling()
    code_route: bool = True  # False: not where code must call Reader.read (3.11), as for a
                             # function dynamo inlines (it cannot trace Reader.read)
    body: str = "return {name}"  # its source body (ast.unparse, "; " between statements,
                                 # docstring dropped), {name}: the row's global
    first: str | None = None     # a global of the module the body calls before answering

    def matches(self, fn: types.FunctionType, name: str) -> bool:
        """Whether fn's source body is the one this reader answers for."""
        return rewrite.def_body(fn.__code__) == self.body.format(name=name)

    @property
    def served(self) -> bool:
        """Whether this Python serves it from C."""
        return bool(_core.VECTORCALL_READERS) or self.code_route


@dataclass(frozen=True)
class PerThread(RowKind):
    """One module global that becomes per-thread (a row kind)."""
    module: str
    name: str
    default: Any = None                  # each thread's initial value (immutable)
    factory: Callable[[], Any] | None = None  # or: a fresh initial value per thread
    writers: tuple[str, ...] = ()        # 'pkg.mod.func' in other modules assigning module.name
    or_writers: tuple[str, ...] = ()     # an older torch's writers, where `writers` are absent
    aliases: tuple[str, ...] = ()        # modules whose functions read a ``from module import name``
    flag: bool = False                   # kept in the record's C flag (the FX-tracing flag)
    readers: tuple[FastReader, ...] = ()  # functions of the module answered in C (see above)
    option: Any = None  # the option it follows (None: always on)
    needed: Callable[[Any], tuple[Outcome, str] | None] = RowKind.needed

    @property
    def where(self) -> str:
        return f"{self.module}.{self.name}"

    @property
    def what(self) -> str:
        return "FX-tracing flag" if self.flag else "per-thread global"

    @property
    def required(self) -> bool:  # type: ignore[override]
        """The FX flag: a library whose flag fxguard cannot follow is unsupported."""
        return self.flag

    def plan(self, ctx: Context) -> Planned:
        """Added to ctx.planner (its changes come from Planner.changes, first of all)."""
        if isinstance(vars(importlib.import_module(self.module)).get(self.name),
                      (contextvars.ContextVar, threading.local)):
            return Planned(outcome=Outcome.NOT_NEEDED,
                           detail="kept per thread already (a ContextVar or threading.local)")
        # A write in a function fxguard does not rewrite (a release it has not
        # seen) would set a module attribute nobody reads.
        missed = writers.unlisted(ctx.writes.get(self.name, ()),
                                  set(self.writers + self.or_writers), self.module.split(".")[0])
        if missed:
            raise NotCovered(f"{self.where} is assigned where fxguard does not rewrite it: "
                             f"{', '.join(missed[:3])}; it stays process-wide")
        before = len(ctx.planner.reader_rows)
        outcome = ctx.planner.add(self)  # the planner is as it was if this raises
        return Planned(outcome=outcome, also=tuple(ctx.planner.reader_rows[before:]))


READER_KINDS = {"value": _core.READ_VALUE, "symbolic": _core.READ_SYMBOLIC}
READER = "fast reader"  # the rows of reader functions, as status() names them


RELOADED: set[str] = set()  # modules importlib.reload ran again (import_watch)


def functions_in(module: types.ModuleType) -> Iterator[types.FunctionType]:
    """Every function a module defines: top level, in its classes, under wrappers;
    in a module that was reloaded, also the functions its earlier run defined
    (other modules imported them by name, and they read the same globals)."""
    def own(value: Any) -> bool:
        return getattr(value, "__module__", None) == module.__name__

    def defined_here(fn: types.FunctionType) -> bool:  # not a functools.wraps wrapper
        return own(fn) and fn.__code__.co_filename == getattr(module, "__file__", None)

    values = list(vars(module).values())
    if module.__name__ in RELOADED:
        values += [f for f in gc.get_referrers(vars(module)) if isinstance(f, types.FunctionType)
                   and f.__globals__ is vars(module) and "<locals>" not in f.__qualname__]
    values += [v for cls in values if isinstance(cls, type) and own(cls) for v in vars(cls).values()]
    seen = set()
    for value in values:
        # Only these are looked into: a getattr on any other object could run
        # its __getattr__ (one of inductor's handlers warns there).
        if isinstance(value, (staticmethod, classmethod, types.MethodType)):
            value = value.__func__
        elif isinstance(value, property):
            value = value.fget
        for _ in range(10):                              # contextmanager, wraps, dynamo's disable()
            if isinstance(value, types.FunctionType) and defined_here(value) \
                    and id(value) not in seen:
                seen.add(id(value))
                yield value
            try:
                value = object.__getattribute__(value, "__dict__").get("__wrapped__")
            except AttributeError:
                value = None
            if value is None:
                break


class Planner:
    """Collects what the rows need; ``changes()`` lists them in apply order."""

    def __init__(self) -> None:
        self.slots: list[PerThread] = []
        self.views: dict[str, dict[str, int]] = {}     # module -> {name: slot}
        self.targets: dict[int, tuple[types.FunctionType, set, dict]] = {}  # fn, names, attributes
        self.getattrs: dict[str, dict[str, int]] = {}  # owning module -> {name: slot}
        self.deletes: list[tuple[types.ModuleType, str]] = []
        self.readers: dict[int, tuple[types.FunctionType, tuple[FastReader, Any]]] = {}
        self.reader_rows: list[Row] = []  # one per reader function, as status() shows it
        self._emitted: dict[Any, Any] = {}  # what changes() listed, to list only what is new
        self._code_made: dict[int, types.CodeType] = {}  # id(fn) -> the code changes() gave it
        self._first_slot = 0                 # the first slot of the next changes()
        # Within one prepare() (which changes nothing): each module's functions and each
        # code's names, listed once for all its rows (18 rows read 6 modules); forget() ends
        # it, and so does an import meanwhile (a module's import may patch another's functions).
        self._functions: dict[int, tuple[types.ModuleType, int, list[types.FunctionType]]] = {}
        self._names: dict[types.CodeType, frozenset[str]] = {}

    def forget(self) -> None:
        """The end of a prepare(): modules may change before the next one."""
        self._functions.clear()
        self._names.clear()

    def _functions_in(self, module: types.ModuleType) -> list[types.FunctionType]:
        held = self._functions.get(id(module))
        if held is None or held[0] is not module or held[1] != len(sys.modules):
            held = self._functions[id(module)] = (module, len(sys.modules), list(functions_in(module)))
        return held[2]

    def _uses(self, code: types.CodeType, name: str) -> bool:
        """rewrite.global_users([code], name), the code's names collected once."""
        names = self._names.get(code)
        if names is None:
            found, stack = set(), [code]
            while stack:
                c = stack.pop()
                found.update(c.co_names)
                stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]
            names = self._names[code] = frozenset(found)
        return name in names

    def add(self, row: PerThread) -> Outcome:
        """Plan one row: PATCHED or NOT_AVAILABLE (its global is absent).
        Raises NotCovered (or what planning it raised, import_watch.ModuleWaiting),
        and then the plan is as it was before the row."""
        saved = self._state()
        try:
            return self._add(row)
        except BaseException:
            (self.slots, self.views, self.targets, self.getattrs, self.deletes) = saved
            raise

    def _state(self) -> tuple:
        """A copy of what _add changes (function and module objects shared)."""
        return (list(self.slots), {m: dict(n) for m, n in self.views.items()},
                {k: (f, set(n), dict(a)) for k, (f, n, a) in self.targets.items()},
                {m: dict(n) for m, n in self.getattrs.items()}, list(self.deletes))

    def _add(self, row: PerThread) -> Outcome:
        owner = importlib.import_module(row.module)
        if row.name not in vars(owner):
            return Outcome.NOT_AVAILABLE
        slot = _core.FLAG_SLOT if row.flag else len([r for r in self.slots if not r.flag])
        self.slots.append(row)
        users = self._redirect_users(owner, row, slot)
        _check_covered(owner, row.name, users)
        for alias in row.aliases:
            self._redirect_users(importlib.import_module(alias), row, slot)
        for path in self._writers_of(row):
            self._redirect_writer(path, row, slot)
        self.getattrs.setdefault(row.module, {})[row.name] = slot
        self.deletes.append((owner, row.name))
        self._add_readers(owner, row, slot, users)
        return Outcome.PATCHED

    def _add_readers(self, owner: types.ModuleType, row: PerThread, slot: int, users: list) -> None:
        """Serve each reader function by the first FastReader of its name whose body it has."""
        for name in dict.fromkeys(r.name for r in row.readers):
            fn, where = vars(owner).get(name), f"{row.module}.{name}"
            if fn not in users:
                continue  # absent on this torch, or no longer reads the global
            candidates = [r for r in row.readers if r.name == name]
            if not all(r.served for r in candidates):
                self.reader_rows.append(Row(READER, where, Outcome.NOT_NEEDED,
                                            "dynamo inlines it (rewritten code on this Python)"))
                continue
            reader = next((r for r in candidates if r.matches(fn, row.name)), None)
            if reader is None or not _takes_no_arguments(fn):
                self.reader_rows.append(Row(READER, where, Outcome.NOT_COVERED,
                                            "its body is not the row's (rewritten code serves it)"))
                continue
            self.reader_rows.append(Row(READER, where, Outcome.PATCHED))
            self.readers[id(fn)] = (fn, (reader, _core.Reader(READER_KINDS[reader.kind], slot,
                                                              first=reader.first)))

    def _view(self, module: str, row: PerThread, slot: int) -> None:
        names = self.views.setdefault(module, {})
        if names.get(row.name, slot) != slot:
            raise NotCovered(f"{module}: two per-thread globals named {row.name}")
        names[row.name] = slot

    def _redirect_users(self, module: types.ModuleType, row: PerThread, slot: int) -> list:
        users = []
        for fn in self._functions_in(module):
            if self._uses(fn.__code__, row.name) and \
                    self._target(fn, names={row.name}):
                self._view(module.__name__, row, slot)
                users.append(fn)
        return users

    def _writers_of(self, row: PerThread) -> tuple[str, ...]:
        """row.writers, or row.or_writers where torch has none of the former."""
        if row.or_writers and all(_find_function(p) is None for p in row.writers):
            return row.or_writers
        return row.writers

    def _redirect_writer(self, path: str, row: PerThread, slot: int) -> None:
        module_name = path.rpartition(".")[0]
        fn = _find_function(path)
        if fn is None:
            raise NotCovered(f"writer {path} not found")
        if not self._target(fn, attributes={row.where: row.name}):
            raise NotCovered(f"writer {path} no longer writes {row.where}")
        self._view(module_name, row, slot)

    def _target(self, fn: types.FunctionType, names: set = frozenset(),
                attributes: dict | None = None) -> bool:
        """Add names/attributes to redirect in fn; whether fn uses any of them."""
        try:
            _, count = rewrite.redirect(fn, names, VIEW, attributes)
        except rewrite.RewriteError as e:
            raise NotCovered(str(e)) from None
        if count and fn.__code__ is not self._code_made.get(
                id(fn), originals.get_original(fn, "__code__")):
            # Another row changed it since (a row applied before this one's module
            # came): recompiled from source, this row would undo that row's change.
            raise NotCovered(f"{fn.__qualname__} was changed by a row applied before its "
                             "module's; it stays process-wide")
        if count:
            _, all_names, all_attributes = self.targets.setdefault(id(fn), (fn, set(), {}))
            all_names |= set(names)
            all_attributes.update(attributes or {})
        return count > 0

    def code_for(self, fn: types.FunctionType) -> types.CodeType:
        """The code fn will have once the per-thread changes are applied."""
        if id(fn) not in self.targets:
            return fn.__code__
        _, names, attributes = self.targets[id(fn)]
        code = rewrite.redirect(fn, names, VIEW, attributes)[0]
        if id(fn) in self.readers:
            spec, reader = self.readers[id(fn)][1]
            if _core.VECTORCALL_READERS:  # the Reader finds itself as the last constant
                return code.replace(co_consts=code.co_consts + (reader,))
            first = f"    {spec.first}()\n" if spec.first else ""  # code calls Reader.read
            return codegen.wrapper_code(fn, f"{first}    return {codegen.namespace_name(fn)}()\n")
        return code

    def initial(self) -> list[tuple[types.ModuleType, str, Any]]:
        """(module, name, value) of the rows the next changes() lists: what the
        installing (or importing) thread starts with, its own state: the row's
        factory run in this thread (which may read the thread's own state),
        else its default.  Never the module global's value now: before
        install() that is process-wide, so it holds whatever another thread's
        trace or with-block set at that moment."""
        rows = {(r.module, r.name): r for r in self.slots}
        out = []
        for owner, name in self.deletes[self._emitted.get("deletes", 0):]:
            row = rows[(owner.__name__, name)]
            out.append((owner, name, row.factory() if row.factory is not None else row.default))
        return out

    def defaults(self) -> tuple[tuple, tuple]:
        """The defaults and factories of the slots the next changes() adds."""
        rows = [r for r in self.slots if not r.flag][self._first_slot:]
        return (tuple(r.default for r in rows), tuple(r.factory for r in rows))

    def changes(self, label: str) -> list[Change]:
        """What is new since the last call, in apply order."""
        done = self._emitted
        out = []
        for module, names in self.views.items():
            if done.get(("view", module)) != names:
                out.append(Change(label, importlib.import_module(module), VIEW,
                                  _core.SlotView(names)))
        readers = [(key, fn, reader) for key, (fn, (_, reader)) in self.readers.items()
                   if ("reader", key) not in done]
        if not _core.VECTORCALL_READERS:  # the code route: the reader is the function's namespace
            out += [Change(label, sys.modules[fn.__module__], codegen.namespace_name(fn), reader.read)
                    for _, fn, reader in readers]
        for key, (fn, names, attributes) in self.targets.items():
            if done.get(("code", key)) != (names, attributes, key in self.readers):
                self._code_made[key] = self.code_for(fn)
                out.append(Change(label, fn, "__code__", self._code_made[key]))
        if _core.VECTORCALL_READERS:
            out += [Change(label, reader, "function", fn) for _, fn, reader in readers]
        for module, names in self.getattrs.items():
            if done.get(("getattr", module)) != names:
                owner = importlib.import_module(module)
                out.append(Change(label, owner, "__getattr__",
                                  _module_getattr(owner, names, vars(owner).get("__getattr__"))))
        out += [Change(label, owner, name, MISSING)
                for owner, name in self.deletes[done.get("deletes", 0):]]
        return out

    def emitted(self) -> None:
        """What changes(), defaults() and initial() listed is applied: the next
        calls list only what rows added after it need."""
        done = self._emitted
        done.update({("view", m): dict(n) for m, n in self.views.items()})
        done.update({("code", k): (set(n), dict(a), k in self.readers)
                     for k, (_, n, a) in self.targets.items()})
        done.update({("reader", k): True for k in self.readers})
        done.update({("getattr", m): dict(n) for m, n in self.getattrs.items()})
        done["deletes"] = len(self.deletes)
        self._first_slot = len([r for r in self.slots if not r.flag])


def _find_function(path: str) -> types.FunctionType | None:
    """'pkg.mod.qualname' -> that function of the module, or None."""
    module_name, _, qualname = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    return next((f for f in functions_in(module) if f.__qualname__ == qualname), None)


def _takes_no_arguments(fn: Any) -> bool:
    code = getattr(fn, "__code__", None)
    return isinstance(fn, types.FunctionType) and code.co_argcount == 0 and \
        code.co_kwonlyargcount == 0 and not code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)


def _module_getattr(module: types.ModuleType, names: dict[str, int], chained: Any) -> Callable:
    """PEP 562 hook: ``module.name`` is the calling thread's value.  The module
    keeps its exact type, which dynamo requires of modules it imports."""
    view = _core.SlotView(names)

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(view, name)
        if chained is not None:
            return chained(name)
        raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")

    __getattr__.__module__ = module.__name__
    __getattr__.__qualname__ = "__getattr__"
    return __getattr__


def _check_covered(module: types.ModuleType, name: str, users: list) -> None:
    """Every use of the global inside a def of the module's source lies in a
    rewritten function; else some code would still read the process-wide one."""
    lines = rewrite.uses_in_defs(module.__file__, name)
    spans = [rewrite.def_span(fn.__code__) for fn in users]
    missed = [n for n in lines if not any(a <= n <= b for a, b in spans)]
    if missed:
        raise NotCovered(f"{module.__name__}.{name} is also used at line(s) "
                         f"{', '.join(map(str, missed[:5]))}, in code fxguard does not rewrite")
