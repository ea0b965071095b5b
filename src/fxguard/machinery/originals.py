"""The one record of originals, so undo is exact (gevent.monkey's ``saved``).

Every change fxguard makes to another library is one ``Patch``: set attribute
``attr`` of ``owner`` (an item, for a plain dict owner: a module's globals; a
dict subclass, such as a defaultdict, is changed by attribute) to a new value, remembering
what was there, or that nothing was.  ``revert_all`` undoes them in reverse
order; ``get_original`` answers from the record.
"""
from __future__ import annotations

import importlib
import types
from typing import Any, Callable, NamedTuple

from .changes import Change

# "No attribute there" in a Patch; never handed out (get_original raises instead).
MISSING: Any = type("MISSING", (), {"__repr__": lambda self: "<missing>"})()


class Patch(NamedTuple):
    label: str      # what this patch is for, as status() shows it
    owner: object   # whose attribute changes
    attr: str       # which attribute
    original: Any   # what was there (MISSING if nothing)
    value: Any      # what we put there
    version: tuple | None = None  # a function's (version, defaults, kwdefaults) before __code__ changed


_applied: list[Patch] = []


def resolve_path(path: str) -> tuple[object, str, object]:
    """'pkg.mod.Class.attr' -> (owner, 'attr', current value), importing pkg.mod."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:-1]:
            obj = getattr(obj, name)
        return obj, parts[-1], getattr(obj, parts[-1], MISSING)
    raise ImportError(f"cannot import any module prefix of {path!r}")


def apply(change: Change) -> Patch:
    """Make the change (MISSING deletes), saving what was there."""
    label, owner, attr, value = change
    original = _get(owner, attr)
    version = None
    if attr == "__code__" and isinstance(owner, types.FunctionType):
        from .. import _core
        version = (_core._function_version(owner), owner.__defaults__, owner.__kwdefaults__)
    _put(owner, attr, value)
    patch = Patch(label, owner, attr, original, value, version)
    _applied.append(patch)
    return patch


def revert(patch: Patch) -> None:
    if patch.original is not MISSING or patch.value is not MISSING:
        _put(patch.owner, patch.attr, patch.original)
        if patch.version is not None and patch.original is not MISSING:
            _restore_version(patch.owner, *patch.version)


def _get(owner: object, attr: str) -> Any:
    return owner.get(attr, MISSING) if type(owner) is dict else getattr(owner, attr, MISSING)


def _put(owner: object, attr: str, value: Any) -> None:
    """owner.attr = value (owner[attr] for a plain dict); MISSING deletes."""
    if type(owner) is dict:
        if value is MISSING:
            del owner[attr]
        else:
            owner[attr] = value
    elif value is MISSING:
        delattr(owner, attr)
    else:
        setattr(owner, attr, value)


def undo(patch: Patch) -> None:
    """Revert one patch now and forget it (it must be the latest on its attribute)."""
    for i in range(len(_applied) - 1, -1, -1):
        if _applied[i] is patch:  # by identity: comparing owners could call anything
            del _applied[i]
            revert(patch)
            return


def _restore_version(fn: types.FunctionType, version: int, defaults: Any, kwdefaults: Any) -> None:
    """Setting __code__ clears a function's specialisation version (3.11+), for
    good on 3.13: stock call sites would stay unspecialised after uninstall.
    Give it back, only if the function is again exactly what it described."""
    if fn.__defaults__ is defaults and fn.__kwdefaults__ is kwdefaults:
        from .. import _core
        _core._restore_function_version(fn, version)


def apply_all(changes: list[Change], settle: Callable[[list[types.CodeType]], None]) -> None:
    """Apply every change: deletions last, after ``settle(old codes)`` has let
    other threads leave the code the ``__code__`` changes retired."""
    deletions = [c for c in changes if c.value is MISSING]
    retired = []
    for change in changes:
        if change.value is not MISSING:
            patch = apply(change)
            if patch.attr == "__code__" and isinstance(patch.original, types.CodeType):
                retired.append(patch.original)
    if deletions:
        names = {change.attr for change in deletions}
        settle([code for code in retired if _uses(code, names)])
        for change in deletions:
            apply(change)


def _uses(code: types.CodeType, names: set[str]) -> bool:
    """Whether code (or code nested in it) names one of ``names``."""
    return not names.isdisjoint(code.co_names) or any(
        _uses(const, names) for const in code.co_consts if isinstance(const, types.CodeType))


def revert_all(settle: Callable[[list[types.CodeType]], None] | None = None,
               down_to: int = 0) -> None:
    """Undo every patch (the newest ones, down to ``down_to`` left), newest
    first; names that fxguard added go last, after ``settle(the codes it had
    swapped in)``."""
    added, retired = [], []
    while len(_applied) > down_to:
        patch = _applied.pop()
        if patch.original is MISSING and patch.value is not MISSING:
            added.append(patch)
            continue
        if patch.attr == "__code__" and isinstance(patch.value, types.CodeType):
            retired.append(patch.value)
        revert(patch)
    if added and settle is not None:
        names = {patch.attr for patch in added}
        settle([code for code in retired if _uses(code, names)])
    for patch in added:
        revert(patch)


def applied() -> tuple[Patch, ...]:
    """Every patch in place, oldest first (for status checks and tests)."""
    return tuple(_applied)


def get_original(owner: object, attr: str) -> Any:
    """What ``owner.attr`` was before fxguard first changed it; its current value if
    fxguard never changed it.  AttributeError if there was no such attribute."""
    for patch in _applied:  # the first change to it holds what was there before
        if patch.owner is owner and patch.attr == attr:
            if patch.original is MISSING:
                raise AttributeError(f"{owner!r} had no attribute {attr!r} before fxguard set it")
            return patch.original
    value = _get(owner, attr)
    if value is MISSING:
        raise AttributeError(f"{owner!r} has no attribute {attr!r}")
    return value


def is_object_patched(owner: object, attr: str | None = None) -> bool:
    return any(p.owner is owner and (attr is None or p.attr == attr) for p in _applied)
