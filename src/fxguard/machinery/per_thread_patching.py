"""Per-thread patching: a library's "patch this for the length of my trace",
made to patch only the calling thread.  Machinery: knows no torch names.

A ``Patching`` row names the functions through which a library patches class
attributes and module globals for the whole process, and the expressions
naming the patched dict or class in them (``frame_dict``, ``cls``).
``plan()`` computes the changes, without changing anything:

1. each such function is recompiled from source (``rewrite.view_containers``)
   so that its item, membership and attribute operations on those containers
   go through ``view(container)``: reads see the calling thread's values,
   writes set only the calling thread's;
2. a write puts a ``_core.Dispatch`` where the function lived (recorded in
   ``originals``); it runs the calling thread's value, or the original.  It
   stays while some thread patches that target, and the original comes back
   when the last one stops, so code that inspects the container (dynamo on
   ``math.sqrt``) sees stock torch while nobody traces.  Listed targets
   (``up_front``: every module call passes them) get theirs at install(),
   for good until uninstall();
3. a target listed in ``keep_identity`` keeps its function object (another
   library compares it by identity): its ``__code__`` becomes a trampoline
   into the Dispatch, which runs a shadow with the original code; module
   globals that hold the function in order to call the real one get the
   shadow.
"""
from __future__ import annotations

import builtins
import importlib
import threading
import types
from dataclasses import dataclass
from typing import Any, NamedTuple

from .. import _core
from . import codegen, originals, rewrite
from .changes import Change, Context, NotCovered, Outcome, Planned, RowKind
from .originals import MISSING
from .per_thread_globals import functions_in

VIEW = codegen.VIEW  # the view function, in the rewritten functions' module
LABEL = "per-thread patching"


@dataclass(frozen=True)
class Patching(RowKind):
    """The functions of one module that patch containers for the whole process."""
    module: str
    functions: tuple[str, ...]     # qualnames; their container operations go through the view
    containers: tuple[str, ...]    # source text naming the patched dict or class in them
    up_front: tuple[str, ...] = ()  # 'pkg.mod.Class.attr': dispatched from install() on
    # 'pkg.mod.Class.attr' -> module globals ('pkg.mod.name') that hold it to call the original
    keep_identity: tuple[tuple[str, tuple[str, ...]], ...] = ()
    what = LABEL

    @property
    def where(self) -> str:
        return f"{self.module}.{self.functions[0].split('.')[0]}"

    def plan(self, ctx: Context) -> Planned:
        changes, outcome = plan(self)
        return Planned(changes, outcome)


class Entry(NamedTuple):
    container: object  # the class, module or dict
    held: object       # what it holds while dispatched: the Dispatch, or the kept function
    dispatch: Any      # _core.Dispatch
    patch: Any         # the originals.Patch that placed it while threads patch it; None if for good


# (id(container), name) -> Entry, replaced as a whole by install() and uninstall().
_dispatchers: dict[tuple[int, str], Entry] = {}
_changing = threading.Lock()  # a target's overrides and its Dispatch's placement change together


# -- what the rewritten functions call ----------------------------------------

def view(container: Any) -> Any:
    """``container`` as the calling thread sees it (and patches it)."""
    if isinstance(container, (DictView, AttrView)):
        return container
    return DictView(container) if isinstance(container, dict) else AttrView(container)


class DictView:
    """A dict (module globals) seen by one thread: items, get, ``in``, ``[]``."""
    __slots__ = ("of",)

    def __init__(self, of: dict) -> None:
        self.of = of

    def __getitem__(self, name: str) -> Any:
        value = _thread_value(self.of, name)
        if value is MISSING:
            raise KeyError(name)
        return value

    def get(self, name: str, default: Any = None) -> Any:
        value = _thread_value(self.of, name)
        return default if value is MISSING else value

    def __contains__(self, name: object) -> bool:
        return _thread_value(self.of, name) is not MISSING

    def __setitem__(self, name: str, value: Any) -> None:
        _set(self.of, name, value)

    def __delitem__(self, name: str) -> None:
        _delete(self.of, name)

    def items(self) -> list[tuple[str, Any]]:
        pairs = [(k, _thread_value(self.of, k)) for k in list(self.of)]
        return [(k, v) for k, v in pairs if v is not MISSING]

    def keys(self) -> list[str]:
        return [k for k, _ in self.items()]

    def values(self) -> list[Any]:
        return [v for _, v in self.items()]


class AttrView:
    """A class or module seen by one thread: getattr, setattr, delattr, hasattr."""
    __slots__ = ("_of",)

    def __init__(self, of: object) -> None:
        object.__setattr__(self, "_of", of)

    def __getattribute__(self, name: str) -> Any:
        value = _thread_value(object.__getattribute__(self, "_of"), name)
        if value is MISSING:
            raise AttributeError(name)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        _set(object.__getattribute__(self, "_of"), name, value)

    def __delattr__(self, name: str) -> None:
        _delete(object.__getattribute__(self, "_of"), name)


def _raw(container: object, name: str) -> Any:
    own = container if isinstance(container, dict) else vars(container)
    return own.get(name, MISSING)


def _entry(container: object, name: str) -> Entry | None:
    """The Dispatch behind container.name, if it is still the one there."""
    entry = _dispatchers.get((id(container), name))
    if entry is None or entry.container is not container or _raw(container, name) is not entry.held:
        return None
    return entry


def _slots(container: object) -> object:
    """Where container.name lives: a module's names are its dict's items, one
    slot whether a library patches the module (``math.pow = f``) or its dict
    (``math.__dict__["pow"] = f``), so both find the same Dispatch."""
    return vars(container) if isinstance(container, types.ModuleType) else container


def _thread_value(container: object, name: str) -> Any:
    entry = _entry(_slots(container), name)
    if entry is not None:
        return _resolve(entry.dispatch, container)
    if isinstance(container, dict):
        value = container.get(name, MISSING)
    else:
        value = getattr(container, name, MISSING)
    if isinstance(value, _core.Dispatch):
        # Read while another thread withdrew one Dispatch and placed the next
        # (the entry we looked up was the old one): the one found answers.
        return _resolve(value, container)
    return value


def _resolve(d: Any, container: object) -> Any:
    """What ``d`` holds for the calling thread, never a Dispatch: a patcher
    that saved one and wrote it back would make it dispatch to itself."""
    value = d.override(_NONE)
    if value is _NONE:
        value = d.original
    if value is MISSING and not isinstance(container, dict):
        value = d.callee  # inherited from a base class or module fallback
    return value


_NONE = object()  # "this thread has no override"


def _set(container: object, name: str, value: Any) -> None:
    if isinstance(value, _core.Dispatch):
        value = _resolve(value, container)  # one read in a race: what it stood for
    container = _slots(container)
    with _changing:
        entry = _entry(container, name) or _dispatch_from_now_on(container, name)
        d = entry.dispatch
        if value is d.original or (d.original is MISSING and value is d.callee):
            d.reset()    # the thread puts back what everyone runs
            _maybe_withdraw(entry, name)
        else:
            d.set(value)


def _delete(container: object, name: str) -> None:
    container = _slots(container)
    with _changing:
        entry = _entry(container, name)
        if entry is None or entry.dispatch.original is not MISSING:
            raise RuntimeError(f"fxguard: deleting {name!r} for one thread only is not supported")
        entry.dispatch.reset()  # the thread's override of an absent name goes away
        _maybe_withdraw(entry, name)


def _dispatch_from_now_on(container: object, name: str) -> Entry:
    """Put a Dispatch where container.name lives (no thread patches it yet)."""
    original = _raw(container, name)
    d = _core.Dispatch(original, _callee(container, name, original),
                       method=isinstance(container, type))
    # Readers take no lock: until the Dispatch is in place they must find the
    # original in the container, so the entry is made before the patch...
    key = (id(container), name)
    _dispatchers[key] = Entry(container, d, d, None)
    patch = originals.apply(Change(LABEL, container, name, d))
    entry = _dispatchers[key] = Entry(container, d, d, patch)
    return entry


def _maybe_withdraw(entry: Entry, name: str) -> None:
    """The last thread stopped patching: put the original back, so that code
    which looks at the container (dynamo, on math.* or a wrapped global)
    sees what stock torch shows when nobody traces."""
    if entry.patch is not None and entry.dispatch.overriding == 0:
        originals.undo(entry.patch)  # ...and removed after the original is back
        del _dispatchers[(id(entry.container), name)]


def _callee(container: object, name: str, original: Any) -> Any:
    """What a thread without an override runs: the original, or for a name
    the container lacks, what the name resolves to without it."""
    if original is not MISSING:
        return original
    if isinstance(container, type):
        for base in container.__mro__[1:]:
            if name in vars(base):
                return vars(base)[name]
    elif hasattr(builtins, name):  # module globals shadowing a builtin
        return getattr(builtins, name)
    raise RuntimeError(f"fxguard: {name!r} is neither in {container!r} nor inherited")


# -- class attributes that are mutable state ------------------------------------

@dataclass(frozen=True)
class ClassState(RowKind):
    """A mutable class attribute every instance updates in place (a counter
    dict): each thread gets its own, made by ``factory``."""
    where: str                  # 'pkg.mod.Class.attr'
    factory: Any                # () -> a fresh value
    what = "per-thread class state"

    def plan(self, ctx: Context) -> Planned:
        changes, outcome = plan_class_state(self)
        return Planned(changes, outcome)


def plan_class_state(row: ClassState) -> tuple[list[Change], Outcome]:
    try:
        owner, name, _ = originals.resolve_path(row.where)
    except (ImportError, AttributeError):
        return [], Outcome.NOT_AVAILABLE
    if not isinstance(owner, type) or name not in vars(owner):
        return [], Outcome.NOT_AVAILABLE
    local = threading.local()

    def per_thread(_self: Any) -> Any:
        try:
            return local.value
        except AttributeError:
            local.value = row.factory()
            return local.value

    return [Change(LABEL, owner, name, property(per_thread, doc=f"per-thread {name} (fxguard)"))], \
        Outcome.PATCHED


# -- planning ------------------------------------------------------------------

def plan(spec: Patching) -> tuple[list[Change], Outcome]:
    """The changes for one row, and its status reason; changes nothing.
    Raises NotCovered if a listed function no longer patches its containers."""
    module = importlib.import_module(spec.module)
    found = {fn.__qualname__: fn for fn in functions_in(module)}
    if any(q not in found for q in spec.functions):
        return [], Outcome.NOT_AVAILABLE
    changes = [Change(LABEL, module, VIEW, view)]
    for qualname in spec.functions:
        try:
            code, count = rewrite.view_containers(found[qualname], spec.containers, VIEW)
        except rewrite.RewriteError as e:
            raise NotCovered(str(e)) from None
        if count == 0:
            raise NotCovered(f"{qualname} no longer patches {' or '.join(spec.containers)}")
        changes.append(Change(LABEL, found[qualname], "__code__", code))
    registry: dict[tuple[int, str], Entry] = {}
    kept = dict(spec.keep_identity)
    for where in spec.up_front:
        owner, name, _ = originals.resolve_path(where)
        original = _raw(owner, name)
        if where in kept:
            changes += _keep_identity(where, owner, name, original, kept[where], registry)
        else:
            d = _core.Dispatch(original, _callee(owner, name, original),
                               method=isinstance(owner, type))
            registry[(id(owner), name)] = Entry(owner, d, d, None)
            changes.append(Change(LABEL, owner, name, d))
    changes.append(Change(LABEL, _this_module(), "_dispatchers", registry))
    return changes, Outcome.PATCHED


def _keep_identity(where: str, owner: object, name: str, fn: Any, callers: tuple[str, ...],
                   registry: dict) -> list[Change]:
    """fn stays where it is; its code becomes a trampoline into the Dispatch
    (its namespace), which runs a shadow with the original code."""
    if not isinstance(fn, types.FunctionType):
        raise NotCovered(f"{where} is not a plain function")
    shadow = codegen.shadow_function(fn)
    d = _core.Dispatch(fn, shadow, method=True)
    registry[(id(owner), name)] = Entry(owner, fn, d, None)
    changes = codegen.swap_code(LABEL, fn, "    return {ns}({call})\n", d)
    for path in callers:
        holder, attr, current = originals.resolve_path(path)
        if current is not fn:
            raise NotCovered(f"{path} no longer holds {where}")
        changes.append(Change(LABEL, holder, attr, shadow))
    return changes


def _this_module() -> types.ModuleType:
    import sys
    return sys.modules[__name__]
